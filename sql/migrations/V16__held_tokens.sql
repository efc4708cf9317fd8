-- Tollgate's PostgreSQL schema, version 16: what the pods hold.
--
-- Every request says how many granted tokens its pod holds. The bucket
-- counts them as part of what it holds (refill stops when the bucket and
-- its pods together hold the burst limit) and takes them as used at the
-- pod's shares per second until the pod reports again. An instance row
-- keeps its own count and rate as of its last request; the head row their
-- sums as of its last refill. Existing rows start at 0: pods that have not
-- reported since hold nothing as far as their bucket can tell, as before.

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS held_tokens FLOAT8 NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS held_use_rate FLOAT8 NOT NULL DEFAULT 0;
