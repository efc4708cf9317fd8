-- Tollgate's PostgreSQL schema, version 5: per-key buckets.
--
-- A per-key bucket definition (of a tier, or an override) gives every key a
-- caller names (a user, an API key, an address) an exact token bucket of
-- its own, checked in a store transaction per call. A key never seen is
-- full, and so is a key that has refilled to its burst: neither needs a
-- row, so tollgate_keys holds only keys below their burst, and a sweep
-- removes rows once their time to be full has come. A check with a
-- request id leaves a record of its answer, so that a retry gets the same
-- answer and takes nothing again; the sweep removes records once they
-- expire. Converts nothing: both tables start empty.
--
-- Keys and request ids are the caller's: any UTF-8, NUL included, which
-- TEXT cannot hold, so they are BYTEA (their UTF-8 bytes). Times are
-- microseconds since the Unix epoch, the core's Timestamp.

CREATE TABLE IF NOT EXISTS tollgate_keys (
    tenant_id   TEXT   NOT NULL,
    bucket      TEXT   NOT NULL,
    key         BYTEA  NOT NULL,
    -- The bucket's level as of last_refill (below its burst limit).
    tokens      FLOAT8 NOT NULL,
    last_refill BIGINT NOT NULL,
    -- When the bucket will be full again under the limits it was written
    -- with, so its row may go; NULL: never (no refill).
    full_at     BIGINT,
    PRIMARY KEY (tenant_id, bucket, key)
);

-- The sweep: the rows whose time to be full has come.
CREATE INDEX IF NOT EXISTS tollgate_keys_full_at
    ON tollgate_keys (full_at) WHERE full_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS tollgate_check_requests (
    tenant_id  TEXT   NOT NULL,
    bucket     TEXT   NOT NULL,
    key        BYTEA  NOT NULL,
    request_id BYTEA  NOT NULL,
    -- The record as JSON: the tokens asked, the answer, the limits, and
    -- expires_at again. Written and read only by the server (TEXT, not
    -- jsonb, to stay portable, as in version 4).
    record     TEXT   NOT NULL,
    -- When the record may go.
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, bucket, key, request_id)
);

-- The sweep: the records past their time.
CREATE INDEX IF NOT EXISTS tollgate_check_requests_expires_at
    ON tollgate_check_requests (expires_at);
