//! The single writer thread: it drains whatever operations are queued and
//! commits them in one write transaction (group commit), each operation
//! standing alone; a dry run gets a transaction of its own, aborted.

use super::*;

/// One queued write: it runs inside the writer's batch transaction and is
/// answered after the batch commits (or fails).
pub(super) trait PendingWrite: Send {
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

pub(super) type Work<T> = Box<
    dyn FnOnce(&Writer, &WriteTransaction, Timestamp) -> Result<Result<T, StoreError>, StoreError>
        + Send,
>;

pub(super) struct Write<T> {
    pub(super) work: Option<Work<T>>,
    pub(super) dry_run: bool,
    pub(super) result: Option<Result<T, StoreError>>,
    pub(super) reply: oneshot::Sender<Result<T, StoreError>>,
    pub(super) queued_at: Instant,
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

/// The single writer: batches queued operations into one transaction each.
pub(super) struct Writer {
    pub(super) db: Arc<Database>,
    pub(super) settings: BucketSettings,
    pub(super) clock: Clock,
    pub(super) counters: Arc<Counters>,
}

/// A served token-bucket request: its grant, and the transaction that
/// served it, to report its removals once committed.
pub(super) struct Served {
    pub(super) grant: Grant,
    pub(super) batch: Batch,
    pub(super) now: Timestamp,
}

impl Writer {
    pub(super) fn inactivity_timeout(&self) -> Duration {
        self.settings.bucket.inactivity_timeout
    }

    pub(super) fn settings(&self) -> &BucketSettings {
        &self.settings
    }

    pub(super) fn run(self, mut rx: mpsc::UnboundedReceiver<Box<dyn PendingWrite>>) {
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

    pub(super) fn commit_batch(
        &self,
        batch: &mut [Box<dyn PendingWrite>],
    ) -> Result<(), StoreError> {
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
    pub(super) fn roll_back(&self, op: &mut dyn PendingWrite) -> Result<(), StoreError> {
        let now = (self.clock)();
        let txn = self
            .db
            .begin_write()
            .map_err(storage("begin write transaction"))?;
        op.apply(self, &txn, now)?;
        txn.abort().map_err(storage("abort a dry run"))
    }
}
