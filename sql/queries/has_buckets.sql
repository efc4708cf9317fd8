-- Whether tenant $1 has a bucket (a head row).
SELECT EXISTS (
    SELECT 1 FROM tenant_usage WHERE tenant_id = $1 AND instance_id = 0
) AS has_buckets
