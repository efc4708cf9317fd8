-- Every tenant state, for an export, in byte order of tenant ids.
SELECT tenant_id, kind, since, actor, reason FROM tollgate_tenant_states
ORDER BY tenant_id COLLATE "C"
