-- Deletes the rows of the keys a batch of checks found full again: key i
-- is ($1[i], $2[i], $3[i]). Returns how many it deleted: a sweep may have
-- removed some already.
DELETE FROM tollgate_keys
WHERE (tenant_id, bucket, key) IN (SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[]))
