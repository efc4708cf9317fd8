//! Per-key buckets in the embedded store: rows in, the script of
//! `tollgate_core::key_bucket` run, rows out.
//!
//! Tables:
//! - `keys`: (tenant id, bucket name, key) → JSON [`StoredKey`]; only keys
//!   below their burst have a row.
//! - `key_requests`: (tenant id, bucket name, key, request id) → JSON
//!   [`RequestRecord`], kept for retries until it expires.
//!
//! Operators' listing of per-key buckets reads the tenants' records and
//! tiers for the definitions and walks each bucket's key rows, in one read
//! transaction (a check, in the writer, never waits on it).
//!
//! A sweep walks each table from where the previous sweep stopped, a
//! bounded number of rows at a time, and removes the rows whose time has
//! come; a key a check finds full is removed at once. Where a sweep
//! stopped (`SweepCursor`) moves only once its transaction commits, so a
//! failed sweep walks the same rows again. Checks are operations of the
//! writer's batches like any other write: several calls share one
//! transaction and one commit.

use std::collections::BTreeMap;

use redb::{
    ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction,
};
use tollgate_core::key_bucket::{
    BusiestKeys, CallAnswer, CheckCall, KeyBatch, KeyId, KeyTable, KeyWrites, RequestRecord,
    StoredKey,
};
use tollgate_core::tier::{self, BucketDefinition, TenantRecord, Tier};
use tollgate_core::{BucketKey, BucketName, TenantId, TierName, Timestamp};

use super::{TENANT_RECORDS, TIERS, decode, encode, read_record, read_tier, storage, tenant_id};
use crate::store::{KeyBucketSnapshot, KeyCounts, StoreError};

pub(super) const KEYS: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("keys");
pub(super) const KEY_REQUESTS: TableDefinition<(&str, &str, &str, &str), &[u8]> =
    TableDefinition::new("key_requests");

/// Where the previous sweep stopped in each table.
#[derive(Clone, Debug, Default)]
pub(super) struct SweepCursor {
    keys: Option<(String, String, String)>,
    records: Option<(String, String, String, String)>,
}

/// Serves one call inside the writer's transaction; answers the call's
/// result and how many key rows it removed.
pub(super) fn check(
    txn: &WriteTransaction,
    call: &CheckCall,
    now: Timestamp,
) -> Result<(Result<CallAnswer, StoreError>, u64), StoreError> {
    let batch = KeyBatch::new([call]);
    let definitions = load_definitions(txn, batch.tenants())?;
    let tenant_states = super::states::read_in(txn, batch.tenants())?;
    let mut keys_table = txn.open_table(KEYS).map_err(storage("open keys"))?;
    let mut requests = txn
        .open_table(KEY_REQUESTS)
        .map_err(storage("open key requests"))?;
    let mut keys = Vec::new();
    for id in batch.keys() {
        if let Some(row) = keys_table.get(key_of(id)).map_err(storage("read key"))? {
            let stored: StoredKey = decode("decode key", row.value())?;
            keys.push((id.clone(), stored.state));
        }
    }
    let mut records = Vec::new();
    for (id, request_id) in batch.records() {
        let (t, b, k) = key_of(id);
        if let Some(row) = requests
            .get((t, b, k, request_id))
            .map_err(storage("read request record"))?
        {
            let record: RequestRecord = decode("decode request record", row.value())?;
            records.push((id.clone(), request_id.to_owned(), record));
        }
    }
    let mut table = KeyTable::new(keys, records).with_states(tenant_states);
    let answer = match table.serve(call, &definitions, now) {
        Ok(answer) => answer,
        Err(e) => return Ok((Err(e.into()), 0)),
    };
    let writes = table.writes();
    write_back(&mut keys_table, &mut requests, &writes)?;
    Ok((Ok(answer), writes.deletes.len() as u64))
}

fn key_of(id: &KeyId) -> (&str, &str, &str) {
    (
        id.bucket.tenant.as_str(),
        id.bucket.bucket.as_str(),
        &id.key,
    )
}

/// Every tenant's bucket definitions (its tier's, its overrides on top).
fn load_definitions<'a>(
    txn: &WriteTransaction,
    tenants: impl IntoIterator<Item = &'a TenantId>,
) -> Result<BTreeMap<TenantId, BTreeMap<BucketName, BucketDefinition>>, StoreError> {
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let mut out = BTreeMap::new();
    for tenant in tenants {
        let Some(record) = read_record(&records, tenant)? else {
            continue;
        };
        let tier = match &record.tier {
            Some(name) => read_tier(&tiers, name)?,
            None => None,
        };
        out.insert(
            tenant.clone(),
            tier::definitions(tier.as_ref(), &record.overrides),
        );
    }
    Ok(out)
}

