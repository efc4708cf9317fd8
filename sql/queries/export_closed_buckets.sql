-- Every closed bucket, by tenant in close order (export).
SELECT seq, record FROM tollgate_closed_buckets ORDER BY tenant_id COLLATE "C", seq
