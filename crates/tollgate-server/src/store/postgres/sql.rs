//! The SQL statements, one per file in `sql/queries`, included at build
//! time; except the two that write head rows, which name every column of
//! a head row and are built from the head row's column list in `rows` (a
//! new head-row field is a line there).

pub(super) use super::rows::{INSERT_BUCKETS, UPDATE_BUCKETS};

macro_rules! query {
    ($name:ident, $file:literal) => {
        pub const $name: &str = include_str!(concat!("../../../../../sql/queries/", $file));
    };
}
query!(LOCK_BUCKETS, "lock_buckets.sql");
query!(LOCK_TENANT, "lock_tenant.sql");
query!(CLOCK, "clock.sql");
query!(LOAD_WINDOWS, "load_windows.sql");
query!(UPSERT_INSTANCES, "upsert_instances.sql");
query!(DELETE_INSTANCES, "delete_instances.sql");
query!(READ_INSTANCES, "read_instances.sql");
query!(READ_BUCKET, "read_bucket.sql");
query!(READ_TENANT, "read_tenant.sql");
query!(LIST_BUCKETS, "list_buckets.sql");
query!(DELETE_TENANT, "delete_tenant.sql");
query!(DELETE_TENANT_KEYS, "delete_tenant_keys.sql");
query!(DELETE_STRAY_INSTANCES, "delete_stray_instances.sql");
query!(DELETE_BUCKET, "delete_bucket.sql");
query!(ENSURE_TENANT_RECORD, "ensure_tenant_record.sql");
query!(LOCK_TENANT_RECORD, "lock_tenant_record.sql");
query!(READ_TENANT_RECORD, "read_tenant_record.sql");
query!(UPSERT_TENANT_RECORD, "upsert_tenant_record.sql");
query!(DELETE_TENANT_RECORD, "delete_tenant_record.sql");
query!(LIST_TENANT_BUCKETS, "list_tenant_buckets.sql");
query!(SHARE_TIER, "share_tier.sql");
query!(LOCK_TIER, "lock_tier.sql");
query!(UPSERT_TIER, "upsert_tier.sql");
query!(READ_TIER, "read_tier.sql");
query!(LIST_TIERS, "list_tiers.sql");
query!(DELETE_TIER, "delete_tier.sql");
query!(TENANTS_ON_TIER, "tenants_on_tier.sql");
query!(COUNT_TENANTS_ON_TIER, "count_tenants_on_tier.sql");
query!(LOCK_KEYS, "lock_keys.sql");
query!(READ_KEYS, "read_keys.sql");
query!(READ_CHECK_REQUESTS, "read_check_requests.sql");
query!(READ_DEFINITIONS, "read_definitions.sql");
query!(UPSERT_KEYS, "upsert_keys.sql");
query!(DELETE_KEYS, "delete_keys.sql");
query!(UPSERT_CHECK_REQUESTS, "upsert_check_requests.sql");
query!(SWEEP_KEYS, "sweep_keys.sql");
query!(SWEEP_CHECK_REQUESTS, "sweep_check_requests.sql");
query!(COUNT_KEYS, "count_keys.sql");
query!(LIST_KEY_BUCKET_TENANTS, "list_key_bucket_tenants.sql");
query!(READ_KEY_BUCKETS, "read_key_buckets.sql");
query!(ENSURE_PARTITION_REPORTS, "ensure_partition_reports.sql");
query!(LOCK_PARTITION_REPORTS, "lock_partition_reports.sql");
query!(READ_TABLE_LIMITS, "read_table_limits.sql");
query!(UPSERT_PARTITION_REPORTS, "upsert_partition_reports.sql");
query!(DELETE_PARTITION_REPORTS, "delete_partition_reports.sql");
query!(EXPORT_TIERS, "export_tiers.sql");
query!(EXPORT_TENANT_RECORDS, "export_tenant_records.sql");
query!(EXPORT_BUCKETS, "export_buckets.sql");
query!(EXPORT_KEYS, "export_keys.sql");
query!(EXPORT_CHECK_REQUESTS, "export_check_requests.sql");
query!(LOCK_STORE, "lock_store.sql");
query!(STORE_CONTENTS, "store_contents.sql");
query!(CLEAR_STORE, "clear_store.sql");
query!(INSERT_TENANT_RECORDS, "insert_tenant_records.sql");
query!(INSERT_CLOSED_BUCKETS, "insert_closed_buckets.sql");
query!(LIST_CLOSED_BUCKETS, "list_closed_buckets.sql");
query!(EXPORT_CLOSED_BUCKETS, "export_closed_buckets.sql");
query!(READ_TENANT_STATES, "read_tenant_states.sql");
query!(LOCK_TENANT_STATE, "lock_tenant_state.sql");
query!(UPSERT_TENANT_STATE, "upsert_tenant_state.sql");
query!(DELETE_TENANT_STATE, "delete_tenant_state.sql");
query!(EXPORT_TENANT_STATES, "export_tenant_states.sql");
query!(INSERT_TENANT_STATES, "insert_tenant_states.sql");
query!(INSERT_BUDGET_CYCLES, "insert_budget_cycles.sql");
query!(INSERT_BUDGET_EVENTS, "insert_budget_events.sql");
query!(LIST_BUDGET_CYCLES, "list_budget_cycles.sql");
query!(PRUNE_BUDGET_CYCLES, "prune_budget_cycles.sql");
query!(EXPORT_BUDGET_CYCLES, "export_budget_cycles.sql");
query!(EXPORT_BUDGET_EVENTS, "export_budget_events.sql");
query!(PRUNE_BUDGET_EVENTS, "prune_budget_events.sql");
query!(CLAIM_BUDGET_EVENTS, "claim_budget_events.sql");
query!(LOCK_BUDGET_EVENT, "lock_budget_event.sql");
query!(UPDATE_BUDGET_DELIVERIES, "update_budget_deliveries.sql");
query!(READ_NODES, "read_nodes.sql");
query!(LOCK_TREE, "lock_tree.sql");
query!(COUNT_MEMBERS, "count_members.sql");
query!(HAS_BUCKETS, "has_buckets.sql");
query!(UPSERT_NODE, "upsert_node.sql");
query!(DELETE_NODE, "delete_node.sql");
query!(LIST_NODES, "list_nodes.sql");
query!(EXPORT_NODES, "export_nodes.sql");
query!(INSERT_NODES, "insert_nodes.sql");
query!(LOCK_BUCKETS_SKIP_LOCKED, "lock_buckets_skip_locked.sql");
query!(READ_BUCKET_KEYS, "read_bucket_keys.sql");
