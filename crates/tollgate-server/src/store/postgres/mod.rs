//! The production store: PostgreSQL (and PostgreSQL-compatible distributed
//! SQL), shared by any number of server replicas.
//!
//! Buckets live in `tenant_usage`, keyed by (tenant, bucket, instance);
//! tiers and tenant records in `tollgate_tiers` and `tollgate_tenants`;
//! tombstones of deleted tenants and suspensions in
//! `tollgate_tenant_states` (see [`states`]);
//! per-key buckets in `tollgate_keys`, keyed by (tenant, bucket, key), and
//! the records of checks kept for retries in `tollgate_check_requests`
//! (see [`keys`]); closed buckets (what is kept of each bucket retired or
//! deleted) in `tollgate_closed_buckets`, appended in the transaction
//! that deletes the bucket. A dry run runs the same transaction and rolls
//! it back. The schema is in `sql/migrations`, applied at start by
//! [`migrate`]. The SQL lives in `sql/queries`, one statement per file
//! (the two that write head rows are built from a column list, see
//! [`rows`]),
//! and is portable (no session state, the database's default isolation
//! level), except for per-key checks, which take advisory locks under
//! READ COMMITTED since a full key has no row to lock, and their sweep,
//! which names rows by `ctid` (see [`keys`]). Correctness across replicas
//! rests on one rule: every transaction that changes a bucket first locks
//! its head row (`SELECT … FOR UPDATE`), or a key its advisory lock, reads
//! the clock and the rows after that, and writes back what the core
//! decided. Under READ COMMITTED (PostgreSQL's default) the lock
//! orders the transactions of a bucket; under SERIALIZABLE (CockroachDB's)
//! a conflict aborts one of them with 40001 and it is retried. A tier or
//! override change locks the tenant's record first, then the tier, then
//! the tenant's head rows.
//!
//! Token-bucket requests are batched (group commit) and served by the
//! transaction script of `tollgate_core::transaction`; this module only
//! reads and writes rows. There is one worker per pooled connection, and
//! each tenant's buckets belong to one worker (by a hash of the tenant
//! id): the transactions of a bucket serialize on its row lock anyway, so
//! within a replica they queue in memory instead of in the database,
//! workers never wait on each other's locks, and the requests of a
//! tenant's buckets share transactions. A worker takes whatever requests are
//! queued for it, up to `max_batch` requests (and `CHECKS_PER_REQUEST_BATCH`
//! times as many checks), and serves them in one transaction of two round
//! trips (see `Pipelined`): `BEGIN`, the lock of the batch's head rows in
//! key order, the state rows of the batch's tenants and every request's
//! instance window in one; the script then
//! serves the requests in turn on the same in-memory rows, and the writes
//! (one statement per kind of write, its rows as arrays) and `COMMIT` go in
//! the other. Statements per transaction do not grow with the batch. Each
//! request stays atomic (a refused one changes nothing) and idempotent (its
//! lease and sequence number are in the rows),
//! and nobody hears back before the commit that holds their change. The
//! requests the script defers (their bucket lost silent instances earlier
//! in the batch) go into the next transaction.
//!
//! Checks of per-key buckets queue to the same workers (by the tenant of
//! their first item) and are batched the same way, in transactions of
//! their own that run the script of `tollgate_core::key_bucket`
//! (`keys::check_batch`): every call atomic (a refused one changes
//! nothing, the batch's others still commit), answered after the commit.
//! A check is not idempotent (a retry with a request id is, by its record;
//! one without takes again), so a check whose commit's outcome is unknown
//! is answered `Unavailable`, not run again.
//!
//! Every transaction is retried on conflicts and lost connections (see
//! [`retry`]); retries are logged and counted in [`StoreStats`].
//!
//! In a token-bucket batch, a write that fails aborts the transaction and
//! the `COMMIT` sent after it rolls back; a conflict or a lost connection
//! reruns the whole batch, which is safe because every request in it is
//! idempotent. A connection left inside a transaction is closed, not
//! pooled.
//!
//! Tier changes ([`tiers`]): `change_in` runs one tenant change inside a transaction
//! (locks the tenant's record, holds the tier it needs `FOR SHARE`, locks
//! the tenant's head rows, reads the clock, applies
//! `tier::change_tenant` and writes the edit); `put_tier_by` locks the tier, writes
//! it, locks the records of its tenants and runs `change_in` with
//! `Reapply` for each, all in one transaction. `DescribeTenant` reads the
//! record and the head rows in one read-only snapshot. [`migrate`] applies
//! `sql/migrations` with refinery (replicas starting at once retry until
//! one has applied them); [`migrate_to`] stops at a schema version, what
//! a server of that version would have made of the database, for upgrade
//! tests.
//!
//! This file holds the store's handle, its start and the `Store` impl,
//! which hands each method to the file of its concern, under the trait's
//! own method names, the same files as the embedded store's:
//! - [`options`], [`migration`] (the schema), [`sql`] (the statements);
//! - [`workers`]: the per-connection workers, their batching and the
//!   retry loop;
//! - [`buckets`]: token buckets' rows and closed records; [`tiers`]: tiers
//!   and tenant records; [`keys`]: per-key buckets; [`partitions`]:
//!   hot-partition reports; [`states`]: deleted and suspended tenants;
//!   [`image`]: export and import; [`rows`]: rows to and from the core's
//!   state; [`tls`].

