-- For each per-key bucket i = ($1[i], $2[i]) (tenant id, bucket): as n =
-- i, how many keys it stores, and its $3 busiest keys, one row each (a
-- bucket without keys: one row with key NULL), and the store's clock.
-- Busiest: furthest from full, the order of
-- tollgate_core::key_bucket::busiest_first (the latest full_at, NULL
-- (never) first, then key); the server sorts the rows again by that rule.
-- Reads only: the primary key's prefix (tenant_id, bucket) finds a
-- bucket's rows, so the cost is its rows, and no index is added to the
-- rows every check writes.
SELECT wanted.n, counted.stored, busiest.key, busiest.tokens,
       busiest.last_refill, busiest.full_at, busiest.quota_used, busiest.quota_cycle_end,
       statement_timestamp() AS read_at
FROM unnest($1::TEXT[], $2::TEXT[]) WITH ORDINALITY AS wanted (tenant_id, bucket, n)
CROSS JOIN LATERAL (
    SELECT count(*) AS stored FROM tollgate_keys AS k
    WHERE k.tenant_id = wanted.tenant_id AND k.bucket = wanted.bucket
) AS counted
LEFT JOIN LATERAL (
    SELECT k.key, k.tokens, k.last_refill, k.full_at, k.quota_used, k.quota_cycle_end
    FROM tollgate_keys AS k
    WHERE k.tenant_id = wanted.tenant_id AND k.bucket = wanted.bucket
    ORDER BY k.full_at DESC NULLS FIRST, k.key
    LIMIT $3
) AS busiest ON true
ORDER BY wanted.n
