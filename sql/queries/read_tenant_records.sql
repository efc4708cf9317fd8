-- The records (tier, overrides) of the tenants in $1, without a lock; a
-- tenant without one is left out.
SELECT tenant_id, record FROM tollgate_tenants WHERE tenant_id = ANY($1::TEXT[])
