-- Which kinds of rows the store holds, for an import that must find it
-- empty. Hot-partition reports last seconds and do not count.
SELECT
    EXISTS (SELECT 1 FROM tollgate_tiers) AS tiers,
    EXISTS (SELECT 1 FROM tollgate_tenants) AS tenants,
    EXISTS (SELECT 1 FROM tenant_usage) AS buckets,
    EXISTS (SELECT 1 FROM tollgate_keys) AS keys,
    EXISTS (SELECT 1 FROM tollgate_check_requests) AS check_requests,
    EXISTS (SELECT 1 FROM tollgate_closed_buckets) AS closed_buckets,
    EXISTS (SELECT 1 FROM tollgate_tenant_states) AS tenant_states,
    EXISTS (SELECT 1 FROM tollgate_budget_cycles) AS budget_cycles,
    EXISTS (SELECT 1 FROM tollgate_budget_events) AS budget_events,
    EXISTS (SELECT 1 FROM tollgate_organisation_nodes) AS organisation_nodes,
    EXISTS (SELECT 1 FROM tollgate_usage_history) AS usage_history,
    EXISTS (SELECT 1 FROM tollgate_check_history) AS check_history
