-- The rows a change of the tree of organisations reads, locked in id
-- order: the chain of organisations up from $1 (its own row, its
-- organisation's, …) and, if $2 is not NULL, $2's row and every row below
-- it (the subtree of a joining member). The walks stop after 6 steps: no
-- tree is deeper than 4, so a longer walk is a cycle.
WITH RECURSIVE up(id, depth) AS (
    SELECT $1::TEXT, 0
    UNION ALL
    SELECT n.member_of, up.depth + 1
    FROM tollgate_organisation_nodes n JOIN up ON n.tenant_id = up.id
    WHERE n.member_of IS NOT NULL AND up.depth < 6
), down(id, depth) AS (
    SELECT $2::TEXT, 0 WHERE $2::TEXT IS NOT NULL
    UNION ALL
    SELECT n.tenant_id, down.depth + 1
    FROM tollgate_organisation_nodes n JOIN down ON n.member_of = down.id
    WHERE down.depth < 6
)
SELECT tenant_id, node FROM tollgate_organisation_nodes
WHERE tenant_id IN (SELECT id FROM up UNION SELECT id FROM down)
ORDER BY tenant_id
FOR UPDATE
