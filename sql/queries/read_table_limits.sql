-- What tenant $1's table limits come from: its record (overrides) and its
-- tier's definition (the tier's tables), either NULL.
SELECT t.record, tr.definition
FROM tollgate_tenants t LEFT JOIN tollgate_tiers tr ON tr.name = t.tier
WHERE t.tenant_id = $1
