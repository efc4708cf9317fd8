-- Every closed budget cycle, for an export: bucket by bucket, in the
-- order each was closed.
SELECT tenant_id, bucket, record
FROM tollgate_budget_cycles
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", seq
