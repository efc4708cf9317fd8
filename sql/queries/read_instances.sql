-- A bucket's instance rows in list order.
SELECT * FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2 AND instance_id > 0
ORDER BY instance_id
