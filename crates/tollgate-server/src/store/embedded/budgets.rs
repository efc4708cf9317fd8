//! Budgets' rows beside the head rows that carry the budgets: closed
//! cycles (the billing records, appended) and crossed thresholds (events
//! for delivery, once per bucket, cycle and threshold), written in the
//! transaction that closed or crossed them.
//!
//! Added without a schema version: a file without the tables gets them,
//! empty, when opened.

use super::*;
use std::time::Duration;

use crate::store::image::{Record, RecordSink, StoreImage};
use crate::store::{ClaimedEvent, KeptEvent, PrunedRecords};
use tollgate_core::budget::delivery::{Attempt, Backoff};
use tollgate_core::budget::{BudgetEvent, CycleRecord};

/// Closed cycles by (tenant, bucket, sequence number): a bucket's records
/// in the order they were closed.
pub(super) const BUDGET_CYCLES: TableDefinition<(&str, &str, u64), &[u8]> =
    TableDefinition::new("budget_cycles");
/// Events by (tenant, bucket, cycle start, threshold label).
pub(super) const BUDGET_EVENTS: TableDefinition<(&str, &str, i64, &str), &[u8]> =
    TableDefinition::new("budget_events");
/// The last sequence number of a closed cycle, in `META`.
const CYCLE_SEQ: &str = "budget_cycle_seq";

/// Appends `key`'s closed cycles and keeps its new events (an event of a
/// bucket, cycle and threshold already kept stays as it is).
pub(super) fn keep(
    txn: &WriteTransaction,
    key: &BucketKey,
    cycles: &[CycleRecord],
    events: &[BudgetEvent],
) -> Result<(), StoreError> {
    append_cycles(txn, key, cycles)?;
    let kept: Vec<KeptEvent> = events.iter().cloned().map(KeptEvent::new).collect();
    keep_events(txn, key, &kept)
}

/// Appends `key`'s closed cycles, each numbered after the last.
fn append_cycles(
    txn: &WriteTransaction,
    key: &BucketKey,
    cycles: &[CycleRecord],
) -> Result<(), StoreError> {
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    if !cycles.is_empty() {
        let mut meta = txn.open_table(META).map_err(storage("open meta"))?;
        let mut seq = meta
            .get(CYCLE_SEQ)
            .map_err(storage("read cycle sequence"))?
            .map_or(0, |v| v.value());
        let mut table = txn
            .open_table(BUDGET_CYCLES)
            .map_err(storage("open budget cycles"))?;
        for record in cycles {
            seq += 1;
            let bytes = encode("encode budget cycle", record)?;
            table
                .insert((t, b, seq), bytes.as_slice())
                .map_err(storage("write budget cycle"))?;
        }
        meta.insert(CYCLE_SEQ, seq)
            .map_err(storage("write cycle sequence"))?;
    }
    Ok(())
}

/// Keeps `key`'s events; one of a bucket, cycle and threshold already
/// kept stays as it is.
fn keep_events(
    txn: &WriteTransaction,
    key: &BucketKey,
    events: &[KeptEvent],
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    let mut table = txn
        .open_table(BUDGET_EVENTS)
        .map_err(storage("open budget events"))?;
    for kept in events {
        let label = kept.event.threshold.label();
        let at = (t, b, kept.event.cycle.start.unix_micros(), label.as_str());
        if table
            .get(at)
            .map_err(storage("read budget event"))?
            .is_some()
        {
            continue;
        }
        let bytes = encode("encode budget event", kept)?;
        table
            .insert(at, bytes.as_slice())
            .map_err(storage("write budget event"))?;
    }
    Ok(())
}

/// Every closed cycle and event, for an export: bucket by bucket, cycles
/// in the order they were closed.
pub(super) fn export(txn: &redb::ReadTransaction, sink: &mut RecordSink) -> Result<(), StoreError> {
    if let Some(table) = open_if_there(txn, BUDGET_CYCLES)? {
        for entry in table.iter().map_err(storage("read budget cycles"))? {
            let (key, value) = entry.map_err(storage("read budget cycles"))?;
            let (t, b, _) = key.value();
            sink.send_blocking(Record::BudgetCycle {
                tenant: tenant_id(t)?,
                bucket: bucket_name(b)?,
                record: decode("decode budget cycle", value.value())?,
            })?;
        }
    }
    if let Some(table) = open_if_there(txn, BUDGET_EVENTS)? {
        for entry in table.iter().map_err(storage("read budget events"))? {
            let (key, value) = entry.map_err(storage("read budget events"))?;
            let (t, b, _, _) = key.value();
            sink.send_blocking(Record::BudgetEvent {
                tenant: tenant_id(t)?,
                bucket: bucket_name(b)?,
                event: decode("decode budget event", value.value())?,
            })?;
        }
    }
    Ok(())
}

/// Loads an image's cycles and events.
pub(super) fn import(txn: &WriteTransaction, image: &StoreImage) -> Result<(), StoreError> {
    for (key, record) in &image.cycles {
        append_cycles(txn, key, std::slice::from_ref(record))?;
    }
    for (key, event) in &image.events {
        keep_events(txn, key, std::slice::from_ref(event))?;
    }
    Ok(())
}

fn open_if_there<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(StoreError::internal("open a budget table", e)),
    }
}

