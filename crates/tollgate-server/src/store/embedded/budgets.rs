//! Budgets' rows beside the head rows that carry the budgets: closed
//! cycles (the billing records, appended) and crossed thresholds (events
//! for delivery, once per bucket, cycle and threshold), written in the
//! transaction that closed or crossed them.
//!
//! Added without a schema version: a file without the tables gets them,
//! empty, when opened.

use super::*;
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

/// An event as kept: what crossed, and how far its delivery has gone.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct KeptEvent {
    pub(super) event: BudgetEvent,
    /// Webhooks that acknowledged it.
    #[serde(default)]
    pub(super) delivered_to: Vec<String>,
    #[serde(default)]
    pub(super) delivered_at: Option<Timestamp>,
    #[serde(default)]
    pub(super) attempts: u32,
}

/// Appends `key`'s closed cycles and keeps its new events (an event of a
/// bucket, cycle and threshold already kept stays as it is).
pub(super) fn keep(
    txn: &WriteTransaction,
    key: &BucketKey,
    cycles: &[CycleRecord],
    events: &[BudgetEvent],
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
    if !events.is_empty() {
        let mut table = txn
            .open_table(BUDGET_EVENTS)
            .map_err(storage("open budget events"))?;
        for event in events {
            let label = event.threshold.label();
            let at = (t, b, event.cycle.start.unix_micros(), label.as_str());
            if table
                .get(at)
                .map_err(storage("read budget event"))?
                .is_some()
            {
                continue;
            }
            let kept = KeptEvent {
                event: event.clone(),
                delivered_to: Vec::new(),
                delivered_at: None,
                attempts: 0,
            };
            let bytes = encode("encode budget event", &kept)?;
            table
                .insert(at, bytes.as_slice())
                .map_err(storage("write budget event"))?;
        }
    }
    Ok(())
}

/// Everything a committed batch of token-bucket requests closed or crossed.
pub(super) fn write_batch(txn: &WriteTransaction, batch: &Batch) -> Result<(), StoreError> {
    for write in batch.writes() {
        keep(txn, write.key, write.closed_cycles, write.budget_events)?;
    }
    Ok(())
}
