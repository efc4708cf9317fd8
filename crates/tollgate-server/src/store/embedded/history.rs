//! Usage history: one row per bucket, resolution and slot, holding the
//! latest sample of the bucket's totals taken in the slot
//! ([`tollgate_core::history`]). Rows outlive their bucket and are
//! pruned by age only.
//!
//! Per-key buckets' checks have a table of their own, a row per bucket,
//! resolution, slot and replica ([`CHECK_HISTORY`]).
//!
//! Added without a schema version: a file without the tables gets them,
//! empty, when opened.

use super::*;

use tollgate_core::global_bucket::BucketRow;
use tollgate_core::history::checks::{CheckCounts, CheckRow, StoredCheckRow};
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
        if slot < cut_off(config, step, now) {
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

/// Rows of `step` with slots before this are past retention at `now`. A
/// step no resolution has any more is kept by the coarsest's retention.
fn cut_off(config: &HistoryConfig, step: u64, now: Timestamp) -> i64 {
    config
        .resolutions
        .iter()
        .find(|r| r.step_secs() == step)
        .or_else(|| config.resolutions.last())
        .map_or(i64::MIN, |r| r.prune_before(now).unix_micros())
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

/// Per-key check rows ([`tollgate_core::history::checks`]) by (tenant,
/// bucket, step in seconds, slot start in microseconds, replica): each
/// replica's counts of the bucket's checks in the slot.
pub(super) const CHECK_HISTORY: TableDefinition<(&str, &str, u64, i64, &str), &[u8]> =
    TableDefinition::new("check_history");

/// Writes `replica`'s check rows, each in place of its earlier one only if
/// its counts grew.
pub(super) fn record_checks(
    txn: &WriteTransaction,
    replica: &str,
    rows: &[CheckRow],
) -> Result<(), StoreError> {
    let mut table = txn
        .open_table(CHECK_HISTORY)
        .map_err(storage("open check history"))?;
    for row in rows {
        let key = (
            row.bucket.tenant.as_str(),
            row.bucket.bucket.as_str(),
            row.step_secs,
            row.slot.unix_micros(),
            replica,
        );
        let kept: Option<CheckCounts> = table
            .get(key)
            .map_err(storage("read check history"))?
            .map(|v| decode("decode check history row", v.value()))
            .transpose()?;
        if kept.is_some_and(|kept| !row.counts.replaces(&kept)) {
            continue;
        }
        let bytes = encode("encode check history row", &row.counts)?;
        table
            .insert(key, bytes.as_slice())
            .map_err(storage("write check history"))?;
    }
    Ok(())
}

/// `key`'s check rows of `resolution` with slots from `since` to `until`,
/// every replica's.
pub(super) fn read_checks(
    db: &Database,
    key: &BucketKey,
    resolution: Resolution,
    since: Timestamp,
    until: Timestamp,
) -> Result<CheckHistoryRows, StoreError> {
    let txn = db.begin_read().map_err(storage("begin read transaction"))?;
    let table = txn
        .open_table(CHECK_HISTORY)
        .map_err(storage("open check history"))?;
    let (t, b, step) = (
        key.tenant.as_str(),
        key.bucket.as_str(),
        resolution.step_secs(),
    );
    let from = resolution.slot(since).unix_micros();
    let mut rows = Vec::new();
    for entry in table
        .range((t, b, step, from, "")..=(t, b, step, until.unix_micros(), "\u{10FFFF}"))
        .map_err(storage("read check history"))?
    {
        let (k, v) = entry.map_err(storage("read check history"))?;
        let (_, _, _, slot, replica) = k.value();
        rows.push(StoredCheckRow {
            slot: Timestamp::from_unix_micros(slot),
            replica: replica.to_owned(),
            counts: decode("decode check history row", v.value())?,
        });
    }
    Ok(CheckHistoryRows { resolution, rows })
}

/// Removes up to `limit` check rows past their resolution's retention at
/// `now`.
pub(super) fn prune_checks(
    txn: &WriteTransaction,
    config: &HistoryConfig,
    limit: usize,
    now: Timestamp,
) -> Result<u64, StoreError> {
    let mut table = txn
        .open_table(CHECK_HISTORY)
        .map_err(storage("open check history"))?;
    let mut old = Vec::new();
    for entry in table.iter().map_err(storage("read check history"))? {
        let (key, _) = entry.map_err(storage("read check history"))?;
        let (t, b, step, slot, replica) = key.value();
        if slot < cut_off(config, step, now) {
            old.push((t.to_owned(), b.to_owned(), step, slot, replica.to_owned()));
            if old.len() >= limit {
                break;
            }
        }
    }
    for (t, b, step, slot, replica) in &old {
        table
            .remove((t.as_str(), b.as_str(), *step, *slot, replica.as_str()))
            .map_err(storage("delete check history row"))?;
    }
    Ok(old.len() as u64)
}

/// Sends every check row of the snapshot `txn`.
pub(super) fn export_checks(
    txn: &redb::ReadTransaction,
    sink: &mut crate::store::image::RecordSink,
) -> Result<(), StoreError> {
    let table = txn
        .open_table(CHECK_HISTORY)
        .map_err(storage("open check history"))?;
    for entry in table.iter().map_err(storage("read check history"))? {
        let (key, value) = entry.map_err(storage("read check history"))?;
        let (tenant, bucket, step_secs, slot, replica) = key.value();
        sink.send_blocking(crate::store::image::Record::CheckHistory {
            tenant: tenant_id(tenant)?,
            bucket: bucket_name(bucket)?,
            step_secs,
            slot: Timestamp::from_unix_micros(slot),
            replica: replica.to_owned(),
            counts: decode("decode check history row", value.value())?,
        })?;
    }
    Ok(())
}

/// Writes an import's check rows.
pub(super) fn import_checks(
    txn: &WriteTransaction,
    rows: &[crate::store::image::CheckHistoryRow],
) -> Result<(), StoreError> {
    let mut table = txn
        .open_table(CHECK_HISTORY)
        .map_err(storage("open check history"))?;
    for row in rows {
        let bytes = encode("encode check history row", &row.counts)?;
        table
            .insert(
                (
                    row.key.tenant.as_str(),
                    row.key.bucket.as_str(),
                    row.step_secs,
                    row.slot.unix_micros(),
                    row.replica.as_str(),
                ),
                bytes.as_slice(),
            )
            .map_err(storage("write check history"))?;
    }
    Ok(())
}
