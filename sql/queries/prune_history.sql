-- Removes at most $4 history rows whose slot started before their
-- resolution's cut-off ($1 steps and $2 cut-offs, side by side; a step no
-- resolution has any more is cut off at $3, the coarsest's). Idempotent:
-- replicas may run it at once.
DELETE FROM tollgate_usage_history
WHERE ctid IN (
    SELECT h.ctid FROM tollgate_usage_history h
    LEFT JOIN unnest($1::BIGINT[], $2::BIGINT[]) AS r(step_secs, before)
        ON r.step_secs = h.step_secs
    WHERE h.slot < COALESCE(r.before, $3)
    LIMIT $4
)