/// `key`'s closed cycles, newest first, at most `limit`.
pub(super) fn read_cycles(
    txn: &redb::ReadTransaction,
    key: &BucketKey,
    limit: usize,
) -> Result<Vec<CycleRecord>, StoreError> {
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    let Some(table) = open_if_there(txn, BUDGET_CYCLES)? else {
        return Ok(Vec::new());
    };
    let mut records = Vec::new();
    for entry in table
        .range((t, b, 0)..=(t, b, u64::MAX))
        .map_err(storage("read budget cycles"))?
    {
        let (_, value) = entry.map_err(storage("read budget cycles"))?;
        records.push(decode::<CycleRecord>("decode budget cycle", value.value())?);
    }
    // Newest cycle first; of two records of one cycle, the later closed.
    records.reverse();
    records.sort_by_key(|r| std::cmp::Reverse(r.cycle.start));
    records.truncate(limit);
    Ok(records)
}

/// Removes at most `limit` closed cycles that ended, and at most `limit`
/// events made, before `before`.
pub(super) fn prune(
    txn: &WriteTransaction,
    before: Timestamp,
    limit: usize,
) -> Result<PrunedRecords, StoreError> {
    let mut pruned = PrunedRecords::default();
    let mut table = txn
        .open_table(BUDGET_CYCLES)
        .map_err(storage("open budget cycles"))?;
    let mut old = Vec::new();
    for entry in table.iter().map_err(storage("read budget cycles"))? {
        let (key, value) = entry.map_err(storage("read budget cycles"))?;
        let record: CycleRecord = decode("decode budget cycle", value.value())?;
        if record.cycle.end < before {
            let (t, b, seq) = key.value();
            old.push((t.to_owned(), b.to_owned(), seq));
            if old.len() >= limit {
                break;
            }
        }
    }
    for (t, b, seq) in &old {
        table
            .remove((t.as_str(), b.as_str(), *seq))
            .map_err(storage("delete budget cycle"))?;
    }
    pruned.cycles = old.len() as u64;
    let mut events = txn
        .open_table(BUDGET_EVENTS)
        .map_err(storage("open budget events"))?;
    let mut old = Vec::new();
    for entry in events.iter().map_err(storage("read budget events"))? {
        let (key, value) = entry.map_err(storage("read budget events"))?;
        let kept: KeptEvent = decode("decode budget event", value.value())?;
        if kept.event.at < before {
            let (t, b, c, th) = key.value();
            old.push((t.to_owned(), b.to_owned(), c, th.to_owned()));
            if kept.delivery.delivered_at.is_none() {
                pruned.undelivered_events += 1;
            }
            if old.len() >= limit {
                break;
            }
        }
    }
    for (t, b, c, th) in &old {
        events
            .remove((t.as_str(), b.as_str(), *c, th.as_str()))
            .map_err(storage("delete budget event"))?;
    }
    pruned.events = old.len() as u64;
    Ok(pruned)
}

/// Claims at most `limit` events due at `now` for `lease`, oldest due
/// first.
pub(super) fn claim(
    txn: &WriteTransaction,
    now: Timestamp,
    limit: usize,
    lease: Duration,
) -> Result<Vec<ClaimedEvent>, StoreError> {
    let mut table = txn
        .open_table(BUDGET_EVENTS)
        .map_err(storage("open budget events"))?;
    let mut due = Vec::new();
    for entry in table.iter().map_err(storage("read budget events"))? {
        let (key, value) = entry.map_err(storage("read budget events"))?;
        let kept: KeptEvent = decode("decode budget event", value.value())?;
        if kept.delivery.is_due(now) {
            let (t, b, _, _) = key.value();
            due.push((BucketKey::new(tenant_id(t)?, bucket_name(b)?), kept));
        }
    }
    due.sort_by_key(|(_, kept)| kept.delivery.next_attempt_at);
    due.truncate(limit);
    let mut claimed = Vec::with_capacity(due.len());
    for (key, mut kept) in due {
        let claim = kept.delivery.claim(now, lease);
        put_event(&mut table, &key, &kept)?;
        claimed.push(ClaimedEvent { key, kept, claim });
    }
    Ok(claimed)
}

/// Settles `claimed` at `now`; an event no longer kept is let go.
pub(super) fn settle(
    txn: &WriteTransaction,
    claimed: &ClaimedEvent,
    attempt: &Attempt,
    webhooks: &[String],
    backoff: &Backoff,
    now: Timestamp,
) -> Result<(), StoreError> {
    let mut table = txn
        .open_table(BUDGET_EVENTS)
        .map_err(storage("open budget events"))?;
    let (cycle, label) = claimed.kept.cycle_and_threshold();
    let at = (
        claimed.key.tenant.as_str(),
        claimed.key.bucket.as_str(),
        cycle.unix_micros(),
        label.as_str(),
    );
    let Some(value) = table.get(at).map_err(storage("read budget event"))? else {
        return Ok(());
    };
    let mut kept: KeptEvent = decode("decode budget event", value.value())?;
    drop(value);
    kept.delivery
        .settle(claimed.claim, attempt, webhooks, backoff, now);
    put_event(&mut table, &claimed.key, &kept)
}

fn put_event(
    table: &mut redb::Table<(&str, &str, i64, &str), &[u8]>,
    key: &BucketKey,
    kept: &KeptEvent,
) -> Result<(), StoreError> {
    let (cycle, label) = kept.cycle_and_threshold();
    let bytes = encode("encode budget event", kept)?;
    table
        .insert(
            (
                key.tenant.as_str(),
                key.bucket.as_str(),
                cycle.unix_micros(),
                label.as_str(),
            ),
            bytes.as_slice(),
        )
        .map_err(storage("write budget event"))?;
    Ok(())
}