mod buckets;
mod budgets;
mod history;
mod image;
mod keys;
mod latches;
mod migration;
mod options;
mod partitions;
mod retry;
mod rows;
mod sql;
mod states;
mod tiers;
mod tls;
mod tree;
mod workers;

use self::buckets::*;
use self::budgets::BudgetRows;
use self::latches::{Latched, Owed, Skipped};
use self::migration::*;
use self::tiers::*;
use self::workers::*;

pub use self::migration::{migrate, migrate_to};
pub use self::options::PostgresOptions;
use self::options::parse_url;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts, tokio_postgres,
};
use futures_util::future::{join, join_all};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres_rustls::MakeRustlsConnect;
use tollgate_core::global_bucket::{self, InstanceWindow};
use tollgate_core::history::checks::CheckRow;
use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_core::partition::{Exchange, ExchangeAnswer, PartitionReports};
use tollgate_core::tenant_state::{StateChange, StateEdit};
use tollgate_core::tier::{
    self, CloseReason, ClosedBucket, ClosedBy, LoadedTenant, TenantChange, TenantRecord, Tier,
    TierError,
};
use tollgate_core::transaction::{Answer, Batch, ParentPlan};
use tollgate_core::{
    BucketKey, Grant, LimitsUpdate, TenantId, TenantState, TierName, Timestamp, TokenBucketRequest,
};

use self::keys::PendingCheck;
use self::retry::{TxError, Verdict, chain};
use self::rows::{HeadColumns, InstanceColumns};
use tollgate_core::budget::delivery::{Attempt, Backoff};

use tollgate_core::organisation::{Node, TreeChange};

use super::{
    AdminCall, BucketSettings, BucketSnapshot, CheckHistoryRows, ClaimedEvent, Clock, ClosedEntry,
    Counters, Counts, DeletedTenant, HistoryPage, HistoryRows, KeyBucketSnapshot, KeyCounts,
    KeySweep, LimitsChange, NodeFilter, PrunedRecords, PutTierOutcome, RecordSink, Stage,
    Stopwatch, Store, StoreError, StoreImage, StoreStats, TenantChangeOutcome, TenantView,
};

pub use self::retry::RetryPolicy;
pub use self::tls::PostgresTls;

/// How many checks one transaction serves per token-bucket request of
/// `max_batch`: at 64, full batches of checks held a tenant to 64 checks
/// per commit (see BENCHMARKS.md, "Per-key checks").
pub const CHECKS_PER_REQUEST_BATCH: usize = 4;