type KeysTable<'t> = redb::Table<'t, (&'static str, &'static str, &'static str), &'static [u8]>;
type RequestsTable<'t> =
    redb::Table<'t, (&'static str, &'static str, &'static str, &'static str), &'static [u8]>;

pub(super) fn write_back(
    keys: &mut KeysTable<'_>,
    requests: &mut RequestsTable<'_>,
    writes: &KeyWrites,
) -> Result<(), StoreError> {
    for (id, stored) in &writes.upserts {
        let bytes = encode("encode key", stored)?;
        keys.insert(key_of(id), bytes.as_slice())
            .map_err(storage("write key"))?;
    }
    for id in &writes.deletes {
        keys.remove(key_of(id)).map_err(storage("delete key"))?;
    }
    for (id, request_id, record) in &writes.records {
        let (t, b, k) = key_of(id);
        let bytes = encode("encode request record", record)?;
        requests
            .insert((t, b, k, request_id.as_str()), bytes.as_slice())
            .map_err(storage("write request record"))?;
    }
    Ok(())
}

/// Removes up to `limit` full keys and `limit` expired records, walking
/// on from `cursor`; answers (keys removed, records removed, more waiting).
pub(super) fn sweep(
    txn: &WriteTransaction,
    cursor: &mut SweepCursor,
    limit: usize,
    now: Timestamp,
) -> Result<(u64, u64, bool), StoreError> {
    let mut keys = txn.open_table(KEYS).map_err(storage("open keys"))?;
    let (full, keys_more) = {
        let mut due = Vec::new();
        let mut last = None;
        let mut more = false;
        let start = cursor.keys.clone().unwrap_or_default();
        let range = keys
            .range((start.0.as_str(), start.1.as_str(), start.2.as_str())..)
            .map_err(storage("scan keys"))?;
        for (n, entry) in range.enumerate() {
            if n >= limit {
                more = true;
                break;
            }
            let (k, v) = entry.map_err(storage("scan keys"))?;
            let (t, b, key) = k.value();
            let owned = (t.to_owned(), b.to_owned(), key.to_owned());
            let stored: StoredKey = decode("decode key", v.value())?;
            if stored.full_at.is_some_and(|at| at <= now) {
                due.push(owned.clone());
            }
            last = Some(owned);
        }
        cursor.keys = if more { last } else { None };
        (due, more)
    };
    for (t, b, k) in &full {
        keys.remove((t.as_str(), b.as_str(), k.as_str()))
            .map_err(storage("delete key"))?;
    }
    let mut requests = txn
        .open_table(KEY_REQUESTS)
        .map_err(storage("open key requests"))?;
    let (expired, records_more) = {
        let mut due = Vec::new();
        let mut last = None;
        let mut more = false;
        let start = cursor.records.clone().unwrap_or_default();
        let range = requests
            .range(
                (
                    start.0.as_str(),
                    start.1.as_str(),
                    start.2.as_str(),
                    start.3.as_str(),
                )..,
            )
            .map_err(storage("scan request records"))?;
        for (n, entry) in range.enumerate() {
            if n >= limit {
                more = true;
                break;
            }
            let (k, v) = entry.map_err(storage("scan request records"))?;
            let (t, b, key, id) = k.value();
            let owned = (t.to_owned(), b.to_owned(), key.to_owned(), id.to_owned());
            let record: RequestRecord = decode("decode request record", v.value())?;
            if record.expires_at <= now {
                due.push(owned.clone());
            }
            last = Some(owned);
        }
        cursor.records = if more { last } else { None };
        (due, more)
    };
    for (t, b, k, id) in &expired {
        requests
            .remove((t.as_str(), b.as_str(), k.as_str(), id.as_str()))
            .map_err(storage("delete request record"))?;
    }
    Ok((
        full.len() as u64,
        expired.len() as u64,
        keys_more || records_more,
    ))
}

/// Deletes a tenant's key rows and check records.
pub(super) fn delete_tenant(txn: &WriteTransaction, tenant: &TenantId) -> Result<(), StoreError> {
    let t = tenant.as_str();
    let mut keys = txn.open_table(KEYS).map_err(storage("open keys"))?;
    let mut doomed = Vec::new();
    for entry in keys
        .range((t, "", "")..)
        .map_err(storage("read the tenant's keys"))?
    {
        let (k, _) = entry.map_err(storage("read the tenant's keys"))?;
        let (tenant, bucket, key) = k.value();
        if tenant != t {
            break;
        }
        doomed.push((bucket.to_owned(), key.to_owned()));
    }
    for (bucket, key) in &doomed {
        keys.remove((t, bucket.as_str(), key.as_str()))
            .map_err(storage("delete the tenant's keys"))?;
    }
    let mut requests = txn
        .open_table(KEY_REQUESTS)
        .map_err(storage("open key requests"))?;
    let mut doomed = Vec::new();
    for entry in requests
        .range((t, "", "", "")..)
        .map_err(storage("read the tenant's check records"))?
    {
        let (k, _) = entry.map_err(storage("read the tenant's check records"))?;
        let (tenant, bucket, key, id) = k.value();
        if tenant != t {
            break;
        }
        doomed.push((bucket.to_owned(), key.to_owned(), id.to_owned()));
    }
    for (bucket, key, id) in &doomed {
        requests
            .remove((t, bucket.as_str(), key.as_str(), id.as_str()))
            .map_err(storage("delete the tenant's check records"))?;
    }
    Ok(())
}

/// Counts the rows of both tables.
pub(super) fn counts(db: &redb::Database) -> Result<KeyCounts, StoreError> {
    let txn = db.begin_read().map_err(storage("begin read transaction"))?;
    let keys = txn.open_table(KEYS).map_err(storage("open keys"))?;
    let requests = txn
        .open_table(KEY_REQUESTS)
        .map_err(storage("open key requests"))?;
    Ok(KeyCounts {
        keys: keys.len().map_err(storage("count keys"))?,
        records: requests.len().map_err(storage("count request records"))?,
    })
}

/// Per-key buckets after `after` in tenant and bucket order, at most
/// `limit` (of `tenant` only, if given), with their keys counted and the
/// `busiest` busiest of them.
pub(super) fn list_buckets(
    db: &redb::Database,
    tenant: Option<&TenantId>,
    after: Option<&BucketKey>,
    limit: usize,
    busiest: usize,
    now: Timestamp,
) -> Result<Vec<KeyBucketSnapshot>, StoreError> {
    let txn = db.begin_read().map_err(storage("begin read transaction"))?;
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let keys = txn.open_table(KEYS).map_err(storage("open keys"))?;
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let tenant_records: Vec<(TenantId, TenantRecord)> = match tenant {
        Some(tenant) => read_record(&records, tenant)?
            .map(|record| (tenant.clone(), record))
            .into_iter()
            .collect(),
        None => Vec::new(),
    };
    let from = after.map_or("", |a| a.tenant.as_str());
    let mut walk = match tenant {
        Some(_) => None,
        None => Some(
            records
                .range(from..)
                .map_err(storage("read tenant records"))?,
        ),
    };
    let mut listed = tenant_records.into_iter();
    let mut tier_cache: BTreeMap<TierName, Option<Tier>> = BTreeMap::new();
    loop {
        let (id, record) = match walk.as_mut() {
            None => match listed.next() {
                Some(next) => next,
                None => break,
            },
            Some(range) => match range.next() {
                Some(entry) => {
                    let (id, bytes) = entry.map_err(storage("read tenant records"))?;
                    let record: TenantRecord = decode("decode tenant record", bytes.value())?;
                    (tenant_id(id.value())?, record)
                }
                None => break,
            },
        };
        let tier = match &record.tier {
            Some(name) => {
                if !tier_cache.contains_key(name) {
                    tier_cache.insert(name.clone(), read_tier(&tiers, name)?);
                }
                tier_cache.get(name).cloned().flatten()
            }
            None => None,
        };
        for (bucket, definition, defined_by) in tier::key_buckets(tier.as_ref(), &record.overrides)
        {
            let key = BucketKey::new(id.clone(), bucket);
            if after.is_some_and(|a| key <= *a) {
                continue;
            }
            let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
            let mut keys_stored = 0u64;
            let mut top = BusiestKeys::new(busiest);
            for entry in keys.range((t, b, "")..).map_err(storage("read keys"))? {
                let (k, v) = entry.map_err(storage("read keys"))?;
                let (kt, kb, name) = k.value();
                if kt != t || kb != b {
                    break;
                }
                keys_stored += 1;
                top.push(name.to_owned(), decode("decode key", v.value())?);
            }
            out.push(KeyBucketSnapshot {
                key,
                definition,
                defined_by,
                keys_stored,
                busiest: top.into_vec(),
                read_at: now,
            });
            if out.len() >= limit {
                return Ok(out);
            }
        }
    }
    Ok(out)
}
