//! Usage history (`tollgate_usage_history`, schema 18): sampling pages of
//! head rows into it, reading a bucket's rows, pruning by age; and
//! per-key buckets' checks (`tollgate_check_history`, schema 20), written
//! by the replica that counted them. The rows to
//! write are the core's (`tollgate_core::history::rows_to_write`); the
//! upsert keeps the later sample of a slot, so replicas may sample at
//! once without a lock.

use super::*;

use tollgate_core::history::checks::{CheckCounts, CheckRow, StoredCheckRow};
use tollgate_core::history::{HistorySample, Resolution, rows_to_write};

/// Samples a page of up to `limit` head rows after `after` at the store's
/// clock.
pub(super) async fn sample(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    after: Option<&BucketKey>,
    limit: usize,
) -> Result<HistoryPage, TxError> {
    let config = &inner.settings.history;
    let (after_tenant, after_bucket) =
        after.map_or(("", ""), |k| (k.tenant.as_str(), k.bucket.as_str()));
    let page_limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let list = client.prepare_cached(sql::LIST_BUCKETS).await?;
    let found = client
        .query(&list, &[&after_tenant, &after_bucket, &page_limit])
        .await?;
    let heads = snapshots_from_rows(inner, &found, "read_at").map_err(TxError::Store)?;
    let mut page = HistoryPage {
        buckets: heads.len(),
        last: heads
            .last()
            .map(|h| h.key.clone())
            .filter(|_| heads.len() >= limit),
        ..HistoryPage::default()
    };
    let Some(first) = heads.first() else {
        return Ok(page);
    };
    let now = first.read_at;
    let tenants: Vec<&str> = heads.iter().map(|h| h.key.tenant.as_str()).collect();
    let buckets: Vec<&str> = heads.iter().map(|h| h.key.bucket.as_str()).collect();
    let steps: Vec<i64> = config
        .resolutions
        .iter()
        .map(|r| i64::try_from(r.step_secs()).unwrap_or(i64::MAX))
        .collect();
    let latest = client.prepare_cached(sql::LATEST_HISTORY).await?;
    let mut kept: BTreeMap<(String, String, i64), HistorySample> = BTreeMap::new();
    for row in client.query(&latest, &[&tenants, &buckets, &steps]).await? {
        let key = (
            get::<String>(&row, "tenant_id")?,
            get::<String>(&row, "bucket")?,
            get::<i64>(&row, "step_secs")?,
        );
        kept.insert(key, decode(&get::<String>(&row, "sample")?)?);
    }
    let mut out = Upserts::default();
    for head in &heads {
        let sample = HistorySample {
            at: now,
            totals: head.head.totals.clone(),
            level: Some(head.head.state.tokens_at(now)),
        };
        for (resolution, &step) in config.resolutions.iter().zip(&steps) {
            let latest = kept.get(&(
                head.key.tenant.as_str().to_owned(),
                head.key.bucket.as_str().to_owned(),
                step,
            ));
            for (slot, row) in
                rows_to_write(resolution, head.head.state.created_at, latest, &sample)
            {
                out.push(&head.key, step, slot.unix_micros(), &row)?;
            }
        }
    }
    if !out.tenants.is_empty() {
        let upsert = client.prepare_cached(sql::UPSERT_HISTORY).await?;
        client.execute(&upsert, &out.as_params()).await?;
    }
    page.rows_written = out.tenants.len() as u64;
    Ok(page)
}

/// History rows to write, column by column.
#[derive(Default)]
struct Upserts {
    tenants: Vec<String>,
    buckets: Vec<String>,
    steps: Vec<i64>,
    slots: Vec<i64>,
    sampled_at: Vec<i64>,
    granted: Vec<f64>,
    samples: Vec<String>,
}

impl Upserts {
    fn push(
        &mut self,
        key: &BucketKey,
        step: i64,
        slot: i64,
        row: &HistorySample,
    ) -> Result<(), TxError> {
        self.tenants.push(key.tenant.as_str().to_owned());
        self.buckets.push(key.bucket.as_str().to_owned());
        self.steps.push(step);
        self.slots.push(slot);
        self.sampled_at.push(row.at.unix_micros());
        self.granted.push(row.totals.granted_tokens);
        self.samples.push(
            serde_json::to_string(row)
                .map_err(|e| TxError::Store(StoreError::internal("encode a history row", e)))?,
        );
        Ok(())
    }

    /// The arrays in `upsert_history.sql`'s order.
    fn as_params(&self) -> [&(dyn ToSql + Sync); 7] {
        [
            &self.tenants,
            &self.buckets,
            &self.steps,
            &self.slots,
            &self.sampled_at,
            &self.granted,
            &self.samples,
        ]
    }
}

