//! Token buckets' rows: the batched transaction of token-bucket requests
//! (two round trips, see the store's module docs), instance windows,
//! snapshots and closed records.

use super::*;

/// What a committed batch did.
pub(super) struct BatchOutcome {
    /// Per request, in batch order: its answer, or `None` if it was deferred.
    pub(super) answers: Vec<Option<Result<Grant, StoreError>>>,
    /// The transaction script's state, to report its removals.
    pub(super) batch: Batch,
    pub(super) now: Timestamp,
    /// Draws skipped because their organisation's row was held: owed,
    /// for the worker's next transaction (see `latches`).
    pub(super) owed: Vec<Skipped>,
}

/// Serves `pending` in one transaction, by the script of
/// `tollgate_core::transaction`, and makes the draws of `owed` (member
/// buckets whose draws the worker's earlier transactions left, see
/// `latches`): this function only reads and writes rows. `latched` holds
/// the organisation rows this transaction may lock.
pub(super) async fn token_bucket_batch(
    store: &Inner,
    pending: &[Pending],
    owed: &[BucketKey],
    latched: &Latched<'_>,
) -> Result<BatchOutcome, TxError> {
    let mut stopwatch = Stopwatch::new(&store.counters.stages);
    let client = store.pool.get().await?;
    let lock = client.prepare_cached(sql::LOCK_BUCKETS).await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let load_windows = client.prepare_cached(sql::LOAD_WINDOWS).await?;
    let read_states = client.prepare_cached(sql::READ_TENANT_STATES).await?;
    let read_nodes = client.prepare_cached(sql::READ_NODES).await?;
    let lock_parents = client.prepare_cached(sql::LOCK_BUCKETS_SKIP_LOCKED).await?;
    let parent_keys = client.prepare_cached(sql::READ_BUCKET_KEYS).await?;
    let insert_heads = client.prepare_cached(&sql::INSERT_BUCKETS).await?;
    let update_heads = client.prepare_cached(&sql::UPDATE_BUCKETS).await?;
    let upsert_instances = client.prepare_cached(sql::UPSERT_INSTANCES).await?;
    let delete_instances = client.prepare_cached(sql::DELETE_INSTANCES).await?;
    let delete_strays = client.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
    let insert_cycles = client.prepare_cached(sql::INSERT_BUDGET_CYCLES).await?;
    let insert_events = client.prepare_cached(sql::INSERT_BUDGET_EVENTS).await?;
    stopwatch.lap(Stage::Begin);
    let txn = Pipelined::new(client);

    let plan = Batch::plan(
        pending.iter().map(|p| (&p.key, p.request.instance_id)),
        store.settings.bucket.cleanup_window,
    )
    .with_draws(owed);
    let locked = KeyColumns::of(&plan.lock);
    let lock_params = locked.as_params();
    let state_tenants: Vec<&str> = plan.tenants().into_iter().map(TenantId::as_str).collect();
    let state_params: [&(dyn ToSql + Sync); 1] = [&state_tenants];
    let mut windows = WindowColumns::default();
    for (p, window) in pending.iter().zip(&plan.windows) {
        windows.push(&p.key, window);
    }
    let window_params = windows.as_params();
    // One round trip, whatever the batch's size: BEGIN, the lock, then
    // (once it is held) the clock, the tenants' states and tree rows and
    // every request's instance window.
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let (begun, read) = join(
        txn.client().batch_execute("BEGIN"),
        join_all([
            txn.client().query(&lock, &lock_params[..]),
            txn.client().query(&clock, &no_params[..]),
            txn.client().query(&read_states, &state_params[..]),
            txn.client().query(&read_nodes, &state_params[..]),
            txn.client().query(&load_windows, &window_params[..]),
        ]),
    )
    .await;
    begun?;
    let [head_rows, clock_rows, state_rows, node_rows, window_rows] = settle(read)?
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
    // Only a pod's request creates a bucket nobody configured: an owed
    // draw's bucket that is gone stays gone.
    let gone =
        |key: &&BucketKey| !heads.contains_key(*key) && !pending.iter().any(|p| &p.key == *key);
    let open: Vec<BucketKey> = plan.lock.iter().filter(|k| !gone(k)).cloned().collect();
    let mut batch = Batch::open(
        open,
        heads,
        &tenant_states,
        &store.settings.unconfigured_tenants,
        now,
    );
    let loaded = windows_from_rows(&window_rows, pending.len())?;
    for (p, instances) in pending.iter().zip(loaded) {
        batch.load(&p.key, instances);
    }
    let config = &store.settings.bucket;
    batch.join_tree(&tree::from_rows(&node_rows)?);
    // Draws due: the organisations' buckets they need, one more round trip
    // per level of the tree (none in the common case). An organisation's
    // row another transaction holds is skipped, never waited on: its
    // draws are owed (see `latches`). Rows another transaction of this
    // replica latched are skipped without asking.
    let mut owed_next = Vec::new();
    loop {
        let due = batch.parents_due(now, config);
        if due.is_empty() {
            break;
        }
        let latched_elsewhere = latched.take(&due.lock);
        let parents = ParentPlan {
            lock: due
                .lock
                .iter()
                .filter(|key| !latched_elsewhere.contains(*key))
                .cloned()
                .collect(),
            windows: due
                .windows
                .iter()
                .filter(|(key, _)| !latched_elsewhere.contains(key))
                .cloned()
                .collect(),
            draws: Vec::new(),
        };
        // Nothing left to ask the database (every row latched here): the
        // same steps, on no rows.
        let (heads, mut busy, parent_states, parent_nodes, loaded) = if parents.is_empty() {
            Default::default()
        } else {
            store
                .counters
                .draw_round_trips
                .fetch_add(1, Ordering::Relaxed);
            let locked = KeyColumns::of(&parents.lock);
            let lock_params = locked.as_params();
            let tenants: Vec<&str> = parents
                .tenants()
                .into_iter()
                .map(TenantId::as_str)
                .collect();
            let tenant_params: [&(dyn ToSql + Sync); 1] = [&tenants];
            let mut windows = WindowColumns::default();
            for (key, window) in &parents.windows {
                windows.push(key, window);
            }
            let window_params = windows.as_params();
            let read = join_all([
                txn.client().query(&lock_parents, &lock_params[..]),
                txn.client().query(&parent_keys, &lock_params[..]),
                txn.client().query(&read_states, &tenant_params[..]),
                txn.client().query(&read_nodes, &tenant_params[..]),
                txn.client().query(&load_windows, &window_params[..]),
            ])
            .await;
            let [head_rows, key_rows, state_rows, node_rows, window_rows] =
                settle(read)?.try_into().map_err(|_| {
                    StoreError::internal("read a draw's rows", "a statement went missing")
                })?;
            let (heads, busy) = parents_from_rows(&head_rows, &key_rows)?;
            (
                heads,
                busy,
                states::from_rows(&state_rows)?,
                tree::from_rows(&node_rows)?,
                windows_from_rows(&window_rows, parents.windows.len())?,
            )
        };
        owed_next.extend(Skipped::of(&due.draws, &latched_elsewhere, &busy));
        busy.extend(latched_elsewhere);
        batch.open_parents(due.lock, heads, &busy, &parent_states, &parent_nodes);
        for ((key, _), instances) in parents.windows.iter().zip(loaded) {
            batch.load(key, instances);
        }
    }
    batch.draw(
        pending.iter().map(|p| (&p.key, p.request.requested_tokens)),
        now,
        config,
    );
    let answers = pending
        .iter()
        .map(|p| match batch.serve(&p.key, &p.request, now, config) {
            Answer::Granted(grant) => Some(Ok(grant)),
            Answer::Refused(e) => Some(Err(e.into())),
            Answer::NotFound => Some(Err(StoreError::not_found(&p.key))),
            Answer::TenantRefused(e) => Some(Err(e.into())),
            Answer::Deferred => None,
        })
        .collect();

    // Write back in one round trip, one statement per kind of write.
    let writes = batch.writes();
    let mut stray_tenants = Vec::new();
    let mut stray_buckets = Vec::new();
    let mut inserted = HeadColumns::default();
    let mut updated = HeadColumns::default();
    let mut upserted = InstanceColumns::default();
    let mut deleted: (Vec<&str>, Vec<&str>, Vec<i64>) = Default::default();
    let mut budgets = BudgetRows::default();
    for write in &writes {
        budgets.push(write.key, write.closed_cycles, write.budget_events)?;
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
    let (cycle_params, event_params) = (budgets.cycle_params(), budgets.event_params());
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
        (budgets.has_cycles(), &insert_cycles, &cycle_params[..]),
        (budgets.has_events(), &insert_events, &event_params[..]),
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
        owed: owed_next,
    })
}

