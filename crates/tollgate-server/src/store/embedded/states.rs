//! Tenant states in the embedded store: tombstones of deleted tenants and
//! suspensions, read and written; the rules are
//! `tollgate_core::tenant_state`'s.
//!
//! Table `tenant_states` (schema version 5): tenant id → JSON
//! [`TenantState`].

use std::collections::BTreeMap;

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use tollgate_core::tenant_state::{self, StateChange, StateEdit, StateWrite};
use tollgate_core::{TenantId, TenantState, Timestamp};

use super::{BUCKETS, TENANT_RECORDS, decode, encode, storage, tenant_heads};
use crate::store::StoreError;

pub(super) const TENANT_STATES: TableDefinition<&str, &[u8]> =
    TableDefinition::new("tenant_states");

/// The state row of `tenant`, if it has one.
pub(super) fn read(
    states: &impl ReadableTable<&'static str, &'static [u8]>,
    tenant: &TenantId,
) -> Result<Option<TenantState>, StoreError> {
    states
        .get(tenant.as_str())
        .map_err(storage("read tenant state"))?
        .map(|row| decode("decode tenant state", row.value()))
        .transpose()
}

/// The state rows of `tenants`; a tenant without one is left out.
pub(super) fn read_all<'a>(
    states: &impl ReadableTable<&'static str, &'static [u8]>,
    tenants: impl IntoIterator<Item = &'a TenantId>,
) -> Result<BTreeMap<TenantId, TenantState>, StoreError> {
    let mut out = BTreeMap::new();
    for tenant in tenants {
        if let Some(state) = read(states, tenant)? {
            out.insert(tenant.clone(), state);
        }
    }
    Ok(out)
}

/// The state rows of `tenants`, read in the writer's transaction.
pub(super) fn read_in<'a>(
    txn: &WriteTransaction,
    tenants: impl IntoIterator<Item = &'a TenantId>,
) -> Result<BTreeMap<TenantId, TenantState>, StoreError> {
    let states = txn
        .open_table(TENANT_STATES)
        .map_err(storage("open tenant states"))?;
    read_all(&states, tenants)
}

/// Writes what the core decided for `tenant`'s state row.
pub(super) fn write(
    txn: &WriteTransaction,
    tenant: &TenantId,
    write: &StateWrite,
) -> Result<(), StoreError> {
    let mut states = txn
        .open_table(TENANT_STATES)
        .map_err(storage("open tenant states"))?;
    match write {
        StateWrite::Keep => {}
        StateWrite::Put(state) => {
            let bytes = encode("encode tenant state", state)?;
            states
                .insert(tenant.as_str(), bytes.as_slice())
                .map_err(storage("write tenant state"))?;
        }
        StateWrite::Remove => {
            states
                .remove(tenant.as_str())
                .map_err(storage("delete tenant state"))?;
        }
    }
    Ok(())
}

/// After an operator's explicit change to `tenant`: removes its tombstone
/// (the tenant is created again), answering it.
pub(super) fn revive(
    txn: &WriteTransaction,
    tenant: &TenantId,
) -> Result<Option<TenantState>, StoreError> {
    let state = read_in(txn, [tenant])?.remove(tenant);
    let decided = tenant_state::after_operator_change(state.as_ref());
    write(txn, tenant, &decided)?;
    Ok(match decided {
        StateWrite::Remove => state,
        StateWrite::Keep | StateWrite::Put(_) => None,
    })
}

/// Suspends or resumes `tenant` (one that has buckets or a record).
pub(super) fn change(
    txn: &WriteTransaction,
    tenant: &TenantId,
    change: &StateChange,
    now: Timestamp,
) -> Result<Result<StateEdit, StoreError>, StoreError> {
    let exists = {
        let records = txn
            .open_table(TENANT_RECORDS)
            .map_err(storage("open tenant records"))?;
        let has_record = records
            .get(tenant.as_str())
            .map_err(storage("read tenant record"))?
            .is_some();
        has_record || {
            let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
            !tenant_heads(&buckets, tenant)?.is_empty()
        }
    };
    change_of(txn, tenant, exists, change, now)
}

/// Applies `change` to `tenant`, which `exists` or not, by the core's
/// rules.
pub(super) fn change_of(
    txn: &WriteTransaction,
    tenant: &TenantId,
    exists: bool,
    change: &StateChange,
    now: Timestamp,
) -> Result<Result<StateEdit, StoreError>, StoreError> {
    let state = read_in(txn, [tenant])?.remove(tenant);
    let edit = match tenant_state::change(tenant, exists, state.as_ref(), change, now) {
        Ok(edit) => edit,
        Err(e) => return Ok(Err(StoreError::state_change(e))),
    };
    write(txn, tenant, &edit.write)?;
    Ok(Ok(edit))
}
