-- Creates buckets' head rows, one per index of the arrays (the columns in
-- update_buckets.sql's order; the head row's instance id is 0). Two
-- transactions creating the same bucket collide on the primary key; the
-- loser is retried and then sees the row.
INSERT INTO tenant_usage (
    tenant_id, bucket, next_instance_id,
    refill_rate, burst_limit, configured, tokens, tokens_avg, last_refill,
    share_sum, live_instances, granted_tokens, committed_tokens, committed_rate,
    total_request_unit_micros, total_read_batches, total_read_requests, total_read_bytes,
    total_write_batches, total_write_requests, total_write_bytes,
    total_cpu_micros, total_egress_bytes, created_at, updated_at,
    capped_refill, capped_from, capped_until,
    instance_id
)
SELECT *, 0 FROM unnest(
    $1::TEXT[], $2::TEXT[], $3::BIGINT[],
    $4::FLOAT8[], $5::FLOAT8[], $6::BOOL[], $7::FLOAT8[], $8::FLOAT8[], $9::TIMESTAMPTZ[],
    $10::FLOAT8[], $11::BIGINT[], $12::FLOAT8[], $13::FLOAT8[], $14::FLOAT8[],
    $15::BIGINT[], $16::BIGINT[], $17::BIGINT[], $18::BIGINT[],
    $19::BIGINT[], $20::BIGINT[], $21::BIGINT[],
    $22::BIGINT[], $23::BIGINT[], $24::TIMESTAMPTZ[], $25::TIMESTAMPTZ[],
    $26::FLOAT8[], $27::TIMESTAMPTZ[], $28::TIMESTAMPTZ[]
)
