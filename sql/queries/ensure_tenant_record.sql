-- Makes sure tenant $1 has a row in tollgate_tenants to lock, even before
-- its first record is written (its record is NULL until then). Two
-- transactions inserting it at once serialize on the primary key.
INSERT INTO tollgate_tenants (tenant_id) VALUES ($1) ON CONFLICT (tenant_id) DO NOTHING
