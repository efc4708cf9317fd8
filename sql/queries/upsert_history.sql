-- Writes history rows (arrays side by side: tenant, bucket, step, slot,
-- sampled at, granted tokens, sample); a row of the same slot is replaced
-- only by a later sample (HistorySample::replaces), so replicas sampling
-- at once keep the same row.
INSERT INTO tollgate_usage_history
    (tenant_id, bucket, step_secs, slot, sampled_at, granted_tokens, sample)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[],
                     $5::BIGINT[], $6::FLOAT8[], $7::TEXT[])
ON CONFLICT (tenant_id, bucket, step_secs, slot) DO UPDATE
SET sampled_at = EXCLUDED.sampled_at,
    granted_tokens = EXCLUDED.granted_tokens,
    sample = EXCLUDED.sample
WHERE (EXCLUDED.sampled_at, EXCLUDED.granted_tokens)
    > (tollgate_usage_history.sampled_at, tollgate_usage_history.granted_tokens)
