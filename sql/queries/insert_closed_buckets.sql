-- Appends closed buckets, in array order (one element per bucket): tenant
-- $1, bucket $2, closed_at $3 (microseconds), reason $4, record $5 (JSON).
-- Runs in the transaction that deletes the buckets' rows.
INSERT INTO tollgate_closed_buckets (tenant_id, bucket, closed_at, reason, record)
SELECT c.tenant_id, c.bucket, c.closed_at, c.reason, c.record
FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[])
    WITH ORDINALITY AS c(tenant_id, bucket, closed_at, reason, record, n)
ORDER BY n
