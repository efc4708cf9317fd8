-- Locks and reads tenant $1's state row, if it has one: a suspend, resume
-- or delete of the tenant decides from it after locking its record and
-- head rows.
SELECT tenant_id, kind, since, actor, reason FROM tollgate_tenant_states
WHERE tenant_id = $1
FOR UPDATE
