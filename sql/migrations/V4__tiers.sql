-- Tollgate's PostgreSQL schema, version 4: tiers and tenant records.
--
-- A tier (free, pro, ...) is a named set of bucket definitions: bucket
-- name -> refill rate, burst limit, initial tokens. A tenant put on a tier,
-- or given an override of one of its buckets, has a record naming its tier
-- and holding its overrides. The buckets themselves stay in tenant_usage;
-- these two tables say what they should be, and every change to them
-- rewrites the tenant's buckets in the same transaction.
--
-- Definitions and records are JSON documents (TEXT, portable), written and
-- read only by the server; the columns beside them exist for the queries.

CREATE TABLE IF NOT EXISTS tollgate_tiers (
    name       TEXT PRIMARY KEY,
    -- The tier as JSON: {"buckets": {name: {"limits": {...},
    -- "initial_tokens": ...}}, "created_at": ..., "updated_at": ...}.
    definition TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS tollgate_tenants (
    tenant_id TEXT PRIMARY KEY,
    -- The tenant's tier, or NULL.
    tier      TEXT,
    -- The record as JSON: tier, overrides by bucket name, timestamps. NULL
    -- only inside the transaction of a tenant's first change, which
    -- inserts the row to lock it and then writes the record.
    record    TEXT
);

-- Which tenants a tier change rewrites, and whether a tier is in use.
CREATE INDEX IF NOT EXISTS tollgate_tenants_tier ON tollgate_tenants (tier);
