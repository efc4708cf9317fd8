-- Deletes the instance rows of buckets that have no head row, before their
-- head rows are created: bucket i is ($1[i], $2[i]). Rows like these are
-- left by versions that deleted tenants without locking them first; a new
-- bucket must start with an empty instance list.
DELETE FROM tenant_usage
WHERE (tenant_id, bucket) IN (SELECT * FROM unnest($1::TEXT[], $2::TEXT[]))
  AND instance_id > 0
