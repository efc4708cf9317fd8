-- Tollgate's PostgreSQL schema, version 6: hot-partition reports.
--
-- Pods enforce per-partition limits (a tenant's table limits, kept in its
-- record and its tier). To hold a hot partition to its limit across pods,
-- each pod reports its hottest partitions, by hash, once per reporting
-- period; the server keeps each tenant's fresh reports in one row, so that
-- every replica adds up the same pods, and answers each pod its share.
-- Reports go stale by themselves (each carries until when it counts), so
-- nothing sweeps this table: a tenant's row goes when its last report
-- does, or with the tenant. Converts nothing: the table starts empty.

CREATE TABLE IF NOT EXISTS tollgate_partition_reports (
    tenant_id TEXT PRIMARY KEY,
    -- The reports as JSON: {"pods": {pod: {"until": ..., "partitions":
    -- [{"table": ..., "op": ..., "partition": ..., "rate": ...}]}}}.
    reports   TEXT NOT NULL
);
