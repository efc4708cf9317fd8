//! Budgets' rows beside the head rows that carry the budgets: closed
//! cycles (the billing records, appended to `tollgate_budget_cycles`) and
//! crossed thresholds (`tollgate_budget_events`, once per bucket, cycle
//! and threshold), written by the statements of the transaction that
//! closed or crossed them. A transaction with neither sends neither
//! statement.

use super::*;
use std::time::Duration;

use super::retry::TxError;
use crate::store::image::{Record, RecordSink, StoreImage};
use crate::store::{ClaimedEvent, KeptEvent};
use tokio_postgres::Row;
use tollgate_core::budget::delivery::{Attempt, Backoff, Delivery};
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
    events: EventColumns<'a>,
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
            self.events.push(key, &KeptEvent::new(event.clone()))?;
        }
        Ok(())
    }

    pub(super) fn has_cycles(&self) -> bool {
        !self.cycle_tenants.is_empty()
    }

    pub(super) fn has_events(&self) -> bool {
        !self.events.is_empty()
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

    pub(super) fn event_params(&self) -> [&(dyn ToSql + Sync); 9] {
        self.events.as_params()
    }
}

/// A row of `list_budget_cycles.sql` as its record.
pub(super) fn cycle_of(row: &Row) -> Result<CycleRecord, StoreError> {
    let text: String = row
        .try_get("record")
        .map_err(|e| StoreError::internal("read a budget cycle", e))?;
    serde_json::from_str(&text).map_err(|e| StoreError::internal("decode a budget cycle", e))
}

/// Every closed cycle and event, for an export, in the export's
/// transaction.
pub(super) async fn export(
    txn: &deadpool_postgres::Transaction<'_>,
    sink: &mut RecordSink,
) -> Result<(), TxError> {
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let cycles = txn.prepare_cached(sql::EXPORT_BUDGET_CYCLES).await?;
    for row in txn.query(&cycles, &no_params).await? {
        let (tenant, bucket) = key_of(&row)?;
        sink.send(Record::BudgetCycle {
            tenant,
            bucket,
            record: cycle_of(&row)?,
        })
        .await?;
    }
    let events = txn.prepare_cached(sql::EXPORT_BUDGET_EVENTS).await?;
    for row in txn.query(&events, &no_params).await? {
        let (tenant, bucket) = key_of(&row)?;
        sink.send(Record::BudgetEvent {
            tenant,
            bucket,
            event: kept_of(&row)?,
        })
        .await?;
    }
    Ok(())
}

/// A row of the events table, with its delivery, as the event kept.
fn kept_of(row: &Row) -> Result<KeptEvent, StoreError> {
    let read = |e: tokio_postgres::Error| StoreError::internal("read a budget event", e);
    let decode = |e: serde_json::Error| StoreError::internal("decode a budget event", e);
    let event: String = row.try_get("event").map_err(read)?;
    let delivered_to: String = row.try_get("delivered_to").map_err(read)?;
    let delivered_at: Option<i64> = row.try_get("delivered_at").map_err(read)?;
    let attempts: i32 = row.try_get("attempts").map_err(read)?;
    let micros = |column: &str| -> Result<Timestamp, StoreError> {
        Ok(Timestamp::from_unix_micros(
            row.try_get(column).map_err(read)?,
        ))
    };
    Ok(KeptEvent {
        event: serde_json::from_str(&event).map_err(decode)?,
        delivery: Delivery {
            delivered_to: serde_json::from_str(&delivered_to).map_err(decode)?,
            delivered_at: delivered_at.map(Timestamp::from_unix_micros),
            attempts: u32::try_from(attempts).unwrap_or(0),
            next_attempt_at: micros("next_attempt_at")?,
            claimed_until: micros("claimed_until")?,
            last_error: row.try_get("last_error").map_err(read)?,
        },
    })
}

