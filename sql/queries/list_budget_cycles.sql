-- A bucket's closed budget cycles, newest first: $1 tenant, $2 bucket,
-- $3 how many at most. Two records of one cycle (a budget cleared and set
-- again in it) come in the order they were closed, the later first.
SELECT record
FROM tollgate_budget_cycles
WHERE tenant_id = $1 AND bucket = $2
ORDER BY cycle_start DESC, seq DESC
LIMIT $3
