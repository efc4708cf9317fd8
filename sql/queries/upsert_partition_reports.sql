-- Writes tenant $1's partition reports ($2, JSON).
INSERT INTO tollgate_partition_reports (tenant_id, reports) VALUES ($1, $2)
ON CONFLICT (tenant_id) DO UPDATE SET reports = EXCLUDED.reports
