-- Bucket ($1, $2)'s per-key check rows of step $3 with slots from $4 to
-- $5, every replica's, oldest first.
SELECT slot, replica, counts FROM tollgate_check_history
WHERE tenant_id = $1 AND bucket = $2 AND step_secs = $3 AND slot >= $4 AND slot <= $5
ORDER BY slot, replica COLLATE "C"
