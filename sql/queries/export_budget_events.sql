-- Every budget event with its delivery so far, for an export, in key
-- order (the embedded store's): bucket, cycle, threshold.
SELECT tenant_id, bucket, event, delivered_to, delivered_at, attempts,
       next_attempt_at, claimed_until, last_error
FROM tollgate_budget_events
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", cycle_start, threshold COLLATE "C"
