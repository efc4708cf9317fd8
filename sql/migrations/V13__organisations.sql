-- Tollgate's PostgreSQL schema, version 13: organisations.
--
-- An organisation is an id in the tenants' namespace whose buckets its
-- members' buckets draw their refill from (tollgate_core::organisation).
-- The tree is kept in tollgate_organisation_nodes: one row per id that is
-- an organisation or belongs to one, the core's Node as JSON, and beside
-- it what listings filter on (whether it is an organisation, which one it
-- belongs to). Token-bucket transactions read the rows of their tenants
-- after their head-row locks, in the same round trip as tenant states.
--
-- Head rows gain the sum of their instances' guaranteed rates
-- (guarantee_sum), the rate a member bucket drew and until when (drawn)
-- and its side of the draws (draw), both JSON, NULL for a bucket of no
-- organisation. Instance rows gain their guaranteed rate (a member's in
-- its organisation's bucket; 0 for pods). Converts nothing: no bucket
-- belongs to an organisation yet.

ALTER TABLE tenant_usage ADD COLUMN IF NOT EXISTS guarantee_sum FLOAT8 NOT NULL DEFAULT 0;
ALTER TABLE tenant_usage ADD COLUMN IF NOT EXISTS drawn TEXT;
ALTER TABLE tenant_usage ADD COLUMN IF NOT EXISTS draw TEXT;
ALTER TABLE tenant_usage ADD COLUMN IF NOT EXISTS guaranteed_rate FLOAT8 NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS tollgate_organisation_nodes (
    tenant_id TEXT PRIMARY KEY,
    is_organisation BOOL NOT NULL,
    member_of TEXT,
    node TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tollgate_organisation_nodes_member_of
    ON tollgate_organisation_nodes (member_of) WHERE member_of IS NOT NULL;
