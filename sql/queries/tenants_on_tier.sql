-- The tenants on tier $1, locked (a tier's new definition rewrites them),
-- in id order.
SELECT tenant_id FROM tollgate_tenants WHERE tier = $1 ORDER BY tenant_id FOR UPDATE