/// Claims at most `limit` events due at the store's clock for `lease`.
pub(super) async fn claim(
    inner: &Inner,
    limit: usize,
    lease: Duration,
) -> Result<Vec<ClaimedEvent>, TxError> {
    let mut client = inner.pool.get().await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let due = client.prepare_cached(sql::CLAIM_BUDGET_EVENTS).await?;
    let update = client.prepare_cached(sql::UPDATE_BUDGET_DELIVERIES).await?;
    let txn = client.transaction().await?;
    let now = inner.now(rows::clock(&txn.query_one(&clock, &[]).await?, "now")?);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut claimed = Vec::new();
    for row in txn.query(&due, &[&now.unix_micros(), &limit]).await? {
        let (tenant, bucket) = key_of(&row)?;
        let mut kept = kept_of(&row)?;
        if !kept.delivery.is_due(now) {
            continue;
        }
        let claim = kept.delivery.claim(now, lease);
        claimed.push(ClaimedEvent {
            key: BucketKey::new(tenant, bucket),
            kept,
            claim,
        });
    }
    if !claimed.is_empty() {
        let mut columns = DeliveryColumns::default();
        for c in &claimed {
            columns.push(&c.key, &c.kept)?;
        }
        txn.execute(&update, &columns.as_params()).await?;
    }
    txn.commit().await?;
    Ok(claimed)
}

/// Settles `claimed` at the store's clock; an event no longer kept is let
/// go.
pub(super) async fn settle(
    inner: &Inner,
    claimed: &ClaimedEvent,
    attempt: &Attempt,
    webhooks: &[String],
    backoff: &Backoff,
) -> Result<(), TxError> {
    let mut client = inner.pool.get().await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let lock = client.prepare_cached(sql::LOCK_BUDGET_EVENT).await?;
    let update = client.prepare_cached(sql::UPDATE_BUDGET_DELIVERIES).await?;
    let txn = client.transaction().await?;
    let (cycle, label) = claimed.kept.cycle_and_threshold();
    let row = txn
        .query_opt(
            &lock,
            &[
                &claimed.key.tenant.as_str(),
                &claimed.key.bucket.as_str(),
                &cycle.unix_micros(),
                &label,
            ],
        )
        .await?;
    let Some(row) = row else {
        return Ok(());
    };
    let now = inner.now(rows::clock(&txn.query_one(&clock, &[]).await?, "now")?);
    let mut kept = kept_of(&row)?;
    kept.delivery
        .settle(claimed.claim, attempt, webhooks, backoff, now);
    let mut columns = DeliveryColumns::default();
    columns.push(&claimed.key, &kept)?;
    txn.execute(&update, &columns.as_params()).await?;
    txn.commit().await?;
    Ok(())
}

/// The parameters of `update_budget_deliveries.sql`.
#[derive(Default)]
struct DeliveryColumns<'a> {
    tenants: Vec<&'a str>,
    buckets: Vec<&'a str>,
    cycles: Vec<i64>,
    thresholds: Vec<String>,
    delivered_to: Vec<String>,
    delivered_at: Vec<Option<i64>>,
    attempts: Vec<i32>,
    next_attempt_at: Vec<i64>,
    claimed_until: Vec<i64>,
    last_error: Vec<String>,
}

impl<'a> DeliveryColumns<'a> {
    fn push(&mut self, key: &'a BucketKey, kept: &KeptEvent) -> Result<(), StoreError> {
        let d = &kept.delivery;
        self.tenants.push(key.tenant.as_str());
        self.buckets.push(key.bucket.as_str());
        self.cycles.push(kept.event.cycle.start.unix_micros());
        self.thresholds.push(kept.event.threshold.label());
        self.delivered_to.push(
            serde_json::to_string(&d.delivered_to)
                .map_err(|e| StoreError::internal("encode a budget event", e))?,
        );
        self.delivered_at
            .push(d.delivered_at.map(Timestamp::unix_micros));
        self.attempts
            .push(i32::try_from(d.attempts).unwrap_or(i32::MAX));
        self.next_attempt_at.push(d.next_attempt_at.unix_micros());
        self.claimed_until.push(d.claimed_until.unix_micros());
        self.last_error.push(d.last_error.clone());
        Ok(())
    }

