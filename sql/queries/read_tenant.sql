-- Every row of tenant $1's buckets, read by one statement so they are
-- consistent with each other, in key order, and the store's clock.
SELECT statement_timestamp() AS read_at, * FROM tenant_usage
WHERE tenant_id = $1
ORDER BY tenant_id, bucket, instance_id
