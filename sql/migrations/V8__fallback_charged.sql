-- Tollgate's PostgreSQL schema, version 8: the fallback charged with an
-- instance's last request.
--
-- A retry carries the fallback tokens its pod used since the first
-- attempt, so that a bucket the first attempt never reached is charged for
-- them before it grants. A retry answered with the stored response of an
-- earlier attempt must tell the pod how much that attempt charged, so the
-- instance row keeps it with the rest of its last grant. Existing rows
-- have it NULL, not recorded: a pod answered from such a grant takes all
-- the fallback its retry carried as charged, as it would have before.

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS last_grant_fallback_charged FLOAT8;
