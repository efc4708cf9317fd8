//! Export and import of the PostgreSQL store (the format of
//! [`crate::store::image`]).
//!
//! An export is one read-only REPEATABLE READ transaction: every statement
//! sees the same snapshot, so the export is consistent while servers go on
//! writing. Rows are streamed, not collected, in byte order of their keys
//! as the embedded store keeps them, so both stores export the same text.
//! An import is one transaction that first locks the tables against other
//! writers (`lock_store.sql`), checks them empty (`store_contents.sql`) or,
//! to replace, clears them (`clear_store.sql`), and inserts the rows in
//! chunks of 5 000 through the statements the store writes with.

use futures_util::{TryStreamExt, pin_mut};
use tokio_postgres::IsolationLevel;
use tokio_postgres::types::ToSql;

use super::retry::TxError;
use super::rows::{self, HeadColumns, InstanceColumns};
use super::{
    Inner, budgets, closed_entry, insert_closed, keys, named_tier, record_of, sql, to_json,
};
use crate::store::image::{Header, Record, RecordSink, StoreImage, refuse_unless_empty};
use crate::store::{Counts, StoreError};

/// Rows written by one statement of an import.
const IMPORT_CHUNK: usize = 5_000;

/// Sends every record of the store as of one snapshot.
pub(super) async fn export(inner: &Inner, mut sink: RecordSink) -> Result<Counts, TxError> {
    let mut client = inner.pool.get().await?;
    let txn = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let clock = txn.prepare_cached(sql::CLOCK).await?;
    let now = inner.now(rows::clock(&txn.query_one(&clock, &[]).await?, "now")?);
    sink.send(Record::Header(Header::new("postgres", now)))
        .await?;

    let tiers = txn.prepare_cached(sql::EXPORT_TIERS).await?;
    for row in txn.query(&tiers, &[]).await? {
        let (name, tier) = named_tier(&row)?;
        sink.send(Record::Tier { name, tier }).await?;
    }

    let records = txn.prepare_cached(sql::EXPORT_TENANT_RECORDS).await?;
    for row in txn.query(&records, &[]).await? {
        let Some(record) = record_of(&row)? else {
            continue;
        };
        sink.send(Record::Tenant {
            tenant: rows::tenant_id(&row)?,
            record,
        })
        .await?;
    }

    let states = txn.prepare_cached(sql::EXPORT_TENANT_STATES).await?;
    for row in txn.query(&states, &[]).await? {
        let (tenant, state) = super::states::from_row(&row)?;
        sink.send(Record::TenantState { tenant, state }).await?;
    }

    let buckets = txn.prepare_cached(sql::EXPORT_BUCKETS).await?;
    let stream = txn.query_raw(&buckets, no_params()).await?;
    pin_mut!(stream);
    while let Some(row) = stream.try_next().await? {
        let key = rows::bucket_key(&row)?;
        let record = if rows::row_instance_id(&row)? == 0 {
            Record::bucket(&key, rows::head_from_row(&row)?)
        } else {
            Record::instance(&key, rows::instance_from_row(&row)?)
        };
        sink.send(record).await?;
    }

    for (query, record_of_row) in [
        (
            sql::EXPORT_KEYS,
            keys::key_record as fn(&tokio_postgres::Row) -> Result<Record, StoreError>,
        ),
        (sql::EXPORT_CHECK_REQUESTS, keys::check_request_record),
    ] {
        let statement = txn.prepare_cached(query).await?;
        let stream = txn.query_raw(&statement, no_params()).await?;
        pin_mut!(stream);
        while let Some(row) = stream.try_next().await? {
            sink.send(record_of_row(&row)?).await?;
        }
    }
    let closed = txn.prepare_cached(sql::EXPORT_CLOSED_BUCKETS).await?;
    let stream = txn.query_raw(&closed, no_params()).await?;
    pin_mut!(stream);
    while let Some(row) = stream.try_next().await? {
        sink.send(Record::ClosedBucket(closed_entry(&row)?.closed))
            .await?;
    }
    budgets::export(&txn, &mut sink).await?;
    let nodes = txn.prepare_cached(sql::EXPORT_NODES).await?;
    for (tenant, node) in super::tree::from_rows(&txn.query(&nodes, &[]).await?)? {
        sink.send(Record::Organisation { tenant, node }).await?;
    }
    super::history::export(&txn, &mut sink).await?;
    super::history::export_checks(&txn, &mut sink).await?;
    txn.commit().await?;
    Ok(sink.end().await?)
}

fn no_params() -> std::iter::Empty<&'static (dyn ToSql + Sync)> {
    std::iter::empty()
}

