-- Writes tenant $1's record: its tier $2 (or NULL) and the record $3.
INSERT INTO tollgate_tenants (tenant_id, tier, record) VALUES ($1, $2, $3)
ON CONFLICT (tenant_id) DO UPDATE SET tier = excluded.tier, record = excluded.record
