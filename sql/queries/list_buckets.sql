-- Up to $3 head rows with keys after ($1, $2) (('', '') lists from the
-- start), in key order, and the store's clock.
SELECT statement_timestamp() AS read_at, * FROM tenant_usage
WHERE instance_id = 0 AND (tenant_id, bucket) > ($1, $2)
ORDER BY tenant_id, bucket
LIMIT $3
