-- Budget thresholds crossed by a transaction, for delivery. Arrays, an
-- event per index: tenant, bucket, the cycle's start (microseconds), the
-- threshold's label, the event as JSON, the store's clock. An event of
-- the same bucket, cycle and threshold already kept is left as it is: an
-- event is made once per cycle.
INSERT INTO tollgate_budget_events (tenant_id, bucket, cycle_start, threshold, event, created_at, next_attempt_at)
SELECT t, b, c, th, e, at, at
FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[]) AS u(t, b, c, th, e, at)
ON CONFLICT (tenant_id, bucket, cycle_start, threshold) DO NOTHING