/// A store in a PostgreSQL database.
///
/// Clones share the pool and the batching workers. The workers stop when
/// the store is closed or its last clone dropped.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    queue: Arc<Queue>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool_size", &self.inner.options.pool_size)
            .field("max_batch", &self.inner.options.max_batch)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Applies the migrations, then connects a pool to the database.
    /// Must be called within a tokio runtime.
    pub async fn connect(
        options: PostgresOptions,
        settings: BucketSettings,
    ) -> Result<Self, StoreError> {
        Self::start(options, settings, None).await
    }

    /// Like [`connect`](Self::connect), but time comes from `clock` instead
    /// of the database (for tests that move time by hand).
    pub async fn connect_with_clock(
        options: PostgresOptions,
        settings: BucketSettings,
        clock: Clock,
    ) -> Result<Self, StoreError> {
        Self::start(options, settings, Some(clock)).await
    }

    async fn start(
        options: PostgresOptions,
        settings: BucketSettings,
        clock: Option<Clock>,
    ) -> Result<Self, StoreError> {
        if options.pool_size == 0 || options.max_batch == 0 {
            return Err(StoreError::internal(
                "configure the PostgreSQL store",
                "pool size and batch size must be at least 1",
            ));
        }
        let mut config = parse_url(&options.url)?;
        let connector = tls::connector(&config, &options.tls)?;
        migrate_with(&config, connector.as_ref(), None).await?;
        if config.get_application_name().is_none() {
            config.application_name("tollgate");
        }
        config.connect_timeout(options.connect_timeout);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match connector {
            Some(tls) => Manager::from_config(config, tls, manager_config),
            None => Manager::from_config(config, NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: Some(options.connect_timeout),
                create: Some(options.connect_timeout),
                recycle: Some(options.connect_timeout),
            })
            .build()
            .map_err(|e| StoreError::internal("build the connection pool", e))?;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..options.pool_size)
            .map(|_| mpsc::channel(options.max_batch.saturating_mul(CHECKS_PER_REQUEST_BATCH)))
            .unzip();
        let inner = Arc::new(Inner {
            pool,
            settings,
            options,
            counters: Counters::default(),
            clock,
            draw_latches: Default::default(),
        });
        let workers = receivers
            .into_iter()
            .map(|rx| tokio::spawn(Arc::clone(&inner).work(rx)))
            .collect();
        Ok(PostgresStore {
            inner,
            queue: Arc::new(Queue {
                requests: std::sync::Mutex::new(Some(senders)),
                workers: std::sync::Mutex::new(workers),
            }),
        })
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn check(&self, call: &CheckCall) -> Result<CallAnswer, StoreError> {
        // The tenant of the first item picks the worker: a call's items are
        // most often of one tenant.
        let tenant = call.items.first().map(|item| &item.key.bucket.tenant);
        let (reply, answer) = oneshot::channel();
        let sender = {
            let queues = self.queue.requests.lock().map_err(|_| closed())?;
            let queues = queues.as_ref().ok_or_else(closed)?;
            queues[tenant.map_or(0, |t| shard(t, queues.len()))].clone()
        };
        let pending = PendingCheck {
            call: call.clone(),
            reply,
        };
        sender
            .send(Job::Check(pending))
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    async fn sweep_keys(&self, limit: usize) -> Result<KeySweep, StoreError> {
        let inner = &*self.inner;
        let sweep = inner
            .run("sweep keys", true, || keys::sweep(inner, limit))
            .await?;
        inner
            .counters
            .keys_removed
            .fetch_add(sweep.keys, Ordering::Relaxed);
        Ok(sweep)
    }

    async fn key_counts(&self) -> Result<KeyCounts, StoreError> {
        let inner = &*self.inner;
        inner.run("count keys", true, || keys::counts(inner)).await
    }

    async fn list_key_buckets(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&BucketKey>,
        limit: usize,
        busiest: usize,
    ) -> Result<Vec<KeyBucketSnapshot>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("list per-key buckets", true, || {
                keys::list_buckets(inner, tenant, after, limit, busiest)
            })
            .await
    }

    async fn export(&self, sink: RecordSink) -> Result<Counts, StoreError> {
        // Not retried: records already sent cannot be taken back.
        image::export(&self.inner, sink)
            .await
            .map_err(|e| e.into_store_error("export"))
    }

    async fn import(&self, image: StoreImage, replace: bool) -> Result<Counts, StoreError> {
        let inner = &*self.inner;
        inner
            .run("import", false, || image::import(inner, &image, replace))
            .await
    }

    async fn token_bucket(
        &self,
        key: &BucketKey,
        request: &TokenBucketRequest,
    ) -> Result<Grant, StoreError> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            key: key.clone(),
            request: request.clone(),
            reply,
            queued_at: Some(Instant::now()),
        };
        let sender = {
            let queues = self.queue.requests.lock().map_err(|_| closed())?;
            let queues = queues.as_ref().ok_or_else(closed)?;
            queues[shard(&key.tenant, queues.len())].clone()
        };
        sender
            .send(Job::TokenBucket(Box::new(pending)))
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    async fn update_limits(
        &self,
        key: &BucketKey,
        update: &LimitsUpdate,
    ) -> Result<LimitsChange, StoreError> {
        let inner = &*self.inner;
        inner
            .run("update bucket limits", false, || async move {
                let mut client = inner.pool.get().await?;
                let lock = client.prepare_cached(sql::LOCK_BUCKETS).await?;
                let clock = client.prepare_cached(sql::CLOCK).await?;
                let insert = client.prepare_cached(&sql::INSERT_BUCKETS).await?;
                let update_row = client.prepare_cached(&sql::UPDATE_BUCKETS).await?;
                let read_instances = client.prepare_cached(sql::READ_INSTANCES).await?;
                let delete_strays = client.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
                let txn = client.transaction().await?;
                let tenants = [key.tenant.as_str()];
                let buckets = [key.bucket.as_str()];
                let (tenants, buckets) = (tenants.as_slice(), buckets.as_slice());
                let lock_params: [&(dyn ToSql + Sync); 2] = [&tenants, &buckets];
                let no_params: [&(dyn ToSql + Sync); 0] = [];
                let mut read = settle(
                    join_all([
                        txn.query(&lock, &lock_params[..]),
                        txn.query(&clock, &no_params[..]),
                    ])
                    .await,
                )?
                .into_iter();
                let (found, clock_rows) = (
                    read.next().unwrap_or_default(),
                    read.next().unwrap_or_default(),
                );
                let clock_row = clock_rows
                    .first()
                    .ok_or_else(|| StoreError::internal("read the clock", "no row"))?;
                let now = inner.now(rows::clock(clock_row, "now")?);
                let before = found.first().map(rows::head_from_row).transpose()?;
                let head = match global_bucket::configure(before.as_ref(), update, now) {
                    Ok(head) => head,
                    Err(e) => return Err(TxError::Store(e.into())),
                };
                let params = HeadColumns::of([(key, &head)])?;
                let (tenant_id, bucket) = (key.tenant.as_str(), key.bucket.as_str());
                let key_params: [&(dyn ToSql + Sync); 2] = [&tenant_id, &bucket];
                let statement = if before.is_some() {
                    &update_row
                } else {
                    // A new bucket starts with an empty instance list.
                    txn.execute(&delete_strays, &[&tenants, &buckets]).await?;
                    &insert
                };
                let write_params = params.as_params();
                let (written, instance_rows) = tokio::join!(
                    txn.execute(statement, &write_params),
                    txn.query(&read_instances, &key_params),
                );
                let instance_rows = match (written, instance_rows) {
                    (Ok(_), Ok(rows)) => rows,
                    (written, read) => {
                        return Err(settle(vec![written.map(|_| ()), read.map(|_| ())])
                            .err()
                            .map_or_else(
                                || {
                                    TxError::Store(StoreError::internal(
                                        "update bucket limits",
                                        "lost error",
                                    ))
                                },
                                TxError::Db,
                            ));
                    }
                };
                let instances = instance_rows
                    .iter()
                    .map(rows::instance_from_row)
                    .collect::<Result<Vec<_>, _>>()?;
                let revived = states::revive(&txn, &key.tenant).await?;
                txn.commit().await.map_err(TxError::Commit)?;
                Ok(LimitsChange {
                    revived,
                    before,
                    after: BucketSnapshot {
                        key: key.clone(),
                        head,
                        instances,
                        read_at: now,
                        inactivity_timeout: inner.settings.bucket.inactivity_timeout,
                    },
                })
            })
            .await
    }

    async fn get_bucket(&self, key: &BucketKey) -> Result<BucketSnapshot, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read bucket", true, || async move {
                let client = inner.pool.get().await?;
                let read = client.prepare_cached(sql::READ_BUCKET).await?;
                let found = client
                    .query(&read, &[&key.tenant.as_str(), &key.bucket.as_str()])
                    .await?;
                snapshots_from_rows(inner, &found, "read_at")?
                    .into_iter()
                    .next()
                    .ok_or_else(|| TxError::Store(StoreError::not_found(key)))
            })
            .await
    }

    async fn get_tenant(&self, tenant: &TenantId) -> Result<Vec<BucketSnapshot>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read tenant", true, || async move {
                let client = inner.pool.get().await?;
                let read = client.prepare_cached(sql::READ_TENANT).await?;
                let found = client.query(&read, &[&tenant.as_str()]).await?;
                let buckets = snapshots_from_rows(inner, &found, "read_at")?;
                if buckets.is_empty() {
                    return Err(TxError::Store(StoreError::TenantNotFound(tenant.clone())));
                }
                Ok(buckets)
            })
            .await
    }

    async fn list_buckets(
        &self,
        after: Option<&BucketKey>,
        limit: usize,
    ) -> Result<Vec<BucketSnapshot>, StoreError> {
        // ('', '') sorts before every key: tenant ids are never empty.
        let (after_tenant, after_bucket) =
            after.map_or(("", ""), |k| (k.tenant.as_str(), k.bucket.as_str()));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let inner = &*self.inner;
        inner
            .run("list buckets", true, || async move {
                let client = inner.pool.get().await?;
                let list = client.prepare_cached(sql::LIST_BUCKETS).await?;
                let found = client
                    .query(&list, &[&after_tenant, &after_bucket, &limit])
                    .await?;
                snapshots_from_rows(inner, &found, "read_at").map_err(TxError::Store)
            })
            .await
    }

    async fn delete_tenant_by(
        &self,
        tenant: &TenantId,
        call: &AdminCall,
    ) -> Result<DeletedTenant, StoreError> {
        let inner = &*self.inner;
        inner
            .run("delete tenant", call.dry_run, || async move {
                let mut client = inner.pool.get().await?;
                let clock = client.prepare_cached(sql::CLOCK).await?;
                let lock_record = client.prepare_cached(sql::LOCK_TENANT_RECORD).await?;
                let lock = client.prepare_cached(sql::LOCK_TENANT).await?;
                let delete = client.prepare_cached(sql::DELETE_TENANT).await?;
                let delete_record = client.prepare_cached(sql::DELETE_TENANT_RECORD).await?;
                let delete_keys = client.prepare_cached(sql::DELETE_TENANT_KEYS).await?;
                let delete_reports = client.prepare_cached(sql::DELETE_PARTITION_REPORTS).await?;
                let txn = client.transaction().await?;
                let tenant_id = tenant.as_str();
                let params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
                // One round trip: the locks first (in the order every tenant
                // change takes them), then the deletes, whose snapshots see
                // every row committed before.
                let no_params: [&(dyn ToSql + Sync); 0] = [];
                let mut results = settle(
                    join_all([
                        txn.query(&lock_record, &params[..]),
                        txn.query(&lock, &params[..]),
                        txn.query(&delete, &params[..]),
                        txn.query(&clock, &no_params[..]),
                    ])
                    .await,
                )?
                .into_iter();
                let had_record = results.next().is_some_and(|rows| !rows.is_empty());
                let mut deleted = results.nth(1).unwrap_or_default();
                let clock_rows = results.next().unwrap_or_default();
                let clock_row = clock_rows
                    .first()
                    .ok_or_else(|| StoreError::internal("read the clock", "no row"))?;
                let now = inner.now(rows::clock(clock_row, "now")?);
                if had_record {
                    txn.execute(&delete_record, &params).await?;
                    txn.execute(&delete_keys, &params).await?;
                    txn.execute(&delete_reports, &params).await?;
                }
                // RETURNING gives no order; heads come first, by key.
                let order = |row: &tokio_postgres::Row| {
                    (
                        row.get::<_, String>("bucket"),
                        row.get::<_, i64>("instance_id"),
                    )
                };
                deleted.sort_by_cached_key(order);
                let buckets: Vec<BucketSnapshot> = snapshots_from_rows(inner, &deleted, "read_at")?;
                let tombstone = StateChange::Delete {
                    actor: call.by.to_string(),
                };
                let exists = !buckets.is_empty() || had_record;
                states::change_of(&txn, tenant, exists, &tombstone, now)
                    .await?
                    .map_err(TxError::Store)?;
                let closed: Vec<ClosedBucket> = buckets
                    .iter()
                    .map(|b| {
                        tier::close_bucket(
                            &b.key,
                            &b.head,
                            CloseReason::TenantDeleted,
                            &call.by,
                            b.read_at,
                        )
                    })
                    .collect();
                insert_closed(&txn, &closed).await?;
                let mut cycles = Vec::new();
                for b in &buckets {
                    for record in tier::closed_cycles(&b.head, b.read_at) {
                        cycles.push((b.key.clone(), record));
                    }
                }
                budgets::insert_cycles(&txn, cycles.iter().map(|(key, record)| (key, record)))
                    .await?;
                finish(txn, call.dry_run).await?;
                Ok(DeletedTenant {
                    buckets: buckets
                        .into_iter()
                        .map(|b| BucketSnapshot {
                            instances: Vec::new(),
                            ..b
                        })
                        .collect(),
                    closed,
                })
            })
            .await
    }

    async fn change_tenant_by(
        &self,
        tenant: &TenantId,
        change: &TenantChange,
        call: &AdminCall,
    ) -> Result<TenantChangeOutcome, StoreError> {
        tiers::change_tenant_by(self, tenant, change, call).await
    }

    async fn list_closed(
        &self,
        tenant: &TenantId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ClosedEntry>, StoreError> {
        let inner = &*self.inner;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        inner
            .run("list closed buckets", true, || async move {
                let client = inner.pool.get().await?;
                let list = client.prepare_cached(sql::LIST_CLOSED_BUCKETS).await?;
                let rows = client
                    .query(&list, &[&tenant.as_str(), &after, &limit])
                    .await?;
                Ok(rows
                    .iter()
                    .map(closed_entry)
                    .collect::<Result<Vec<_>, StoreError>>()?)
            })
            .await
    }

    async fn budget_cycles(
        &self,
        key: &BucketKey,
        limit: usize,
    ) -> Result<Vec<tollgate_core::budget::CycleRecord>, StoreError> {
        let inner = &*self.inner;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        inner
            .run("list budget cycles", true, || async move {
                let client = inner.pool.get().await?;
                let list = client.prepare_cached(sql::LIST_BUDGET_CYCLES).await?;
                let rows = client
                    .query(&list, &[&key.tenant.as_str(), &key.bucket.as_str(), &limit])
                    .await?;
                Ok(rows
                    .iter()
                    .map(budgets::cycle_of)
                    .collect::<Result<Vec<_>, StoreError>>()?)
            })
            .await
    }

    async fn prune_budget_records(&self, limit: usize) -> Result<PrunedRecords, StoreError> {
        let inner = &*self.inner;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        inner
            .run("prune budget records", true, || async move {
                let client = inner.pool.get().await?;
                let cycles = client.prepare_cached(sql::PRUNE_BUDGET_CYCLES).await?;
                let events = client.prepare_cached(sql::PRUNE_BUDGET_EVENTS).await?;
                let now = inner.read_clock(&client).await?;
                let before = now
                    .saturating_sub(inner.settings.budget_record_retention)
                    .unix_micros();
                let cycles = client.execute(&cycles, &[&before, &limit]).await?;
                let removed = client.query(&events, &[&before, &limit]).await?;
                let mut undelivered_events = 0;
                for row in &removed {
                    let delivered: bool = row
                        .try_get("delivered")
                        .map_err(|e| StoreError::internal("read a pruned budget event", e))?;
                    undelivered_events += u64::from(!delivered);
                }
                Ok(PrunedRecords {
                    cycles,
                    events: removed.len() as u64,
                    undelivered_events,
                })
            })
            .await
    }

    async fn sample_history(
        &self,
        after: Option<&BucketKey>,
        limit: usize,
    ) -> Result<HistoryPage, StoreError> {
        let inner = &*self.inner;
        inner
            .run("sample usage history", true, || async move {
                let client = inner.pool.get().await?;
                history::sample(inner, &client, after, limit).await
            })
            .await
    }

    async fn history(
        &self,
        key: &BucketKey,
        since: Timestamp,
        until: Timestamp,
        step: Duration,
    ) -> Result<HistoryRows, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read usage history", true, || async move {
                let client = inner.pool.get().await?;
                let now = inner.read_clock(&client).await?;
                let resolution = inner.settings.history.resolution_for(since, now, step);
                history::read(&client, key, resolution, since, until).await
            })
            .await
    }

    async fn prune_history(&self, limit: usize) -> Result<u64, StoreError> {
        let inner = &*self.inner;
        inner
            .run("prune usage history", true, || async move {
                let client = inner.pool.get().await?;
                let now = inner.read_clock(&client).await?;
                history::prune(inner, &client, now, limit).await
            })
            .await
    }

    async fn record_checks(&self, replica: &str, rows: &[CheckRow]) -> Result<(), StoreError> {
        let inner = &*self.inner;
        inner
            .run("record per-key checks", true, || async move {
                let client = inner.pool.get().await?;
                history::record_checks(&client, replica, rows).await
            })
            .await
    }

    async fn check_history(
        &self,
        key: &BucketKey,
        since: Timestamp,
        until: Timestamp,
        step: Duration,
    ) -> Result<CheckHistoryRows, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read per-key check history", true, || async move {
                let client = inner.pool.get().await?;
                let now = inner.read_clock(&client).await?;
                let resolution = inner.settings.history.resolution_for(since, now, step);
                history::read_checks(&client, key, resolution, since, until).await
            })
            .await
    }

    fn history_config(&self) -> tollgate_core::history::HistoryConfig {
        self.inner.settings.history.clone()
    }

    async fn claim_budget_events(
        &self,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("claim budget events", false, || {
                budgets::claim(inner, limit, lease)
            })
            .await
    }

    async fn settle_budget_event(
        &self,
        claimed: &ClaimedEvent,
        attempt: &Attempt,
        webhooks: &[String],
        backoff: &Backoff,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        inner
            .run("settle a budget event", true, || {
                budgets::settle(inner, claimed, attempt, webhooks, backoff)
            })
            .await
    }

    async fn change_tenant_state(
        &self,
        tenant: &TenantId,
        change: &StateChange,
    ) -> Result<StateEdit, StoreError> {
        let inner = &*self.inner;
        inner
            .run("change tenant state", false, || {
                states::change(inner, tenant, change)
            })
            .await
    }

    async fn change_tree(&self, change: &TreeChange) -> Result<Vec<(TenantId, Node)>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("change the tree of organisations", false, || {
                tree::change(inner, change)
            })
            .await
    }

    async fn tree_nodes(&self, filter: &NodeFilter) -> Result<Vec<(TenantId, Node)>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read the tree of organisations", true, || {
                tree::read(inner, filter)
            })
            .await
    }

    async fn tenant_states(
        &self,
        tenants: &[TenantId],
    ) -> Result<BTreeMap<TenantId, TenantState>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read tenant states", true, || states::read(inner, tenants))
            .await
    }

    async fn describe_tenant(&self, tenant: &TenantId) -> Result<TenantView, StoreError> {
        tiers::describe_tenant(self, tenant).await
    }

    async fn tenant_records(
        &self,
        tenants: &[TenantId],
    ) -> Result<BTreeMap<TenantId, TenantRecord>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read tenant records", true, || {
                tiers::read_records(inner, tenants)
            })
            .await
    }

    async fn partition_load(
        &self,
        tenant: &TenantId,
        exchange: &Exchange,
    ) -> Result<ExchangeAnswer, StoreError> {
        partitions::partition_load(self, tenant, exchange).await
    }

    async fn put_tier_by(
        &self,
        name: &TierName,
        tier: &Tier,
        call: &AdminCall,
    ) -> Result<PutTierOutcome, StoreError> {
        tiers::put_tier_by(self, name, tier, call).await
    }

    async fn get_tier(&self, name: &TierName) -> Result<Tier, StoreError> {
        tiers::get_tier(self, name).await
    }

    async fn list_tiers(&self) -> Result<Vec<(TierName, Tier)>, StoreError> {
        tiers::list_tiers(self).await
    }

    async fn delete_tier(&self, name: &TierName) -> Result<(), StoreError> {
        tiers::delete_tier(self, name).await
    }

    fn stats(&self) -> StoreStats {
        self.inner.counters.snapshot()
    }

    async fn close(&self) -> Result<(), StoreError> {
        // Stop taking requests; the workers serve what is queued, then exit.
        let sender = self.queue.requests.lock().map_err(|_| closed())?.take();
        drop(sender);
        let workers = std::mem::take(&mut *self.queue.workers.lock().map_err(|_| closed())?);
        for worker in workers {
            worker
                .await
                .map_err(|e| StoreError::internal("stop a store worker", e))?;
        }
        self.inner.pool.close();
        Ok(())
    }
}
