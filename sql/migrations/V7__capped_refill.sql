-- Tollgate's PostgreSQL schema, version 7: refill lost to the burst limit.
--
-- While the server cannot be reached, pods run on their fallback rate and
-- repay those tokens once it answers again; meanwhile the bucket, unaware
-- of what they used, refills only up to its burst limit. The head row now
-- keeps the refill lost to the limit in the last stretch without requests,
-- and when, so that fallback tokens used in that stretch are paid from it
-- rather than from the refill that follows. Existing rows start with none.

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS capped_refill FLOAT8 NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS capped_from   TIMESTAMPTZ NOT NULL DEFAULT 'epoch',
    ADD COLUMN IF NOT EXISTS capped_until  TIMESTAMPTZ NOT NULL DEFAULT 'epoch';
