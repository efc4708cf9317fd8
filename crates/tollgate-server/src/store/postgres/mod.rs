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
//! [`migrate`]. The SQL lives in `sql/queries`, one statement per file,
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
//! Tier changes: `change_in` runs one tenant change inside a transaction
//! (locks the tenant's record, holds the tier it needs `FOR SHARE`, locks
//! the tenant's head rows, reads the clock, applies
//! `tier::change_tenant` and writes the edit); `put` locks the tier, writes
//! it, locks the records of its tenants and runs `change_in` with
//! `Reapply` for each, all in one transaction. `DescribeTenant` reads the
//! record and the head rows in one read-only snapshot. [`migrate`] applies
//! `sql/migrations` with refinery (replicas starting at once retry until
//! one has applied them); [`migrate_to`] stops at a schema version, what
//! a server of that version would have made of the database, for upgrade
//! tests.

mod image;
mod keys;
mod retry;
mod rows;
mod states;
mod tls;

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
use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_core::partition::{self, Exchange, ExchangeAnswer, PartitionReports, TableLimitSet};
use tollgate_core::tenant_state::{StateChange, StateEdit};
use tollgate_core::tier::{
    self, CloseReason, ClosedBucket, ClosedBy, LoadedTenant, TenantChange, TenantRecord, Tier,
    TierError,
};
use tollgate_core::transaction::{Answer, Batch};
use tollgate_core::{
    BucketKey, Grant, LimitsUpdate, TenantId, TenantState, TierName, Timestamp, TokenBucketRequest,
};

use self::keys::PendingCheck;
use self::retry::{TxError, Verdict, chain};
use self::rows::{HeadColumns, InstanceColumns};
use super::{
    AdminCall, BucketSettings, BucketSnapshot, Clock, ClosedEntry, Counters, Counts, DeletedTenant,
    KeyBucketSnapshot, KeyCounts, KeySweep, LimitsChange, PutTierOutcome, RecordSink, Stage,
    Stopwatch, Store, StoreError, StoreImage, StoreStats, TenantChangeOutcome, TenantView,
};

pub use self::retry::RetryPolicy;
pub use self::tls::PostgresTls;

mod sql {
    macro_rules! query {
        ($name:ident, $file:literal) => {
            pub const $name: &str = include_str!(concat!("../../../../../sql/queries/", $file));
        };
    }
    query!(LOCK_BUCKETS, "lock_buckets.sql");
    query!(LOCK_TENANT, "lock_tenant.sql");
    query!(CLOCK, "clock.sql");
    query!(LOAD_WINDOWS, "load_windows.sql");
    query!(INSERT_BUCKETS, "insert_buckets.sql");
    query!(UPDATE_BUCKETS, "update_buckets.sql");
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
}

mod embedded_migrations {
    refinery::embed_migrations!("../../sql/migrations");
}

/// How many checks one transaction serves per token-bucket request of
/// `max_batch`: at 64, full batches of checks held a tenant to 64 checks
/// per commit (see BENCHMARKS.md, "Per-key checks").
pub const CHECKS_PER_REQUEST_BATCH: usize = 4;

/// How to reach the database and how hard to work it.
#[derive(Clone, Debug, PartialEq)]
pub struct PostgresOptions {
    /// A libpq-style URL or key/value string, e.g. `postgres://user@host:5432/db`.
    pub url: String,
    /// Connections in the pool; also the number of transactions in flight.
    pub pool_size: usize,
    /// The most token-bucket requests served by one transaction; a
    /// transaction of checks serves up to [`CHECKS_PER_REQUEST_BATCH`]
    /// times as many (a check's rows are fewer and smaller).
    pub max_batch: usize,
    /// How long to wait for a new connection or a free one from the pool.
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
    /// TLS: on with `sslmode=require` in the URL or a CA file.
    pub tls: PostgresTls,
}

impl PostgresOptions {
    /// Options with the defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            pool_size: 16,
            max_batch: 64,
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            tls: PostgresTls::default(),
        }
    }
}

/// Applies the schema migrations in `sql/migrations` to the database at
/// `url`, over TLS as `tls` and the URL say. Applying them again is
/// harmless; several replicas starting at once are fine too (a loser of the
/// race retries and finds them applied).
pub async fn migrate(url: &str, tls: &PostgresTls) -> Result<(), StoreError> {
    let config = parse_url(url)?;
    let connector = tls::connector(&config, tls)?;
    migrate_with(&config, connector.as_ref(), None).await
}

/// Like [`migrate`], but stops at schema `version`: what a server of that
/// version would have made of the database (for upgrade tests, and to
/// stage an upgrade).
pub async fn migrate_to(url: &str, tls: &PostgresTls, version: u32) -> Result<(), StoreError> {
    let config = parse_url(url)?;
    let connector = tls::connector(&config, tls)?;
    migrate_with(&config, connector.as_ref(), Some(version)).await
}

fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    url.parse()
        .map_err(|e| StoreError::internal("parse the PostgreSQL URL", e))
}

