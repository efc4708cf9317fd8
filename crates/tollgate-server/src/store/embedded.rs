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
//! Token-bucket requests run the transaction script of
//! `tollgate_core::transaction`; this module only reads and writes rows.
//!
//! Layout (schema version 5):
//! - `meta`: `"schema_version"` → 5
//! - `buckets`: (tenant id, bucket name) → JSON [`BucketRow`] (the head
//!   row, instance 0)
//! - `bucket_instances`: (tenant id, bucket name, instance id) → JSON
//!   [`InstanceState`]
//! - `tiers`: tier name → JSON [`Tier`]
//! - `tenant_records`: tenant id → JSON [`TenantRecord`] (its tier and
//!   overrides; only for tenants put on a tier or given an override)
//! - `closed_buckets`: (tenant id, sequence number) → JSON
//!   [`ClosedBucket`]: what is kept of each bucket retired or deleted,
//!   numbered from 1 per tenant in the order they were closed; never
//!   deleted but by an import that replaces the store
//!
//! - `tenant_states`: tenant id → JSON `TenantState` (the tombstone of a
//!   deleted tenant, or its suspension; see [`states`])
//! - `keys`, `key_requests`: per-key buckets and the records of checks
//!   kept for retries (see [`keys`]); created when missing, so a version
//!   3 file written before them needs no conversion
//! - `partition_reports`: tenant id → JSON `PartitionReports` (its pods'
//!   hot-partition reports), removed when no report is fresh or with the
//!   tenant; created when missing, like the per-key tables
//!
//! Older files are converted when opened, in one transaction with the
//! version change: version 1 kept request units and CPU seconds as
//! floating-point totals ([`migrate_v1_totals`]); versions 1 and 2 kept one
//! bucket per tenant, keyed by tenant id alone ([`migrate_v2_keys`]);
//! version 3 had no closed buckets and versions 3 and 4 no
//! `tenant_states`: the conversion creates the tables, empty. A file of a
//! later schema than this server knows is refused.
//!
//! The writer drains up to 512 queued operations into one write
//! transaction. Each token-bucket request in it runs the transaction
//! script on its own; a tier or override change is one operation too
//! (`load_tenant` reads the record, the tier and the tenant's head rows,
//! `change_one` applies `tier::change_tenant` and writes the edit);
//! `put_tier` writes the tier and runs `change_one` with `Reapply` for each
//! tenant whose record names it; `delete_tier` refuses a tier a record
//! names; deleting a tenant deletes its record too.
//!
//! A dry run (`AdminCall::dry_run`) runs in a write transaction of its own,
//! apart from the batch it was queued with, and is aborted instead of
//! committed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::{mpsc, oneshot};
use tollgate_core::global_bucket::{self, IdRange};
use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_core::partition::{self, Exchange, ExchangeAnswer, PartitionReports};
use tollgate_core::tenant_state::{self, StateChange, StateEdit};
use tollgate_core::tier::{
    self, CloseReason, ClosedBucket, ClosedBy, LoadedTenant, TenantChange, TenantRecord, Tier,
    TierError,
};
use tollgate_core::transaction::{Answer, Batch};
use tollgate_core::{
    BucketKey, BucketName, BucketRow, Grant, InstanceState, LimitsUpdate, TenantId, TenantState,
    TierName, Timestamp, TokenBucketRequest,
};

mod image;
mod keys;
mod states;

use super::{
    AdminCall, BucketSettings, BucketSnapshot, ClosedEntry, Counters, Counts, DeletedTenant,
    KeyBucketSnapshot, KeyCounts, KeySweep, LimitsChange, PutTierOutcome, RecordSink, Stage,
    Stopwatch, Store, StoreError, StoreImage, StoreStats, TenantChangeOutcome, TenantView,
};

const SCHEMA_VERSION: u64 = 5;
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const BUCKETS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("buckets");
const INSTANCES: TableDefinition<(&str, &str, u32), &[u8]> =
    TableDefinition::new("bucket_instances");
const TIERS: TableDefinition<&str, &[u8]> = TableDefinition::new("tiers");
const TENANT_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenant_records");
/// Closed buckets by (tenant id, sequence number); see the module's docs.
const CLOSED_BUCKETS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("closed_buckets");
/// Each tenant's fresh hot-partition reports (`PartitionReports`), for
/// coordinated partition limits. Added without a schema version: a file
/// without the table gets it, empty, when opened.
const PARTITION_REPORTS: TableDefinition<&str, &[u8]> = TableDefinition::new("partition_reports");
/// Versions 1 and 2: one bucket per tenant.
const V2_TENANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenants");
const V2_INSTANCES: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("instances");
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
    sweep_cursor: Arc<Mutex<keys::SweepCursor>>,
    /// Pods silent longer are not live (`BucketSnapshot::live_instances`).
    inactivity_timeout: Duration,
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
    /// When it was queued.
    fn queued_at(&self) -> Instant;
    /// True for a dry run: applied in a transaction of its own, aborted.
    fn dry_run(&self) -> bool;
}

type Work<T> = Box<
    dyn FnOnce(&Writer, &WriteTransaction, Timestamp) -> Result<Result<T, StoreError>, StoreError>
        + Send,
>;

struct Write<T> {
    work: Option<Work<T>>,
    dry_run: bool,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
    queued_at: Instant,
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

    fn queued_at(&self) -> Instant {
        self.queued_at
    }

