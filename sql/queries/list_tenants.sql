-- Up to $2 tenant rows with ids after $1 ('' lists from the start), in id
-- order, and the store's clock.
SELECT statement_timestamp() AS read_at, * FROM tenant_usage
WHERE instance_id = 0 AND tenant_id > $1
ORDER BY tenant_id
LIMIT $2
