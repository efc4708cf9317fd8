-- Tollgate's PostgreSQL schema, version 10: tenant states.
--
-- Deleting a tenant removes its rows; its pods would then recreate its
-- request-unit bucket with the server's default limits at their next
-- request. A deleted tenant therefore leaves a tombstone here, and its
-- pods are refused until an operator creates it again (which removes the
-- row). An operator may also suspend a tenant: its rows stay untouched,
-- its pods are refused until it is resumed (which removes the row). One
-- row per tenant at most: a delete replaces a suspension. Token-bucket
-- transactions read the rows of their tenants after locking their
-- buckets' head rows. Converts nothing: the table starts empty.
--
-- (Version 9 is the closed-bucket records' migration.)

CREATE TABLE IF NOT EXISTS tollgate_tenant_states (
    tenant_id TEXT PRIMARY KEY,
    kind      TEXT NOT NULL CHECK (kind IN ('deleted', 'suspended')),
    -- When the tenant was deleted or suspended (the store's clock).
    since     TIMESTAMPTZ NOT NULL,
    -- Who did it, as the audit log names them: `alice at 10.0.0.7:51234`.
    actor     TEXT NOT NULL,
    -- Why, as the operator said (suspensions; may be empty).
    reason    TEXT NOT NULL DEFAULT ''
);
