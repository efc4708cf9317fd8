-- Deletes up to $2 key rows full by $1 (the store's clock): a full key's
-- row says what no row says, so deleting it changes no answer and needs no
-- key lock. A check that read the row before the delete holds a state the
-- key refills from as it would have, and writes it back with ON CONFLICT.
-- Rows a check has locked are skipped (SKIP LOCKED), so the sweep never
-- waits; under READ COMMITTED a row a check changed meanwhile is tested
-- again, and is kept if it is no longer full (or left for the next sweep:
-- its new version is not the one the statement's snapshot sees). The rows
-- are named by ctid, so the delete visits only them: naming them by key
-- made PostgreSQL scan the whole table to join on it.
DELETE FROM tollgate_keys
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM tollgate_keys
        WHERE full_at <= $1
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    AND full_at <= $1
