-- The instance rows a request from instance $2 of tenant $1 needs: its own
-- row, its predecessor (the highest id below it), and the up to $3 rows
-- that follow it in list order, wrapping past the highest id to the lowest.
-- It may return a row twice, and more rows than needed; never fewer.
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND instance_id = $2)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND instance_id > 0 AND instance_id < $2
 ORDER BY instance_id DESC LIMIT 1)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND instance_id > $2
 ORDER BY instance_id LIMIT $3)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND instance_id > 0 AND instance_id < $2
 ORDER BY instance_id LIMIT $3)
