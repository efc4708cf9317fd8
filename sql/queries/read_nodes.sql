-- The rows of the tree of organisations of the tenants in $1. A
-- token-bucket transaction sends it after locking its head rows, in the
-- same round trip as the tenants' states, so it sees a member that joined
-- or left before the lock was granted.
SELECT tenant_id, node FROM tollgate_organisation_nodes
WHERE tenant_id = ANY($1::TEXT[])
