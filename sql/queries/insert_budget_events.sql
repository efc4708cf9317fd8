-- Budget events to keep for delivery: thresholds a transaction crossed
-- (not delivered yet), or an import's (with their delivery so far).
-- Arrays, an event per index: tenant, bucket, the cycle's start
-- (microseconds), the threshold's label, the webhooks that acknowledged
-- it (a JSON list), when all had (NULL: not yet), attempts, the event as
-- JSON, when it was made. An event still to deliver is due at once. An
-- event of the same bucket, cycle and threshold already kept is left as
-- it is: an event is made once per cycle.
INSERT INTO tollgate_budget_events
    (tenant_id, bucket, cycle_start, threshold, event, created_at,
     delivered_to, delivered_at, attempts, next_attempt_at)
SELECT t, b, c, th, e, at, dt, da, n, at
FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
            $7::INTEGER[], $8::TEXT[], $9::BIGINT[])
    AS u(t, b, c, th, dt, da, n, e, at)
ON CONFLICT (tenant_id, bucket, cycle_start, threshold) DO NOTHING
