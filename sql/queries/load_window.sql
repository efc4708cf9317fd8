-- The instance rows a request needs from bucket ($1, $2): the four runs of
-- ids of its window (tollgate_core::global_bucket::instance_window), each
-- as (first id, last id, row limit): its own row ($3-$5), its predecessor
-- (the highest id in $6..$7, descending), and the rows that follow it
-- ($9-$11) and wrap past the highest id ($12-$14). It may return a row
-- twice; the caller keeps one.
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2
   AND instance_id BETWEEN $3 AND $4 ORDER BY instance_id LIMIT $5)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2
   AND instance_id BETWEEN $6 AND $7 ORDER BY instance_id DESC LIMIT $8)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2
   AND instance_id BETWEEN $9 AND $10 ORDER BY instance_id LIMIT $11)
UNION ALL
(SELECT * FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2
   AND instance_id BETWEEN $12 AND $13 ORDER BY instance_id LIMIT $14)
