-- Reads the stored keys among those of a batch of checks, after
-- lock_keys.sql: key i is ($1[i], $2[i], $3[i]) as (tenant id, bucket,
-- key) and comes back as n = i; a key without a row (a full one) does not
-- come back. Each key is looked up on its own, by the primary key: the
-- LIMIT keeps PostgreSQL from flattening the lookup into a join, which it
-- planned (going by the statistics of a table still small when the
-- statement was first prepared, and kept in the cached plan) as a scan of
-- the whole table for every batch.
SELECT wanted.n, k.tokens, k.last_refill, k.quota_used, k.quota_cycle_end
FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[])
    WITH ORDINALITY AS wanted (tenant_id, bucket, key, n)
CROSS JOIN LATERAL (
    SELECT tokens, last_refill, quota_used, quota_cycle_end
    FROM tollgate_keys
    WHERE tenant_id = wanted.tenant_id AND bucket = wanted.bucket AND key = wanted.key
    LIMIT 1
) AS k
