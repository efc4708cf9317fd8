-- Every stored key (keys below their burst), for an export.
SELECT tenant_id, bucket, key, tokens, last_refill, full_at, quota_used, quota_cycle_end
FROM tollgate_keys
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", key
