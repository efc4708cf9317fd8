//! The workers: one per pooled connection, each tenant's requests on one
//! of them, batched into transactions (see the module docs of the store),
//! and the retry loop every transaction runs in ([`Inner::run`]).

use super::*;

/// How long an idle worker with owed draws waits for requests before it
/// makes them alone.
const OWED_WAIT: Duration = Duration::from_millis(20);

/// What the workers share.
pub(super) struct Inner {
    pub(super) pool: Pool,
    pub(super) settings: BucketSettings,
    pub(super) options: PostgresOptions,
    pub(super) counters: Counters,
    /// Replaces the database's clock (tests that move time).
    pub(super) clock: Option<Clock>,
    /// Organisation rows this replica's transactions are drawing on.
    pub(super) draw_latches: super::latches::DrawLatches,
}

/// The way into the workers; only the store's handles hold it, so dropping
/// the last handle closes the queue and lets the workers finish.
pub(super) struct Queue {
    /// One queue per worker; a tenant's requests and checks go to
    /// `shard(tenant)`.
    pub(super) requests: std::sync::Mutex<Option<Vec<mpsc::Sender<Job>>>>,
    pub(super) workers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// A queued token-bucket request.
pub(super) struct Pending {
    pub(super) key: BucketKey,
    pub(super) request: TokenBucketRequest,
    pub(super) reply: oneshot::Sender<Result<Grant, StoreError>>,
    /// When it was queued, until its wait is recorded (a deferred request
    /// waits again, but counts once).
    pub(super) queued_at: Option<Instant>,
}

/// What a worker serves: token-bucket requests and checks, each kind
/// batched into transactions of its own.
pub(super) enum Job {
    TokenBucket(Box<Pending>),
    Check(PendingCheck),
}

impl Inner {
    /// The store's clock: the database's, read in the transaction, unless
    /// a test replaced it.
    pub(super) fn now(&self, database_clock: Timestamp) -> Timestamp {
        self.clock.as_ref().map_or(database_clock, |clock| clock())
    }

    /// The store's clock ([`Inner::now`] of the database's), read on
    /// `client` outside a transaction of rows.
    pub(super) async fn read_clock(
        &self,
        client: &deadpool_postgres::Client,
    ) -> Result<Timestamp, TxError> {
        let clock = client.prepare_cached(sql::CLOCK).await?;
        Ok(self.now(rows::clock(&client.query_one(&clock, &[]).await?, "now")?))
    }
}

impl Inner {
    /// Runs `attempt` until it succeeds, fails for good, or runs out of
    /// attempts; logs and counts the retries.
    pub(super) async fn run<T, F, Fut>(
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
    pub(super) async fn work(self: Arc<Self>, mut queue: mpsc::Receiver<Job>) {
        let max_requests = self.options.max_batch;
        let max_checks = max_requests.saturating_mul(CHECKS_PER_REQUEST_BATCH);
        // Draws this worker's transactions skipped for a held organisation
        // row (see `latches`).
        let mut owed = Owed::default();
        loop {
            let mut jobs = Vec::with_capacity(max_checks);
            let received = if owed.is_empty() {
                queue.recv_many(&mut jobs, max_checks).await
            } else {
                match tokio::time::timeout(OWED_WAIT, queue.recv_many(&mut jobs, max_checks)).await
                {
                    Ok(received) => received,
                    Err(_idle) => {
                        // Nothing queued: the owed draws go alone.
                        self.serve_owing(Vec::new(), &mut owed, true).await;
                        continue;
                    }
                }
            };
            if received == 0 {
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
            // ones go first into the next. Owed draws go with the first.
            let mut first = true;
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(max_requests));
                batch = self.serve_owing(batch, &mut owed, first).await;
                first = false;
                batch.extend(rest);
            }
        }
    }