/// [`migrate`] with the URL parsed and the TLS connector (if any) built.
async fn migrate_with(
    config: &tokio_postgres::Config,
    connector: Option<&MakeRustlsConnect>,
    version: Option<u32>,
) -> Result<(), StoreError> {
    let policy = RetryPolicy::default();
    let mut attempt = 1;
    loop {
        let outcome = match connector {
            Some(tls) => migrate_once(config, tls.clone(), version).await,
            None => migrate_once(config, NoTls, version).await,
        };
        match outcome {
            Ok(applied) => {
                for name in applied {
                    tracing::info!(migration = %name, "applied schema migration");
                }
                return Ok(());
            }
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, attempt, "schema migration failed; retrying");
                tokio::time::sleep(policy.delay(attempt).max(Duration::from_millis(50))).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn migrate_once<T>(
    config: &tokio_postgres::Config,
    tls: T,
    version: Option<u32>,
) -> Result<Vec<String>, StoreError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (mut client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| StoreError::Unavailable(format!("connect to PostgreSQL: {}", chain(&e))))?;
    let connection = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "migration connection closed");
        }
    });
    let target = version.map_or(refinery::Target::Latest, |v| {
        refinery::Target::Version(v.try_into().unwrap_or(refinery::SchemaVersion::MAX))
    });
    let report = embedded_migrations::migrations::runner()
        .set_target(target)
        .run_async(&mut client)
        .await
        .map_err(|e| StoreError::internal("apply schema migrations", e));
    drop(client);
    let _ = connection.await;
    Ok(report?
        .applied_migrations()
        .iter()
        .map(ToString::to_string)
        .collect())
}

/// A store in a PostgreSQL database.
///
/// Clones share the pool and the batching workers. The workers stop when
/// the store is closed or its last clone dropped.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    queue: Arc<Queue>,
}

/// What the workers share.
struct Inner {
    pool: Pool,
    settings: BucketSettings,
    options: PostgresOptions,
    counters: Counters,
    /// Replaces the database's clock (tests that move time).
    clock: Option<Clock>,
}

impl Inner {
    /// The store's clock: the database's, read in the transaction, unless
    /// a test replaced it.
    fn now(&self, database_clock: Timestamp) -> Timestamp {
        self.clock.as_ref().map_or(database_clock, |clock| clock())
    }
}

/// The way into the workers; only the store's handles hold it, so dropping
/// the last handle closes the queue and lets the workers finish.
struct Queue {
    /// One queue per worker; a tenant's requests and checks go to
    /// `shard(tenant)`.
    requests: std::sync::Mutex<Option<Vec<mpsc::Sender<Job>>>>,
    workers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool_size", &self.inner.options.pool_size)
            .field("max_batch", &self.inner.options.max_batch)
            .finish_non_exhaustive()
    }
}

/// A queued token-bucket request.
struct Pending {
    key: BucketKey,
    request: TokenBucketRequest,
    reply: oneshot::Sender<Result<Grant, StoreError>>,
    /// When it was queued, until its wait is recorded (a deferred request
    /// waits again, but counts once).
    queued_at: Option<Instant>,
}

/// What a worker serves: token-bucket requests and checks, each kind
/// batched into transactions of its own.
enum Job {
    TokenBucket(Box<Pending>),
    Check(PendingCheck),
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

/// The results of a pipelined flight of statements, or the error that
/// caused its failure. Once a statement fails, PostgreSQL refuses the rest
/// of the transaction's statements with 25P02 (in failed transaction); the
/// first other error, in statement order, is the cause, and it decides
/// whether the transaction is retried.
fn settle<T>(
    results: Vec<Result<T, tokio_postgres::Error>>,
) -> Result<Vec<T>, tokio_postgres::Error> {
    let aborted =
        |e: &tokio_postgres::Error| e.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION);
    let mut values = Vec::with_capacity(results.len());
    let mut cause: Option<tokio_postgres::Error> = None;
    for result in results {
        match result {
            Ok(value) => values.push(value),
            Err(e) => {
                if cause.as_ref().is_none_or(|c| aborted(c) && !aborted(&e)) {
                    cause = Some(e);
                }
            }
        }
    }
    match cause {
        Some(e) => Err(e),
        None => Ok(values),
    }
}

/// The worker, of `workers`, that serves a tenant's requests and checks,
/// so that a tenant's buckets share transactions as its one bucket did (a
/// tenant with many buckets costs as few commits as one with a single
/// bucket), and so do the checks of its keys: within a replica they queue
/// in memory rather than on each other's locks.
fn shard(tenant: &TenantId, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same tenant goes to the same worker in every process.
    let mut hasher = std::hash::DefaultHasher::new();
    tenant.hash(&mut hasher);
    usize::try_from(hasher.finish() % workers.max(1) as u64).unwrap_or(0)
}

fn closed() -> StoreError {
    StoreError::Unavailable("the PostgreSQL store is closed".into())
}

/// Commits `txn`, or for a dry run rolls it back.
async fn finish(txn: deadpool_postgres::Transaction<'_>, dry_run: bool) -> Result<(), TxError> {
    if dry_run {
        txn.rollback().await?;
        Ok(())
    } else {
        txn.commit().await.map_err(TxError::Commit)
    }
}

impl Inner {
    /// Runs `attempt` until it succeeds, fails for good, or runs out of
    /// attempts; logs and counts the retries.
    async fn run<T, F, Fut>(
        &self,
        op: &'static str,
        idempotent: bool,
        mut attempt: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        let policy = self.options.retry;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let error = match attempt().await {
                Ok(value) => {
                    if tries > 1 {
                        tracing::info!(
                            op,
                            retries = tries - 1,
                            "transaction succeeded after retries"
                        );
                    }
                    return Ok(value);
                }
                Err(e) => e,
            };
            let verdict = error.verdict(idempotent);
            if verdict == Verdict::Fatal || tries >= policy.max_attempts {
                let error = error.into_store_error(op);
                // An answer about the request (not found, refused) is not a
                // failure of the store; only those count and alert.
                if error.is_store_failure() {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                }
                // Logged where it is handled (the service), with the count here.
                return Err(match error {
                    StoreError::Unavailable(message) if tries > 1 => StoreError::Unavailable(
                        format!("{message} (gave up after {tries} attempts)"),
                    ),
                    other => other,
                });
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(op, attempt = tries, ?verdict, error = ?error, "retrying store transaction");
            tokio::time::sleep(policy.delay(tries)).await;
        }
    }

