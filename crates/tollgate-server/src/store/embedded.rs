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
//! Layout (schema version 6):
//! - `meta`: `"schema_version"` → 6
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
//! floating-point totals ([`migration::migrate_v1_totals`]); versions 1 and 2 kept one
//! bucket per tenant, keyed by tenant id alone ([`migration::migrate_v2_keys`]);
//! version 3 had no closed buckets and versions 3 and 4 no
//! `tenant_states`: the conversion creates the tables, empty; before
//! version 6 head rows had no `held_reported`, the sum of their instances'
//! `held_tokens` ([`migration::migrate_v5_held_reported`]). A file of a
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
//!
//! This file holds the tables, opening and the `Store` impl, which only
//! queues work and reads snapshots; the rows are read and written by
//! concern, in the same files as the PostgreSQL store's:
//! - [`migration`]: tables made, older versions converted;
//! - [`writer`]: the writer thread and its group commit;
//! - [`buckets`]: token buckets' head and instance rows, deletion, closed
//!   records;
//! - [`tiers`]: tiers and tenant records;
//! - [`keys`]: per-key buckets; [`partitions`]: hot-partition reports;
//!   [`states`]: deleted and suspended tenants; [`image`]: export and
//!   import.

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
use tollgate_core::partition::{Exchange, ExchangeAnswer, PartitionReports};
use tollgate_core::tenant_state::{StateChange, StateEdit};
use tollgate_core::tier::{
    self, CloseReason, ClosedBucket, ClosedBy, LoadedTenant, TenantChange, TenantRecord, Tier,
    TierError,
};
use tollgate_core::transaction::{Answer, Batch};
use tollgate_core::{
    BucketKey, BucketName, BucketRow, Grant, InstanceState, LimitsUpdate, TenantId, TenantState,
    TierName, Timestamp, TokenBucketRequest,
};

mod buckets;
mod budgets;
mod history;
mod image;
mod keys;
mod migration;
mod partitions;
mod states;
mod tiers;
mod tree;
mod writer;

use self::buckets::*;
use self::migration::*;
use self::partitions::*;
use self::tiers::*;
use self::writer::*;

use tollgate_core::budget::delivery::{Attempt, Backoff};

use tollgate_core::history::checks::CheckRow;
use tollgate_core::organisation::{Node, TreeChange};

use super::{
    AdminCall, BucketSettings, BucketSnapshot, CheckHistoryRows, ClaimedEvent, ClosedEntry,
    Counters, Counts, DeletedTenant, HistoryPage, HistoryRows, KeyBucketSnapshot, KeyCounts,
    KeySweep, LimitsChange, NodeFilter, PrunedRecords, PutTierOutcome, RecordSink, Stage,
    Stopwatch, Store, StoreError, StoreImage, StoreStats, TenantChangeOutcome, TenantView,
};

const SCHEMA_VERSION: u64 = 6;
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
    Timestamp::from_system_time(SystemTime::now())
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
    history: tollgate_core::history::HistoryConfig,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
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
        let history = settings.history.clone();
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
                history,
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

fn tenant_id(stored: &str) -> Result<TenantId, StoreError> {
    TenantId::parse("tenant_id", stored).map_err(|e| StoreError::internal("decode tenant id", e))
}

