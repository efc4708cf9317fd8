//! The production store: PostgreSQL (and PostgreSQL-compatible distributed
//! SQL), shared by any number of server replicas.
//!
//! State lives in one table, `tenant_usage` (schema in `sql/migrations`,
//! applied at start by [`migrate`]). The SQL lives in `sql/queries`, one
//! statement per file, and is portable: no advisory locks, no session state,
//! the database's default isolation level. Correctness across replicas rests
//! on one rule: every transaction that changes a tenant first locks its
//! tenant row (`SELECT … FOR UPDATE`), reads the clock and the instance rows
//! after that, and writes back what the core changed. Under READ COMMITTED
//! (PostgreSQL's default) the lock orders the transactions of a tenant;
//! under SERIALIZABLE (CockroachDB's) a conflict aborts one of them with
//! 40001 and it is retried.
//!
//! Token-bucket requests are batched (group commit). There is one worker
//! per pooled connection, and each tenant belongs to one worker (by a hash
//! of its id): the transactions of a tenant serialize on its row lock
//! anyway, so within a replica they queue in memory instead of in the
//! database, and workers never wait on each other's locks. A worker takes
//! whatever requests are queued for it, up to `max_batch`, and serves them
//! in one transaction. It locks the batch's tenant rows in id order, loads
//! each request's instance window, and runs the core state machine on each
//! request in turn, on the same in-memory rows, so requests of one tenant
//! see each other's changes exactly as if they had been separate
//! transactions. Each request stays atomic (a refused one changes
//! nothing) and idempotent (its lease and sequence number are in the rows),
//! and nobody hears back before the commit that holds their change. One
//! case is not batched: once a request has removed silent instances, the
//! rest of its tenant's requests wait for the next transaction, since the
//! rows they need may no longer all be loaded.
//!
//! Every transaction is retried on conflicts and lost connections (see
//! [`retry`]); retries are logged and counted in [`StoreStats`].

mod retry;
mod rows;
mod tls;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts, tokio_postgres,
};
use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres_rustls::MakeRustlsConnect;
use tollgate_core::global_bucket::{self, BucketRows};
use tollgate_core::{
    Grant, InstanceState, LimitsUpdate, TenantId, TenantState, Timestamp, TokenBucketRequest,
};

use self::retry::{TxError, Verdict, chain};
use self::rows::{InstanceParams, TenantParams};
use super::{
    BucketSettings, Clock, Counters, LimitsChange, Store, StoreError, StoreStats, TenantSnapshot,
    UnconfiguredTenants,
};

pub use self::retry::RetryPolicy;
pub use self::tls::PostgresTls;

mod sql {
    pub const LOCK_TENANTS: &str = include_str!("../../../../../sql/queries/lock_tenants.sql");
    pub const CLOCK: &str = include_str!("../../../../../sql/queries/clock.sql");
    pub const LOAD_WINDOW: &str = include_str!("../../../../../sql/queries/load_window.sql");
    pub const INSERT_TENANT: &str = include_str!("../../../../../sql/queries/insert_tenant.sql");
    pub const UPDATE_TENANT: &str = include_str!("../../../../../sql/queries/update_tenant.sql");
    pub const UPSERT_INSTANCE: &str =
        include_str!("../../../../../sql/queries/upsert_instance.sql");
    pub const DELETE_INSTANCE: &str =
        include_str!("../../../../../sql/queries/delete_instance.sql");
    pub const READ_INSTANCES: &str = include_str!("../../../../../sql/queries/read_instances.sql");
    pub const READ_TENANT: &str = include_str!("../../../../../sql/queries/read_tenant.sql");
    pub const LIST_TENANTS: &str = include_str!("../../../../../sql/queries/list_tenants.sql");
    pub const DELETE_TENANT: &str = include_str!("../../../../../sql/queries/delete_tenant.sql");
    pub const DELETE_STRAY_INSTANCES: &str =
        include_str!("../../../../../sql/queries/delete_stray_instances.sql");
}

mod embedded_migrations {
    refinery::embed_migrations!("../../sql/migrations");
}

/// How to reach the database and how hard to work it.
#[derive(Clone, Debug, PartialEq)]
pub struct PostgresOptions {
    /// A libpq-style URL or key/value string, e.g. `postgres://user@host:5432/db`.
    pub url: String,
    /// Connections in the pool; also the number of transactions in flight.
    pub pool_size: usize,
    /// The most token-bucket requests served by one transaction.
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
    migrate_with(&config, connector.as_ref()).await
}

fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    url.parse()
        .map_err(|e| StoreError::internal("parse the PostgreSQL URL", e))
}

/// [`migrate`] with the URL parsed and the TLS connector (if any) built.
async fn migrate_with(
    config: &tokio_postgres::Config,
    connector: Option<&MakeRustlsConnect>,
) -> Result<(), StoreError> {
    let policy = RetryPolicy::default();
    let mut attempt = 1;
    loop {
        let outcome = match connector {
            Some(tls) => migrate_once(config, tls.clone()).await,
            None => migrate_once(config, NoTls).await,
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

async fn migrate_once<T>(config: &tokio_postgres::Config, tls: T) -> Result<Vec<String>, StoreError>
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
    let report = embedded_migrations::migrations::runner()
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
    /// One queue per worker; a tenant's requests go to `shard(tenant)`.
    requests: std::sync::Mutex<Option<Vec<mpsc::Sender<Pending>>>>,
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
    tenant: TenantId,
    request: TokenBucketRequest,
    reply: oneshot::Sender<Result<Grant, StoreError>>,
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
        migrate_with(&config, connector.as_ref()).await?;
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
            .map(|_| mpsc::channel(options.max_batch * 4))
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

/// The worker that serves `tenant`'s requests, of `workers`.
fn shard(tenant: &TenantId, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same tenant goes to the same worker in every process.
    let mut hasher = std::hash::DefaultHasher::new();
    tenant.as_str().hash(&mut hasher);
    usize::try_from(hasher.finish() % workers.max(1) as u64).unwrap_or(0)
}

fn closed() -> StoreError {
    StoreError::Unavailable("the PostgreSQL store is closed".into())
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

    /// A batching worker: takes what is queued, serves it in one transaction.
    async fn work(self: Arc<Self>, mut queue: mpsc::Receiver<Pending>) {
        let max = self.options.max_batch;
        loop {
            let mut batch = Vec::with_capacity(max);
            if queue.recv_many(&mut batch, max).await == 0 {
                return;
            }
            while !batch.is_empty() {
                batch = self.serve_batch(batch).await;
            }
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
        for (tenant, removed) in outcome.removed {
            self.counters
                .instances_removed
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                tenant = %tenant,
                instance = removed.instance_id,
                silent_for = ?outcome.now.duration_since(removed.last_update),
                "removed silent instance"
            );
        }
        deferred
    }
}

/// What a committed batch did.
struct BatchOutcome {
    /// Per request, in batch order: its answer, or `None` if it was deferred.
    answers: Vec<Option<Result<Grant, StoreError>>>,
    removed: Vec<(TenantId, InstanceState)>,
    now: Timestamp,
}

/// One tenant's rows within a batch.
struct TenantWork {
    rows: BucketRows,
    /// The tenant row exists in the database (else it is inserted).
    exists: bool,
    /// A request changed the rows (else nothing is written).
    dirty: bool,
    upserted: BTreeSet<u32>,
    removed: Vec<InstanceState>,
}

async fn token_bucket_batch(store: &Inner, batch: &[Pending]) -> Result<BatchOutcome, TxError> {
    let mut client = store.pool.get().await?;
    let lock = client.prepare_cached(sql::LOCK_TENANTS).await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let window = client.prepare_cached(sql::LOAD_WINDOW).await?;
    let insert_tenant = client.prepare_cached(sql::INSERT_TENANT).await?;
    let update_tenant = client.prepare_cached(sql::UPDATE_TENANT).await?;
    let upsert_instance = client.prepare_cached(sql::UPSERT_INSTANCE).await?;
    let delete_instance = client.prepare_cached(sql::DELETE_INSTANCE).await?;
    let delete_strays = client.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
    let txn = client.transaction().await?;

    let tenant_ids: Vec<&str> = batch
        .iter()
        .map(|p| p.tenant.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let cleanup_window = i64::try_from(store.settings.bucket.cleanup_window).unwrap_or(i64::MAX);
    let window_keys: Vec<(&str, i64)> = batch
        .iter()
        .map(|p| (p.tenant.as_str(), i64::from(p.request.instance_id)))
        .collect();
    let window_params: Vec<[&(dyn ToSql + Sync); 3]> = window_keys
        .iter()
        .map(|(tenant, id)| -> [&(dyn ToSql + Sync); 3] { [tenant, id, &cleanup_window] })
        .collect();
    let lock_params: [&(dyn ToSql + Sync); 1] = [&tenant_ids];
    // One round trip: the lock first, then (once it is held) the clock and
    // the instance windows.
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let mut read = settle(
        join_all(
            [
                txn.query(&lock, &lock_params[..]),
                txn.query(&clock, &no_params[..]),
            ]
            .into_iter()
            .chain(
                window_params
                    .iter()
                    .map(|params| txn.query(&window, &params[..])),
            ),
        )
        .await,
    )?
    .into_iter();
    let (tenant_rows, clock_rows) = (
        read.next().unwrap_or_default(),
        read.next().unwrap_or_default(),
    );
    let windows: Vec<_> = read.collect();
    let clock_row = clock_rows
        .first()
        .ok_or_else(|| StoreError::internal("read the clock", "no row"))?;
    let now = store.now(rows::clock(clock_row, "now")?);

    let mut tenants: HashMap<&str, Option<TenantWork>> = HashMap::new();
    for row in &tenant_rows {
        let state = rows::tenant_from_row(row)?;
        let id = tenant_ids
            .iter()
            .find(|id| row.get::<_, &str>("tenant_id") == **id)
            .copied()
            .ok_or_else(|| StoreError::internal("lock tenant rows", "unexpected tenant row"))?;
        tenants.insert(
            id,
            Some(TenantWork {
                rows: BucketRows {
                    tenant: state,
                    instances: BTreeMap::new(),
                },
                exists: true,
                dirty: false,
                upserted: BTreeSet::new(),
                removed: Vec::new(),
            }),
        );
    }
    for id in &tenant_ids {
        tenants
            .entry(*id)
            .or_insert_with(|| match &store.settings.unconfigured_tenants {
                UnconfiguredTenants::Reject => None,
                UnconfiguredTenants::UseDefaults(d) => Some(TenantWork {
                    rows: BucketRows {
                        tenant: TenantState::new(d.limits, d.initial_tokens, false, now),
                        instances: BTreeMap::new(),
                    },
                    exists: false,
                    dirty: false,
                    upserted: BTreeSet::new(),
                    removed: Vec::new(),
                }),
            });
    }
    for (p, window_rows) in batch.iter().zip(&windows) {
        // Instance rows of a tenant without a tenant row are strays (see
        // `delete_stray_instances.sql`): a new tenant starts with none.
        if let Some(Some(work)) = tenants.get_mut(p.tenant.as_str())
            && work.exists
        {
            for row in window_rows {
                let instance = rows::instance_from_row(row)?;
                work.rows
                    .instances
                    .entry(instance.instance_id)
                    .or_insert(instance);
            }
        }
    }

    let mut answers = Vec::with_capacity(batch.len());
    for p in batch {
        let Some(entry) = tenants.get_mut(p.tenant.as_str()) else {
            answers.push(Some(Err(StoreError::internal(
                "token bucket request",
                "tenant missing from its batch",
            ))));
            continue;
        };
        let Some(work) = entry else {
            answers.push(Some(Err(StoreError::TenantNotFound(p.tenant.clone()))));
            continue;
        };
        if !work.removed.is_empty() {
            answers.push(None);
            continue;
        }
        match global_bucket::request(&mut work.rows, &p.request, now, &store.settings.bucket) {
            Ok(outcome) => {
                if !outcome.duplicate {
                    work.dirty = true;
                    work.upserted.extend(outcome.changes.upserted);
                    work.removed.extend(outcome.changes.removed);
                }
                answers.push(Some(Ok(outcome.grant)));
            }
            Err(e) => answers.push(Some(Err(e.into()))),
        }
    }

    // Write back, in one round trip.
    let mut tenant_params = Vec::new();
    let mut strays = Vec::new();
    let mut instance_params = Vec::new();
    let mut deletes = Vec::new();
    let mut removed = Vec::new();
    for id in &tenant_ids {
        let Some(Some(work)) = tenants.get(id) else {
            continue;
        };
        if !work.dirty {
            continue;
        }
        let tenant = TenantId::parse("tenant_id", id)
            .map_err(|e| StoreError::internal("token bucket request", e))?;
        tenant_params.push((work.exists, TenantParams::new(&tenant, &work.rows.tenant)?));
        if !work.exists {
            strays.push(*id);
        }
        let gone: BTreeSet<u32> = work.removed.iter().map(|r| r.instance_id).collect();
        for instance in work.upserted.difference(&gone) {
            if let Some(row) = work.rows.instances.get(instance) {
                instance_params.push(InstanceParams::new(&tenant, row)?);
            }
        }
        for row in &work.removed {
            deletes.push((*id, i64::from(row.instance_id)));
            removed.push((tenant.clone(), row.clone()));
        }
    }
    let tenant_writes: Vec<_> = tenant_params
        .iter()
        .map(|(exists, params)| (*exists, params.as_params()))
        .collect();
    let instance_writes: Vec<_> = instance_params
        .iter()
        .map(InstanceParams::as_params)
        .collect();
    let delete_params: Vec<[&(dyn ToSql + Sync); 2]> = deletes
        .iter()
        .map(|(tenant, id)| -> [&(dyn ToSql + Sync); 2] { [tenant, id] })
        .collect();
    let stray_params: Vec<[&(dyn ToSql + Sync); 1]> = strays
        .iter()
        .map(|tenant| -> [&(dyn ToSql + Sync); 1] { [tenant] })
        .collect();
    // Statements run in the order sent: strays go before anything is written.
    settle(
        join_all(
            stray_params
                .iter()
                .map(|params| txn.execute(&delete_strays, params))
                .chain(tenant_writes.iter().map(|(exists, params)| {
                    let statement = if *exists {
                        &update_tenant
                    } else {
                        &insert_tenant
                    };
                    txn.execute(statement, params)
                }))
                .chain(
                    instance_writes
                        .iter()
                        .map(|params| txn.execute(&upsert_instance, params)),
                )
                .chain(
                    delete_params
                        .iter()
                        .map(|params| txn.execute(&delete_instance, params)),
                ),
        )
        .await,
    )?;
    txn.commit().await.map_err(TxError::Commit)?;
    Ok(BatchOutcome {
        answers,
        removed,
        now,
    })
}

fn snapshot_from_rows(
    inner: &Inner,
    tenant: &TenantId,
    rows: &[tokio_postgres::Row],
    read_at_column: &'static str,
) -> Result<Option<TenantSnapshot>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    if rows::row_instance_id(first)? != 0 {
        return Ok(None);
    }
    let instances = rows[1..]
        .iter()
        .map(rows::instance_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(TenantSnapshot {
        tenant_id: tenant.clone(),
        state: rows::tenant_from_row(first)?,
        instances,
        read_at: inner.now(rows::clock(first, read_at_column)?),
    }))
}

/// The tenant a `DELETE … RETURNING` removed, from its rows in any order.
fn deleted_tenant(
    inner: &Inner,
    tenant: &TenantId,
    deleted: &[tokio_postgres::Row],
) -> Result<TenantSnapshot, StoreError> {
    for row in deleted {
        if rows::row_instance_id(row)? == 0 {
            return Ok(TenantSnapshot {
                tenant_id: tenant.clone(),
                state: rows::tenant_from_row(row)?,
                instances: Vec::new(),
                read_at: inner.now(rows::clock(row, "read_at")?),
            });
        }
    }
    Err(StoreError::TenantNotFound(tenant.clone()))
}

#[async_trait]
impl Store for PostgresStore {
    async fn token_bucket(
        &self,
        tenant: &TenantId,
        request: &TokenBucketRequest,
    ) -> Result<Grant, StoreError> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            tenant: tenant.clone(),
            request: request.clone(),
            reply,
        };
        let sender = {
            let queues = self.queue.requests.lock().map_err(|_| closed())?;
            let queues = queues.as_ref().ok_or_else(closed)?;
            queues[shard(tenant, queues.len())].clone()
        };
        sender.send(pending).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    async fn update_limits(
        &self,
        tenant: &TenantId,
        update: &LimitsUpdate,
    ) -> Result<LimitsChange, StoreError> {
        let inner = &*self.inner;
        inner
            .run("update tenant limits", false, || async move {
                let mut client = inner.pool.get().await?;
                let lock = client.prepare_cached(sql::LOCK_TENANTS).await?;
                let clock = client.prepare_cached(sql::CLOCK).await?;
                let insert = client.prepare_cached(sql::INSERT_TENANT).await?;
                let update_row = client.prepare_cached(sql::UPDATE_TENANT).await?;
                let read_instances = client.prepare_cached(sql::READ_INSTANCES).await?;
                let delete_strays = client.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
                let txn = client.transaction().await?;
                let ids = [tenant.as_str()];
                let ids = ids.as_slice();
                let lock_params: [&(dyn ToSql + Sync); 1] = [&ids];
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
                let before = found.first().map(rows::tenant_from_row).transpose()?;
                let mut state = before
                    .clone()
                    .unwrap_or_else(|| TenantState::new(update.limits, 0.0, true, now));
                if let Err(e) = global_bucket::reconfigure(&mut state, update, now) {
                    return Err(TxError::Store(e.into()));
                }
                let params = TenantParams::new(tenant, &state)?;
                let statement = if before.is_some() {
                    &update_row
                } else {
                    // A new tenant starts with an empty instance list.
                    let tenant_id = tenant.as_str();
                    txn.execute(&delete_strays, &[&tenant_id]).await?;
                    &insert
                };
                let write_params = params.as_params();
                let tenant_id = tenant.as_str();
                let read_params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
                let (written, instance_rows) = tokio::join!(
                    txn.execute(statement, &write_params),
                    txn.query(&read_instances, &read_params),
                );
                let instance_rows = match (written, instance_rows) {
                    (Ok(_), Ok(rows)) => rows,
                    (written, read) => {
                        return Err(settle(vec![written.map(|_| ()), read.map(|_| ())])
                            .err()
                            .map_or_else(
                                || {
                                    TxError::Store(StoreError::internal(
                                        "update tenant limits",
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
                txn.commit().await.map_err(TxError::Commit)?;
                Ok(LimitsChange {
                    before,
                    after: TenantSnapshot {
                        tenant_id: tenant.clone(),
                        state,
                        instances,
                        read_at: now,
                    },
                })
            })
            .await
    }

    async fn get_tenant(&self, tenant: &TenantId) -> Result<TenantSnapshot, StoreError> {
        let inner = &*self.inner;
        inner
            .run("read tenant", true, || async move {
                let client = inner.pool.get().await?;
                let read = client.prepare_cached(sql::READ_TENANT).await?;
                let found = client.query(&read, &[&tenant.as_str()]).await?;
                snapshot_from_rows(inner, tenant, &found, "read_at")?
                    .ok_or_else(|| TxError::Store(StoreError::TenantNotFound(tenant.clone())))
            })
            .await
    }

    async fn list_tenants(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> Result<Vec<TenantSnapshot>, StoreError> {
        let after = after.map_or("", TenantId::as_str);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let inner = &*self.inner;
        inner
            .run("list tenants", true, || async move {
                let client = inner.pool.get().await?;
                let list = client.prepare_cached(sql::LIST_TENANTS).await?;
                let found = client.query(&list, &[&after, &limit]).await?;
                found
                    .iter()
                    .map(|row| {
                        Ok(TenantSnapshot {
                            tenant_id: rows::tenant_id(row)?,
                            state: rows::tenant_from_row(row)?,
                            instances: Vec::new(),
                            read_at: inner.now(rows::clock(row, "read_at")?),
                        })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
                    .map_err(TxError::Store)
            })
            .await
    }

    async fn delete_tenant(&self, tenant: &TenantId) -> Result<TenantSnapshot, StoreError> {
        let inner = &*self.inner;
        inner
            .run("delete tenant", false, || async move {
                let mut client = inner.pool.get().await?;
                let lock = client.prepare_cached(sql::LOCK_TENANTS).await?;
                let delete = client.prepare_cached(sql::DELETE_TENANT).await?;
                let txn = client.transaction().await?;
                let ids = [tenant.as_str()];
                let ids = ids.as_slice();
                let tenant_id = tenant.as_str();
                let lock_params: [&(dyn ToSql + Sync); 1] = [&ids];
                let delete_params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
                // One round trip: the lock first, then (once it is held) the
                // delete, whose snapshot sees every row committed before it.
                let mut results = settle(
                    join_all([
                        txn.query(&lock, &lock_params[..]),
                        txn.query(&delete, &delete_params[..]),
                    ])
                    .await,
                )?
                .into_iter();
                let deleted = results.nth(1).unwrap_or_default();
                let snapshot = deleted_tenant(inner, tenant, &deleted).map_err(TxError::Store)?;
                txn.commit().await.map_err(TxError::Commit)?;
                Ok(snapshot)
            })
            .await
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