    /// A batching worker: takes what is queued, serves its token-bucket
    /// requests in one transaction and its checks in another.
    async fn work(self: Arc<Self>, mut queue: mpsc::Receiver<Job>) {
        let max_requests = self.options.max_batch;
        let max_checks = max_requests.saturating_mul(CHECKS_PER_REQUEST_BATCH);
        loop {
            let mut jobs = Vec::with_capacity(max_checks);
            if queue.recv_many(&mut jobs, max_checks).await == 0 {
                return;
            }
            let mut batch = Vec::with_capacity(jobs.len());
            let mut checks = Vec::new();
            for job in jobs {
                match job {
                    Job::TokenBucket(pending) => batch.push(*pending),
                    Job::Check(pending) => checks.push(pending),
                }
            }
            if !checks.is_empty() {
                self.serve_checks(checks).await;
            }
            // At most `max_batch` requests a transaction; the deferred
            // ones go first into the next.
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(max_requests));
                batch = self.serve_batch(batch).await;
                batch.extend(rest);
            }
        }
    }

    /// Serves a batch of checks in one transaction and answers them.
    async fn serve_checks(&self, mut batch: Vec<PendingCheck>) {
        // As for token-bucket requests: what has not started never starts.
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            return;
        }
        // Not idempotent: a check whose commit was lost may have taken its
        // tokens, and taking them again would take twice.
        let result = self
            .run("check", false, || keys::check_batch(self, &batch))
            .await;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.for_another_caller()));
                }
                return;
            }
        };
        // The commit holds: count what it did.
        let answered = outcome.answers.iter().filter(|a| a.is_ok()).count();
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        self.counters
            .checks
            .fetch_add(answered as u64, Ordering::Relaxed);
        self.counters
            .keys_removed
            .fetch_add(outcome.keys_removed, Ordering::Relaxed);
        for (p, answer) in batch.into_iter().zip(outcome.answers) {
            let _ = p.reply.send(answer);
        }
    }

    /// Serves a batch in one transaction and answers its requests; returns
    /// the requests deferred to another transaction.
    async fn serve_batch(&self, mut batch: Vec<Pending>) -> Vec<Pending> {
        // A caller that has gone (its deadline passed, it cancelled) was
        // told nothing was certain; what has not started never starts.
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            return batch;
        }
        let started = Instant::now();
        self.counters.stages.record_all(
            Stage::Queued,
            batch
                .iter_mut()
                .filter_map(|p| p.queued_at.take())
                .map(|queued_at| started.duration_since(queued_at)),
        );
        let result = self
            .run("token bucket request", true, || {
                token_bucket_batch(self, &batch)
            })
            .await;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.for_another_caller()));
                }
                return Vec::new();
            }
        };
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        let mut deferred = Vec::new();
        let mut served = 0;
        for (p, answer) in batch.into_iter().zip(outcome.answers) {
            match answer {
                Some(answer) => {
                    served += 1;
                    // A caller that went away no longer needs the answer; its
                    // change stands, as it would had the answer been lost.
                    let _ = p.reply.send(answer);
                }
                None => deferred.push(p),
            }
        }
        self.counters.requests.fetch_add(served, Ordering::Relaxed);
        // The commit holds: report the removals.
        self.counters
            .instances_removed
            .fetch_add(outcome.batch.report_removed(outcome.now), Ordering::Relaxed);
        deferred
    }
}

/// What a committed batch did.
struct BatchOutcome {
    /// Per request, in batch order: its answer, or `None` if it was deferred.
    answers: Vec<Option<Result<Grant, StoreError>>>,
    /// The transaction script's state, to report its removals.
    batch: Batch,
    now: Timestamp,
}

