-- Removes tenant $1's state row (a resume, or an operator creating a
-- deleted tenant again); returns it, if there was one.
DELETE FROM tollgate_tenant_states WHERE tenant_id = $1
RETURNING tenant_id, kind, since, actor, reason
