//! The default store: one crash-safe file, kept with `redb`.
//!
//! `redb` gives ACID transactions with copy-on-write B-trees and a checksummed
//! commit, so a crash or power loss leaves either the old or the new state.
//!
//! Writes go through one writer thread that drains whatever operations are
//! queued and runs them in a single write transaction (group commit): one
//! `fsync` serves many requests. Each operation still stands alone: a refused
//! operation writes nothing, and no caller hears back before the commit that
//! holds its change is durable. Reads run concurrently on their own snapshots.
//!
//! Layout (schema version 2):
//! - `meta`: `"schema_version"` → 2
//! - `tenants`: tenant id → JSON [`TenantState`] (the tenant row, instance 0)
//! - `instances`: (tenant id, instance id) → JSON [`InstanceState`]
//!
//! Version 1 kept request units and CPU seconds as floating-point totals;
//! opening such a file converts them to exact micro-units, in one
//! transaction with the version change (see [`migrate_v1_totals`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::{mpsc, oneshot};
use tollgate_core::global_bucket::{self, BucketRows};
use tollgate_core::{
    Grant, InstanceState, LimitsUpdate, TenantId, TenantState, Timestamp, TokenBucketRequest,
};

use super::{
    BucketSettings, Counters, LimitsChange, Store, StoreError, StoreStats, TenantSnapshot,
    UnconfiguredTenants,
};

const SCHEMA_VERSION: u64 = 2;
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const TENANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenants");
const INSTANCES: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("instances");
/// The most operations committed together.
const MAX_BATCH: usize = 512;

/// The store's clock.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

fn system_clock() -> Timestamp {
    let micros = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    Timestamp::from_unix_micros(micros)
}

/// A store in one file (or in memory, for tests).
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    clock: Clock,
    counters: Arc<Counters>,
    writes: Mutex<Option<mpsc::UnboundedSender<Box<dyn PendingWrite>>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

/// One queued write: it runs inside the writer's batch transaction and is
/// answered after the batch commits (or fails).
trait PendingWrite: Send {
    /// Runs the operation. `Err` is a storage failure that dooms the batch;
    /// a refused operation is `Ok` and writes nothing.
    fn apply(
        &mut self,
        writer: &Writer,
        txn: &WriteTransaction,
        now: Timestamp,
    ) -> Result<(), StoreError>;
    /// Answers the caller: with the operation's result if the batch committed,
    /// or with the batch's failure.
    fn answer(self: Box<Self>, batch_failure: Option<&str>);
}

type Work<T> = Box<
    dyn FnOnce(&Writer, &WriteTransaction, Timestamp) -> Result<Result<T, StoreError>, StoreError>
        + Send,
>;