/// Loads `image` in one transaction.
pub(super) async fn import(
    inner: &Inner,
    image: &StoreImage,
    replace: bool,
) -> Result<Counts, TxError> {
    let mut client = inner.pool.get().await?;
    let contents = client.prepare_cached(sql::STORE_CONTENTS).await?;
    let upsert_tier = client.prepare_cached(sql::UPSERT_TIER).await?;
    let insert_records = client.prepare_cached(sql::INSERT_TENANT_RECORDS).await?;
    let insert_states = client.prepare_cached(sql::INSERT_TENANT_STATES).await?;
    let insert_buckets = client.prepare_cached(&sql::INSERT_BUCKETS).await?;
    let upsert_instances = client.prepare_cached(sql::UPSERT_INSTANCES).await?;
    let txn = client.transaction().await?;
    txn.batch_execute(sql::LOCK_STORE).await?;
    if replace {
        txn.batch_execute(sql::CLEAR_STORE).await?;
    } else {
        let row = txn.query_one(&contents, &[]).await?;
        let held = |column: &'static str| -> Result<bool, StoreError> {
            row.try_get(column)
                .map_err(|e| StoreError::internal("read a stored row", e))
        };
        refuse_unless_empty(&[
            ("tiers", held("tiers")?),
            ("tenant records", held("tenants")?),
            ("tenant states", held("tenant_states")?),
            ("buckets", held("buckets")?),
            ("keys", held("keys")?),
            ("check records", held("check_requests")?),
            ("closed buckets", held("closed_buckets")?),
            ("budget cycles", held("budget_cycles")?),
            ("budget events", held("budget_events")?),
            ("organisations", held("organisation_nodes")?),
            ("usage history", held("usage_history")?),
            ("per-key check history", held("check_history")?),
        ])?;
    }

    for (name, tier) in &image.tiers {
        let definition = to_json("encode tier", tier)?;
        txn.execute(&upsert_tier, &[&name.as_str(), &definition])
            .await?;
    }
    for chunk in image.tenants.chunks(IMPORT_CHUNK) {
        let tenants: Vec<&str> = chunk.iter().map(|(t, _)| t.as_str()).collect();
        let tiers: Vec<Option<&str>> = chunk
            .iter()
            .map(|(_, r)| r.tier.as_ref().map(|t| t.as_str()))
            .collect();
        let records = chunk
            .iter()
            .map(|(_, r)| to_json("encode tenant record", r))
            .collect::<Result<Vec<String>, StoreError>>()?;
        txn.execute(&insert_records, &[&tenants, &tiers, &records])
            .await?;
    }
    for chunk in image.states.chunks(IMPORT_CHUNK) {
        let tenants: Vec<&str> = chunk.iter().map(|(t, _)| t.as_str()).collect();
        let kinds: Vec<&str> = chunk.iter().map(|(_, s)| s.kind.name()).collect();
        let since: Vec<std::time::SystemTime> = chunk
            .iter()
            .map(|(_, s)| rows::to_system_time(s.since))
            .collect();
        let actors: Vec<&str> = chunk.iter().map(|(_, s)| s.actor.as_str()).collect();
        let reasons: Vec<&str> = chunk.iter().map(|(_, s)| s.reason.as_str()).collect();
        txn.execute(
            &insert_states,
            &[&tenants, &kinds, &since, &actors, &reasons],
        )
        .await?;
    }
    for chunk in image.buckets.chunks(IMPORT_CHUNK) {
        let heads = HeadColumns::of(chunk.iter().map(|b| (&b.key, &b.head)))?;
        txn.execute(&insert_buckets, &heads.as_params()).await?;
    }
    let instances: Vec<_> = image
        .buckets
        .iter()
        .flat_map(|b| b.instances.iter().map(move |i| (&b.key, i)))
        .collect();
    for chunk in instances.chunks(IMPORT_CHUNK) {
        let mut columns = InstanceColumns::default();
        for (key, instance) in chunk {
            columns.push(key, instance)?;
        }
        txn.execute(&upsert_instances, &columns.as_params()).await?;
    }
    keys::import(&txn, &image.keys, IMPORT_CHUNK).await?;
    for chunk in image.closed.chunks(IMPORT_CHUNK) {
        insert_closed(&txn, chunk).await?;
    }
    budgets::import(&txn, image, IMPORT_CHUNK).await?;
    super::tree::import(&txn, &image.nodes, IMPORT_CHUNK).await?;
    super::history::import(&txn, &image.history, IMPORT_CHUNK).await?;
    super::history::import_checks(&txn, &image.check_history, IMPORT_CHUNK).await?;
    txn.commit().await.map_err(TxError::Commit)?;
    Ok(image.counts())
}
