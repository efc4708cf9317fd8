-- Every tenant record, for an export, in byte order of tenant ids. A row
-- without a record exists only inside the transaction that creates it.
SELECT tenant_id, record FROM tollgate_tenants
WHERE record IS NOT NULL
ORDER BY tenant_id COLLATE "C"
