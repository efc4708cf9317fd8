-- The state rows (tombstones, suspensions) of the tenants in $1. A
-- token-bucket or check transaction sends it after locking its head rows
-- (or keys), in the same round trip, so it sees a delete or suspension
-- that committed before the lock was granted.
SELECT tenant_id, kind, since, actor, reason FROM tollgate_tenant_states
WHERE tenant_id = ANY($1::TEXT[])
