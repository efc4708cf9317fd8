-- Budget events that may be due for delivery, locked, oldest due first:
-- not delivered, their next try come and nobody's claim running at $1
-- (the store's clock, microseconds), at most $2. The predicate is
-- `Delivery::is_due`'s, here so the partial index on next_attempt_at
-- finds the rows; the core decides again on each. Rows another server is
-- claiming right now are skipped, not waited for.
SELECT tenant_id, bucket, event, delivered_to, delivered_at, attempts,
       next_attempt_at, claimed_until, last_error
FROM tollgate_budget_events
WHERE delivered_at IS NULL AND next_attempt_at <= $1 AND claimed_until <= $1
ORDER BY next_attempt_at
LIMIT $2
FOR UPDATE SKIP LOCKED
