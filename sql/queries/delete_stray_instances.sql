-- Deletes instance rows of a bucket that has no head row, before the head
-- row is created. Rows like these are left by versions that deleted
-- tenants without locking them first; a new bucket must start with an
-- empty instance list.
DELETE FROM tenant_usage WHERE tenant_id = $1 AND bucket = $2 AND instance_id > 0
