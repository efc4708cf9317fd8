-- Writes the tree row of $1: whether it is an organisation ($2), the
-- organisation it belongs to ($3, NULL for none) and the core's Node as
-- JSON ($4).
INSERT INTO tollgate_organisation_nodes (tenant_id, is_organisation, member_of, node)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id) DO UPDATE SET
    is_organisation = excluded.is_organisation,
    member_of = excluded.member_of,
    node = excluded.node
