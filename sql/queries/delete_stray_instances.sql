-- Deletes instance rows of a tenant that has no tenant row, before the
-- tenant row is created. Rows like these are left by versions that deleted
-- tenants without locking them first; a new tenant must start with an
-- empty instance list.
DELETE FROM tenant_usage WHERE tenant_id = $1 AND instance_id > 0
