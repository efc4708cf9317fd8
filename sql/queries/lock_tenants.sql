-- Locks and reads the tenant rows ($1: tenant ids) a transaction will
-- change. Rows are locked in tenant id order, so two transactions never
-- wait on each other in a cycle. Every change to a tenant's rows holds this
-- lock, so the instance rows read after it are current.
SELECT * FROM tenant_usage
WHERE tenant_id = ANY($1) AND instance_id = 0
ORDER BY tenant_id
FOR UPDATE
