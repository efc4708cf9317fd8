-- Up to $4 tenants' records with their tiers' definitions, for a listing
-- of per-key buckets: tenant $1 alone if $3, else the tenants after $1
-- (from $1 itself if $2), in tenant-id order by byte ("C"), the order
-- page tokens compare in. A record still NULL (a first change not
-- committed) comes back NULL and is skipped.
SELECT t.tenant_id, t.record, tiers.definition
FROM tollgate_tenants AS t
LEFT JOIN tollgate_tiers AS tiers ON tiers.name = t.tier
WHERE CASE
    WHEN $3 THEN t.tenant_id = $1
    WHEN $2 THEN t.tenant_id COLLATE "C" >= $1
    ELSE t.tenant_id COLLATE "C" > $1
END
ORDER BY t.tenant_id COLLATE "C"
LIMIT $4
