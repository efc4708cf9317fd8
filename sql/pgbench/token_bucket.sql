-- pgbench script: the transaction one token-bucket request costs the
-- PostgreSQL store, statement for statement, with the same pipelining:
-- lock the bucket's head row, then (pipelined) read the clock and the instance
-- window; write the head row and the instance row (pipelined); commit.
-- The arithmetic the server does between the reads and the writes is
-- stood in for by fixed values; the rows read and written are the same.
--
--   pgbench -n -M prepared -D tenants=4 -D instances=16 -f token_bucket.sql …
\set tenant random(0, :tenants - 1)
\set instance random(1, :instances)
\set seq random(1, 1000000000)
BEGIN;
\startpipeline
SELECT * FROM tenant_usage
WHERE (tenant_id, bucket) IN (SELECT * FROM unnest(ARRAY['bench-' || :tenant], ARRAY['']))
  AND instance_id = 0
ORDER BY tenant_id, bucket
FOR UPDATE;
SELECT clock_timestamp() AS now;
(SELECT * FROM tenant_usage WHERE tenant_id = 'bench-' || :tenant AND bucket = ''
   AND instance_id BETWEEN :instance AND :instance ORDER BY instance_id LIMIT 1)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = 'bench-' || :tenant AND bucket = ''
   AND instance_id BETWEEN 1 AND :instance - 1 ORDER BY instance_id DESC LIMIT 1)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = 'bench-' || :tenant AND bucket = ''
   AND instance_id BETWEEN :instance + 1 AND 4294967295 ORDER BY instance_id LIMIT 8)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = 'bench-' || :tenant AND bucket = ''
   AND instance_id BETWEEN 1 AND :instance - 1 ORDER BY instance_id LIMIT 8);
\endpipeline
\startpipeline
UPDATE tenant_usage SET
    next_instance_id = 1,
    refill_rate = 1000, burst_limit = 10000, configured = true,
    tokens = 5000, tokens_avg = 5000, last_refill = now(),
    share_sum = :instances, live_instances = :instances, granted_tokens = granted_tokens + 100,
    committed_tokens = 0, committed_rate = 0,
    total_request_unit_micros = total_request_unit_micros + 100000000, total_read_batches = total_read_batches + 1,
    total_read_requests = total_read_requests + 1, total_read_bytes = total_read_bytes + 1,
    total_write_batches = total_write_batches + 1, total_write_requests = total_write_requests + 1,
    total_write_bytes = total_write_bytes + 1, total_cpu_micros = 0, total_egress_bytes = 0,
    created_at = created_at, updated_at = now()
WHERE tenant_id = 'bench-' || :tenant AND bucket = '' AND instance_id = 0;
INSERT INTO tenant_usage (
    tenant_id, bucket, instance_id, next_instance_id,
    lease, seq, shares, last_update, committed_rate, committed_until,
    last_grant_tokens, last_grant_trickle_nanos, last_grant_max_burst,
    last_grant_fallback_rate
) VALUES ('bench-' || :tenant, '', :instance, CASE WHEN :instance = :instances THEN 0 ELSE :instance + 1 END,
          '\x00'::bytea, :seq, 1, now(), 0, now(), 100, 0, 0, 62.5)
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
    last_grant_fallback_rate = excluded.last_grant_fallback_rate;
\endpipeline
COMMIT;
