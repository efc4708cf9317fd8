//! Budgets' rows beside the head rows that carry the budgets: closed
//! cycles (the billing records, appended to `tollgate_budget_cycles`) and
//! crossed thresholds (`tollgate_budget_events`, once per bucket, cycle
//! and threshold), written by the statements of the transaction that
//! closed or crossed them. A transaction with neither sends neither
//! statement.

use super::*;
use tollgate_core::budget::{BudgetEvent, CycleRecord};

/// The parameters of `insert_budget_cycles.sql` and
/// `insert_budget_events.sql`: an array per column, a row per index.
#[derive(Default)]
pub(super) struct BudgetRows<'a> {
    cycle_tenants: Vec<&'a str>,
    cycle_buckets: Vec<&'a str>,
    cycle_starts: Vec<i64>,
    cycle_ends: Vec<i64>,
    cycle_records: Vec<String>,
    event_tenants: Vec<&'a str>,
    event_buckets: Vec<&'a str>,
    event_cycles: Vec<i64>,
    event_thresholds: Vec<String>,
    event_documents: Vec<String>,
    event_times: Vec<i64>,
}

impl<'a> BudgetRows<'a> {
    /// Adds `key`'s closed cycles and crossed thresholds.
    pub(super) fn push(
        &mut self,
        key: &'a BucketKey,
        cycles: &[CycleRecord],
        events: &[BudgetEvent],
    ) -> Result<(), StoreError> {
        for record in cycles {
            let document = serde_json::to_string(record)
                .map_err(|e| StoreError::internal("encode a budget cycle", e))?;
            self.cycle_tenants.push(key.tenant.as_str());
            self.cycle_buckets.push(key.bucket.as_str());
            self.cycle_starts.push(record.cycle.start.unix_micros());
            self.cycle_ends.push(record.cycle.end.unix_micros());
            self.cycle_records.push(document);
        }
        for event in events {
            let document = serde_json::to_string(event)
                .map_err(|e| StoreError::internal("encode a budget event", e))?;
            self.event_tenants.push(key.tenant.as_str());
            self.event_buckets.push(key.bucket.as_str());
            self.event_cycles.push(event.cycle.start.unix_micros());
            self.event_thresholds.push(event.threshold.label());
            self.event_documents.push(document);
            self.event_times.push(event.at.unix_micros());
        }
        Ok(())
    }

    pub(super) fn has_cycles(&self) -> bool {
        !self.cycle_tenants.is_empty()
    }

    pub(super) fn has_events(&self) -> bool {
        !self.event_tenants.is_empty()
    }

    pub(super) fn cycle_params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.cycle_tenants,
            &self.cycle_buckets,
            &self.cycle_starts,
            &self.cycle_ends,
            &self.cycle_records,
        ]
    }

    pub(super) fn event_params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.event_tenants,
            &self.event_buckets,
            &self.event_cycles,
            &self.event_thresholds,
            &self.event_documents,
            &self.event_times,
        ]
    }
}