struct Write<T> {
    work: Option<Work<T>>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send> PendingWrite for Write<T> {
    fn apply(
        &mut self,
        writer: &Writer,
        txn: &WriteTransaction,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let Some(work) = self.work.take() else {
            return Ok(());
        };
        // A caller that has gone (its deadline passed, it cancelled) was
        // told nothing was certain; what has not started never starts.
        if self.reply.is_closed() {
            self.result = Some(Err(abandoned()));
            return Ok(());
        }
        self.result = Some(work(writer, txn, now)?);
        Ok(())
    }

    fn answer(self: Box<Self>, batch_failure: Option<&str>) {
        let result = match (batch_failure, self.result) {
            (None, Some(result)) => result,
            (Some(msg), _) => Err(StoreError::internal(
                "write to the embedded store",
                msg.to_owned(),
            )),
            (None, None) => Err(closed()),
        };
        // A caller that went away (its RPC was cancelled) no longer needs the
        // answer; its change stands, as it would had the answer been lost.
        let _ = self.reply.send(result);
    }
}

/// Maps a redb error, giving it `context`.
fn storage<E: Into<redb::Error>>(context: &'static str) -> impl FnOnce(E) -> StoreError {
    move |e| StoreError::internal(context, e.into())
}

impl EmbeddedStore {
    /// Opens the store file at `path`, creating it if it does not exist.
    pub fn open(path: impl AsRef<Path>, settings: BucketSettings) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::internal("create the store's directory", e))?;
        }
        let db = Database::create(path)
            .map_err(|e| StoreError::internal("open the store file", redb::Error::from(e)))?;
        Self::start(db, settings, Arc::new(system_clock))
    }

    /// A store that lives in memory and is gone when dropped.
    pub fn in_memory(settings: BucketSettings) -> Result<Self, StoreError> {
        Self::in_memory_with_clock(settings, Arc::new(system_clock))
    }

    /// An in-memory store reading time from `clock` (for tests that move time).
    pub fn in_memory_with_clock(
        settings: BucketSettings,
        clock: Clock,
    ) -> Result<Self, StoreError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| StoreError::internal("create an in-memory store", redb::Error::from(e)))?;
        Self::start(db, settings, clock)
    }

    fn start(db: Database, settings: BucketSettings, clock: Clock) -> Result<Self, StoreError> {
        init_schema(&db)?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            db: Arc::clone(&db),
            settings,
            clock: Arc::clone(&clock),
            counters: Arc::clone(&counters),
            batch: BatchCounts::default(),
        };
        let handle = std::thread::Builder::new()
            .name("tollgate-store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::internal("start the store writer thread", e))?;
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                db,
                clock,
                counters,
                writes: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
            }),
        })
    }

    async fn write<T: Send + 'static>(&self, work: Work<T>) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let op = Box::new(Write {
            work: Some(work),
            result: None,
            reply,
        });
        {
            let writes = self.inner.writes.lock().map_err(|_| closed())?;
            let tx = writes.as_ref().ok_or_else(closed)?;
            tx.send(op).map_err(|_| closed())?;
        }
        answer.await.map_err(|_| closed())?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database, Timestamp) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        if self.inner.writes.lock().map_err(|_| closed())?.is_none() {
            return Err(closed());
        }
        let db = Arc::clone(&self.inner.db);
        let now = (self.inner.clock)();
        tokio::task::spawn_blocking(move || f(&db, now))
            .await
            .map_err(|e| StoreError::internal("run a store read", e))?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the embedded store is closed".into())
}

fn abandoned() -> StoreError {
    StoreError::Unavailable("the caller went away before the operation started".into())
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut writes) = self.writes.lock() {
            writes.take();
        }
        if let Some(handle) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            let _ = handle.join();
        }
    }
}

fn init_schema(db: &Database) -> Result<(), StoreError> {
    let txn = db
        .begin_write()
        .map_err(|e| StoreError::internal("begin schema transaction", redb::Error::from(e)))?;
    {
        let mut meta = txn
            .open_table(META)
            .map_err(|e| StoreError::internal("open meta table", redb::Error::from(e)))?;
        let found = meta
            .get("schema_version")
            .map_err(|e| StoreError::internal("read schema version", redb::Error::from(e)))?
            .map(|v| v.value());
        match found {
            None => {
                meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| {
                    StoreError::internal("write schema version", redb::Error::from(e))
                })?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(1) => {
                migrate_v1_totals(&txn)?;
                meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| {
                    StoreError::internal("write schema version", redb::Error::from(e))
                })?;
                tracing::info!(
                    from = 1,
                    to = SCHEMA_VERSION,
                    "migrated the embedded store's schema"
                );
            }
            Some(other) => {
                return Err(StoreError::internal(
                    "check schema version",
                    format!(
                        "store file has schema version {other}; this server understands {SCHEMA_VERSION}"
                    ),
                ));
            }
        }
        txn.open_table(TENANTS)
            .map_err(|e| StoreError::internal("create tenants table", redb::Error::from(e)))?;
        txn.open_table(INSTANCES)
            .map_err(|e| StoreError::internal("create instances table", redb::Error::from(e)))?;
    }
    txn.commit()
        .map_err(|e| StoreError::internal("commit schema", redb::Error::from(e)))
}