/// Serves `pending` in one transaction, by the script of
/// `tollgate_core::transaction`: this function only reads and writes rows.
async fn token_bucket_batch(store: &Inner, pending: &[Pending]) -> Result<BatchOutcome, TxError> {
    let mut stopwatch = Stopwatch::new(&store.counters.stages);
    let client = store.pool.get().await?;
    let lock = client.prepare_cached(sql::LOCK_BUCKETS).await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let load_windows = client.prepare_cached(sql::LOAD_WINDOWS).await?;
    let read_states = client.prepare_cached(sql::READ_TENANT_STATES).await?;
    let insert_heads = client.prepare_cached(sql::INSERT_BUCKETS).await?;
    let update_heads = client.prepare_cached(sql::UPDATE_BUCKETS).await?;
    let upsert_instances = client.prepare_cached(sql::UPSERT_INSTANCES).await?;
    let delete_instances = client.prepare_cached(sql::DELETE_INSTANCES).await?;
    let delete_strays = client.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
    stopwatch.lap(Stage::Begin);
    let txn = Pipelined::new(client);

    let plan = Batch::plan(
        pending.iter().map(|p| (&p.key, p.request.instance_id)),
        store.settings.bucket.cleanup_window,
    );
    let lock_tenants: Vec<&str> = plan.lock.iter().map(|k| k.tenant.as_str()).collect();
    let lock_buckets: Vec<&str> = plan.lock.iter().map(|k| k.bucket.as_str()).collect();
    let lock_params: [&(dyn ToSql + Sync); 2] = [&lock_tenants, &lock_buckets];
    let state_tenants: Vec<&str> = plan.tenants().into_iter().map(TenantId::as_str).collect();
    let state_params: [&(dyn ToSql + Sync); 1] = [&state_tenants];
    let mut windows = WindowColumns::default();
    for (p, window) in pending.iter().zip(&plan.windows) {
        windows.push(&p.key, window);
    }
    let window_params = windows.as_params();
    // One round trip, whatever the batch's size: BEGIN, the lock, then
    // (once it is held) the clock, the tenants' states and every request's
    // instance window.
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let (begun, read) = join(
        txn.client().batch_execute("BEGIN"),
        join_all([
            txn.client().query(&lock, &lock_params[..]),
            txn.client().query(&clock, &no_params[..]),
            txn.client().query(&read_states, &state_params[..]),
            txn.client().query(&load_windows, &window_params[..]),
        ]),
    )
    .await;
    begun?;
    let [head_rows, clock_rows, state_rows, window_rows] = settle(read)?
        .try_into()
        .map_err(|_| StoreError::internal("read a batch's rows", "a statement went missing"))?;
    stopwatch.lap(Stage::Read);
    let clock_row = clock_rows
        .first()
        .ok_or_else(|| StoreError::internal("read the clock", "no row"))?;
    let now = store.now(rows::clock(clock_row, "now")?);

    let heads = head_rows
        .iter()
        .map(|row| Ok((rows::bucket_key(row)?, rows::head_from_row(row)?)))
        .collect::<Result<BTreeMap<_, _>, StoreError>>()?;
    let tenant_states = states::from_rows(&state_rows)?;
    let mut batch = Batch::open(
        plan.lock.iter().cloned(),
        heads,
        &tenant_states,
        &store.settings.unconfigured_tenants,
        now,
    );
    let mut loaded = vec![Vec::new(); pending.len()];
    for row in &window_rows {
        let request: i64 = row
            .try_get("request")
            .map_err(|e| StoreError::internal("read an instance window", e))?;
        let slot = usize::try_from(request - 1)
            .ok()
            .and_then(|i| loaded.get_mut(i))
            .ok_or_else(|| {
                StoreError::internal("read an instance window", format!("no request {request}"))
            })?;
        slot.push(rows::instance_from_row(row)?);
    }
    for (p, instances) in pending.iter().zip(loaded) {
        batch.load(&p.key, instances);
    }
    let answers = pending
        .iter()
        .map(
            |p| match batch.serve(&p.key, &p.request, now, &store.settings.bucket) {
                Answer::Granted(grant) => Some(Ok(grant)),
                Answer::Refused(e) => Some(Err(e.into())),
                Answer::NotFound => Some(Err(StoreError::not_found(&p.key))),
                Answer::TenantRefused(e) => Some(Err(e.into())),
                Answer::Deferred => None,
            },
        )
        .collect();

    // Write back in one round trip, one statement per kind of write.
    let writes = batch.writes();
    let mut stray_tenants = Vec::new();
    let mut stray_buckets = Vec::new();
    let mut inserted = HeadColumns::default();
    let mut updated = HeadColumns::default();
    let mut upserted = InstanceColumns::default();
    let mut deleted: (Vec<&str>, Vec<&str>, Vec<i64>) = Default::default();
    for write in &writes {
        let (tenant, bucket) = (write.key.tenant.as_str(), write.key.bucket.as_str());
        if write.insert {
            stray_tenants.push(tenant);
            stray_buckets.push(bucket);
            inserted.push(write.key, write.head)?;
        } else {
            updated.push(write.key, write.head)?;
        }
        for row in &write.upsert {
            upserted.push(write.key, row)?;
        }
        for id in &write.delete {
            deleted.0.push(tenant);
            deleted.1.push(bucket);
            deleted.2.push(i64::from(*id));
        }
    }
    let stray_params: [&(dyn ToSql + Sync); 2] = [&stray_tenants, &stray_buckets];
    let (inserted_params, updated_params) = (inserted.as_params(), updated.as_params());
    let upserted_params = upserted.as_params();
    let deleted_params: [&(dyn ToSql + Sync); 3] = [&deleted.0, &deleted.1, &deleted.2];
    // Statements run in the order sent: strays go before anything is
    // written. Kinds with nothing to write are not sent.
    let statements = [
        (!stray_tenants.is_empty(), &delete_strays, &stray_params[..]),
        (!inserted.is_empty(), &insert_heads, &inserted_params[..]),
        (!updated.is_empty(), &update_heads, &updated_params[..]),
        (
            !upserted.is_empty(),
            &upsert_instances,
            &upserted_params[..],
        ),
        (
            !deleted.0.is_empty(),
            &delete_instances,
            &deleted_params[..],
        ),
    ];
    stopwatch.lap(Stage::Write);
    let (written, committed) = join(
        join_all(
            statements
                .iter()
                .filter(|(send, _, _)| *send)
                .map(|(_, statement, params)| txn.client().execute(*statement, params)),
        ),
        txn.client().batch_execute("COMMIT"),
    )
    .await;
    // A failed write aborted the transaction, and PostgreSQL answers the
    // COMMIT after it by rolling back: nothing was applied.
    settle(written)?;
    committed.map_err(TxError::Commit)?;
    txn.ended();
    drop(writes);
    stopwatch.lap(Stage::Commit);
    Ok(BatchOutcome {
        answers,
        batch,
        now,
    })
}

/// A pooled connection running a transaction whose BEGIN is sent with its
/// first statements and whose COMMIT with its last, so that a transaction
/// of token-bucket requests costs two round trips. Unlike
/// `tokio_postgres::Transaction`, nothing rolls it back when it is dropped
/// unfinished (an error, a cancelled future): the connection is then closed
/// instead of going back to the pool in the middle of a transaction, and
/// PostgreSQL rolls the transaction back.
struct Pipelined {
    connection: Option<deadpool_postgres::Object>,
}

impl Pipelined {
    fn new(connection: deadpool_postgres::Object) -> Self {
        Self {
            connection: Some(connection),
        }
    }

