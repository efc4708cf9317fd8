-- Writes back a tenant row the transaction has locked.
UPDATE tenant_usage SET
    next_instance_id = $2,
    refill_rate = $3, burst_limit = $4, configured = $5,
    tokens = $6, tokens_avg = $7, last_refill = $8,
    share_sum = $9, live_instances = $10, granted_tokens = $11,
    committed_tokens = $12, committed_rate = $13,
    total_request_unit_micros = $14, total_read_batches = $15,
    total_read_requests = $16, total_read_bytes = $17,
    total_write_batches = $18, total_write_requests = $19,
    total_write_bytes = $20, total_cpu_micros = $21, total_egress_bytes = $22,
    created_at = $23, updated_at = $24
WHERE tenant_id = $1 AND instance_id = 0
