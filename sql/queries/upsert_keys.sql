-- Writes the keys a batch of checks left below their burst or with a
-- quota in use: key i is ($1[i], $2[i], $3[i]) with its level $4[i] as of
-- $5[i], the time its row may go $6[i] (NULL: never), and what it took
-- from its quota $7[i] in the cycle ending $8[i] (both NULL: nothing).
-- Each key appears once. Its row may be gone although the batch read it
-- (a sweep removed it as full), or be there although the batch found
-- none: the key's lock is held, so either way the batch's state is the
-- key's, and it replaces what is there.
INSERT INTO tollgate_keys
    (tenant_id, bucket, key, tokens, last_refill, full_at, quota_used, quota_cycle_end)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[], $4::FLOAT8[], $5::BIGINT[], $6::BIGINT[],
                     $7::FLOAT8[], $8::BIGINT[])
ON CONFLICT (tenant_id, bucket, key) DO UPDATE SET
    tokens = excluded.tokens,
    last_refill = excluded.last_refill,
    full_at = excluded.full_at,
    quota_used = excluded.quota_used,
    quota_cycle_end = excluded.quota_cycle_end
