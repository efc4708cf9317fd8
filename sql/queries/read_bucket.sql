-- A bucket's head row and its instance rows, read by one statement so they
-- are consistent with each other, and the store's clock.
SELECT statement_timestamp() AS read_at, * FROM tenant_usage
WHERE tenant_id = $1 AND bucket = $2
ORDER BY instance_id
