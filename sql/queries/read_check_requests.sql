-- Reads the records retries of a batch of checks may be answered from,
-- after lock_keys.sql (which also stands for the records of its keys):
-- record i is ($1[i], $2[i], $3[i], $4[i]) as (tenant id, bucket, key,
-- request id) and comes back as n = i, if it is kept. Expired records may
-- come back; the core ignores them.
SELECT wanted.n, r.record
FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[], $4::BYTEA[])
    WITH ORDINALITY AS wanted (tenant_id, bucket, key, request_id, n)
JOIN tollgate_check_requests AS r
    ON r.tenant_id = wanted.tenant_id AND r.bucket = wanted.bucket
    AND r.key = wanted.key AND r.request_id = wanted.request_id
