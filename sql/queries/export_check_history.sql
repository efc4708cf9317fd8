-- Every per-key check row, for an export, in byte order of (tenant id,
-- bucket name), then step, slot and replica, as the embedded store keeps
-- them.
SELECT tenant_id, bucket, step_secs, slot, replica, counts FROM tollgate_check_history
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", step_secs, slot, replica COLLATE "C"
