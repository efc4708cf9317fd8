//! Export and import of the embedded store (the format of
//! [`crate::store::image`]).
//!
//! An export reads one read transaction: redb's snapshot, untouched by the
//! writes that commit meanwhile. An import is one write transaction,
//! which for `replace` first drops and refills the tables.

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};
use tollgate_core::key_bucket::{KeyId, RequestRecord, StoredKey};
use tollgate_core::tenant_state::StateWrite;
use tollgate_core::{BucketKey, Timestamp};

use super::budgets::{BUDGET_CYCLES, BUDGET_EVENTS};
use super::keys::{self, KEY_REQUESTS, KEYS};
use super::states::{self, TENANT_STATES};
use super::{
    BUCKETS, CLOSED_BUCKETS, INSTANCES, PARTITION_REPORTS, TENANT_RECORDS, TIERS, bucket_name,
    decode, encode, read_all_instances, read_tiers, storage, tenant_id, write_closed, write_head,
    write_record,
};
use crate::store::image::{Header, Record, RecordSink, StoreImage, refuse_unless_empty};
use crate::store::{Counts, StoreError};

/// Sends every record of the store as of one snapshot, from a blocking
/// thread.
pub(super) fn export(
    db: &Database,
    now: Timestamp,
    mut sink: RecordSink,
) -> Result<Counts, StoreError> {
    let txn = db.begin_read().map_err(storage("begin read transaction"))?;
    sink.send_blocking(Record::Header(Header::new("embedded", now)))?;
    let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    for (name, tier) in read_tiers(&tiers)? {
        sink.send_blocking(Record::Tier { name, tier })?;
    }
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    for entry in records.iter().map_err(storage("read tenant records"))? {
        let (tenant, bytes) = entry.map_err(storage("read tenant records"))?;
        sink.send_blocking(Record::Tenant {
            tenant: tenant_id(tenant.value())?,
            record: decode("decode tenant record", bytes.value())?,
        })?;
    }
    let states = txn
        .open_table(TENANT_STATES)
        .map_err(storage("open tenant states"))?;
    for entry in states.iter().map_err(storage("read tenant states"))? {
        let (tenant, bytes) = entry.map_err(storage("read tenant states"))?;
        sink.send_blocking(Record::TenantState {
            tenant: tenant_id(tenant.value())?,
            state: decode("decode tenant state", bytes.value())?,
        })?;
    }
    let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    for entry in buckets.iter().map_err(storage("read bucket rows"))? {
        let (key, bytes) = entry.map_err(storage("read bucket rows"))?;
        let (tenant, bucket) = key.value();
        let key = BucketKey::new(tenant_id(tenant)?, bucket_name(bucket)?);
        sink.send_blocking(Record::bucket(
            &key,
            decode("decode bucket row", bytes.value())?,
        ))?;
        for instance in read_all_instances(&instances, &key)? {
            sink.send_blocking(Record::instance(&key, instance))?;
        }
    }
    let keys = txn.open_table(KEYS).map_err(storage("open keys"))?;
    for entry in keys.iter().map_err(storage("read keys"))? {
        let (id, bytes) = entry.map_err(storage("read keys"))?;
        let (tenant, bucket, key) = id.value();
        let stored: StoredKey = decode("decode key", bytes.value())?;
        sink.send_blocking(Record::key(key_id(tenant, bucket, key)?, stored))?;
    }
    let requests = txn
        .open_table(KEY_REQUESTS)
        .map_err(storage("open key requests"))?;
    for entry in requests.iter().map_err(storage("read request records"))? {
        let (id, bytes) = entry.map_err(storage("read request records"))?;
        let (tenant, bucket, key, request_id) = id.value();
        let record: RequestRecord = decode("decode request record", bytes.value())?;
        sink.send_blocking(Record::check_request(
            key_id(tenant, bucket, key)?,
            request_id.to_owned(),
            record,
        ))?;
    }
    let closed = txn
        .open_table(CLOSED_BUCKETS)
        .map_err(storage("open closed buckets"))?;
    for entry in closed.iter().map_err(storage("read closed buckets"))? {
        let (_, bytes) = entry.map_err(storage("read closed buckets"))?;
        sink.send_blocking(Record::ClosedBucket(decode(
            "decode closed bucket",
            bytes.value(),
        )?))?;
    }
    super::budgets::export(&txn, &mut sink)?;
    let nodes = txn
        .open_table(super::tree::NODES)
        .map_err(storage("open organisation nodes"))?;
    for (tenant, node) in super::tree::read_every(&nodes)? {
        sink.send_blocking(Record::Organisation { tenant, node })?;
    }
    super::history::export(&txn, &mut sink)?;
    super::history::export_checks(&txn, &mut sink)?;
    sink.end_blocking()
}

