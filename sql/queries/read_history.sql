-- Bucket ($1, $2)'s rows of step $3 with slots from $4 to $5, after the
-- last row before $4 (baseline true), oldest first.
SELECT * FROM (
    (SELECT slot, sample, TRUE AS baseline FROM tollgate_usage_history
     WHERE tenant_id = $1 AND bucket = $2 AND step_secs = $3 AND slot < $4
     ORDER BY slot DESC LIMIT 1)
    UNION ALL
    (SELECT slot, sample, FALSE AS baseline FROM tollgate_usage_history
     WHERE tenant_id = $1 AND bucket = $2 AND step_secs = $3
       AND slot >= $4 AND slot <= $5)
) rows
ORDER BY slot
