-- Locks and reads tenant $1's record (NULL for a tenant never put on a
-- tier nor given an override; ensure_tenant_record.sql made the row). A tier or override change takes this lock
-- first, then the tier's, then the tenant's buckets' (lock_tenant.sql).
SELECT record FROM tollgate_tenants WHERE tenant_id = $1 FOR UPDATE
