-- Locks and reads the head rows of the buckets a transaction will change:
-- bucket i is ($1[i], $2[i]) as (tenant id, bucket name). Rows are locked in
-- key order, so two transactions never wait on each other in a cycle.
-- Every change to a bucket's rows holds this lock, so the instance rows
-- read after it are current.
SELECT * FROM tenant_usage
WHERE (tenant_id, bucket) IN (SELECT * FROM unnest($1::TEXT[], $2::TEXT[]))
  AND instance_id = 0
ORDER BY tenant_id, bucket
FOR UPDATE
