-- Deletes every row of tenant $1 (all its buckets' head and instance
-- rows); returns the rows deleted and the store's clock. Runs after
-- lock_tenant.sql in the same transaction: once the head rows are locked
-- no other transaction can add or change the tenant's rows, and this
-- statement's snapshot (taken after the lock) sees every row committed
-- before. Without the lock, a request committing an instance row while the
-- delete ran could leave that row behind, an instance of no bucket.
DELETE FROM tenant_usage WHERE tenant_id = $1
RETURNING statement_timestamp() AS read_at, *
