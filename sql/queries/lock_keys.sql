-- Takes the transaction's advisory lock of every key a batch of checks
-- touches; $1 are the locks' ids, a 64-bit hash of (tenant id, bucket,
-- key) that the server computes (store/postgres/keys.rs, lock_id). A full
-- key has no row to lock with FOR UPDATE, and two checks of such a key
-- must not both find it full: the advisory lock stands for the key, row
-- or no row. Locks are taken in ascending id order, so two batches never
-- wait on each other in a cycle; two keys with the same id only wait for
-- each other. The locks are released at commit or rollback, after the
-- transaction's changes are visible, so the next holder reads them.
SELECT pg_advisory_xact_lock(id)
FROM (SELECT DISTINCT id FROM unnest($1::BIGINT[]) AS ids (id) ORDER BY id) AS ordered
