-- Inserts tenant records, one per index of the arrays: tenant $1[i] on
-- tier $2[i] (or NULL) with the record $3[i] as JSON. For an import into
-- a store found empty.
INSERT INTO tollgate_tenants (tenant_id, tier, record)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[])