/// Schema 1 → 2: the consumption totals `request_units` and `cpu_seconds`
/// (floating point) become `request_unit_micros` and `cpu_micros`
/// (integers), rounded to the nearest micro-unit.
fn migrate_v1_totals(txn: &WriteTransaction) -> Result<(), StoreError> {
    let mut tenants = txn.open_table(TENANTS).map_err(storage("open tenants"))?;
    let mut rows = Vec::new();
    for entry in tenants.iter().map_err(storage("read tenants"))? {
        let (id, bytes) = entry.map_err(storage("read a tenant row"))?;
        let mut row: serde_json::Value = decode("decode a version 1 tenant row", bytes.value())?;
        if let Some(consumption) = row
            .get_mut("consumption")
            .and_then(serde_json::Value::as_object_mut)
        {
            for (old, new) in [
                ("request_units", "request_unit_micros"),
                ("cpu_seconds", "cpu_micros"),
            ] {
                let units = consumption
                    .remove(old)
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0);
                let micros = tollgate_core::validate::to_micros(units)
                    .min(tollgate_core::validate::MAX_TOTAL);
                consumption.insert(new.to_owned(), micros.into());
            }
        }
        rows.push((id.value().to_owned(), encode("encode a tenant row", &row)?));
    }
    for (id, bytes) in rows {
        tenants
            .insert(id.as_str(), bytes.as_slice())
            .map_err(storage("write a tenant row"))?;
    }
    Ok(())
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::internal(what, e))
}

fn encode<T: serde::Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::internal(what, e))
}

/// The single writer: batches queued operations into one transaction each.
struct Writer {
    db: Arc<Database>,
    settings: BucketSettings,
    clock: Clock,
    counters: Arc<Counters>,
    /// What the batch being written did; counted once it commits.
    batch: BatchCounts,
}

#[derive(Default)]
struct BatchCounts {
    requests: AtomicU64,
    instances_removed: AtomicU64,
}

