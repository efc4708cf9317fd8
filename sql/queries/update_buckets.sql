-- Writes back head rows the transaction has locked, one per index of the
-- arrays: bucket ($1[i], $2[i]) gets the values at i of the others.
UPDATE tenant_usage AS t SET
    next_instance_id = v.next_instance_id,
    refill_rate = v.refill_rate, burst_limit = v.burst_limit, configured = v.configured,
    tokens = v.tokens, tokens_avg = v.tokens_avg, last_refill = v.last_refill,
    share_sum = v.share_sum, live_instances = v.live_instances,
    granted_tokens = v.granted_tokens,
    committed_tokens = v.committed_tokens, committed_rate = v.committed_rate,
    total_request_unit_micros = v.total_request_unit_micros,
    total_read_batches = v.total_read_batches,
    total_read_requests = v.total_read_requests, total_read_bytes = v.total_read_bytes,
    total_write_batches = v.total_write_batches,
    total_write_requests = v.total_write_requests,
    total_write_bytes = v.total_write_bytes, total_cpu_micros = v.total_cpu_micros,
    total_egress_bytes = v.total_egress_bytes,
    created_at = v.created_at, updated_at = v.updated_at,
    capped_refill = v.capped_refill, capped_from = v.capped_from,
    capped_until = v.capped_until
FROM unnest(
    $1::TEXT[], $2::TEXT[], $3::BIGINT[],
    $4::FLOAT8[], $5::FLOAT8[], $6::BOOL[], $7::FLOAT8[], $8::FLOAT8[], $9::TIMESTAMPTZ[],
    $10::FLOAT8[], $11::BIGINT[], $12::FLOAT8[], $13::FLOAT8[], $14::FLOAT8[],
    $15::BIGINT[], $16::BIGINT[], $17::BIGINT[], $18::BIGINT[],
    $19::BIGINT[], $20::BIGINT[], $21::BIGINT[],
    $22::BIGINT[], $23::BIGINT[], $24::TIMESTAMPTZ[], $25::TIMESTAMPTZ[],
    $26::FLOAT8[], $27::TIMESTAMPTZ[], $28::TIMESTAMPTZ[]
) AS v(
    tenant_id, bucket, next_instance_id,
    refill_rate, burst_limit, configured, tokens, tokens_avg, last_refill,
    share_sum, live_instances, granted_tokens, committed_tokens, committed_rate,
    total_request_unit_micros, total_read_batches, total_read_requests, total_read_bytes,
    total_write_batches, total_write_requests, total_write_bytes,
    total_cpu_micros, total_egress_bytes, created_at, updated_at,
    capped_refill, capped_from, capped_until
)
WHERE t.tenant_id = v.tenant_id AND t.bucket = v.bucket AND t.instance_id = 0
