-- Inserts or replaces an instance row (its bucket's head row is locked).
INSERT INTO tenant_usage (
    tenant_id, bucket, instance_id, next_instance_id,
    lease, seq, shares, last_update, committed_rate, committed_until,
    last_grant_tokens, last_grant_trickle_nanos, last_grant_max_burst,
    last_grant_fallback_rate
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
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
    last_grant_fallback_rate = excluded.last_grant_fallback_rate
