-- The records and tiers of the tenants a batch of checks needs (or the
-- one tenant a listing of per-key buckets names), without locks: tenant i is $1[i] and comes back as n = i with its record and its
-- tier's definition (NULL if it is on none). A tenant without a record
-- does not come back: it has no definitions. A tier or override change
-- committing meanwhile applies to the next batch.
SELECT wanted.n, t.record, tiers.definition
FROM unnest($1::TEXT[]) WITH ORDINALITY AS wanted (tenant_id, n)
JOIN tollgate_tenants AS t ON t.tenant_id = wanted.tenant_id
LEFT JOIN tollgate_tiers AS tiers ON tiers.name = t.tier
