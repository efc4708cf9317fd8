-- Loads tenant states for an import: state i is ($1[i], $2[i], $3[i],
-- $4[i], $5[i]) as (tenant id, kind, since, actor, reason).
INSERT INTO tollgate_tenant_states (tenant_id, kind, since, actor, reason)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TIMESTAMPTZ[], $4::TEXT[], $5::TEXT[])
