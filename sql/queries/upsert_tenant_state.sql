-- Writes tenant $1's state: kind $2 ('deleted' or 'suspended') since $3,
-- by actor $4, for reason $5.
INSERT INTO tollgate_tenant_states (tenant_id, kind, since, actor, reason)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id) DO UPDATE
SET kind = EXCLUDED.kind, since = EXCLUDED.since, actor = EXCLUDED.actor,
    reason = EXCLUDED.reason