    fn client(&self) -> &tokio_postgres::Client {
        // Some until `ended` consumes the value.
        self.connection
            .as_deref()
            .map(|wrapper| &**wrapper)
            .expect("a pipelined transaction's connection is held until it ends")
    }

    /// The transaction committed (or rolled back): the connection goes
    /// back to the pool.
    fn ended(mut self) {
        drop(self.connection.take());
    }
}

impl Drop for Pipelined {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            drop(deadpool_postgres::Object::take(connection));
        }
    }
}

/// The parameters of `load_windows.sql`: a request per index; its bucket,
/// and each run of its window as (first, last, limit), in the statement's
/// order (own row, predecessor, following, wrapped).
#[derive(Default)]
struct WindowColumns<'a> {
    tenant: Vec<&'a str>,
    bucket: Vec<&'a str>,
    /// Per run, per part (first, last, limit): a value per request.
    runs: [[Vec<i64>; 3]; 4],
}

impl<'a> WindowColumns<'a> {
    fn push(&mut self, key: &'a BucketKey, window: &InstanceWindow) {
        self.tenant.push(key.tenant.as_str());
        self.bucket.push(key.bucket.as_str());
        let runs = [
            window.own,
            window.predecessor,
            window.following,
            window.wrapped,
        ];
        for (columns, range) in self.runs.iter_mut().zip(runs) {
            columns[0].push(i64::from(range.first));
            columns[1].push(i64::from(range.last));
            columns[2].push(i64::try_from(range.limit).unwrap_or(i64::MAX));
        }
    }

    fn as_params(&self) -> [&(dyn ToSql + Sync); 14] {
        let r = &self.runs;
        [
            &self.tenant,
            &self.bucket,
            &r[0][0],
            &r[0][1],
            &r[0][2],
            &r[1][0],
            &r[1][1],
            &r[1][2],
            &r[2][0],
            &r[2][1],
            &r[2][2],
            &r[3][0],
            &r[3][1],
            &r[3][2],
        ]
    }
}

/// The buckets in `rows` (ordered by key, then instance id), each with its
/// instances; rows of a bucket without its head row are left out.
fn snapshots_from_rows(
    inner: &Inner,
    rows: &[tokio_postgres::Row],
    read_at_column: &'static str,
) -> Result<Vec<BucketSnapshot>, StoreError> {
    let mut out: Vec<BucketSnapshot> = Vec::new();
    for row in rows {
        let key = rows::bucket_key(row)?;
        if rows::row_instance_id(row)? == 0 {
            out.push(BucketSnapshot {
                key,
                head: rows::head_from_row(row)?,
                instances: Vec::new(),
                read_at: inner.now(rows::clock(row, read_at_column)?),
                inactivity_timeout: inner.settings.bucket.inactivity_timeout,
            });
        } else if let Some(last) = out.last_mut().filter(|s| s.key == key) {
            last.instances.push(rows::instance_from_row(row)?);
        }
    }
    Ok(out)
}

/// A JSON document of a tier or tenant record, as the tier tables keep it.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &tokio_postgres::Row,
    column: &'static str,
) -> Result<T, StoreError> {
    let text: &str = row
        .try_get(column)
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    serde_json::from_str(text).map_err(|e| StoreError::internal("decode a stored document", e))
}

/// A tenant record, or `None` for the row a first change of the tenant
/// inserts to lock (`ensure_tenant_record.sql`).
fn record_of(row: &tokio_postgres::Row) -> Result<Option<TenantRecord>, StoreError> {
    let text: Option<&str> = row
        .try_get("record")
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    text.map(|text| {
        serde_json::from_str(text).map_err(|e| StoreError::internal("decode a stored document", e))
    })
    .transpose()
}

/// A tier as `tollgate_tiers.definition` keeps it.
fn tier_of(row: &tokio_postgres::Row) -> Result<Tier, StoreError> {
    json_column(row, "definition")
}

/// A row of `tollgate_tiers`: the tier's name and definition.
fn named_tier(row: &tokio_postgres::Row) -> Result<(TierName, Tier), StoreError> {
    let name: &str = row
        .try_get("name")
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    let name =
        TierName::parse("tier", name).map_err(|e| StoreError::internal("decode tier name", e))?;
    Ok((name, tier_of(row)?))
}

fn to_json<T: serde::Serialize>(what: &'static str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::internal(what, e))
}

/// Appends closed records inside `txn` (`insert_closed_buckets.sql`).
async fn insert_closed(
    txn: &deadpool_postgres::Transaction<'_>,
    closed: &[ClosedBucket],
) -> Result<(), TxError> {
    if closed.is_empty() {
        return Ok(());
    }
    let insert = txn.prepare_cached(sql::INSERT_CLOSED_BUCKETS).await?;
    let tenants: Vec<&str> = closed.iter().map(|c| c.tenant.as_str()).collect();
    let buckets: Vec<&str> = closed.iter().map(|c| c.bucket.as_str()).collect();
    let closed_at: Vec<i64> = closed.iter().map(|c| c.closed_at.unix_micros()).collect();
    let reasons: Vec<&str> = closed.iter().map(|c| c.reason.name()).collect();
    let records = closed
        .iter()
        .map(|c| to_json("encode closed bucket", c))
        .collect::<Result<Vec<String>, StoreError>>()?;
    txn.execute(
        &insert,
        &[&tenants, &buckets, &closed_at, &reasons, &records],
    )
    .await?;
    Ok(())
}

/// A row of `tollgate_closed_buckets` as listed.
fn closed_entry(row: &tokio_postgres::Row) -> Result<ClosedEntry, StoreError> {
    let seq: i64 = row
        .try_get("seq")
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    Ok(ClosedEntry {
        seq: u64::try_from(seq).map_err(|e| StoreError::internal("read a closed bucket", e))?,
        closed: json_column(row, "record")?,
    })
}

