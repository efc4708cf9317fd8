-- How many tenants are on tier $1, and up to three of them.
SELECT count(*) OVER () AS total, tenant_id FROM tollgate_tenants
WHERE tier = $1 ORDER BY tenant_id LIMIT 3
