-- Every bucket's head row, each followed by its instance rows in list
-- order, for an export, in byte order of (tenant id, bucket name).
SELECT * FROM tenant_usage
ORDER BY tenant_id COLLATE "C", bucket COLLATE "C", instance_id
