-- Deletes a tenant row and its instance rows; returns the ids deleted.
DELETE FROM tenant_usage WHERE tenant_id = $1 RETURNING instance_id
