-- Every usage history row, for an export, in byte order of (tenant id,
-- bucket name), then step and slot, as the embedded store keeps them.
SELECT tenant_id, bucket, step_secs, slot, sample FROM tollgate_usage_history
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", step_secs, slot
