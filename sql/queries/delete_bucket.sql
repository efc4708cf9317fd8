-- Deletes bucket ($1, $2): its head row and instance rows (its head row
-- is locked).
DELETE FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2
