-- Rows for the pgbench baseline: tenants bench-0 .. bench-(:tenants - 1),
-- each with instances 1 .. :instances, linked in a list as Tollgate keeps
-- them. Run on a database migrated with `tollgate migrate`:
--   psql -v tenants=4 -v instances=16 -f setup.sql "$URL"
DELETE FROM tenant_usage WHERE tenant_id LIKE 'bench-%';

INSERT INTO tenant_usage (
    tenant_id, instance_id, next_instance_id,
    refill_rate, burst_limit, configured, tokens, tokens_avg, last_refill,
    share_sum, live_instances, granted_tokens, committed_tokens, committed_rate,
    total_request_unit_micros, total_read_batches, total_read_requests, total_read_bytes,
    total_write_batches, total_write_requests, total_write_bytes,
    total_cpu_micros, total_egress_bytes, created_at, updated_at
)
SELECT 'bench-' || t, 0, 1,
       1000, 10000, true, 10000, 10000, now(),
       :instances, :instances, 0, 0, 0,
       0, 0, 0, 0, 0, 0, 0, 0, 0, now(), now()
FROM generate_series(0, :tenants - 1) AS t;

INSERT INTO tenant_usage (
    tenant_id, instance_id, next_instance_id,
    lease, seq, shares, last_update, committed_rate, committed_until,
    last_grant_tokens, last_grant_trickle_nanos, last_grant_max_burst,
    last_grant_fallback_rate
)
SELECT 'bench-' || t, i, CASE WHEN i = :instances THEN 0 ELSE i + 1 END,
       '\x00'::bytea, 0, 1, now(), 0, now(), 0, 0, 0, 0
FROM generate_series(0, :tenants - 1) AS t, generate_series(1, :instances) AS i;
