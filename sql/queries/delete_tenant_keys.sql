-- Deletes tenant $1's per-key rows and check records, in the transaction
-- that deletes its buckets and record. A check that read the tenant's
-- definitions before the deletion committed may still write a key row
-- after it; such a row is swept when its key is full, like any other.
WITH deleted_records AS (
    DELETE FROM tollgate_check_requests WHERE tenant_id = $1
)
DELETE FROM tollgate_keys WHERE tenant_id = $1
