-- Deletes an instance row unlinked from its bucket's list (the bucket's
-- head row is locked).
DELETE FROM tenant_usage
WHERE tenant_id = $1 AND bucket = $2 AND instance_id = $3 AND instance_id > 0
