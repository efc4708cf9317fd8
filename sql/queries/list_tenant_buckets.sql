-- Tenant $1's buckets' head rows, and the store's clock.
SELECT statement_timestamp() AS read_at, * FROM tenant_usage
WHERE tenant_id = $1 AND instance_id = 0
ORDER BY tenant_id, bucket
