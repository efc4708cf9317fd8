-- Tollgate's PostgreSQL schema, version 3: a tenant owns many buckets.
--
-- A tenant rate-limits each action with its own bucket (schedule-email,
-- invoke-doc-summary-ai), so every row is now keyed by (tenant_id, bucket,
-- instance_id): a head row per bucket (instance_id = 0: the bucket's
-- level and limits, its pods' share sum and list head, its cumulative
-- totals) and a row per live pod of that bucket. The empty bucket name is
-- the tenant's request-unit bucket: every existing row becomes part of it,
-- so today's tenants, pods and totals carry over unchanged.

ALTER TABLE tenant_usage ADD COLUMN bucket TEXT NOT NULL DEFAULT '';
ALTER TABLE tenant_usage DROP CONSTRAINT tenant_usage_pkey;
ALTER TABLE tenant_usage ADD CONSTRAINT tenant_usage_pkey
    PRIMARY KEY (tenant_id, bucket, instance_id);

-- Listing buckets reads only the head rows.
DROP INDEX IF EXISTS tenant_usage_tenants;
CREATE INDEX IF NOT EXISTS tenant_usage_buckets
    ON tenant_usage (tenant_id, bucket) WHERE instance_id = 0;
