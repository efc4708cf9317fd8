-- Locks and reads the head rows of every bucket of tenant $1, in the key
-- order lock_buckets.sql uses.
SELECT * FROM tenant_usage
WHERE tenant_id = $1 AND instance_id = 0
ORDER BY tenant_id, bucket
FOR UPDATE