/// Organisation head rows as `lock_buckets_skip_locked.sql` found them,
/// and those held by another transaction: keys `read_bucket_keys.sql`
/// found that the lock skipped.
fn parents_from_rows(
    head_rows: &[tokio_postgres::Row],
    key_rows: &[tokio_postgres::Row],
) -> Result<
    (
        BTreeMap<BucketKey, global_bucket::BucketRow>,
        std::collections::BTreeSet<BucketKey>,
    ),
    StoreError,
> {
    let heads = head_rows
        .iter()
        .map(|row| Ok((rows::bucket_key(row)?, rows::head_from_row(row)?)))
        .collect::<Result<BTreeMap<_, _>, StoreError>>()?;
    let mut busy = std::collections::BTreeSet::new();
    for row in key_rows {
        let key = rows::bucket_key(row)?;
        if !heads.contains_key(&key) {
            busy.insert(key);
        }
    }
    Ok((heads, busy))
}

/// Bucket keys as the parameters of the statements that lock or read
/// head rows: tenants and bucket names, in the same order.
struct KeyColumns<'a> {
    tenant: Vec<&'a str>,
    bucket: Vec<&'a str>,
}

impl<'a> KeyColumns<'a> {
    fn of(keys: &'a [BucketKey]) -> Self {
        KeyColumns {
            tenant: keys.iter().map(|k| k.tenant.as_str()).collect(),
            bucket: keys.iter().map(|k| k.bucket.as_str()).collect(),
        }
    }

