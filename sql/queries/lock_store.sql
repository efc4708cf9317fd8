-- An import's first statement: holds off every other write to tenants'
-- state until the import commits (reads go on), so that what it found
-- empty stays empty and nothing is written between its delete and its
-- inserts.
LOCK TABLE tollgate_tiers, tollgate_tenants, tenant_usage, tollgate_keys,
    tollgate_check_requests, tollgate_partition_reports, tollgate_closed_buckets,
    tollgate_tenant_states, tollgate_organisation_nodes, tollgate_usage_history
IN EXCLUSIVE MODE