impl Writer {
    fn run(self, mut rx: mpsc::UnboundedReceiver<Box<dyn PendingWrite>>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            let failure = self.commit_batch(&mut batch).err().map(|e| {
                tracing::error!(error = %e, ops = batch.len(), "embedded store: write batch failed, nothing committed");
                e.to_string()
            });
            let requests = self.batch.requests.swap(0, Ordering::Relaxed);
            let removed = self.batch.instances_removed.swap(0, Ordering::Relaxed);
            if failure.is_some() {
                self.counters
                    .failures
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            } else {
                self.counters.transactions.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .requests
                    .fetch_add(requests, Ordering::Relaxed);
                self.counters
                    .instances_removed
                    .fetch_add(removed, Ordering::Relaxed);
            }
            for op in batch.drain(..) {
                op.answer(failure.as_deref());
            }
        }
    }

    fn commit_batch(&self, batch: &mut [Box<dyn PendingWrite>]) -> Result<(), StoreError> {
        let now = (self.clock)();
        let txn = self
            .db
            .begin_write()
            .map_err(storage("begin write transaction"))?;
        for op in batch.iter_mut() {
            op.apply(self, &txn, now)?;
        }
        txn.commit().map_err(storage("commit write transaction"))
    }

    fn token_bucket(
        &self,
        txn: &WriteTransaction,
        tenant: &TenantId,
        request: &TokenBucketRequest,
        now: Timestamp,
    ) -> Result<Result<Grant, StoreError>, StoreError> {
        let mut tenants = txn.open_table(TENANTS).map_err(storage("open tenants"))?;
        let mut instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open instances"))?;
        let state = match read_tenant(&tenants, tenant)? {
            Some(state) => state,
            None => match &self.settings.unconfigured_tenants {
                UnconfiguredTenants::Reject => {
                    return Ok(Err(StoreError::TenantNotFound(tenant.clone())));
                }
                UnconfiguredTenants::UseDefaults(d) => {
                    TenantState::new(d.limits, d.initial_tokens, false, now)
                }
            },
        };
        let loaded = load_instance_window(
            &instances,
            tenant,
            request.instance_id,
            self.settings.bucket.cleanup_window,
        )?;
        let mut rows = BucketRows {
            tenant: state,
            instances: loaded,
        };
        let outcome = match global_bucket::request(&mut rows, request, now, &self.settings.bucket) {
            Ok(outcome) => outcome,
            Err(e) => return Ok(Err(e.into())),
        };
        self.batch.requests.fetch_add(1, Ordering::Relaxed);
        if outcome.duplicate {
            return Ok(Ok(outcome.grant));
        }
        self.batch
            .instances_removed
            .fetch_add(outcome.changes.removed.len() as u64, Ordering::Relaxed);
        write_tenant(&mut tenants, tenant, &rows.tenant)?;
        for id in &outcome.changes.upserted {
            if let Some(row) = rows.instances.get(id) {
                let bytes = encode("encode instance row", row)?;
                instances
                    .insert((tenant.as_str(), *id), bytes.as_slice())
                    .map_err(storage("write instance row"))?;
            }
        }
        for removed in &outcome.changes.removed {
            instances
                .remove((tenant.as_str(), removed.instance_id))
                .map_err(storage("delete instance row"))?;
            tracing::info!(
                tenant = %tenant,
                instance = removed.instance_id,
                silent_for = ?now.duration_since(removed.last_update),
                "removed silent instance"
            );
        }
        Ok(Ok(outcome.grant))
    }

    fn update_limits(
        &self,
        txn: &WriteTransaction,
        tenant: &TenantId,
        update: &LimitsUpdate,
        now: Timestamp,
    ) -> Result<Result<LimitsChange, StoreError>, StoreError> {
        let mut tenants = txn.open_table(TENANTS).map_err(storage("open tenants"))?;
        let before = read_tenant(&tenants, tenant)?;
        let mut state = before
            .clone()
            .unwrap_or_else(|| TenantState::new(update.limits, 0.0, true, now));
        if let Err(e) = global_bucket::reconfigure(&mut state, update, now) {
            return Ok(Err(e.into()));
        }
        write_tenant(&mut tenants, tenant, &state)?;
        let instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open instances"))?;
        Ok(Ok(LimitsChange {
            before,
            after: TenantSnapshot {
                tenant_id: tenant.clone(),
                state,
                instances: read_all_instances(&instances, tenant)?,
                read_at: now,
            },
        }))
    }
}

fn delete(
    txn: &WriteTransaction,
    tenant: &TenantId,
    now: Timestamp,
) -> Result<Result<TenantSnapshot, StoreError>, StoreError> {
    let mut tenants = txn.open_table(TENANTS).map_err(storage("open tenants"))?;
    let removed = tenants
        .remove(tenant.as_str())
        .map_err(storage("delete tenant row"))?;
    let Some(row) = removed else {
        return Ok(Err(StoreError::TenantNotFound(tenant.clone())));
    };
    let state: TenantState = decode("decode tenant row", row.value())?;
    drop(row);
    let mut instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    instances
        .retain_in(
            (tenant.as_str(), 0)..=(tenant.as_str(), u32::MAX),
            |_, _| false,
        )
        .map_err(storage("delete instance rows"))?;
    Ok(Ok(TenantSnapshot {
        tenant_id: tenant.clone(),
        state,
        instances: Vec::new(),
        read_at: now,
    }))
}

fn read_tenant(
    tenants: &impl ReadableTable<&'static str, &'static [u8]>,
    tenant: &TenantId,
) -> Result<Option<TenantState>, StoreError> {
    tenants
        .get(tenant.as_str())
        .map_err(storage("read tenant row"))?
        .map(|row| decode("decode tenant row", row.value()))
        .transpose()
}