    fn as_params(&self) -> [&(dyn ToSql + Sync); 2] {
        [&self.tenant, &self.bucket]
    }
}

/// The rows `load_windows.sql` answered for `requests` windows, per
/// window in order.
fn windows_from_rows(
    rows: &[tokio_postgres::Row],
    requests: usize,
) -> Result<Vec<Vec<tollgate_core::InstanceState>>, StoreError> {
    let mut loaded = vec![Vec::new(); requests];
    for row in rows {
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
    Ok(loaded)
}

/// The parameters of `load_windows.sql`: a request per index; its bucket,
/// and each run of its window as (first, last, limit), in the statement's
/// order (own row, predecessor, following, wrapped).
#[derive(Default)]
pub(super) struct WindowColumns<'a> {
    pub(super) tenant: Vec<&'a str>,
    pub(super) bucket: Vec<&'a str>,
    /// Per run, per part (first, last, limit): a value per request.
    pub(super) runs: [[Vec<i64>; 3]; 4],
}

impl<'a> WindowColumns<'a> {
    pub(super) fn push(&mut self, key: &'a BucketKey, window: &InstanceWindow) {
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

    pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); 14] {
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
pub(super) fn snapshots_from_rows(
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
pub(super) fn json_column<T: serde::de::DeserializeOwned>(
    row: &tokio_postgres::Row,
    column: &'static str,
) -> Result<T, StoreError> {
    let text: &str = row
        .try_get(column)
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    serde_json::from_str(text).map_err(|e| StoreError::internal("decode a stored document", e))
}

/// Appends closed records inside `txn` (`insert_closed_buckets.sql`).
pub(super) async fn insert_closed(
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
pub(super) fn closed_entry(row: &tokio_postgres::Row) -> Result<ClosedEntry, StoreError> {
    let seq: i64 = row
        .try_get("seq")
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    Ok(ClosedEntry {
        seq: u64::try_from(seq).map_err(|e| StoreError::internal("read a closed bucket", e))?,
        closed: json_column(row, "record")?,
    })
}
