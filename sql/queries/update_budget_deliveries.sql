-- Writes the delivery of budget events (claimed or settled, as the core
-- decided). Arrays, an event per index: tenant, bucket, the cycle's start,
-- the threshold's label; then the webhooks that acknowledged it (a JSON
-- list), when every one had (NULL: not yet), attempts, the next try, the
-- claim, the last failure.
UPDATE tollgate_budget_events e
SET delivered_to = u.dt, delivered_at = u.da, attempts = u.n,
    next_attempt_at = u.na, claimed_until = u.cu, last_error = u.le
FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
            $7::INTEGER[], $8::BIGINT[], $9::BIGINT[], $10::TEXT[])
    AS u(t, b, c, th, dt, da, n, na, cu, le)
WHERE e.tenant_id = u.t AND e.bucket = u.b AND e.cycle_start = u.c AND e.threshold = u.th