    /// Serves a batch of checks in one transaction and answers them.
    pub(super) async fn serve_checks(&self, mut batch: Vec<PendingCheck>) {
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

    /// Serves `batch` as [`Inner::serve_batch`] does, and with it, if
    /// `with_owed`, the draws `owed` whose organisation rows it can latch;
    /// keeps `owed` up to date. Returns the requests deferred.
    async fn serve_owing(
        &self,
        batch: Vec<Pending>,
        owed: &mut Owed,
        with_owed: bool,
    ) -> Vec<Pending> {
        let latched = self.draw_latches.none();
        let members = if with_owed && !owed.is_empty() {
            owed.latch(&latched)
        } else {
            Vec::new()
        };
        let (deferred, skipped) = self.serve_batch(batch, &members, latched).await;
        owed.settle(&members, skipped);
        deferred
    }

    /// Serves a batch in one transaction and answers its requests, making
    /// the draws `owed` too, with the organisation rows `latched` holds
    /// (theirs) and any it takes; returns the requests deferred to another
    /// transaction and the draws owed to the next.
    pub(super) async fn serve_batch(
        &self,
        mut batch: Vec<Pending>,
        owed: &[BucketKey],
        latched: Latched<'_>,
    ) -> (Vec<Pending>, Vec<Skipped>) {
        // A caller that has gone (its deadline passed, it cancelled) was
        // told nothing was certain; what has not started never starts.
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() && owed.is_empty() {
            return (batch, Vec::new());
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
                token_bucket_batch(self, &batch, owed, &latched)
            })
            .await;
        // The transaction is over: its organisation rows are free before
        // its callers hear, so a caller's next request never finds them
        // latched by a transaction that has ended.
        drop(latched);
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.for_another_caller()));
                }
                // The owed draws are still due: their buckets' next
                // requests draw.
                return (Vec::new(), Vec::new());
            }
        };
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        self.counters
            .owed_draws
            .fetch_add(owed.len() as u64, Ordering::Relaxed);
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
        (deferred, outcome.owed)
    }
}

/// The results of a pipelined flight of statements, or the error that
/// caused its failure. Once a statement fails, PostgreSQL refuses the rest
/// of the transaction's statements with 25P02 (in failed transaction); the
/// first other error, in statement order, is the cause, and it decides
/// whether the transaction is retried.
pub(super) fn settle<T>(
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
pub(super) fn shard(tenant: &TenantId, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same tenant goes to the same worker in every process.
    let mut hasher = std::hash::DefaultHasher::new();
    tenant.hash(&mut hasher);
    usize::try_from(hasher.finish() % workers.max(1) as u64).unwrap_or(0)
}

pub(super) fn closed() -> StoreError {
    StoreError::Unavailable("the PostgreSQL store is closed".into())
}

/// Commits `txn`, or for a dry run rolls it back.
pub(super) async fn finish(
    txn: deadpool_postgres::Transaction<'_>,
    dry_run: bool,
) -> Result<(), TxError> {
    if dry_run {
        txn.rollback().await?;
        Ok(())
    } else {
        txn.commit().await.map_err(TxError::Commit)
    }
}

/// A pooled connection running a transaction whose BEGIN is sent with its
/// first statements and whose COMMIT with its last, so that a transaction
/// of token-bucket requests costs two round trips. Unlike
/// `tokio_postgres::Transaction`, nothing rolls it back when it is dropped
/// unfinished (an error, a cancelled future): the connection is then closed
/// instead of going back to the pool in the middle of a transaction, and
/// PostgreSQL rolls the transaction back.
pub(super) struct Pipelined {
    pub(super) connection: Option<deadpool_postgres::Object>,
}

impl Pipelined {
    pub(super) fn new(connection: deadpool_postgres::Object) -> Self {
        Self {
            connection: Some(connection),
        }
    }

    pub(super) fn client(&self) -> &tokio_postgres::Client {
        // Some until `ended` consumes the value.
        self.connection
            .as_deref()
            .map(|wrapper| &**wrapper)
            .expect("a pipelined transaction's connection is held until it ends")
    }

    /// The transaction committed (or rolled back): the connection goes
    /// back to the pool.
    pub(super) fn ended(mut self) {
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
