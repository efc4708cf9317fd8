-- Deletes tenant $1's record (with its buckets, by delete_tenant.sql).
DELETE FROM tollgate_tenants WHERE tenant_id = $1
