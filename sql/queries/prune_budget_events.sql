-- Removes budget events made before $1 (microseconds since the epoch: the
-- store's clock less the retention), at most $2 of them, oldest first;
-- answers whether each had been delivered. Idempotent: replicas may run
-- it at once.
DELETE FROM tollgate_budget_events
WHERE seq IN (
    SELECT seq FROM tollgate_budget_events
    WHERE created_at < $1
    ORDER BY created_at
    LIMIT $2
)
RETURNING delivered_at IS NOT NULL AS delivered
