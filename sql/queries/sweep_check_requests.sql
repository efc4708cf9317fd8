-- Deletes up to $2 check records expired by $1 (the store's clock): a
-- retry after that is a new check. Records a check holds are skipped, so
-- the sweep never waits; rows are named by ctid, as in sweep_keys.sql.
DELETE FROM tollgate_check_requests
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM tollgate_check_requests
        WHERE expires_at <= $1
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    AND expires_at <= $1
