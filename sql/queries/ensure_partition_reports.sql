-- Makes sure tenant $1 has a reports row to lock. Two transactions
-- inserting it at once serialize on the primary key.
INSERT INTO tollgate_partition_reports (tenant_id, reports) VALUES ($1, '{"pods":{}}')
ON CONFLICT (tenant_id) DO NOTHING