/// Runs one tenant change inside `txn`: lock the record, the tier (shared)
/// and the buckets, decide by the core's rules, write. `Ok(Err(_))` is a
/// refusal: nothing was written.
async fn change_in(
    inner: &Inner,
    txn: &deadpool_postgres::Transaction<'_>,
    tenant: &TenantId,
    change: &TenantChange,
    by: &ClosedBy,
) -> Result<Result<TenantChangeOutcome, StoreError>, TxError> {
    let ensure_record = txn.prepare_cached(sql::ENSURE_TENANT_RECORD).await?;
    let lock_record = txn.prepare_cached(sql::LOCK_TENANT_RECORD).await?;
    let share_tier = txn.prepare_cached(sql::SHARE_TIER).await?;
    let read_tier = txn.prepare_cached(sql::READ_TIER).await?;
    let lock_buckets = txn.prepare_cached(sql::LOCK_TENANT).await?;
    let clock = txn.prepare_cached(sql::CLOCK).await?;
    let upsert_record = txn.prepare_cached(sql::UPSERT_TENANT_RECORD).await?;
    let delete_strays = txn.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
    let insert_heads = txn.prepare_cached(sql::INSERT_BUCKETS).await?;
    let update_heads = txn.prepare_cached(sql::UPDATE_BUCKETS).await?;
    let delete_bucket = txn.prepare_cached(sql::DELETE_BUCKET).await?;

    let tenant_id = tenant.as_str();
    // A row to lock even for a tenant without a record yet: two first
    // changes of a tenant serialize on it (the second waits for the first
    // to commit). A change that is refused rolls it back.
    txn.execute(&ensure_record, &[&tenant_id]).await?;
    let record = record_of(&txn.query_one(&lock_record, &[&tenant_id]).await?)?;
    // The tier a tier query found, if it did.
    let tier_by = async |statement, name: Option<TierName>| -> Result<Option<Tier>, TxError> {
        let Some(name) = name else {
            return Ok(None);
        };
        let row = txn.query_opt(statement, &[&name.as_str()]).await?;
        Ok(row.as_ref().map(tier_of).transpose()?)
    };
    let tier = tier_by(&share_tier, change.tier_to_load(record.as_ref())).await?;
    let previous_tier = tier_by(&read_tier, change.previous_tier_to_load(record.as_ref())).await?;
    let heads = txn.query(&lock_buckets, &[&tenant_id]).await?;
    let now = {
        let row = txn.query_one(&clock, &[]).await?;
        inner.now(rows::clock(&row, "now")?)
    };
    let mut buckets = BTreeMap::new();
    for row in &heads {
        buckets.insert(rows::bucket_key(row)?.bucket, rows::head_from_row(row)?);
    }
    let loaded = LoadedTenant {
        record,
        buckets,
        tier,
        previous_tier,
    };
    let edit = match tier::change_tenant(tenant, change, &loaded, now) {
        Ok(edit) => edit,
        Err(e) => return Ok(Err(e.into())),
    };

    let record_json = to_json("encode tenant record", &edit.record)?;
    let tier_name = edit.record.tier.as_ref().map(TierName::as_str);
    txn.execute(&upsert_record, &[&tenant_id, &tier_name, &record_json])
        .await?;
    let created: Vec<_> = edit
        .created
        .iter()
        .map(|(name, head)| (BucketKey::new(tenant.clone(), name.clone()), head))
        .collect();
    let changed: Vec<_> = edit
        .changed
        .iter()
        .map(|(name, head)| (BucketKey::new(tenant.clone(), name.clone()), head))
        .collect();
    if !created.is_empty() {
        let tenants = vec![tenant_id; created.len()];
        let buckets: Vec<&str> = created.iter().map(|(key, _)| key.bucket.as_str()).collect();
        txn.execute(&delete_strays, &[&tenants, &buckets]).await?;
        let columns = HeadColumns::of(created.iter().map(|(key, head)| (key, *head)))?;
        txn.execute(&insert_heads, &columns.as_params()).await?;
    }
    if !changed.is_empty() {
        let columns = HeadColumns::of(changed.iter().map(|(key, head)| (key, *head)))?;
        txn.execute(&update_heads, &columns.as_params()).await?;
    }
    let mut retired = Vec::new();
    let mut closed = Vec::new();
    for name in &edit.retired {
        txn.execute(&delete_bucket, &[&tenant_id, &name.as_str()])
            .await?;
        if let Some(head) = loaded.buckets.get(name) {
            let key = BucketKey::new(tenant.clone(), name.clone());
            closed.push(tier::close_bucket(
                &key,
                head,
                change.close_reason(),
                by,
                now,
            ));
            retired.push(BucketSnapshot {
                key: BucketKey::new(tenant.clone(), name.clone()),
                head: head.clone(),
                instances: Vec::new(),
                read_at: now,
                inactivity_timeout: inner.settings.bucket.inactivity_timeout,
            });
        }
    }
    insert_closed(txn, &closed).await?;
    let revived = states::revive(txn, tenant).await?;
    let mut after = loaded.buckets.clone();
    after.extend(edit.created.clone());
    after.extend(edit.changed.clone());
    for name in &edit.retired {
        after.remove(name);
    }
    Ok(Ok(TenantChangeOutcome {
        view: TenantView {
            tenant: tenant.clone(),
            record: Some(edit.record),
            buckets: after
                .into_iter()
                .map(|(name, head)| BucketSnapshot {
                    key: BucketKey::new(tenant.clone(), name),
                    head,
                    instances: Vec::new(),
                    read_at: now,
                    inactivity_timeout: inner.settings.bucket.inactivity_timeout,
                })
                .collect(),
        },
        created: edit.created.into_keys().collect(),
        changed: edit.changed.into_keys().collect(),
        retired,
        closed,
        revived,
    }))
}

