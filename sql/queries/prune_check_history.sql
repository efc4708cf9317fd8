-- Removes at most $4 per-key check rows whose slot started before their
-- resolution's cut-off (as prune_history.sql).
DELETE FROM tollgate_check_history
WHERE ctid IN (
    SELECT h.ctid FROM tollgate_check_history h
    LEFT JOIN unnest($1::BIGINT[], $2::BIGINT[]) AS r(step_secs, before)
        ON r.step_secs = h.step_secs
    WHERE h.slot < COALESCE(r.before, $3)
    LIMIT $4
)
