-- Writes a replica's per-key check rows (arrays side by side: tenant,
-- bucket, step, slot, replica, checks, refusals, shadow refusals,
-- counts); a row is replaced only by counts that grew
-- (CheckCounts::replaces), so a retried or late write never takes a
-- slot's counts back.
INSERT INTO tollgate_check_history
    (tenant_id, bucket, step_secs, slot, replica, checks, refusals, shadow_refusals, counts)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[],
                     $6::BIGINT[], $7::BIGINT[], $8::BIGINT[], $9::TEXT[])
ON CONFLICT (tenant_id, bucket, step_secs, slot, replica) DO UPDATE
SET checks = EXCLUDED.checks,
    refusals = EXCLUDED.refusals,
    shadow_refusals = EXCLUDED.shadow_refusals,
    counts = EXCLUDED.counts
WHERE (EXCLUDED.checks, EXCLUDED.refusals, EXCLUDED.shadow_refusals)
    >= (tollgate_check_history.checks, tollgate_check_history.refusals,
        tollgate_check_history.shadow_refusals)
