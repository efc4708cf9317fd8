-- Tollgate's PostgreSQL schema, version 1: the tenant_usage table.
--
-- One table, as in CockroachDB's distributed token bucket RFC: a row per
-- tenant with instance_id = 0 (the global bucket, the share sum and the
-- cumulative consumption), and a row per live instance (pod) with
-- instance_id >= 1 (its place in the list, its lease and last sequence
-- number, its shares and the grant it was last answered).
--
-- The instance rows of a tenant form a circular linked list in ascending
-- id order through next_instance_id, with the tenant row as the sentinel:
-- the tenant row's next_instance_id is the lowest live instance (or 0), the
-- highest instance points back at 0.
--
-- Every transaction that changes a tenant's rows first locks its tenant row
-- (SELECT ... FOR UPDATE), so the instance rows need no locks of their own.
--
-- Portable SQL only (it runs unchanged on CockroachDB and YugabyteDB):
-- no advisory locks, no session state, no PL/pgSQL.

CREATE TABLE IF NOT EXISTS tenant_usage (
    tenant_id        TEXT   NOT NULL,
    instance_id      BIGINT NOT NULL,
    next_instance_id BIGINT NOT NULL,

    -- The tenant row (instance_id = 0) ---------------------------------
    -- Limits: tokens added per second; refill pauses at the burst limit.
    refill_rate      FLOAT8,
    burst_limit      FLOAT8,
    -- False while the tenant runs on the server's default limits.
    configured       BOOL,
    -- Tokens in the bucket as of last_refill (negative: debt), and their
    -- exponential moving average.
    tokens           FLOAT8,
    tokens_avg       FLOAT8,
    last_refill      TIMESTAMPTZ,
    share_sum        FLOAT8,
    live_instances   BIGINT,
    -- Cumulative tokens granted since the tenant was created.
    granted_tokens   FLOAT8,
    -- Trickle tokens granted but not yet delivered, as of last_refill.
    committed_tokens FLOAT8,
    -- Cumulative consumption since the tenant was created.
    total_request_units  FLOAT8,
    total_read_batches   BIGINT,
    total_read_requests  BIGINT,
    total_read_bytes     BIGINT,
    total_write_batches  BIGINT,
    total_write_requests BIGINT,
    total_write_bytes    BIGINT,
    total_cpu_seconds    FLOAT8,
    total_egress_bytes   BIGINT,
    created_at       TIMESTAMPTZ,
    updated_at       TIMESTAMPTZ,

    -- Both kinds of row --------------------------------------------------
    -- Tenant row: the sum of the trickle rates being delivered.
    -- Instance row: the rate of the part of its trickle that refill pays for.
    committed_rate   FLOAT8,

    -- Instance rows (instance_id >= 1) ---------------------------------
    lease            BYTEA,
    -- The last sequence number seen for lease.
    seq              BIGINT,
    shares           FLOAT8,
    -- When the server last heard from the instance.
    last_update      TIMESTAMPTZ,
    -- Until when committed_rate is delivered.
    committed_until  TIMESTAMPTZ,
    -- The grant answered to (lease, seq), replayed to a duplicate.
    last_grant_tokens          FLOAT8,
    last_grant_trickle_nanos   BIGINT,
    last_grant_max_burst       FLOAT8,
    last_grant_fallback_rate   FLOAT8,

    PRIMARY KEY (tenant_id, instance_id),
    CONSTRAINT instance_id_range CHECK (instance_id >= 0 AND instance_id <= 4294967295),
    CONSTRAINT next_instance_id_range CHECK (next_instance_id >= 0 AND next_instance_id <= 4294967295),
    CONSTRAINT tenant_row_complete CHECK (
        instance_id <> 0 OR (
            refill_rate IS NOT NULL AND burst_limit IS NOT NULL AND configured IS NOT NULL
            AND tokens IS NOT NULL AND tokens_avg IS NOT NULL AND last_refill IS NOT NULL
            AND share_sum IS NOT NULL AND live_instances IS NOT NULL
            AND granted_tokens IS NOT NULL AND committed_tokens IS NOT NULL
            AND committed_rate IS NOT NULL
            AND total_request_units IS NOT NULL AND total_read_batches IS NOT NULL
            AND total_read_requests IS NOT NULL AND total_read_bytes IS NOT NULL
            AND total_write_batches IS NOT NULL AND total_write_requests IS NOT NULL
            AND total_write_bytes IS NOT NULL AND total_cpu_seconds IS NOT NULL
            AND total_egress_bytes IS NOT NULL
            AND created_at IS NOT NULL AND updated_at IS NOT NULL
        )
    ),
    CONSTRAINT instance_row_complete CHECK (
        instance_id = 0 OR (
            lease IS NOT NULL AND seq IS NOT NULL AND shares IS NOT NULL
            AND last_update IS NOT NULL AND committed_rate IS NOT NULL
            AND committed_until IS NOT NULL
            AND last_grant_tokens IS NOT NULL AND last_grant_trickle_nanos IS NOT NULL
            AND last_grant_max_burst IS NOT NULL AND last_grant_fallback_rate IS NOT NULL
        )
    )
);

-- Listing tenants reads only the tenant rows.
CREATE INDEX IF NOT EXISTS tenant_usage_tenants
    ON tenant_usage (tenant_id) WHERE instance_id = 0;
