-- Removes closed budget cycles that ended before $1 (microseconds since
-- the epoch: the store's clock less the retention), at most $2 of them,
-- oldest first. Idempotent: replicas may run it at once.
DELETE FROM tollgate_budget_cycles
WHERE seq IN (
    SELECT seq FROM tollgate_budget_cycles
    WHERE cycle_end < $1
    ORDER BY cycle_end
    LIMIT $2
)
