-- Tollgate's PostgreSQL schema, version 18: usage history.
--
-- One row per bucket, resolution (its step in seconds) and slot (its
-- start, in microseconds since the Unix epoch): the latest sample of the
-- bucket's totals taken in the slot (tollgate_core::history). Any replica
-- samples; of two samples of one slot the later is kept (the upsert's
-- condition is HistorySample::replaces: later sampled_at, then more
-- granted tokens). Rows outlive their bucket and are deleted by age only.
--
-- A head row's totals gain the time its pods spent on trickles
-- (throttled), summed over the pods, in microseconds; 0 for the time
-- before. Converts nothing.

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS total_throttled_micros BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS tollgate_usage_history (
    tenant_id      TEXT NOT NULL,
    bucket         TEXT NOT NULL,
    step_secs      BIGINT NOT NULL,
    slot           BIGINT NOT NULL,
    sampled_at     BIGINT NOT NULL,
    granted_tokens FLOAT8 NOT NULL,
    -- The sample: when, and the bucket's totals (JSON).
    sample         TEXT NOT NULL,
    PRIMARY KEY (tenant_id, bucket, step_secs, slot)
);

-- Pruning by age, per resolution.
CREATE INDEX IF NOT EXISTS tollgate_usage_history_by_slot
    ON tollgate_usage_history (step_secs, slot);
