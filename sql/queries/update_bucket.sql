-- Writes back a bucket's head row the transaction has locked.
UPDATE tenant_usage SET
    next_instance_id = $3,
    refill_rate = $4, burst_limit = $5, configured = $6,
    tokens = $7, tokens_avg = $8, last_refill = $9,
    share_sum = $10, live_instances = $11, granted_tokens = $12,
    committed_tokens = $13, committed_rate = $14,
    total_request_unit_micros = $15, total_read_batches = $16,
    total_read_requests = $17, total_read_bytes = $18,
    total_write_batches = $19, total_write_requests = $20,
    total_write_bytes = $21, total_cpu_micros = $22, total_egress_bytes = $23,
    created_at = $24, updated_at = $25,
    capped_refill = $26, capped_from = $27, capped_until = $28
WHERE tenant_id = $1 AND bucket = $2 AND instance_id = 0
