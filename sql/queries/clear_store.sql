-- Removes all tenants' state, for an import told to replace it (after
-- lock_store.sql, in the import's transaction).
DELETE FROM tollgate_tiers;
DELETE FROM tollgate_tenants;
DELETE FROM tenant_usage;
DELETE FROM tollgate_keys;
DELETE FROM tollgate_check_requests;
DELETE FROM tollgate_partition_reports;
DELETE FROM tollgate_closed_buckets;
DELETE FROM tollgate_tenant_states;
DELETE FROM tollgate_budget_cycles;
DELETE FROM tollgate_budget_events;
DELETE FROM tollgate_organisation_nodes;
DELETE FROM tollgate_usage_history;
DELETE FROM tollgate_check_history;
