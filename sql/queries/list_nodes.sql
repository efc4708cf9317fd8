-- Rows of the tree: the organisations ($1 = 'organisations'), the members
-- of organisation $2 ($1 = 'members'), or the rows of the ids in $3
-- ($1 = 'ids'); in id order.
SELECT tenant_id, node FROM tollgate_organisation_nodes
WHERE ($1 = 'organisations' AND is_organisation)
   OR ($1 = 'members' AND member_of = $2)
   OR ($1 = 'ids' AND tenant_id = ANY($3::TEXT[]))
ORDER BY tenant_id
