-- Every row of the tree of organisations, in id order, for an export.
SELECT tenant_id, node FROM tollgate_organisation_nodes ORDER BY tenant_id
