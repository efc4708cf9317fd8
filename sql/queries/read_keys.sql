-- Reads the stored keys among those of a batch of checks, after
-- lock_keys.sql: key i is ($1[i], $2[i], $3[i]) as (tenant id, bucket,
-- key) and comes back as n = i; a key without a row (a full one) does not
-- come back.
SELECT wanted.n, k.tokens, k.last_refill, k.quota_used, k.quota_cycle_end
FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[])
    WITH ORDINALITY AS wanted (tenant_id, bucket, key, n)
JOIN tollgate_keys AS k
    ON k.tenant_id = wanted.tenant_id AND k.bucket = wanted.bucket AND k.key = wanted.key
