-- Every record of a check kept for retries, for an export.
SELECT tenant_id, bucket, key, request_id, record FROM tollgate_check_requests
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", key, request_id