impl PostgresStore {
    async fn tier_change(
        &self,
        tenant: &TenantId,
        change: &TenantChange,
        call: &AdminCall,
    ) -> Result<TenantChangeOutcome, StoreError> {
        let inner = &*self.inner;
        inner
            .run("change tenant", call.dry_run, || async move {
                let mut client = inner.pool.get().await?;
                let txn = client.transaction().await?;
                let outcome = change_in(inner, &txn, tenant, change, &call.by).await?;
                let outcome = outcome.map_err(TxError::Store)?;
                finish(txn, call.dry_run).await?;
                Ok(outcome)
            })
            .await
    }

    /// One pod's partition-load exchange: the tenant's reports row locked
    /// (created if need be), its table limits read, the exchange run and
    /// the row written back (or removed once no report is fresh).
    async fn exchange(
        &self,
        tenant: &TenantId,
        exchange: &Exchange,
    ) -> Result<ExchangeAnswer, StoreError> {
        let inner = &*self.inner;
        inner
            .run("partition load", false, || async move {
                let mut client = inner.pool.get().await?;
                let ensure = client.prepare_cached(sql::ENSURE_PARTITION_REPORTS).await?;
                let lock = client.prepare_cached(sql::LOCK_PARTITION_REPORTS).await?;
                let read_limits = client.prepare_cached(sql::READ_TABLE_LIMITS).await?;
                let clock = client.prepare_cached(sql::CLOCK).await?;
                let upsert = client.prepare_cached(sql::UPSERT_PARTITION_REPORTS).await?;
                let delete = client.prepare_cached(sql::DELETE_PARTITION_REPORTS).await?;
                let read_states = client.prepare_cached(sql::READ_TENANT_STATES).await?;
                let txn = client.transaction().await?;
                let tenant_id = tenant.as_str();
                let params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
                let tenant_ids = [tenant_id];
                let tenants_param = tenant_ids.as_slice();
                let states_params: [&(dyn ToSql + Sync); 1] = [&tenants_param];
                // One round trip: the row made sure of and locked, then the
                // limits, the clock and the tenant's state, read under the
                // lock.
                let no_params: [&(dyn ToSql + Sync); 0] = [];
                let mut results = settle(
                    join_all([
                        txn.query(&ensure, &params[..]),
                        txn.query(&lock, &params[..]),
                        txn.query(&read_limits, &params[..]),
                        txn.query(&clock, &no_params[..]),
                        txn.query(&read_states, &states_params[..]),
                    ])
                    .await,
                )?
                .into_iter()
                .skip(1);
                let locked = results.next().unwrap_or_default();
                let limits_rows = results.next().unwrap_or_default();
                let clock_rows = results.next().unwrap_or_default();
                let state = states::from_rows(&results.next().unwrap_or_default())?.remove(tenant);
                // Refused: the row ensure made is rolled back with the
                // transaction.
                tollgate_core::tenant_state::admit(tenant, state.as_ref())
                    .map_err(|e| TxError::Store(e.into()))?;
                let mut reports: PartitionReports = match locked.first() {
                    Some(row) => json_column(row, "reports")?,
                    None => PartitionReports::default(),
                };
                let limits = match limits_rows.first() {
                    Some(row) => {
                        let record = record_of(row)?;
                        let definition: Option<&str> = row
                            .try_get("definition")
                            .map_err(|e| StoreError::internal("read a stored row", e))?;
                        let tier: Option<Tier> =
                            definition
                                .map(serde_json::from_str)
                                .transpose()
                                .map_err(|e| StoreError::internal("decode a stored document", e))?;
                        partition::tenant_limits(record.as_ref(), tier.as_ref())
                    }
                    None => TableLimitSet::new(),
                };
                let now = match clock_rows.first() {
                    Some(row) => inner.now(rows::clock(row, "now")?),
                    None => {
                        return Err(TxError::Store(StoreError::internal(
                            "read the clock",
                            "no row",
                        )));
                    }
                };
                let answer = partition::exchange(&mut reports, &limits, exchange, now);
                if reports.is_empty() {
                    txn.execute(&delete, &params).await?;
                } else {
                    let json = to_json("encode partition reports", &reports)?;
                    txn.execute(&upsert, &[&tenant_id, &json]).await?;
                }
                txn.commit().await.map_err(TxError::Commit)?;
                Ok(answer)
            })
            .await
    }

    async fn describe(&self, tenant: &TenantId) -> Result<TenantView, StoreError> {
        let inner = &*self.inner;
        inner
            .run("describe tenant", true, || async move {
                let mut client = inner.pool.get().await?;
                let read_record = client.prepare_cached(sql::READ_TENANT_RECORD).await?;
                let list = client.prepare_cached(sql::LIST_TENANT_BUCKETS).await?;
                // One snapshot for the record and the buckets.
                let txn = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await?;
                let tenant_id = tenant.as_str();
                let params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
                let (record, heads) = tokio::join!(
                    txn.query_opt(&read_record, &params),
                    txn.query(&list, &params),
                );
                let record = match record? {
                    Some(row) => record_of(&row)?,
                    None => None,
                };
                let heads = heads?;
                txn.commit().await.map_err(TxError::Commit)?;
                let mut buckets = snapshots_from_rows(inner, &heads, "read_at")?;
                buckets.sort_by(|a, b| a.key.cmp(&b.key));
                if record.is_none() && buckets.is_empty() {
                    return Err(TxError::Store(StoreError::TenantNotFound(tenant.clone())));
                }
                Ok(TenantView {
                    tenant: tenant.clone(),
                    record,
                    buckets,
                })
            })
            .await
    }

