-- Writes the keys a batch of checks left below their burst: key i is
-- ($1[i], $2[i], $3[i]) with its level $4[i] as of $5[i] and the time it
-- will be full $6[i] (NULL: never). Each key appears once. Its row may be
-- gone although the batch read it (a sweep removed it as full), or be
-- there although the batch found none: the key's lock is held, so either
-- way the batch's state is the key's, and it replaces what is there.
INSERT INTO tollgate_keys (tenant_id, bucket, key, tokens, last_refill, full_at)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[], $4::FLOAT8[], $5::BIGINT[], $6::BIGINT[])
ON CONFLICT (tenant_id, bucket, key) DO UPDATE SET
    tokens = excluded.tokens,
    last_refill = excluded.last_refill,
    full_at = excluded.full_at