/// The rows `query` reads of `key` in `resolution`, with slots from the
/// one `since` falls in to `until` (its parameters: tenant, bucket, step,
/// first slot, last).
async fn span_rows(
    client: &deadpool_postgres::Client,
    query: &str,
    key: &BucketKey,
    resolution: Resolution,
    since: Timestamp,
    until: Timestamp,
) -> Result<Vec<tokio_postgres::Row>, TxError> {
    let step = i64::try_from(resolution.step_secs()).unwrap_or(i64::MAX);
    let from = resolution.slot(since).unix_micros();
    let read = client.prepare_cached(query).await?;
    Ok(client
        .query(
            &read,
            &[
                &key.tenant.as_str(),
                &key.bucket.as_str(),
                &step,
                &from,
                &until.unix_micros(),
            ],
        )
        .await?)
}

/// `key`'s rows of `resolution` from `since` to `until`.
pub(super) async fn read(
    client: &deadpool_postgres::Client,
    key: &BucketKey,
    resolution: Resolution,
    since: Timestamp,
    until: Timestamp,
) -> Result<HistoryRows, TxError> {
    let rows = span_rows(client, sql::READ_HISTORY, key, resolution, since, until).await?;
    let mut out = HistoryRows {
        resolution,
        samples: Vec::with_capacity(rows.len()),
        baseline: false,
    };
    for row in &rows {
        out.baseline |= get::<bool>(row, "baseline")?;
        out.samples.push(decode(&get::<String>(row, "sample")?)?);
    }
    Ok(out)
}

/// Removes up to `limit` rows past retention at `now`.
pub(super) async fn prune(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    now: Timestamp,
    limit: usize,
) -> Result<u64, TxError> {
    let resolutions = &inner.settings.history.resolutions;
    let steps: Vec<i64> = resolutions
        .iter()
        .map(|r| i64::try_from(r.step_secs()).unwrap_or(i64::MAX))
        .collect();
    let before: Vec<i64> = resolutions
        .iter()
        .map(|r| r.prune_before(now).unix_micros())
        .collect();
    let coarsest = before.last().copied().unwrap_or(i64::MIN);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut pruned = 0;
    for query in [sql::PRUNE_HISTORY, sql::PRUNE_CHECK_HISTORY] {
        let prune = client.prepare_cached(query).await?;
        pruned += client
            .execute(&prune, &[&steps, &before, &coarsest, &limit])
            .await?;
    }
    Ok(pruned)
}

/// Writes `replica`'s check rows, each in place of its earlier one only if
/// its counts grew.
pub(super) async fn record_checks(
    client: &deadpool_postgres::Client,
    replica: &str,
    rows: &[CheckRow],
) -> Result<(), TxError> {
    let mut out = CheckUpserts::default();
    for row in rows {
        out.push(&row.bucket, row.step_secs, row.slot, replica, &row.counts)?;
    }
    if !out.tenants.is_empty() {
        let upsert = client.prepare_cached(sql::UPSERT_CHECK_HISTORY).await?;
        client.execute(&upsert, &out.as_params()).await?;
    }
    Ok(())
}

/// Check rows to write, column by column.
#[derive(Default)]
struct CheckUpserts {
    tenants: Vec<String>,
    buckets: Vec<String>,
    steps: Vec<i64>,
    slots: Vec<i64>,
    replicas: Vec<String>,
    checks: Vec<i64>,
    refusals: Vec<i64>,
    shadow_refusals: Vec<i64>,
    counts: Vec<String>,
}

impl CheckUpserts {
    fn push(
        &mut self,
        key: &BucketKey,
        step_secs: u64,
        slot: Timestamp,
        replica: &str,
        counts: &CheckCounts,
    ) -> Result<(), TxError> {
        let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.tenants.push(key.tenant.as_str().to_owned());
        self.buckets.push(key.bucket.as_str().to_owned());
        self.steps.push(big(step_secs));
        self.slots.push(slot.unix_micros());
        self.replicas.push(replica.to_owned());
        self.checks.push(big(counts.checks));
        self.refusals.push(big(counts.refusals));
        self.shadow_refusals.push(big(counts.shadow_refusals));
        self.counts.push(
            serde_json::to_string(counts).map_err(|e| {
                TxError::Store(StoreError::internal("encode a check history row", e))
            })?,
        );
        Ok(())
    }

    /// The arrays in `upsert_check_history.sql`'s order.
    fn as_params(&self) -> [&(dyn ToSql + Sync); 9] {
        [
            &self.tenants,
            &self.buckets,
            &self.steps,
            &self.slots,
            &self.replicas,
            &self.checks,
            &self.refusals,
            &self.shadow_refusals,
            &self.counts,
        ]
    }
}

