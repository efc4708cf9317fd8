-- Tenant $1's closed buckets numbered above $2, in close order, at most $3.
SELECT seq, record FROM tollgate_closed_buckets
WHERE tenant_id = $1 AND seq > $2
ORDER BY seq
LIMIT $3
