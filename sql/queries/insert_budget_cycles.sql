-- Budget cycles closed by a transaction: one billing record per bucket
-- and cycle, appended in the transaction that closed it (a request that
-- found its cycle over, a budget changed or cleared). Arrays, a record
-- per index: tenant, bucket, the cycle's start and end (microseconds
-- since the epoch), the record as JSON.
INSERT INTO tollgate_budget_cycles (tenant_id, bucket, cycle_start, cycle_end, record)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[])
