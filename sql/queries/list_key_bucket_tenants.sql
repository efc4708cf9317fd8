-- Up to $3 tenants' records with their tiers' definitions, for a listing
-- of per-key buckets: the tenants from $1 on (with $1 itself only if $2),
-- in tenant-id order, the order ListTenants pages in. The primary key
-- serves the range and the order (no COLLATE, which would bypass it). A
-- record still NULL (a first change not committed) comes back NULL and is
-- skipped. One tenant's come from read_definitions.sql.
SELECT t.tenant_id, t.record, tiers.definition
FROM tollgate_tenants AS t
LEFT JOIN tollgate_tiers AS tiers ON tiers.name = t.tier
WHERE t.tenant_id >= $1 AND ($2 OR t.tenant_id > $1)
ORDER BY t.tenant_id
LIMIT $3