/// `key`'s check rows of `resolution` from `since` to `until`, every
/// replica's.
pub(super) async fn read_checks(
    client: &deadpool_postgres::Client,
    key: &BucketKey,
    resolution: Resolution,
    since: Timestamp,
    until: Timestamp,
) -> Result<CheckHistoryRows, TxError> {
    let found = span_rows(
        client,
        sql::READ_CHECK_HISTORY,
        key,
        resolution,
        since,
        until,
    )
    .await?;
    let mut rows = Vec::with_capacity(found.len());
    for row in &found {
        rows.push(StoredCheckRow {
            slot: Timestamp::from_unix_micros(get(row, "slot")?),
            replica: get(row, "replica")?,
            counts: decode_json(&get::<String>(row, "counts")?)?,
        });
    }
    Ok(CheckHistoryRows { resolution, rows })
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    column: &'static str,
) -> Result<T, TxError> {
    row.try_get(column)
        .map_err(|e| TxError::Store(StoreError::internal("read a history row", e)))
}

fn decode(text: &str) -> Result<HistorySample, TxError> {
    decode_json(text)
}

fn decode_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, TxError> {
    serde_json::from_str(text)
        .map_err(|e| TxError::Store(StoreError::internal("decode a history row", e)))
}

/// Streams every history row of the export's snapshot `txn`.
pub(super) async fn export(
    txn: &deadpool_postgres::Transaction<'_>,
    sink: &mut crate::store::image::RecordSink,
) -> Result<(), TxError> {
    export_rows(txn, sink, sql::EXPORT_HISTORY, |row| {
        let (key, step_secs, slot) = row_slot(row)?;
        Ok(crate::store::image::Record::History {
            tenant: key.tenant,
            bucket: key.bucket,
            step_secs,
            slot,
            sample: decode(&get::<String>(row, "sample")?)?,
        })
    })
    .await
}

/// Streams every check history row of the export's snapshot `txn`.
pub(super) async fn export_checks(
    txn: &deadpool_postgres::Transaction<'_>,
    sink: &mut crate::store::image::RecordSink,
) -> Result<(), TxError> {
    export_rows(txn, sink, sql::EXPORT_CHECK_HISTORY, |row| {
        let (key, step_secs, slot) = row_slot(row)?;
        Ok(crate::store::image::Record::CheckHistory {
            tenant: key.tenant,
            bucket: key.bucket,
            step_secs,
            slot,
            replica: get(row, "replica")?,
            counts: decode_json(&get::<String>(row, "counts")?)?,
        })
    })
    .await
}

/// Streams what `query` reads in the export's snapshot `txn` to `sink`,
/// each row made a record by `record`.
async fn export_rows(
    txn: &deadpool_postgres::Transaction<'_>,
    sink: &mut crate::store::image::RecordSink,
    query: &str,
    record: impl Fn(&tokio_postgres::Row) -> Result<crate::store::image::Record, TxError>,
) -> Result<(), TxError> {
    use futures_util::{TryStreamExt, pin_mut};
    let export = txn.prepare_cached(query).await?;
    let stream = txn
        .query_raw(&export, std::iter::empty::<&(dyn ToSql + Sync)>())
        .await?;
    pin_mut!(stream);
    while let Some(row) = stream.try_next().await? {
        sink.send(record(&row)?).await?;
    }
    Ok(())
}

/// A history row's bucket, step and slot.
fn row_slot(row: &tokio_postgres::Row) -> Result<(BucketKey, u64, Timestamp), TxError> {
    let key = rows::bucket_key(row)?;
    let step: i64 = get(row, "step_secs")?;
    let step = u64::try_from(step)
        .map_err(|e| TxError::Store(StoreError::internal("read a history row's step", e)))?;
    Ok((key, step, Timestamp::from_unix_micros(get(row, "slot")?)))
}

/// Writes an import's check history rows, `chunk` a statement.
pub(super) async fn import_checks(
    txn: &deadpool_postgres::Transaction<'_>,
    rows: &[crate::store::image::CheckHistoryRow],
    chunk: usize,
) -> Result<(), TxError> {
    let upsert = txn.prepare_cached(sql::UPSERT_CHECK_HISTORY).await?;
    for rows in rows.chunks(chunk) {
        let mut out = CheckUpserts::default();
        for row in rows {
            out.push(&row.key, row.step_secs, row.slot, &row.replica, &row.counts)?;
        }
        txn.execute(&upsert, &out.as_params()).await?;
    }
    Ok(())
}

/// Writes an import's history rows, `chunk` a statement.
pub(super) async fn import(
    txn: &deadpool_postgres::Transaction<'_>,
    history: &[crate::store::image::HistoryRow],
    chunk: usize,
) -> Result<(), TxError> {
    let upsert = txn.prepare_cached(sql::UPSERT_HISTORY).await?;
    for rows in history.chunks(chunk) {
        let mut out = Upserts::default();
        for row in rows {
            let step = i64::try_from(row.step_secs).unwrap_or(i64::MAX);
            out.push(&row.key, step, row.slot.unix_micros(), &row.sample)?;
        }
        txn.execute(&upsert, &out.as_params()).await?;
    }
    Ok(())
}
