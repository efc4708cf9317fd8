-- Deletes a tenant row and its instance rows; returns the rows deleted
-- and the store's clock.
DELETE FROM tenant_usage WHERE tenant_id = $1
RETURNING statement_timestamp() AS read_at, *
