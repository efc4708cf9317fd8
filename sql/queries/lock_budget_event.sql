-- One budget event with its delivery so far, locked: $1 tenant, $2
-- bucket, $3 the cycle's start (microseconds), $4 the threshold's label.
SELECT tenant_id, bucket, event, delivered_to, delivered_at, attempts,
       next_attempt_at, claimed_until, last_error
FROM tollgate_budget_events
WHERE tenant_id = $1 AND bucket = $2 AND cycle_start = $3 AND threshold = $4
FOR UPDATE
