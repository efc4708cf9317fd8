-- Locks and reads the head rows of organisation buckets a transaction's
-- due draws need (bucket i is ($1[i], $2[i])), in key order, skipping
-- those another transaction holds: a pod request never waits on its
-- organisation's row; a draw that finds it held is left for its bucket's
-- next request. read_bucket_keys.sql tells a held row from a missing one.
SELECT * FROM tenant_usage
WHERE (tenant_id, bucket) IN (SELECT * FROM unnest($1::TEXT[], $2::TEXT[]))
  AND instance_id = 0
ORDER BY tenant_id, bucket
FOR UPDATE SKIP LOCKED
