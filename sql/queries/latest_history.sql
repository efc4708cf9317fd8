-- The latest history row of each bucket ($1 tenants, $2 buckets, side by
-- side) in each resolution ($3 steps in seconds).
SELECT k.tenant_id, k.bucket, s.step_secs, h.sample
FROM unnest($1::TEXT[], $2::TEXT[]) AS k(tenant_id, bucket)
CROSS JOIN unnest($3::BIGINT[]) AS s(step_secs)
CROSS JOIN LATERAL (
    SELECT sample FROM tollgate_usage_history h
    WHERE h.tenant_id = k.tenant_id AND h.bucket = k.bucket
      AND h.step_secs = s.step_secs
    ORDER BY h.slot DESC
    LIMIT 1
) h