    async fn put(
        &self,
        name: &TierName,
        tier: &Tier,
        call: &AdminCall,
    ) -> Result<PutTierOutcome, StoreError> {
        let inner = &*self.inner;
        inner
            .run("put tier", call.dry_run, || async move {
                let mut client = inner.pool.get().await?;
                let lock = client.prepare_cached(sql::LOCK_TIER).await?;
                let clock = client.prepare_cached(sql::CLOCK).await?;
                let upsert = client.prepare_cached(sql::UPSERT_TIER).await?;
                let on_tier = client.prepare_cached(sql::TENANTS_ON_TIER).await?;
                let txn = client.transaction().await?;
                let before: Option<Tier> = txn
                    .query_opt(&lock, &[&name.as_str()])
                    .await?
                    .as_ref()
                    .map(tier_of)
                    .transpose()?;
                let now = {
                    let row = txn.query_one(&clock, &[]).await?;
                    inner.now(rows::clock(&row, "now")?)
                };
                let mut stored = tier.clone();
                stored.created_at = before.as_ref().map_or(now, |b| b.created_at);
                stored.updated_at = now;
                let definition = to_json("encode tier", &stored)?;
                txn.execute(&upsert, &[&name.as_str(), &definition]).await?;
                let tenants = txn.query(&on_tier, &[&name.as_str()]).await?;
                let mut changed = Vec::new();
                for row in &tenants {
                    let tenant = rows::tenant_id(row)?;
                    let reapply = TenantChange::Reapply {
                        previous: before.clone(),
                    };
                    let outcome = change_in(inner, &txn, &tenant, &reapply, &call.by)
                        .await?
                        .map_err(TxError::Store)?;
                    if !(outcome.created.is_empty()
                        && outcome.changed.is_empty()
                        && outcome.retired.is_empty())
                    {
                        changed.push(outcome);
                    }
                }
                finish(txn, call.dry_run).await?;
                Ok(PutTierOutcome {
                    tier: stored,
                    created: before.is_none(),
                    tenants: changed,
                })
            })
            .await
    }

    async fn read_tier(&self, name: &TierName) -> Result<Tier, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read tier", true, || async move {
                let client = inner.pool.get().await?;
                let read = client.prepare_cached(sql::READ_TIER).await?;
                match client.query_opt(&read, &[&name.as_str()]).await? {
                    Some(row) => Ok(tier_of(&row)?),
                    None => Err(TxError::Store(TierError::TierNotFound(name.clone()).into())),
                }
            })
            .await
    }

    async fn all_tiers(&self) -> Result<Vec<(TierName, Tier)>, StoreError> {
        let inner = &*self.inner;
        inner
            .run("list tiers", true, || async move {
                let client = inner.pool.get().await?;
                let list = client.prepare_cached(sql::LIST_TIERS).await?;
                let mut tiers = client
                    .query(&list, &[])
                    .await?
                    .iter()
                    .map(named_tier)
                    .collect::<Result<Vec<(TierName, Tier)>, StoreError>>()?;
                tiers.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(tiers)
            })
            .await
    }

    async fn remove_tier(&self, name: &TierName) -> Result<(), StoreError> {
        let inner = &*self.inner;
        inner
            .run("delete tier", false, || async move {
                let mut client = inner.pool.get().await?;
                let lock = client.prepare_cached(sql::LOCK_TIER).await?;
                let count = client.prepare_cached(sql::COUNT_TENANTS_ON_TIER).await?;
                let delete = client.prepare_cached(sql::DELETE_TIER).await?;
                let txn = client.transaction().await?;
                if txn.query_opt(&lock, &[&name.as_str()]).await?.is_none() {
                    return Err(TxError::Store(TierError::TierNotFound(name.clone()).into()));
                }
                let users = txn.query(&count, &[&name.as_str()]).await?;
                if let Some(first) = users.first() {
                    let total: i64 = first
                        .try_get("total")
                        .map_err(|e| StoreError::internal("read a stored row", e))?;
                    let examples = users
                        .iter()
                        .map(rows::tenant_id)
                        .collect::<Result<Vec<_>, _>>()?;
                    return Err(TxError::Store(
                        TierError::TierInUse {
                            tier: name.clone(),
                            count: total.unsigned_abs(),
                            examples,
                        }
                        .into(),
                    ));
                }
                txn.execute(&delete, &[&name.as_str()]).await?;
                txn.commit().await.map_err(TxError::Commit)?;
                Ok(())
            })
            .await
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
                let insert = client.prepare_cached(sql::INSERT_BUCKETS).await?;
                let update_row = client.prepare_cached(sql::UPDATE_BUCKETS).await?;
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
        self.tier_change(tenant, change, call).await
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
        self.describe(tenant).await
    }

    async fn partition_load(
        &self,
        tenant: &TenantId,
        exchange: &Exchange,
    ) -> Result<ExchangeAnswer, StoreError> {
        self.exchange(tenant, exchange).await
    }

    async fn put_tier_by(
        &self,
        name: &TierName,
        tier: &Tier,
        call: &AdminCall,
    ) -> Result<PutTierOutcome, StoreError> {
        self.put(name, tier, call).await
    }

    async fn get_tier(&self, name: &TierName) -> Result<Tier, StoreError> {
        self.read_tier(name).await
    }

    async fn list_tiers(&self) -> Result<Vec<(TierName, Tier)>, StoreError> {
        self.all_tiers().await
    }

    async fn delete_tier(&self, name: &TierName) -> Result<(), StoreError> {
        self.remove_tier(name).await
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
