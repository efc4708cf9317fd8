-- Inserts or replaces instance rows (their buckets' head rows are
-- locked), one per index of the arrays. A row appears once: one statement
-- cannot change a row twice.
INSERT INTO tenant_usage (
    tenant_id, bucket, instance_id, next_instance_id,
    lease, seq, shares, last_update, committed_rate, committed_until,
    last_grant_tokens, last_grant_trickle_nanos, last_grant_max_burst,
    last_grant_fallback_rate, last_grant_fallback_charged, guaranteed_rate,
    last_grant_initial_allowance, held_tokens, held_use_rate
)
SELECT * FROM unnest(
    $1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[],
    $5::BYTEA[], $6::BIGINT[], $7::FLOAT8[], $8::TIMESTAMPTZ[], $9::FLOAT8[], $10::TIMESTAMPTZ[],
    $11::FLOAT8[], $12::BIGINT[], $13::FLOAT8[], $14::FLOAT8[],
    $15::FLOAT8[], $16::FLOAT8[], $17::FLOAT8[], $18::FLOAT8[], $19::FLOAT8[]
)
ON CONFLICT (tenant_id, bucket, instance_id) DO UPDATE SET
    next_instance_id = excluded.next_instance_id,
    lease = excluded.lease,
    seq = excluded.seq,
    shares = excluded.shares,
    last_update = excluded.last_update,
    committed_rate = excluded.committed_rate,
    committed_until = excluded.committed_until,
    last_grant_tokens = excluded.last_grant_tokens,
    last_grant_trickle_nanos = excluded.last_grant_trickle_nanos,
    last_grant_max_burst = excluded.last_grant_max_burst,
    last_grant_fallback_rate = excluded.last_grant_fallback_rate,
    last_grant_fallback_charged = excluded.last_grant_fallback_charged,
    guaranteed_rate = excluded.guaranteed_rate,
    last_grant_initial_allowance = excluded.last_grant_initial_allowance,
    held_tokens = excluded.held_tokens,
    held_use_rate = excluded.held_use_rate