fn write_tenant(
    tenants: &mut redb::Table<'_, &'static str, &'static [u8]>,
    tenant: &TenantId,
    state: &TenantState,
) -> Result<(), StoreError> {
    let bytes = encode("encode tenant row", state)?;
    tenants
        .insert(tenant.as_str(), bytes.as_slice())
        .map_err(storage("write tenant row"))?;
    Ok(())
}

/// Loads the instance rows a request needs (see [`BucketRows`]).
fn load_instance_window(
    instances: &impl ReadableTable<(&'static str, u32), &'static [u8]>,
    tenant: &TenantId,
    id: u32,
    window: usize,
) -> Result<BTreeMap<u32, InstanceState>, StoreError> {
    let t = tenant.as_str();
    let mut rows = BTreeMap::new();
    let mut put = |value: &[u8]| -> Result<(), StoreError> {
        let row: InstanceState = decode("decode instance row", value)?;
        rows.insert(row.instance_id, row);
        Ok(())
    };
    if let Some(row) = instances
        .get((t, id))
        .map_err(storage("read instance row"))?
    {
        put(row.value())?;
    } else if let Some(entry) = instances
        .range((t, 1)..(t, id))
        .map_err(storage("read predecessor row"))?
        .next_back()
    {
        put(entry.map_err(storage("read predecessor row"))?.1.value())?;
    }
    let after = instances
        .range((t, id.saturating_add(1))..=(t, u32::MAX))
        .map_err(storage("read following rows"))?;
    let wrapped = instances
        .range((t, 1)..(t, id))
        .map_err(storage("read following rows"))?;
    for entry in after.chain(wrapped).take(window) {
        put(entry.map_err(storage("read following rows"))?.1.value())?;
    }
    Ok(rows)
}

fn read_all_instances(
    instances: &impl ReadableTable<(&'static str, u32), &'static [u8]>,
    tenant: &TenantId,
) -> Result<Vec<InstanceState>, StoreError> {
    let t = tenant.as_str();
    let mut rows = Vec::new();
    for entry in instances
        .range((t, 0)..=(t, u32::MAX))
        .map_err(storage("read instance rows"))?
    {
        let (_, value) = entry.map_err(storage("read instance rows"))?;
        rows.push(decode("decode instance row", value.value())?);
    }
    Ok(rows)
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn token_bucket(
        &self,
        tenant: &TenantId,
        request: &TokenBucketRequest,
    ) -> Result<Grant, StoreError> {
        let (tenant, request) = (tenant.clone(), request.clone());
        self.write(Box::new(move |w, txn, now| {
            w.token_bucket(txn, &tenant, &request, now)
        }))
        .await
    }

    async fn update_limits(
        &self,
        tenant: &TenantId,
        update: &LimitsUpdate,
    ) -> Result<LimitsChange, StoreError> {
        let (tenant, update) = (tenant.clone(), update.clone());
        self.write(Box::new(move |w, txn, now| {
            w.update_limits(txn, &tenant, &update, now)
        }))
        .await
    }

    async fn get_tenant(&self, tenant: &TenantId) -> Result<TenantSnapshot, StoreError> {
        let tenant = tenant.clone();
        self.read(move |db, now| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let tenants = txn.open_table(TENANTS).map_err(storage("open tenants"))?;
            let Some(state) = read_tenant(&tenants, &tenant)? else {
                return Err(StoreError::TenantNotFound(tenant));
            };
            let instances = txn
                .open_table(INSTANCES)
                .map_err(storage("open instances"))?;
            let instances = read_all_instances(&instances, &tenant)?;
            Ok(TenantSnapshot {
                tenant_id: tenant,
                state,
                instances,
                read_at: now,
            })
        })
        .await
    }

    async fn list_tenants(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> Result<Vec<TenantSnapshot>, StoreError> {
        let after = after.cloned();
        self.read(move |db, now| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let tenants = txn.open_table(TENANTS).map_err(storage("open tenants"))?;
            let range = match &after {
                Some(a) => tenants.range::<&str>((
                    std::ops::Bound::Excluded(a.as_str()),
                    std::ops::Bound::Unbounded,
                )),
                None => tenants.range::<&str>(..),
            }
            .map_err(storage("list tenant rows"))?;
            let mut out = Vec::new();
            for entry in range.take(limit) {
                let (key, value) = entry.map_err(storage("list tenant rows"))?;
                let tenant_id = TenantId::parse("tenant_id", key.value())
                    .map_err(|e| StoreError::internal("decode tenant id", e))?;
                out.push(TenantSnapshot {
                    tenant_id,
                    state: decode("decode tenant row", value.value())?,
                    instances: Vec::new(),
                    read_at: now,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn delete_tenant(&self, tenant: &TenantId) -> Result<TenantSnapshot, StoreError> {
        let tenant = tenant.clone();
        self.write(Box::new(move |_, txn, now| delete(txn, &tenant, now)))
            .await
    }

    fn stats(&self) -> StoreStats {
        self.inner.counters.snapshot()
    }

    async fn close(&self) -> Result<(), StoreError> {
        // Stop taking writes; the writer finishes what is queued, then exits.
        let sender = self.inner.writes.lock().map_err(|_| closed())?.take();
        drop(sender);
        let handle = self.inner.writer.lock().map_err(|_| closed())?.take();
        if let Some(handle) = handle {
            tokio::task::spawn_blocking(move || handle.join())
                .await
                .map_err(|e| StoreError::internal("wait for the store writer", e))?
                .map_err(|_| StoreError::internal("store writer", "the writer thread panicked"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file written by schema version 1 (floating-point totals) opens
    /// with its totals converted to micro-units, nothing else changed.
    #[tokio::test]
    async fn a_version_1_file_is_migrated_to_exact_totals() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.redb");
        let mut state = TenantState::new(
            tollgate_core::Limits {
                refill_rate: 5.0,
                burst_limit: 50.0,
            },
            20.0,
            true,
            Timestamp::from_unix_micros(1_700_000_000_000_000),
        );
        state.consumption.read_bytes = 4096;
        let mut v1 = serde_json::to_value(&state).expect("JSON");
        let consumption = v1["consumption"].as_object_mut().expect("consumption");
        consumption.remove("request_unit_micros");
        consumption.remove("cpu_micros");
        consumption.insert("request_units".into(), 199.99999999999292.into());
        consumption.insert("cpu_seconds".into(), 0.25.into());
        {
            let db = Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert("schema_version", 1).expect("version");
                let mut tenants = txn.open_table(TENANTS).expect("tenants");
                let bytes = serde_json::to_vec(&v1).expect("encode");
                tenants.insert("old", bytes.as_slice()).expect("row");
                txn.open_table(INSTANCES).expect("instances");
            }
            txn.commit().expect("commit");
        }
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let tenant = TenantId::parse("tenant_id", "old").expect("id");
        let migrated = store.get_tenant(&tenant).await.expect("tenant").state;
        assert_eq!(migrated.consumption.request_unit_micros, 200_000_000);
        assert_eq!(migrated.consumption.cpu_micros, 250_000);
        assert_eq!(migrated.consumption.read_bytes, 4096);
        assert_eq!(migrated.limits, state.limits);
        assert_eq!(migrated.tokens, state.tokens);
        store.close().await.expect("close");
        drop(store);
        // Opening again finds version 2 and changes nothing.
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("reopen");
        let again = store.get_tenant(&tenant).await.expect("tenant").state;
        assert_eq!(again, migrated);
        store.close().await.expect("close");
    }
}
