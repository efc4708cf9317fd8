-- Tenant $1's record, without a lock.
SELECT record FROM tollgate_tenants WHERE tenant_id = $1
