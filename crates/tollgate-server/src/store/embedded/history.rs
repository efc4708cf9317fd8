//! Usage history: one row per bucket, resolution and slot, holding the
//! latest sample of the bucket's totals taken in the slot
//! ([`tollgate_core::history`]). Rows outlive their bucket and are
//! pruned by age only.
//!
//! Added without a schema version: a file without the table gets it,
//! empty, when opened.

use super::*;

use tollgate_core::global_bucket::BucketRow;
use tollgate_core::history::{HistoryConfig, HistorySample, Resolution, rows_to_write};

/// Rows by (tenant, bucket, step in seconds, slot start in microseconds).
pub(super) const HISTORY: TableDefinition<(&str, &str, u64, i64), &[u8]> =
    TableDefinition::new("bucket_history");

/// Samples the totals of up to `limit` buckets after `after`, at `now`,
/// into each resolution's row of the slot `now` falls in.
pub(super) fn sample(
    txn: &WriteTransaction,
    config: &HistoryConfig,
    after: Option<&BucketKey>,
    limit: usize,
    now: Timestamp,
) -> Result<HistoryPage, StoreError> {
    let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let mut history = txn.open_table(HISTORY).map_err(storage("open history"))?;
    let range = match after {
        Some(a) => buckets.range::<(&str, &str)>((
            std::ops::Bound::Excluded((a.tenant.as_str(), a.bucket.as_str())),
            std::ops::Bound::Unbounded,
        )),
        None => buckets.range::<(&str, &str)>(..),
    }
    .map_err(storage("list bucket rows"))?;
    let mut page = HistoryPage::default();
    for entry in range.take(limit) {
        let (key, value) = entry.map_err(storage("list bucket rows"))?;
        let (tenant, bucket) = key.value();
        let head: BucketRow = decode("decode bucket row", value.value())?;
        let sample = HistorySample {
            at: now,
            totals: head.totals.clone(),
            level: Some(head.state.tokens_at(now)),
        };
        for resolution in &config.resolutions {
            let step = resolution.step_secs();
            let latest: Option<HistorySample> = history
                .range((tenant, bucket, step, i64::MIN)..=(tenant, bucket, step, i64::MAX))
                .map_err(storage("read history"))?
                .next_back()
                .map(|e| {
                    let (_, v) = e.map_err(storage("read history"))?;
                    decode("decode history row", v.value())
                })
                .transpose()?;
            for (slot, row) in
                rows_to_write(resolution, head.state.created_at, latest.as_ref(), &sample)
            {
                let bytes = encode("encode history row", &row)?;
                history
                    .insert((tenant, bucket, step, slot.unix_micros()), bytes.as_slice())
                    .map_err(storage("write history"))?;
                page.rows_written += 1;
            }
        }
        page.buckets += 1;
        page.last = Some(BucketKey::new(tenant_id(tenant)?, bucket_name(bucket)?));
    }
    if page.buckets < limit {
        page.last = None;
    }
    Ok(page)
}

/// `key`'s rows of `resolution` with slots from `since` to `until`, after
/// the last row before `since` (the baseline of the first span).
pub(super) fn read(
    db: &Database,
    key: &BucketKey,
    resolution: Resolution,
    since: Timestamp,
    until: Timestamp,
) -> Result<HistoryRows, StoreError> {
    let txn = db.begin_read().map_err(storage("begin read transaction"))?;
    let history = txn.open_table(HISTORY).map_err(storage("open history"))?;
    let (t, b, step) = (
        key.tenant.as_str(),
        key.bucket.as_str(),
        resolution.step_secs(),
    );
    let from = resolution.slot(since).unix_micros();
    let mut samples = Vec::new();
    if let Some(entry) = history
        .range((t, b, step, i64::MIN)..(t, b, step, from))
        .map_err(storage("read history"))?
        .next_back()
    {
        let (_, value) = entry.map_err(storage("read history"))?;
        samples.push(decode("decode history row", value.value())?);
    }
    let baseline = samples.len();
    for entry in history
        .range((t, b, step, from)..=(t, b, step, until.unix_micros()))
        .map_err(storage("read history"))?
    {
        let (_, value) = entry.map_err(storage("read history"))?;
        samples.push(decode("decode history row", value.value())?);
    }
    Ok(HistoryRows {
        resolution,
        samples,
        baseline: baseline > 0,
    })
}

/// Removes up to `limit` rows past their resolution's retention at `now`.
pub(super) fn prune(
    txn: &WriteTransaction,
    config: &HistoryConfig,
    limit: usize,
    now: Timestamp,
) -> Result<u64, StoreError> {
    let mut history = txn.open_table(HISTORY).map_err(storage("open history"))?;
    let mut old = Vec::new();
    for entry in history.iter().map_err(storage("read history"))? {
        let (key, _) = entry.map_err(storage("read history"))?;
        let (t, b, step, slot) = key.value();
        // A step no resolution has any more is kept by the coarsest's
        // retention.
        let resolution = config
            .resolutions
            .iter()
            .find(|r| r.step_secs() == step)
            .or_else(|| config.resolutions.last());
        if let Some(r) = resolution
            && slot < r.prune_before(now).unix_micros()
        {
            old.push((t.to_owned(), b.to_owned(), step, slot));
            if old.len() >= limit {
                break;
            }
        }
    }
    for (t, b, step, slot) in &old {
        history
            .remove((t.as_str(), b.as_str(), *step, *slot))
            .map_err(storage("delete history row"))?;
    }
    Ok(old.len() as u64)
}

/// Sends every history row of the snapshot `txn`.
pub(super) fn export(
    txn: &redb::ReadTransaction,
    sink: &mut crate::store::image::RecordSink,
) -> Result<(), StoreError> {
    let history = txn.open_table(HISTORY).map_err(storage("open history"))?;
    for entry in history.iter().map_err(storage("read history"))? {
        let (key, value) = entry.map_err(storage("read history"))?;
        let (tenant, bucket, step_secs, slot) = key.value();
        sink.send_blocking(crate::store::image::Record::History {
            tenant: tenant_id(tenant)?,
            bucket: bucket_name(bucket)?,
            step_secs,
            slot: Timestamp::from_unix_micros(slot),
            sample: decode("decode history row", value.value())?,
        })?;
    }
    Ok(())
}

/// Writes an import's history rows.
pub(super) fn import(
    txn: &WriteTransaction,
    rows: &[crate::store::image::HistoryRow],
) -> Result<(), StoreError> {
    let mut history = txn.open_table(HISTORY).map_err(storage("open history"))?;
    for row in rows {
        let bytes = encode("encode history row", &row.sample)?;
        history
            .insert(
                (
                    row.key.tenant.as_str(),
                    row.key.bucket.as_str(),
                    row.step_secs,
                    row.slot.unix_micros(),
                ),
                bytes.as_slice(),
            )
            .map_err(storage("write history"))?;
    }
    Ok(())
}
