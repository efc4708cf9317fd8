//! Tenant states in PostgreSQL (`tollgate_tenant_states`): tombstones of
//! deleted tenants and suspensions, read and written; the rules are
//! `tollgate_core::tenant_state`'s.

use std::collections::BTreeMap;

use tokio_postgres::Row;
use tollgate_core::tenant_state::{self, StateChange, StateEdit, StateWrite};
use tollgate_core::{TenantId, TenantState, TenantStateKind, Timestamp};

use super::retry::TxError;
use super::rows::{self, to_system_time};
use super::{Inner, sql};
use crate::store::StoreError;

/// A state row as the core's.
pub(super) fn from_row(row: &Row) -> Result<(TenantId, TenantState), StoreError> {
    let read = |e| StoreError::internal("read a tenant state", e);
    let kind: &str = row.try_get("kind").map_err(read)?;
    let kind = TenantStateKind::parse("kind", kind)
        .map_err(|e| StoreError::internal("read a tenant state", e))?;
    Ok((
        rows::tenant_id(row)?,
        TenantState {
            kind,
            since: rows::clock(row, "since")?,
            actor: row.try_get("actor").map_err(read)?,
            reason: row.try_get("reason").map_err(read)?,
        },
    ))
}

/// The states in `rows`, by tenant.
pub(super) fn from_rows(rows: &[Row]) -> Result<BTreeMap<TenantId, TenantState>, StoreError> {
    rows.iter().map(from_row).collect()
}

/// Writes what the core decided for `tenant`'s state row; answers the row
/// removed, if any.
pub(super) async fn write(
    txn: &deadpool_postgres::Transaction<'_>,
    tenant: &TenantId,
    write: &StateWrite,
) -> Result<Option<TenantState>, TxError> {
    match write {
        StateWrite::Keep => Ok(None),
        StateWrite::Put(state) => {
            let upsert = txn.prepare_cached(sql::UPSERT_TENANT_STATE).await?;
            txn.execute(
                &upsert,
                &[
                    &tenant.as_str(),
                    &state.kind.name(),
                    &to_system_time(state.since),
                    &state.actor,
                    &state.reason,
                ],
            )
            .await?;
            Ok(None)
        }
        StateWrite::Remove => {
            let delete = txn.prepare_cached(sql::DELETE_TENANT_STATE).await?;
            let removed = txn.query_opt(&delete, &[&tenant.as_str()]).await?;
            Ok(removed.as_ref().map(from_row).transpose()?.map(|(_, s)| s))
        }
    }
}

/// `tenant`'s state row, locked.
pub(super) async fn locked(
    txn: &deadpool_postgres::Transaction<'_>,
    tenant: &TenantId,
) -> Result<Option<TenantState>, TxError> {
    let lock = txn.prepare_cached(sql::LOCK_TENANT_STATE).await?;
    Ok(txn
        .query_opt(&lock, &[&tenant.as_str()])
        .await?
        .as_ref()
        .map(from_row)
        .transpose()?
        .map(|(_, s)| s))
}

/// After an operator's explicit change to `tenant` (its head rows or
/// record locked): removes its tombstone, answering it.
pub(super) async fn revive(
    txn: &deadpool_postgres::Transaction<'_>,
    tenant: &TenantId,
) -> Result<Option<TenantState>, TxError> {
    let state = locked(txn, tenant).await?;
    let decided = tenant_state::after_operator_change(state.as_ref());
    write(txn, tenant, &decided).await
}

/// Decides `change` for `tenant` (which `exists` or not) by the core's
/// rules, after its record and head rows are locked, and writes it.
/// `Ok(Err(_))` is a refusal: nothing was written.
pub(super) async fn change_of(
    txn: &deadpool_postgres::Transaction<'_>,
    tenant: &TenantId,
    exists: bool,
    change: &StateChange,
    now: Timestamp,
) -> Result<Result<StateEdit, StoreError>, TxError> {
    let lock = txn.prepare_cached(sql::LOCK_TENANT_STATE).await?;
    let state = txn
        .query_opt(&lock, &[&tenant.as_str()])
        .await?
        .as_ref()
        .map(from_row)
        .transpose()?
        .map(|(_, s)| s);
    let edit = match tenant_state::change(tenant, exists, state.as_ref(), change, now) {
        Ok(edit) => edit,
        Err(e) => return Ok(Err(StoreError::state_change(e))),
    };
    write(txn, tenant, &edit.write).await?;
    Ok(Ok(edit))
}

/// Suspends or resumes `tenant`, in a transaction of its own: its record
/// and head rows locked (as a tenant change locks them), then its state.
pub(super) async fn change(
    inner: &Inner,
    tenant: &TenantId,
    change: &StateChange,
) -> Result<StateEdit, TxError> {
    let mut client = inner.pool.get().await?;
    let lock_record = client.prepare_cached(sql::LOCK_TENANT_RECORD).await?;
    let lock_buckets = client.prepare_cached(sql::LOCK_TENANT).await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let txn = client.transaction().await?;
    let tenant_id = tenant.as_str();
    let record = txn.query_opt(&lock_record, &[&tenant_id]).await?;
    let heads = txn.query(&lock_buckets, &[&tenant_id]).await?;
    let now = inner.now(rows::clock(&txn.query_one(&clock, &[]).await?, "now")?);
    let exists = record.is_some() || !heads.is_empty();
    let edit = change_of(&txn, tenant, exists, change, now)
        .await?
        .map_err(TxError::Store)?;
    txn.commit().await.map_err(TxError::Commit)?;
    Ok(edit)
}

/// The state rows of `tenants`.
pub(super) async fn read(
    inner: &Inner,
    tenants: &[TenantId],
) -> Result<BTreeMap<TenantId, TenantState>, TxError> {
    let client = inner.pool.get().await?;
    let read = client.prepare_cached(sql::READ_TENANT_STATES).await?;
    let ids: Vec<&str> = tenants.iter().map(TenantId::as_str).collect();
    let found = client.query(&read, &[&ids]).await?;
    Ok(from_rows(&found)?)
}
