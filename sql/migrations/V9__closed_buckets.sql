-- Tollgate's PostgreSQL schema, version 9: closed buckets.
--
-- Retiring a bucket (a tier change, a tier redefined, an override
-- cleared) or deleting a tenant deletes the bucket's rows from
-- tenant_usage; the same transaction writes one row here per bucket, so
-- that its last limits and exact totals outlive it. Rows are only ever
-- inserted: no operation but an import that replaces the whole store
-- deletes them, and a bucket closed several times has a row each time.
--
-- The record is a JSON document (TEXT, portable) written and read only
-- by the server: tenant, bucket, closed_at, reason, closed_by (actor,
-- operator, peer), limits, totals (the head row's exact integer counters
-- and granted tokens), created_at. The columns beside it exist for the
-- queries; seq orders a tenant's records in the order they were closed.

CREATE TABLE IF NOT EXISTS tollgate_closed_buckets (
    seq       BIGSERIAL PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    bucket    TEXT NOT NULL,
    -- The store's clock when the bucket was closed, in microseconds since
    -- the Unix epoch.
    closed_at BIGINT NOT NULL,
    -- tier-change, tier-redefined, override-cleared or tenant-deleted.
    reason    TEXT NOT NULL,
    record    TEXT NOT NULL
);

-- A tenant's records in close order (ListClosedBuckets).
CREATE INDEX IF NOT EXISTS tollgate_closed_buckets_tenant
    ON tollgate_closed_buckets (tenant_id, seq);
