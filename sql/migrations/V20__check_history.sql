-- Tollgate's PostgreSQL schema, version 20: per-key buckets in the usage
-- history.
--
-- A per-key bucket has no totals to sample, so each replica counts the
-- checks it answers (tollgate_core::history::checks) and writes, every
-- sample interval, one row per bucket, resolution (its step in seconds),
-- slot (its start, in microseconds since the Unix epoch) and replica: its
-- counts in that slot so far, and the busiest keys (JSON). Only the
-- replica that counted a row writes it, and a row is replaced only by
-- counts that grew (CheckCounts::replaces), so a slot's checks are the sum
-- of its replicas' rows. Rows are deleted by age only. Converts nothing.

CREATE TABLE IF NOT EXISTS tollgate_check_history (
    tenant_id       TEXT NOT NULL,
    bucket          TEXT NOT NULL,
    step_secs       BIGINT NOT NULL,
    slot            BIGINT NOT NULL,
    replica         TEXT NOT NULL,
    checks          BIGINT NOT NULL,
    refusals        BIGINT NOT NULL,
    shadow_refusals BIGINT NOT NULL,
    counts          TEXT NOT NULL,
    PRIMARY KEY (tenant_id, bucket, step_secs, slot, replica)
);

-- Pruning by age, per resolution.
CREATE INDEX IF NOT EXISTS tollgate_check_history_by_slot
    ON tollgate_check_history (step_secs, slot);