    fn dry_run(&self) -> bool {
        self.dry_run
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
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                "another process has the store file {} open: an embedded store serves one process at a time; stop the server on it first",
                path.display()
            )),
            e => StoreError::internal("open the store file", redb::Error::from(e)),
        })?;
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
        let inactivity_timeout = settings.bucket.inactivity_timeout;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            db: Arc::clone(&db),
            settings,
            clock: Arc::clone(&clock),
            counters: Arc::clone(&counters),
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
                sweep_cursor: Arc::default(),
                inactivity_timeout,
            }),
        })
    }

    async fn write<T: Send + 'static>(&self, work: Work<T>) -> Result<T, StoreError> {
        self.write_as(work, false).await
    }

    /// [`EmbeddedStore::write`], or with `dry_run` the same work in a
    /// transaction that is aborted.
    async fn write_as<T: Send + 'static>(
        &self,
        work: Work<T>,
        dry_run: bool,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let op = Box::new(Write {
            work: Some(work),
            dry_run,
            result: None,
            reply,
            queued_at: Instant::now(),
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
        .map_err(storage("begin schema transaction"))?;
    {
        let mut meta = txn.open_table(META).map_err(storage("open meta table"))?;
        let found = meta
            .get("schema_version")
            .map_err(storage("read schema version"))?
            .map(|v| v.value());
        match found {
            None | Some(SCHEMA_VERSION) => {}
            // Versions 3 → 4 → 5 only add tables (closed buckets, tenant
            // states), made below.
            Some(from @ (1..=4)) => {
                if from == 1 {
                    migrate_v1_totals(&txn)?;
                }
                if from <= 2 {
                    migrate_v2_keys(&txn)?;
                }
                tracing::info!(
                    from,
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
        meta.insert("schema_version", SCHEMA_VERSION)
            .map_err(storage("write schema version"))?;
        txn.open_table(BUCKETS)
            .map_err(storage("create buckets table"))?;
        txn.open_table(INSTANCES)
            .map_err(storage("create instances table"))?;
        txn.open_table(TIERS)
            .map_err(storage("create tiers table"))?;
        txn.open_table(TENANT_RECORDS)
            .map_err(storage("create tenant records table"))?;
        txn.open_table(CLOSED_BUCKETS)
            .map_err(storage("create closed buckets table"))?;
        txn.open_table(PARTITION_REPORTS)
            .map_err(storage("create partition reports table"))?;
        txn.open_table(states::TENANT_STATES)
            .map_err(storage("create tenant states table"))?;
        txn.open_table(keys::KEYS)
            .map_err(storage("create keys table"))?;
        txn.open_table(keys::KEY_REQUESTS)
            .map_err(storage("create key requests table"))?;
    }
    txn.commit().map_err(storage("commit schema"))
}

/// Schema 1 → 2: the consumption totals `request_units` and `cpu_seconds`
/// (floating point) become `request_unit_micros` and `cpu_micros`
/// (integers), rounded to the nearest micro-unit.
fn migrate_v1_totals(txn: &WriteTransaction) -> Result<(), StoreError> {
    let mut tenants = txn
        .open_table(V2_TENANTS)
        .map_err(storage("open tenants"))?;
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

/// Schema 2 → 3: a tenant's one bucket, keyed by tenant id, becomes its
/// request-unit bucket, keyed by (tenant id, ""). The rows' contents are
/// unchanged; the old tables are dropped.
fn migrate_v2_keys(txn: &WriteTransaction) -> Result<(), StoreError> {
    let ru = BucketName::REQUEST_UNITS;
    {
        let old = txn
            .open_table(V2_TENANTS)
            .map_err(storage("open tenants"))?;
        let mut new = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        for entry in old.iter().map_err(storage("read tenants"))? {
            let (id, bytes) = entry.map_err(storage("read a tenant row"))?;
            new.insert((id.value(), ru.as_str()), bytes.value())
                .map_err(storage("write a bucket row"))?;
        }
        let old = txn
            .open_table(V2_INSTANCES)
            .map_err(storage("open instances"))?;
        let mut new = txn
            .open_table(INSTANCES)
            .map_err(storage("open bucket instances"))?;
        for entry in old.iter().map_err(storage("read instances"))? {
            let (key, bytes) = entry.map_err(storage("read an instance row"))?;
            let (tenant, id) = key.value();
            new.insert((tenant, ru.as_str(), id), bytes.value())
                .map_err(storage("write an instance row"))?;
        }
    }
    txn.delete_table(V2_TENANTS)
        .map_err(storage("drop the version 2 tenants table"))?;
    txn.delete_table(V2_INSTANCES)
        .map_err(storage("drop the version 2 instances table"))?;
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

type BucketsTable<'t> = redb::Table<'t, (&'static str, &'static str), &'static [u8]>;
type InstancesTable<'t> = redb::Table<'t, (&'static str, &'static str, u32), &'static [u8]>;

/// The single writer: batches queued operations into one transaction each.
struct Writer {
    db: Arc<Database>,
    settings: BucketSettings,
    clock: Clock,
    counters: Arc<Counters>,
}

/// A served token-bucket request: its grant, and the transaction that
/// served it, to report its removals once committed.
struct Served {
    grant: Grant,
    batch: Batch,
    now: Timestamp,
}

impl Writer {
    fn inactivity_timeout(&self) -> Duration {
        self.settings.bucket.inactivity_timeout
    }

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
            let started = Instant::now();
            self.counters.stages.record_all(
                Stage::Queued,
                batch
                    .iter()
                    .map(|op| started.duration_since(op.queued_at())),
            );
            let (dry_runs, writes): (Vec<_>, Vec<_>) = batch.drain(..).partition(|op| op.dry_run());
            batch.extend(writes);
            for mut op in dry_runs {
                let failure = self.roll_back(op.as_mut()).err().map(|e| {
                    tracing::error!(error = %e, "embedded store: dry run failed");
                    e.to_string()
                });
                op.answer(failure.as_deref());
            }
            if batch.is_empty() {
                continue;
            }
            let failure = self.commit_batch(&mut batch).err().map(|e| {
                tracing::error!(error = %e, ops = batch.len(), "embedded store: write batch failed, nothing committed");
                e.to_string()
            });
            if failure.is_some() {
                self.counters
                    .failures
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            } else {
                self.counters.transactions.fetch_add(1, Ordering::Relaxed);
            }
            for op in batch.drain(..) {
                op.answer(failure.as_deref());
            }
        }
    }

    fn commit_batch(&self, batch: &mut [Box<dyn PendingWrite>]) -> Result<(), StoreError> {
        let mut stopwatch = Stopwatch::new(&self.counters.stages);
        let now = (self.clock)();
        let txn = self
            .db
            .begin_write()
            .map_err(storage("begin write transaction"))?;
        stopwatch.lap(Stage::Begin);
        for op in batch.iter_mut() {
            op.apply(self, &txn, now)?;
        }
        stopwatch.lap(Stage::Write);
        txn.commit().map_err(storage("commit write transaction"))?;
        stopwatch.lap(Stage::Commit);
        Ok(())
    }

    /// Runs a dry run in a transaction of its own and aborts it.
    fn roll_back(&self, op: &mut dyn PendingWrite) -> Result<(), StoreError> {
        let now = (self.clock)();
        let txn = self
            .db
            .begin_write()
            .map_err(storage("begin write transaction"))?;
        op.apply(self, &txn, now)?;
        txn.abort().map_err(storage("abort a dry run"))
    }

    /// One request, by the script of `tollgate_core::transaction`.
    fn token_bucket(
        &self,
        txn: &WriteTransaction,
        key: &BucketKey,
        request: &TokenBucketRequest,
        now: Timestamp,
    ) -> Result<Result<Served, StoreError>, StoreError> {
        let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        let mut instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open instances"))?;
        let plan = Batch::plan(
            [(key, request.instance_id)],
            self.settings.bucket.cleanup_window,
        );
        let heads = read_head(&buckets, key)?
            .map(|head| (key.clone(), head))
            .into_iter()
            .collect();
        let tenant_states = states::read_in(txn, plan.tenants())?;
        let mut batch = Batch::open(
            plan.lock,
            heads,
            &tenant_states,
            &self.settings.unconfigured_tenants,
            now,
        );
        for window in &plan.windows {
            for range in window.ranges() {
                batch.load(key, read_range(&instances, key, range)?);
            }
        }
        let answer = batch.serve(key, request, now, &self.settings.bucket);
        write_back(&mut buckets, &mut instances, &batch)?;
        Ok(match answer {
            Answer::Granted(grant) => Ok(Served { grant, batch, now }),
            Answer::Refused(e) => Err(e.into()),
            Answer::NotFound => Err(StoreError::not_found(key)),
            Answer::TenantRefused(e) => Err(e.into()),
            Answer::Deferred => Err(StoreError::internal(
                "token bucket request",
                "a lone request was deferred",
            )),
        })
    }

    fn update_limits(
        &self,
        txn: &WriteTransaction,
        key: &BucketKey,
        update: &LimitsUpdate,
        now: Timestamp,
    ) -> Result<Result<LimitsChange, StoreError>, StoreError> {
        let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        let before = read_head(&buckets, key)?;
        let head = match global_bucket::configure(before.as_ref(), update, now) {
            Ok(head) => head,
            Err(e) => return Ok(Err(e.into())),
        };
        write_head(&mut buckets, key, &head)?;
        let revived = states::revive(txn, &key.tenant)?;
        let instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open instances"))?;
        Ok(Ok(LimitsChange {
            revived,
            before,
            after: BucketSnapshot {
                key: key.clone(),
                head,
                instances: read_all_instances(&instances, key)?,
                read_at: now,
                inactivity_timeout: self.inactivity_timeout(),
            },
        }))
    }
}

/// Writes back what a transaction script changed.
fn write_back(
    buckets: &mut BucketsTable<'_>,
    instances: &mut InstancesTable<'_>,
    batch: &Batch,
) -> Result<(), StoreError> {
    for write in batch.writes() {
        let (t, b) = (write.key.tenant.as_str(), write.key.bucket.as_str());
        if write.insert {
            delete_instances(instances, write.key)?;
        }
        write_head(buckets, write.key, write.head)?;
        for row in &write.upsert {
            let bytes = encode("encode instance row", row)?;
            instances
                .insert((t, b, row.instance_id), bytes.as_slice())
                .map_err(storage("write instance row"))?;
        }
        for id in &write.delete {
            instances
                .remove((t, b, *id))
                .map_err(storage("delete instance row"))?;
        }
    }
    Ok(())
}

/// A tenant's buckets' head rows, in key order, read in one range scan.
fn tenant_heads(
    buckets: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    tenant: &TenantId,
) -> Result<Vec<(BucketKey, BucketRow)>, StoreError> {
    let t = tenant.as_str();
    let mut heads = Vec::new();
    for entry in buckets
        .range((t, "")..)
        .map_err(storage("read bucket rows"))?
    {
        let (key, value) = entry.map_err(storage("read bucket rows"))?;
        let (row_tenant, bucket) = key.value();
        if row_tenant != t {
            break;
        }
        heads.push((
            BucketKey::new(tenant.clone(), bucket_name(bucket)?),
            decode("decode bucket row", value.value())?,
        ));
    }
    Ok(heads)
}

/// A head row as a snapshot without instances.
fn head_snapshot(
    (key, head): (BucketKey, BucketRow),
    now: Timestamp,
    inactivity_timeout: Duration,
) -> BucketSnapshot {
    BucketSnapshot {
        key,
        head,
        instances: Vec::new(),
        read_at: now,
        inactivity_timeout,
    }
}

/// Deletes every instance row of a bucket.
fn delete_instances(instances: &mut InstancesTable<'_>, key: &BucketKey) -> Result<(), StoreError> {
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    instances
        .retain_in((t, b, 0)..=(t, b, u32::MAX), |_, _| false)
        .map_err(storage("delete instance rows"))
}

/// A tenant's record, if it has one.
fn read_record(
    records: &impl ReadableTable<&'static str, &'static [u8]>,
    tenant: &TenantId,
) -> Result<Option<TenantRecord>, StoreError> {
    records
        .get(tenant.as_str())
        .map_err(storage("read tenant record"))?
        .map(|row| decode("decode tenant record", row.value()))
        .transpose()
}

fn write_record(
    records: &mut redb::Table<'_, &'static str, &'static [u8]>,
    tenant: &TenantId,
    record: &TenantRecord,
) -> Result<(), StoreError> {
    let bytes = encode("encode tenant record", record)?;
    records
        .insert(tenant.as_str(), bytes.as_slice())
        .map_err(storage("write tenant record"))?;
    Ok(())
}

fn tenant_id(stored: &str) -> Result<TenantId, StoreError> {
    TenantId::parse("tenant_id", stored).map_err(|e| StoreError::internal("decode tenant id", e))
}

/// Every tier, in name order.
fn read_tiers(
    tiers: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<(TierName, Tier)>, StoreError> {
    let mut out = Vec::new();
    for entry in tiers.iter().map_err(storage("list tiers"))? {
        let (name, bytes) = entry.map_err(storage("list tiers"))?;
        let name = TierName::parse("tier", name.value())
            .map_err(|e| StoreError::internal("decode tier name", e))?;
        out.push((name, decode("decode tier", bytes.value())?));
    }
    Ok(out)
}

fn bucket_name(stored: &str) -> Result<BucketName, StoreError> {
    BucketName::parse("bucket", stored).map_err(|e| StoreError::internal("decode bucket name", e))
}

fn delete(
    txn: &WriteTransaction,
    tenant: &TenantId,
    by: &ClosedBy,
    now: Timestamp,
    inactivity_timeout: Duration,
) -> Result<Result<DeletedTenant, StoreError>, StoreError> {
    let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let mut instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    let mut records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let had_record = records
        .remove(tenant.as_str())
        .map_err(storage("delete tenant record"))?
        .is_some();
    let heads = tenant_heads(&buckets, tenant)?;
    let delete = StateChange::Delete {
        actor: by.to_string(),
    };
    match states::change_of(txn, tenant, !heads.is_empty() || had_record, &delete, now)? {
        Ok(_) => {}
        Err(e) => return Ok(Err(e)),
    }
    keys::delete_tenant(txn, tenant)?;
    txn.open_table(PARTITION_REPORTS)
        .map_err(storage("open partition reports"))?
        .remove(tenant.as_str())
        .map_err(storage("delete partition reports"))?;
    let mut closed = Vec::with_capacity(heads.len());
    for (key, head) in &heads {
        buckets
            .remove((key.tenant.as_str(), key.bucket.as_str()))
            .map_err(storage("delete bucket row"))?;
        delete_instances(&mut instances, key)?;
        closed.push(tier::close_bucket(
            key,
            head,
            CloseReason::TenantDeleted,
            by,
            now,
        ));
    }
    write_closed(txn, &closed)?;
    Ok(Ok(DeletedTenant {
        buckets: heads
            .into_iter()
            .map(|head| head_snapshot(head, now, inactivity_timeout))
            .collect(),
        closed,
    }))
}

/// Appends closed records, each numbered after its tenant's last.
fn write_closed(txn: &WriteTransaction, closed: &[ClosedBucket]) -> Result<(), StoreError> {
    let mut table = txn
        .open_table(CLOSED_BUCKETS)
        .map_err(storage("open closed buckets"))?;
    for record in closed {
        let t = record.tenant.as_str();
        let last = table
            .range((t, 0)..=(t, u64::MAX))
            .map_err(storage("read closed buckets"))?
            .next_back()
            .transpose()
            .map_err(storage("read closed buckets"))?
            .map_or(0, |(key, _)| key.value().1);
        let bytes = encode("encode closed bucket", record)?;
        table
            .insert((t, last + 1), bytes.as_slice())
            .map_err(storage("write closed bucket"))?;
    }
    Ok(())
}

/// A tenant's closed records numbered above `after`, at most `limit`.
fn read_closed(
    table: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    tenant: &TenantId,
    after: u64,
    limit: usize,
) -> Result<Vec<ClosedEntry>, StoreError> {
    let t = tenant.as_str();
    let Some(from) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in table
        .range((t, from)..=(t, u64::MAX))
        .map_err(storage("read closed buckets"))?
        .take(limit)
    {
        let (key, bytes) = entry.map_err(storage("read closed buckets"))?;
        out.push(ClosedEntry {
            seq: key.value().1,
            closed: decode("decode closed bucket", bytes.value())?,
        });
    }
    Ok(out)
}

fn read_head(
    buckets: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    key: &BucketKey,
) -> Result<Option<BucketRow>, StoreError> {
    buckets
        .get((key.tenant.as_str(), key.bucket.as_str()))
        .map_err(storage("read bucket row"))?
        .map(|row| decode("decode bucket row", row.value()))
        .transpose()
}

fn write_head(
    buckets: &mut BucketsTable<'_>,
    key: &BucketKey,
    head: &BucketRow,
) -> Result<(), StoreError> {
    let bytes = encode("encode bucket row", head)?;
    buckets
        .insert((key.tenant.as_str(), key.bucket.as_str()), bytes.as_slice())
        .map_err(storage("write bucket row"))?;
    Ok(())
}

/// The instance rows of one run of a request's window.
fn read_range(
    instances: &impl ReadableTable<(&'static str, &'static str, u32), &'static [u8]>,
    key: &BucketKey,
    range: IdRange,
) -> Result<Vec<InstanceState>, StoreError> {
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    let entries = instances
        .range((t, b, range.first)..=(t, b, range.last))
        .map_err(storage("read instance rows"))?;
    let decode_row = |entry: Result<_, redb::StorageError>| -> Result<InstanceState, StoreError> {
        let (_, value): (_, redb::AccessGuard<'_, &[u8]>) =
            entry.map_err(storage("read instance rows"))?;
        decode("decode instance row", value.value())
    };
    if range.descending {
        entries.rev().take(range.limit).map(decode_row).collect()
    } else {
        entries.take(range.limit).map(decode_row).collect()
    }
}

fn read_all_instances(
    instances: &impl ReadableTable<(&'static str, &'static str, u32), &'static [u8]>,
    key: &BucketKey,
) -> Result<Vec<InstanceState>, StoreError> {
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    let mut rows = Vec::new();
    for entry in instances
        .range((t, b, 0)..=(t, b, u32::MAX))
        .map_err(storage("read instance rows"))?
    {
        let (_, value) = entry.map_err(storage("read instance rows"))?;
        rows.push(decode("decode instance row", value.value())?);
    }
    Ok(rows)
}

/// Everything a tenant change reads, under the writer's transaction.
fn load_tenant(
    txn: &WriteTransaction,
    tenant: &TenantId,
    change: &TenantChange,
) -> Result<LoadedTenant, StoreError> {
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let record = read_record(&records, tenant)?;
    let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let tier = match change.tier_to_load(record.as_ref()) {
        Some(name) => read_tier(&tiers, &name)?,
        None => None,
    };
    let previous_tier = match change.previous_tier_to_load(record.as_ref()) {
        Some(name) => read_tier(&tiers, &name)?,
        None => None,
    };
    let buckets_table = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let buckets = tenant_heads(&buckets_table, tenant)?
        .into_iter()
        .map(|(key, head)| (key.bucket, head))
        .collect();
    Ok(LoadedTenant {
        record,
        buckets,
        tier,
        previous_tier,
    })
}

/// Runs one tenant change: load, decide by the core's rules, write.
fn change_one(
    txn: &WriteTransaction,
    tenant: &TenantId,
    change: &TenantChange,
    by: &ClosedBy,
    now: Timestamp,
    inactivity_timeout: Duration,
) -> Result<Result<TenantChangeOutcome, StoreError>, StoreError> {
    let loaded = load_tenant(txn, tenant, change)?;
    let edit = match tier::change_tenant(tenant, change, &loaded, now) {
        Ok(edit) => edit,
        Err(e) => return Ok(Err(e.into())),
    };
    let mut records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    write_record(&mut records, tenant, &edit.record)?;
    let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let mut instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    let key = |name: &BucketName| BucketKey::new(tenant.clone(), name.clone());
    for (name, head) in &edit.created {
        delete_instances(&mut instances, &key(name))?;
        write_head(&mut buckets, &key(name), head)?;
    }
    for (name, head) in &edit.changed {
        write_head(&mut buckets, &key(name), head)?;
    }
    let mut retired = Vec::new();
    let mut closed = Vec::new();
    for name in &edit.retired {
        if let Some(head) = loaded.buckets.get(name) {
            buckets
                .remove((tenant.as_str(), name.as_str()))
                .map_err(storage("delete bucket row"))?;
            delete_instances(&mut instances, &key(name))?;
            closed.push(tier::close_bucket(
                &key(name),
                head,
                change.close_reason(),
                by,
                now,
            ));
            retired.push(head_snapshot(
                (key(name), head.clone()),
                now,
                inactivity_timeout,
            ));
        }
    }
    write_closed(txn, &closed)?;
    let view_buckets = tenant_heads(&buckets, tenant)?
        .into_iter()
        .map(|head| head_snapshot(head, now, inactivity_timeout))
        .collect();
    let revived = states::revive(txn, tenant)?;
    Ok(Ok(TenantChangeOutcome {
        revived,
        view: TenantView {
            tenant: tenant.clone(),
            record: Some(edit.record),
            buckets: view_buckets,
        },
        created: edit.created.into_keys().collect(),
        changed: edit.changed.into_keys().collect(),
        retired,
        closed,
    }))
}

/// One pod's partition-load exchange: the tenant's limits read, its
/// reports updated (removed once none is fresh); refused for a deleted or
/// suspended tenant.
fn partition_load(
    txn: &WriteTransaction,
    tenant: &TenantId,
    exchange: &Exchange,
    now: Timestamp,
) -> Result<Result<ExchangeAnswer, StoreError>, StoreError> {
    let state = states::read_in(txn, [tenant])?.remove(tenant);
    if let Err(e) = tenant_state::admit(tenant, state.as_ref()) {
        return Ok(Err(e.into()));
    }
    let record = {
        let records = txn
            .open_table(TENANT_RECORDS)
            .map_err(storage("open tenant records"))?;
        read_record(&records, tenant)?
    };
    let tier = match record.as_ref().and_then(|r| r.tier.as_ref()) {
        Some(name) => read_tier(&txn.open_table(TIERS).map_err(storage("open tiers"))?, name)?,
        None => None,
    };
    let limits = partition::tenant_limits(record.as_ref(), tier.as_ref());
    let mut table = txn
        .open_table(PARTITION_REPORTS)
        .map_err(storage("open partition reports"))?;
    let mut reports: PartitionReports = table
        .get(tenant.as_str())
        .map_err(storage("read partition reports"))?
        .map(|row| decode("decode partition reports", row.value()))
        .transpose()?
        .unwrap_or_default();
    let had_reports = !reports.is_empty();
    let answer = partition::exchange(&mut reports, &limits, exchange, now);
    if !reports.is_empty() {
        let bytes = encode("encode partition reports", &reports)?;
        table
            .insert(tenant.as_str(), bytes.as_slice())
            .map_err(storage("write partition reports"))?;
    } else if had_reports {
        table
            .remove(tenant.as_str())
            .map_err(storage("delete partition reports"))?;
    }
    Ok(Ok(answer))
}

fn read_tier(
    tiers: &impl ReadableTable<&'static str, &'static [u8]>,
    name: &TierName,
) -> Result<Option<Tier>, StoreError> {
    tiers
        .get(name.as_str())
        .map_err(storage("read tier"))?
        .map(|row| decode("decode tier", row.value()))
        .transpose()
}

/// The tenants whose record names `tier`, in id order.
fn tenants_on(
    records: &impl ReadableTable<&'static str, &'static [u8]>,
    tier: &TierName,
) -> Result<Vec<TenantId>, StoreError> {
    let mut tenants = Vec::new();
    for entry in records.iter().map_err(storage("read tenant records"))? {
        let (id, bytes) = entry.map_err(storage("read tenant records"))?;
        let record: TenantRecord = decode("decode tenant record", bytes.value())?;
        if record.tier.as_ref() == Some(tier) {
            tenants.push(tenant_id(id.value())?);
        }
    }
    Ok(tenants)
}

fn put_tier(
    txn: &WriteTransaction,
    name: &TierName,
    tier: &Tier,
    by: &ClosedBy,
    now: Timestamp,
    inactivity_timeout: Duration,
) -> Result<Result<PutTierOutcome, StoreError>, StoreError> {
    let mut tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let before = read_tier(&tiers, name)?;
    let mut stored = tier.clone();
    stored.created_at = before.as_ref().map_or(now, |b| b.created_at);
    stored.updated_at = now;
    let bytes = encode("encode tier", &stored)?;
    tiers
        .insert(name.as_str(), bytes.as_slice())
        .map_err(storage("write tier"))?;
    drop(tiers);
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let on_tier = tenants_on(&records, name)?;
    drop(records);
    let mut tenants = Vec::new();
    let reapply = TenantChange::Reapply {
        previous: before.clone(),
    };
    for tenant in on_tier {
        match change_one(txn, &tenant, &reapply, by, now, inactivity_timeout)? {
            Ok(outcome) => {
                if !(outcome.created.is_empty()
                    && outcome.changed.is_empty()
                    && outcome.retired.is_empty())
                {
                    tenants.push(outcome);
                }
            }
            // A tenant with a record is never refused a re-application;
            // should one be, fail the whole write batch, so that no part of
            // the tier's change (written in this transaction) is kept.
            Err(e) => return Err(StoreError::internal("re-apply a tier", e.to_string())),
        }
    }
    Ok(Ok(PutTierOutcome {
        tier: stored,
        created: before.is_none(),
        tenants,
    }))
}

fn delete_tier(
    txn: &WriteTransaction,
    name: &TierName,
) -> Result<Result<(), StoreError>, StoreError> {
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let on_tier = tenants_on(&records, name)?;
    if !on_tier.is_empty() {
        return Ok(Err(TierError::TierInUse {
            tier: name.clone(),
            count: on_tier.len() as u64,
            examples: on_tier.into_iter().take(3).collect(),
        }
        .into()));
    }
    let mut tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let removed = tiers
        .remove(name.as_str())
        .map_err(storage("delete tier"))?
        .is_some();
    Ok(if removed {
        Ok(())
    } else {
        Err(TierError::TierNotFound(name.clone()).into())
    })
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn token_bucket(
        &self,
        key: &BucketKey,
        request: &TokenBucketRequest,
    ) -> Result<Grant, StoreError> {
        let (key, request) = (key.clone(), request.clone());
        let served = self
            .write(Box::new(move |w, txn, now| {
                w.token_bucket(txn, &key, &request, now)
            }))
            .await?;
        // The commit holds: count the request and report its removals.
        let counters = &self.inner.counters;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        counters
            .instances_removed
            .fetch_add(served.batch.report_removed(served.now), Ordering::Relaxed);
        Ok(served.grant)
    }

    async fn update_limits(
        &self,
        key: &BucketKey,
        update: &LimitsUpdate,
    ) -> Result<LimitsChange, StoreError> {
        let (key, update) = (key.clone(), update.clone());
        self.write(Box::new(move |w, txn, now| {
            w.update_limits(txn, &key, &update, now)
        }))
        .await
    }

    async fn get_bucket(&self, key: &BucketKey) -> Result<BucketSnapshot, StoreError> {
        let key = key.clone();
        let inactivity_timeout = self.inner.inactivity_timeout;
        self.read(move |db, now| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
            let Some(head) = read_head(&buckets, &key)? else {
                return Err(StoreError::not_found(&key));
            };
            let instances = txn
                .open_table(INSTANCES)
                .map_err(storage("open instances"))?;
            let instances = read_all_instances(&instances, &key)?;
            Ok(BucketSnapshot {
                key,
                head,
                instances,
                read_at: now,
                inactivity_timeout,
            })
        })
        .await
    }

    async fn get_tenant(&self, tenant: &TenantId) -> Result<Vec<BucketSnapshot>, StoreError> {
        let tenant = tenant.clone();
        let inactivity_timeout = self.inner.inactivity_timeout;
        self.read(move |db, now| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
            let instances = txn
                .open_table(INSTANCES)
                .map_err(storage("open instances"))?;
            let mut out = Vec::new();
            for (key, head) in tenant_heads(&buckets, &tenant)? {
                let rows = read_all_instances(&instances, &key)?;
                out.push(BucketSnapshot {
                    key,
                    head,
                    instances: rows,
                    read_at: now,
                    inactivity_timeout,
                });
            }
            if out.is_empty() {
                return Err(StoreError::TenantNotFound(tenant));
            }
            Ok(out)
        })
        .await
    }

    async fn list_buckets(
        &self,
        after: Option<&BucketKey>,
        limit: usize,
    ) -> Result<Vec<BucketSnapshot>, StoreError> {
        let after = after.cloned();
        let inactivity_timeout = self.inner.inactivity_timeout;
        self.read(move |db, now| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
            let range = match &after {
                Some(a) => buckets.range::<(&str, &str)>((
                    std::ops::Bound::Excluded((a.tenant.as_str(), a.bucket.as_str())),
                    std::ops::Bound::Unbounded,
                )),
                None => buckets.range::<(&str, &str)>(..),
            }
            .map_err(storage("list bucket rows"))?;
            let mut out = Vec::new();
            for entry in range.take(limit) {
                let (key, value) = entry.map_err(storage("list bucket rows"))?;
                let (tenant, bucket) = key.value();
                out.push(BucketSnapshot {
                    key: BucketKey::new(tenant_id(tenant)?, bucket_name(bucket)?),
                    head: decode("decode bucket row", value.value())?,
                    instances: Vec::new(),
                    read_at: now,
                    inactivity_timeout,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn delete_tenant_by(
        &self,
        tenant: &TenantId,
        call: &AdminCall,
    ) -> Result<DeletedTenant, StoreError> {
        let (tenant, by) = (tenant.clone(), call.by.clone());
        self.write_as(
            Box::new(move |writer, txn, now| {
                delete(txn, &tenant, &by, now, writer.inactivity_timeout())
            }),
            call.dry_run,
        )
        .await
    }

    async fn change_tenant_state(
        &self,
        tenant: &TenantId,
        change: &StateChange,
    ) -> Result<StateEdit, StoreError> {
        let (tenant, change) = (tenant.clone(), change.clone());
        self.write(Box::new(move |_, txn, now| {
            states::change(txn, &tenant, &change, now)
        }))
        .await
    }

    async fn tenant_states(
        &self,
        tenants: &[TenantId],
    ) -> Result<BTreeMap<TenantId, TenantState>, StoreError> {
        let tenants = tenants.to_vec();
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let table = txn
                .open_table(states::TENANT_STATES)
                .map_err(storage("open tenant states"))?;
            states::read_all(&table, &tenants)
        })
        .await
    }

    async fn change_tenant_by(
        &self,
        tenant: &TenantId,
        change: &TenantChange,
        call: &AdminCall,
    ) -> Result<TenantChangeOutcome, StoreError> {
        let (tenant, change, by) = (tenant.clone(), change.clone(), call.by.clone());
        self.write_as(
            Box::new(move |writer, txn, now| {
                change_one(txn, &tenant, &change, &by, now, writer.inactivity_timeout())
            }),
            call.dry_run,
        )
        .await
    }

    async fn list_closed(
        &self,
        tenant: &TenantId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ClosedEntry>, StoreError> {
        let tenant = tenant.clone();
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let table = txn
                .open_table(CLOSED_BUCKETS)
                .map_err(storage("open closed buckets"))?;
            read_closed(&table, &tenant, after, limit)
        })
        .await
    }

    async fn describe_tenant(&self, tenant: &TenantId) -> Result<TenantView, StoreError> {
        let tenant = tenant.clone();
        let inactivity_timeout = self.inner.inactivity_timeout;
        self.read(move |db, now| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let records = txn
                .open_table(TENANT_RECORDS)
                .map_err(storage("open tenant records"))?;
            let record = read_record(&records, &tenant)?;
            let buckets_table = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
            let buckets: Vec<_> = tenant_heads(&buckets_table, &tenant)?
                .into_iter()
                .map(|head| head_snapshot(head, now, inactivity_timeout))
                .collect();
            if record.is_none() && buckets.is_empty() {
                return Err(StoreError::TenantNotFound(tenant));
            }
            Ok(TenantView {
                tenant,
                record,
                buckets,
            })
        })
        .await
    }

    async fn put_tier_by(
        &self,
        name: &TierName,
        tier: &Tier,
        call: &AdminCall,
    ) -> Result<PutTierOutcome, StoreError> {
        let (name, tier, by) = (name.clone(), tier.clone(), call.by.clone());
        self.write_as(
            Box::new(move |writer, txn, now| {
                put_tier(txn, &name, &tier, &by, now, writer.inactivity_timeout())
            }),
            call.dry_run,
        )
        .await
    }

    async fn get_tier(&self, name: &TierName) -> Result<Tier, StoreError> {
        let name = name.clone();
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
            read_tier(&tiers, &name)?.ok_or_else(|| TierError::TierNotFound(name).into())
        })
        .await
    }

    async fn list_tiers(&self) -> Result<Vec<(TierName, Tier)>, StoreError> {
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
            read_tiers(&tiers)
        })
        .await
    }

    async fn delete_tier(&self, name: &TierName) -> Result<(), StoreError> {
        let name = name.clone();
        self.write(Box::new(move |_, txn, _| delete_tier(txn, &name)))
            .await
    }

    async fn partition_load(
        &self,
        tenant: &TenantId,
        exchange: &Exchange,
    ) -> Result<ExchangeAnswer, StoreError> {
        let (tenant, exchange) = (tenant.clone(), exchange.clone());
        self.write(Box::new(move |_, txn, now| {
            partition_load(txn, &tenant, &exchange, now)
        }))
        .await
    }

    async fn check(&self, call: &CheckCall) -> Result<CallAnswer, StoreError> {
        let call = call.clone();
        let (answer, removed) = self
            .write(Box::new(move |_, txn, now| {
                let (answer, removed) = keys::check(txn, &call, now)?;
                Ok(answer.map(|a| (a, removed)))
            }))
            .await?;
        let counters = &self.inner.counters;
        counters.checks.fetch_add(1, Ordering::Relaxed);
        counters.keys_removed.fetch_add(removed, Ordering::Relaxed);
        Ok(answer)
    }

    async fn sweep_keys(&self, limit: usize) -> Result<KeySweep, StoreError> {
        let cursor = Arc::clone(&self.inner.sweep_cursor);
        let (keys, records, more) = self
            .write(Box::new(move |_, txn, now| {
                let mut cursor = cursor.lock().map_err(|_| {
                    StoreError::internal("sweep keys", "the sweep cursor is poisoned")
                })?;
                // The cursor moves only if the batch commits; a failed
                // batch walks the same rows again next time.
                let mut next = cursor.clone();
                let swept = keys::sweep(txn, &mut next, limit, now)?;
                *cursor = next;
                Ok(Ok(swept))
            }))
            .await?;
        self.inner
            .counters
            .keys_removed
            .fetch_add(keys, Ordering::Relaxed);
        Ok(KeySweep {
            keys,
            records,
            more,
        })
    }

    async fn key_counts(&self) -> Result<KeyCounts, StoreError> {
        self.read(|db, _| keys::counts(db)).await
    }

    async fn list_key_buckets(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&BucketKey>,
        limit: usize,
        busiest: usize,
    ) -> Result<Vec<KeyBucketSnapshot>, StoreError> {
        let (tenant, after) = (tenant.cloned(), after.cloned());
        self.read(move |db, now| {
            keys::list_buckets(db, tenant.as_ref(), after.as_ref(), limit, busiest, now)
        })
        .await
    }

    async fn export(&self, sink: RecordSink) -> Result<Counts, StoreError> {
        self.read(move |db, now| image::export(db, now, sink)).await
    }

    async fn import(&self, image: StoreImage, replace: bool) -> Result<Counts, StoreError> {
        self.write(Box::new(move |_, txn, _| {
            image::import(txn, &image, replace)
        }))
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

    /// A store file as a schema 1 or 2 server left it.
    fn write_old_file(
        path: &Path,
        version: u64,
        tenants: &[(&str, serde_json::Value)],
        instances: &[(&str, u32, serde_json::Value)],
    ) {
        let db = Database::create(path).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut meta = txn.open_table(META).expect("meta");
            meta.insert("schema_version", version).expect("version");
            let mut table = txn.open_table(V2_TENANTS).expect("tenants");
            for (id, row) in tenants {
                let bytes = serde_json::to_vec(row).expect("encode");
                table.insert(*id, bytes.as_slice()).expect("row");
            }
            let mut table = txn.open_table(V2_INSTANCES).expect("instances");
            for (id, instance, row) in instances {
                let bytes = serde_json::to_vec(row).expect("encode");
                table
                    .insert((*id, *instance), bytes.as_slice())
                    .expect("row");
            }
        }
        txn.commit().expect("commit");
    }

    fn tenant_row() -> BucketRow {
        let mut head = BucketRow::new(
            tollgate_core::Limits {
                refill_rate: 5.0,
                burst_limit: 50.0,
            },
            20.0,
            true,
            Timestamp::from_unix_micros(1_700_000_000_000_000),
        );
        head.totals.consumption.read_bytes = 4096;
        head.members.live_instances = 1;
        head.members.first_instance_id = 4;
        head
    }

    fn instance_row() -> InstanceState {
        InstanceState {
            instance_id: 4,
            next_instance_id: 0,
            lease: b"lease".to_vec(),
            seq: 9,
            shares: 1.0,
            last_update: Timestamp::from_unix_micros(1_700_000_000_000_000),
            last_grant: Grant {
                granted_tokens: 7.5,
                ..Grant::default()
            },
            committed_rate: 0.0,
            committed_until: Timestamp::from_unix_micros(1_700_000_000_000_000),
        }
    }

    /// A file written by schema version 1 (floating-point totals, one
    /// bucket per tenant) opens with its totals converted to micro-units
    /// and each tenant's rows as its request-unit bucket, nothing else
    /// changed.
    #[tokio::test]
    async fn a_version_1_file_is_migrated_to_exact_totals_and_bucket_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.redb");
        let head = tenant_row();
        let mut v1 = serde_json::to_value(&head).expect("JSON");
        let consumption = v1["consumption"].as_object_mut().expect("consumption");
        consumption.remove("request_unit_micros");
        consumption.remove("cpu_micros");
        consumption.insert("request_units".into(), 199.99999999999292.into());
        consumption.insert("cpu_seconds".into(), 0.25.into());
        let instance = serde_json::to_value(instance_row()).expect("JSON");
        write_old_file(&path, 1, &[("old", v1)], &[("old", 4, instance)]);

        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let tenant = TenantId::parse("tenant_id", "old").expect("id");
        let buckets = store.get_tenant(&tenant).await.expect("tenant");
        assert_eq!(buckets.len(), 1);
        let migrated = &buckets[0];
        assert_eq!(migrated.key, BucketKey::request_units(tenant.clone()));
        let totals = &migrated.head.totals.consumption;
        assert_eq!(totals.request_unit_micros, 200_000_000);
        assert_eq!(totals.cpu_micros, 250_000);
        assert_eq!(totals.read_bytes, 4096);
        assert_eq!(migrated.head.state, head.state);
        assert_eq!(migrated.instances, vec![instance_row()]);
        store.close().await.expect("close");
        drop(store);
        // Opening again finds the current version and changes nothing.
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("reopen");
        let again = store.get_tenant(&tenant).await.expect("tenant");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].head, migrated.head);
        assert_eq!(again[0].instances, migrated.instances);
        store.close().await.expect("close");
    }

    /// A file written by schema version 3 (no closed buckets) opens as
    /// version 4: its buckets as they were, and deleting a tenant keeps
    /// their closed records.
    #[tokio::test]
    async fn a_version_3_file_gets_closed_buckets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v3.redb");
        {
            let db = Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert("schema_version", 3).expect("version");
                let mut buckets = txn.open_table(BUCKETS).expect("buckets");
                let bytes = serde_json::to_vec(&tenant_row()).expect("encode");
                buckets
                    .insert(("old", "export"), bytes.as_slice())
                    .expect("row");
            }
            txn.commit().expect("commit");
        }
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let tenant = TenantId::parse("tenant_id", "old").expect("id");
        let deleted = store.delete_tenant(&tenant).await.expect("delete");
        assert_eq!(deleted.len(), 1);
        let closed = store.list_closed(&tenant, 0, 10).await.expect("closed");
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].closed.totals, tenant_row().totals);
        assert_eq!(closed[0].closed.reason, CloseReason::TenantDeleted);
        store.close().await.expect("close");
        drop(store);
        let db = Database::create(&path).expect("reopen");
        let txn = db.begin_read().expect("read");
        let meta = txn.open_table(META).expect("meta");
        let version = meta.get("schema_version").expect("read").map(|v| v.value());
        assert_eq!(version, Some(SCHEMA_VERSION));
    }

    /// A file written by schema version 2 serves on: a pod's retry of its
    /// last request gets the recorded answer and counts nothing again.
    #[tokio::test]
    async fn a_version_2_file_keeps_its_pods_and_their_idempotency() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v2.redb");
        let head = serde_json::to_value(tenant_row()).expect("JSON");
        let instance = serde_json::to_value(instance_row()).expect("JSON");
        write_old_file(&path, 2, &[("old", head)], &[("old", 4, instance)]);
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let key = BucketKey::request_units(TenantId::parse("tenant_id", "old").expect("id"));
        let retry = TokenBucketRequest {
            instance_id: 4,
            lease: b"lease".to_vec(),
            seq: 9,
            requested_tokens: 1000.0,
            shares: 1.0,
            target_request_period: std::time::Duration::from_secs(10),
            consumption: tollgate_core::Consumption::from_request_units(5.0),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: std::time::Duration::ZERO,
        };
        let grant = store.token_bucket(&key, &retry).await.expect("retry");
        assert_eq!(grant.granted_tokens, 7.5);
        let bucket = store.get_bucket(&key).await.expect("bucket");
        assert_eq!(bucket.head.totals.consumption.request_unit_micros, 0);
        store.close().await.expect("close");
    }
}
