-- Tollgate's PostgreSQL schema, version 11: spend budgets per billing
-- cycle.
--
-- A bucket's budget and its state in the current cycle (the amount, the
-- cycle's rule, what happens at the limit, the thresholds; the cycle's
-- bounds, what it granted, charged and counted so far, the thresholds
-- fired, the spend rate) live in its head row, so the token-bucket
-- transaction that grants tokens also enforces the budget, under the head
-- row's lock. The column is a JSON document (TEXT, portable) written and
-- read only by the server; NULL means no budget. Converts nothing.
--
-- When a transaction finds its bucket's cycle over, it closes the cycle:
-- one row in tollgate_budget_cycles, the billing record (what the cycle
-- granted and every consumption counter the pods reported in it,
-- exactly), in the same transaction. Rows are only appended, and deleted
-- once older than the retention (13 months by default) or by an import
-- that replaces the store.
--
-- A transaction that takes a budget across a threshold (50, 75, 90, 100 %
-- by default) writes one row in tollgate_budget_events in the same
-- transaction; the key (tenant, bucket, cycle, threshold) makes an event
-- once per cycle. Any replica delivers events to the webhooks and marks
-- them delivered.

ALTER TABLE tenant_usage ADD COLUMN IF NOT EXISTS budget TEXT;

CREATE TABLE IF NOT EXISTS tollgate_budget_cycles (
    seq         BIGSERIAL PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    bucket      TEXT NOT NULL,
    -- The cycle's bounds, in microseconds since the Unix epoch.
    cycle_start BIGINT NOT NULL,
    cycle_end   BIGINT NOT NULL,
    -- The record: cycle, amount, usage (granted and fallback tokens,
    -- consumption counters), when the limit was reached.
    record      TEXT NOT NULL
);

-- A bucket's records, newest first (a budget cleared and set again in
-- one cycle closes that cycle twice: both records are kept).
CREATE INDEX IF NOT EXISTS tollgate_budget_cycles_bucket
    ON tollgate_budget_cycles (tenant_id, bucket, cycle_start);
-- Pruning by age.
CREATE INDEX IF NOT EXISTS tollgate_budget_cycles_end
    ON tollgate_budget_cycles (cycle_end);

CREATE TABLE IF NOT EXISTS tollgate_budget_events (
    seq             BIGSERIAL PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    bucket          TEXT NOT NULL,
    cycle_start     BIGINT NOT NULL,
    -- `75`, or `forecast:100`.
    threshold       TEXT NOT NULL,
    -- The event: cycle, threshold, amount, spend, forecast, when.
    event           TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    -- Delivery: the webhooks that acknowledged it (a JSON list of URLs),
    -- when every configured one had, the attempts so far, when to try
    -- next, until when a replica holds it, and the last failure.
    delivered_to    TEXT NOT NULL DEFAULT '[]',
    delivered_at    BIGINT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL DEFAULT 0,
    claimed_until   BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT NOT NULL DEFAULT '',
    UNIQUE (tenant_id, bucket, cycle_start, threshold)
);

-- The events still to deliver, in the order they are due.
CREATE INDEX IF NOT EXISTS tollgate_budget_events_due
    ON tollgate_budget_events (next_attempt_at)
    WHERE delivered_at IS NULL;
