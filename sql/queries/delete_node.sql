-- Deletes the tree row of $1 (neither an organisation nor a member any
-- more).
DELETE FROM tollgate_organisation_nodes WHERE tenant_id = $1
