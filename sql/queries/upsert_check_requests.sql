-- Writes the records of a batch's checks that carried a request id:
-- record i is ($1[i], $2[i], $3[i], $4[i]) as (tenant id, bucket, key,
-- request id), the record $5[i] as JSON and its expiry $6[i]. Each
-- appears once. A record is only written when none was kept or the kept
-- one had expired (and the sweep had not removed it yet): it replaces it.
INSERT INTO tollgate_check_requests (tenant_id, bucket, key, request_id, record, expires_at)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BYTEA[], $4::BYTEA[], $5::TEXT[], $6::BIGINT[])
ON CONFLICT (tenant_id, bucket, key, request_id) DO UPDATE SET
    record = excluded.record,
    expires_at = excluded.expires_at