fn key_id(tenant: &str, bucket: &str, key: &str) -> Result<KeyId, StoreError> {
    Ok(KeyId::new(tenant_id(tenant)?, bucket_name(bucket)?, key))
}

/// Loads `image` inside the writer's transaction. `Ok(Err(NotEmpty))`
/// writes nothing.
pub(super) fn import(
    txn: &WriteTransaction,
    image: &StoreImage,
    replace: bool,
) -> Result<Result<Counts, StoreError>, StoreError> {
    if replace {
        clear(txn)?;
    } else if let Err(refused) = refuse_unless_empty(&held(txn)?) {
        return Ok(Err(refused));
    }
    let mut tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    for (name, tier) in &image.tiers {
        let bytes = encode("encode tier", tier)?;
        tiers
            .insert(name.as_str(), bytes.as_slice())
            .map_err(storage("write tier"))?;
    }
    let mut records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    for (tenant, record) in &image.tenants {
        write_record(&mut records, tenant, record)?;
    }
    for (tenant, state) in &image.states {
        states::write(txn, tenant, &StateWrite::Put(state.clone()))?;
    }
    let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let mut instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    for bucket in &image.buckets {
        write_head(&mut buckets, &bucket.key, &bucket.head)?;
        let (t, b) = (bucket.key.tenant.as_str(), bucket.key.bucket.as_str());
        for instance in &bucket.instances {
            let bytes = encode("encode instance row", instance)?;
            instances
                .insert((t, b, instance.instance_id), bytes.as_slice())
                .map_err(storage("write instance row"))?;
        }
    }
    let mut keys_table = txn.open_table(KEYS).map_err(storage("open keys"))?;
    let mut requests = txn
        .open_table(KEY_REQUESTS)
        .map_err(storage("open key requests"))?;
    keys::write_back(&mut keys_table, &mut requests, &image.keys)?;
    super::tree::write_all(txn, &image.nodes)?;
    write_closed(txn, &image.closed)?;
    super::budgets::import(txn, image)?;
    super::history::import(txn, &image.history)?;
    super::history::import_checks(txn, &image.check_history)?;
    Ok(Ok(image.counts()))
}

/// Which kinds of rows the store holds (hot-partition reports, which last
/// seconds, do not count).
fn held(txn: &WriteTransaction) -> Result<[(&'static str, bool); 12], StoreError> {
    Ok([
        ("organisations", has_rows(txn, super::tree::NODES)?),
        ("tiers", has_rows(txn, TIERS)?),
        ("tenant records", has_rows(txn, TENANT_RECORDS)?),
        ("tenant states", has_rows(txn, TENANT_STATES)?),
        ("buckets", has_rows(txn, BUCKETS)?),
        ("keys", has_rows(txn, KEYS)?),
        ("check records", has_rows(txn, KEY_REQUESTS)?),
        ("closed buckets", has_rows(txn, CLOSED_BUCKETS)?),
        ("budget cycles", has_rows(txn, BUDGET_CYCLES)?),
        ("budget events", has_rows(txn, BUDGET_EVENTS)?),
        ("usage history", has_rows(txn, super::history::HISTORY)?),
        (
            "per-key check history",
            has_rows(txn, super::history::CHECK_HISTORY)?,
        ),
    ])
}

fn has_rows<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<bool, StoreError> {
    let table = txn.open_table(table).map_err(storage("open a table"))?;
    Ok(!table.is_empty().map_err(storage("read a table"))?)
}

/// Empties every table of tenants' state; the next `open_table` makes
/// each again, empty.
fn clear(txn: &WriteTransaction) -> Result<(), StoreError> {
    drop_table(txn, BUCKETS)?;
    drop_table(txn, INSTANCES)?;
    drop_table(txn, TIERS)?;
    drop_table(txn, TENANT_RECORDS)?;
    drop_table(txn, TENANT_STATES)?;
    drop_table(txn, super::tree::NODES)?;
    drop_table(txn, PARTITION_REPORTS)?;
    drop_table(txn, KEYS)?;
    drop_table(txn, KEY_REQUESTS)?;
    drop_table(txn, CLOSED_BUCKETS)?;
    drop_table(txn, BUDGET_CYCLES)?;
    drop_table(txn, BUDGET_EVENTS)?;
    drop_table(txn, super::history::HISTORY)?;
    drop_table(txn, super::history::CHECK_HISTORY)
}

fn drop_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<(), StoreError> {
    txn.delete_table(table)
        .map_err(storage("clear the store"))?;
    Ok(())
}