fn bucket_name(stored: &str) -> Result<BucketName, StoreError> {
    BucketName::parse("bucket", stored).map_err(|e| StoreError::internal("decode bucket name", e))
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

    async fn change_tree(&self, change: &TreeChange) -> Result<Vec<(TenantId, Node)>, StoreError> {
        let change = change.clone();
        self.write(Box::new(move |_, txn, now| tree::change(txn, &change, now)))
            .await
    }

    async fn tree_nodes(&self, filter: &NodeFilter) -> Result<Vec<(TenantId, Node)>, StoreError> {
        let filter = filter.clone();
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let table = txn
                .open_table(tree::NODES)
                .map_err(storage("open organisation nodes"))?;
            tree::read(&table, &filter)
        })
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
                change_one(txn, &tenant, &change, &by, now, writer.settings())
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

    async fn budget_cycles(
        &self,
        key: &BucketKey,
        limit: usize,
    ) -> Result<Vec<tollgate_core::budget::CycleRecord>, StoreError> {
        let key = key.clone();
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            budgets::read_cycles(&txn, &key, limit)
        })
        .await
    }

    async fn tenant_records(
        &self,
        tenants: &[TenantId],
    ) -> Result<BTreeMap<TenantId, TenantRecord>, StoreError> {
        let tenants = tenants.to_vec();
        self.read(move |db, _| {
            let txn = db.begin_read().map_err(storage("begin read transaction"))?;
            let records = txn
                .open_table(TENANT_RECORDS)
                .map_err(storage("open tenant records"))?;
            let mut found = BTreeMap::new();
            for tenant in tenants {
                if let Some(record) = read_record(&records, &tenant)? {
                    found.insert(tenant, record);
                }
            }
            Ok(found)
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
                put_tier(txn, &name, &tier, &by, now, writer.settings())
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

    async fn prune_budget_records(&self, limit: usize) -> Result<PrunedRecords, StoreError> {
        self.write(Box::new(move |writer, txn, now| {
            let before = now.saturating_sub(writer.settings().budget_record_retention);
            Ok(Ok(budgets::prune(txn, before, limit)?))
        }))
        .await
    }

    async fn sample_history(
        &self,
        after: Option<&BucketKey>,
        limit: usize,
    ) -> Result<HistoryPage, StoreError> {
        let after = after.cloned();
        self.write(Box::new(move |writer, txn, now| {
            let config = &writer.settings().history;
            Ok(Ok(history::sample(
                txn,
                config,
                after.as_ref(),
                limit,
                now,
            )?))
        }))
        .await
    }

    async fn history(
        &self,
        key: &BucketKey,
        since: Timestamp,
        until: Timestamp,
        step: Duration,
    ) -> Result<HistoryRows, StoreError> {
        let key = key.clone();
        let config = self.inner.history.clone();
        self.read(move |db, now| {
            let resolution = config.resolution_for(since, now, step);
            history::read(db, &key, resolution, since, until)
        })
        .await
    }

    async fn prune_history(&self, limit: usize) -> Result<u64, StoreError> {
        self.write(Box::new(move |writer, txn, now| {
            let config = &writer.settings().history;
            let rows = history::prune(txn, config, limit, now)?;
            Ok(Ok(rows + history::prune_checks(txn, config, limit, now)?))
        }))
        .await
    }

    async fn record_checks(&self, replica: &str, rows: &[CheckRow]) -> Result<(), StoreError> {
        let (replica, rows) = (replica.to_owned(), rows.to_vec());
        self.write(Box::new(move |_, txn, _| {
            Ok(Ok(history::record_checks(txn, &replica, &rows)?))
        }))
        .await
    }

    async fn check_history(
        &self,
        key: &BucketKey,
        since: Timestamp,
        until: Timestamp,
        step: Duration,
    ) -> Result<CheckHistoryRows, StoreError> {
        let key = key.clone();
        let config = self.inner.history.clone();
        self.read(move |db, now| {
            let resolution = config.resolution_for(since, now, step);
            history::read_checks(db, &key, resolution, since, until)
        })
        .await
    }

    fn history_config(&self) -> tollgate_core::history::HistoryConfig {
        self.inner.history.clone()
    }

    async fn claim_budget_events(
        &self,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        self.write(Box::new(move |_, txn, now| {
            Ok(Ok(budgets::claim(txn, now, limit, lease)?))
        }))
        .await
    }

    async fn settle_budget_event(
        &self,
        claimed: &ClaimedEvent,
        attempt: &Attempt,
        webhooks: &[String],
        backoff: &Backoff,
    ) -> Result<(), StoreError> {
        let (claimed, attempt, webhooks, backoff) = (
            claimed.clone(),
            attempt.clone(),
            webhooks.to_vec(),
            *backoff,
        );
        self.write(Box::new(move |_, txn, now| {
            Ok(Ok(budgets::settle(
                txn, &claimed, &attempt, &webhooks, &backoff, now,
            )?))
        }))
        .await
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
