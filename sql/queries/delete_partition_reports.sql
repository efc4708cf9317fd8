-- Removes tenant $1's partition reports (none fresh, or the tenant gone).
DELETE FROM tollgate_partition_reports WHERE tenant_id = $1