    fn as_params(&self) -> [&(dyn ToSql + Sync); 10] {
        [
            &self.tenants,
            &self.buckets,
            &self.cycles,
            &self.thresholds,
            &self.delivered_to,
            &self.delivered_at,
            &self.attempts,
            &self.next_attempt_at,
            &self.claimed_until,
            &self.last_error,
        ]
    }
}

fn key_of(row: &Row) -> Result<(TenantId, tollgate_core::BucketName), StoreError> {
    let read = |e: tokio_postgres::Error| StoreError::internal("read a budget row", e);
    let tenant: String = row.try_get("tenant_id").map_err(read)?;
    let bucket: String = row.try_get("bucket").map_err(read)?;
    let bad = |e: tollgate_core::InvalidInput| StoreError::internal("read a budget row", e);
    Ok((
        TenantId::parse("tenant_id", &tenant).map_err(bad)?,
        tollgate_core::BucketName::parse("bucket", &bucket).map_err(bad)?,
    ))
}

/// Appends closed cycles, each of its bucket, in `txn` (a tenant change
/// or delete, an import); sends nothing if there are none.
pub(super) async fn insert_cycles<'a>(
    txn: &deadpool_postgres::Transaction<'_>,
    cycles: impl IntoIterator<Item = (&'a BucketKey, &'a CycleRecord)>,
) -> Result<(), TxError> {
    let mut rows = BudgetRows::default();
    for (key, record) in cycles {
        rows.push(key, std::slice::from_ref(record), &[])?;
    }
    if rows.has_cycles() {
        let insert = txn.prepare_cached(sql::INSERT_BUDGET_CYCLES).await?;
        txn.execute(&insert, &rows.cycle_params()).await?;
    }
    Ok(())
}

/// Loads an image's cycles and events, `chunk` rows per statement.
pub(super) async fn import(
    txn: &deadpool_postgres::Transaction<'_>,
    image: &StoreImage,
    chunk: usize,
) -> Result<(), TxError> {
    for part in image.cycles.chunks(chunk) {
        insert_cycles(txn, part.iter().map(|(key, record)| (key, record))).await?;
    }
    let insert_events = txn.prepare_cached(sql::INSERT_BUDGET_EVENTS).await?;
    for part in image.events.chunks(chunk) {
        let mut columns = EventColumns::default();
        for (key, kept) in part {
            columns.push(key, kept)?;
        }
        txn.execute(&insert_events, &columns.as_params()).await?;
    }
    Ok(())
}

/// The parameters of `insert_budget_events.sql`: an array per column, an
/// event per index, with its delivery so far (none for a new one): the
/// delivery's columns, then the events and when they were made.
#[derive(Default)]
struct EventColumns<'a> {
    delivery: DeliveryColumns<'a>,
    events: Vec<String>,
    created: Vec<i64>,
}

impl<'a> EventColumns<'a> {
    fn push(&mut self, key: &'a BucketKey, kept: &KeptEvent) -> Result<(), StoreError> {
        self.delivery.push(key, kept)?;
        self.events.push(
            serde_json::to_string(&kept.event)
                .map_err(|e| StoreError::internal("encode a budget event", e))?,
        );
        self.created.push(kept.event.at.unix_micros());
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The delivery's columns a new or imported event starts with (its
    /// next try is when it was made; no claim, no failure yet), then the
    /// events and their times.
    fn as_params(&self) -> [&(dyn ToSql + Sync); 9] {
        let d = &self.delivery;
        [
            &d.tenants,
            &d.buckets,
            &d.cycles,
            &d.thresholds,
            &d.delivered_to,
            &d.delivered_at,
            &d.attempts,
            &self.events,
            &self.created,
        ]
    }
}
