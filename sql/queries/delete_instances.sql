-- Deletes instance rows unlinked from their buckets' lists (the buckets'
-- head rows are locked): row i is ($1[i], $2[i], $3[i]).
DELETE FROM tenant_usage
WHERE (tenant_id, bucket, instance_id) IN (SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[]))
  AND instance_id > 0
