-- Tollgate's PostgreSQL schema, version 12: calendar quotas on per-key
-- buckets.
--
-- A per-key bucket's definition may carry a quota (so many tokens a day,
-- week or month, per key). A key's row keeps what the key took from its
-- quota in the cycle it last took in: the tokens (quota_used) and the
-- cycle's end (quota_cycle_end, microseconds since the Unix epoch). Both
-- are NULL for a key whose bucket has no quota, or that took nothing from
-- it. A row with a quota in use has a full_at no earlier than its cycle's
-- end, so the sweep keeps it until the cycle is over. Converts nothing:
-- existing rows have no quota in use.

ALTER TABLE tollgate_keys ADD COLUMN IF NOT EXISTS quota_used FLOAT8;
ALTER TABLE tollgate_keys ADD COLUMN IF NOT EXISTS quota_cycle_end BIGINT;
