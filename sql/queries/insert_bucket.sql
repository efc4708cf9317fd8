-- Creates a bucket's head row. Two transactions creating the same bucket
-- collide on the primary key; the loser is retried and then sees the row.
INSERT INTO tenant_usage (
    tenant_id, bucket, instance_id, next_instance_id,
    refill_rate, burst_limit, configured, tokens, tokens_avg, last_refill,
    share_sum, live_instances, granted_tokens, committed_tokens, committed_rate,
    total_request_unit_micros, total_read_batches, total_read_requests, total_read_bytes,
    total_write_batches, total_write_requests, total_write_bytes,
    total_cpu_micros, total_egress_bytes, created_at, updated_at,
    capped_refill, capped_from, capped_until
) VALUES (
    $1, $2, 0, $3,
    $4, $5, $6, $7, $8, $9,
    $10, $11, $12, $13, $14,
    $15, $16, $17, $18,
    $19, $20, $21,
    $22, $23, $24, $25,
    $26, $27, $28
)
