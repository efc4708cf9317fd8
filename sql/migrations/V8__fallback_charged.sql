-- Tollgate's PostgreSQL schema, version 8: the fallback charged with an
-- instance's last request.
--
-- A retry carries the fallback tokens its pod used since the first
-- attempt, so that a bucket the first attempt never reached is charged for
-- them before it grants. A retry answered with the stored response of an
-- earlier attempt must tell the pod how much that attempt charged, so the
-- instance row keeps it with the rest of its last grant. Existing rows
-- start with none (their last requests carried no more than they charged).

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS last_grant_fallback_charged FLOAT8 NOT NULL DEFAULT 0;
