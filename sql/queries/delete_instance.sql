-- Deletes an instance row unlinked from the list (its tenant row is locked).
DELETE FROM tenant_usage WHERE tenant_id = $1 AND instance_id = $2 AND instance_id > 0
