-- Tenant $1's partition reports, locked until the transaction ends.
SELECT reports FROM tollgate_partition_reports WHERE tenant_id = $1 FOR UPDATE
