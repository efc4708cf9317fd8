-- Which of the buckets ($1[i], $2[i]) exist (have a head row), without
-- locking: beside lock_buckets_skip_locked.sql, the rows it skipped.
SELECT tenant_id, bucket FROM tenant_usage
WHERE (tenant_id, bucket) IN (SELECT * FROM unnest($1::TEXT[], $2::TEXT[]))
  AND instance_id = 0
