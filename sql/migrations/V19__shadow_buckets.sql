-- Tollgate's PostgreSQL schema, version 19: shared buckets in shadow mode.
--
-- A shared bucket may be `enforce = false`: every request is decided as if
-- enforced, and the pod is granted what it asked for at once. The head row
-- keeps whether it enforces, and what enforcing would have held back: the
-- tokens the pods got at once that it would not have given at once, and
-- the trickles it would have put them on (microseconds, summed).

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS enforce BOOL NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS shadow_throttled_tokens FLOAT8 NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS shadow_throttled_micros BIGINT NOT NULL DEFAULT 0;
