//! Per-key buckets in PostgreSQL: a batch of checks' rows in, the script of
//! `tollgate_core::key_bucket` run, rows out. No rule of the core is
//! repeated here.
//!
//! Tables (`sql/migrations/V5__keys.sql`, `V12__key_quotas.sql`):
//! - `tollgate_keys`: (tenant_id, bucket, key) → tokens, last_refill,
//!   full_at, quota_used, quota_cycle_end. Only keys below their burst or
//!   with a quota in use have a row.
//! - `tollgate_check_requests`: (tenant_id, bucket, key, request_id) → the
//!   JSON [`RequestRecord`] and its expires_at, kept for retries.
//!
//! Keys and request ids are BYTEA (their UTF-8 bytes, NUL included); times
//! are BIGINT microseconds, the core's [`Timestamp`].
//!
//! **Why advisory locks.** A full key has no row, so `SELECT … FOR UPDATE`
//! has nothing to lock, and two replicas that both found a key absent
//! would both take its burst. A batch therefore first takes a
//! transaction-scoped advisory lock per key (`lock_keys.sql`), whose id is
//! [`lock_id`], in ascending id order so that two batches never wait on
//! each other in a cycle (any one order every batch follows will do; it
//! need not be [`KeyBatch::keys`]'s). The transaction runs under READ COMMITTED
//! whatever the database's default, because each later statement then
//! reads a snapshot taken after the locks are held, and so sees everything
//! the key's previous holder committed (PostgreSQL releases a
//! transaction's locks only once its changes are visible). A key's lock
//! also stands for its request records.
//!
//! A batch is one transaction of two round trips: BEGIN, the locks, the
//! clock, the key rows, the records and the tenants' definitions; then,
//! after the script has served every call in turn on the same rows, the
//! upserts, deletes and new records, one statement each, and COMMIT. BEGIN
//! and COMMIT are sent by hand to ride with the other statements; a batch
//! that fails is rolled back before its connection goes back to the pool.
//! A connection lost with COMMIT in flight leaves the outcome unknown
//! ([`TxError::Commit`]), as a lost commit does.
//!
//! **Operators' listing** of per-key buckets (`list_key_bucket_tenants.sql`,
//! `read_key_buckets.sql`) is a read-only REPEATABLE READ transaction: the
//! tenants' records and tiers for the definitions, then each bucket's keys
//! counted and its busiest read. It takes no lock, so a check never waits
//! on it.
//!
//! **The sweep** takes no key lock: a full key's row says what its absence
//! says, so deleting it changes no answer. It deletes only rows whose time
//! has come by the store's clock, skipping rows a check holds (`SKIP
//! LOCKED`), so it never waits; a check's upserts replace a row or insert
//! it again (`ON CONFLICT`), whichever the sweep left. It names the rows
//! by `ctid`, so a sweep costs its limit, not the table's size.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, Row};
use tollgate_core::budget::QuotaUse;
use tollgate_core::key_bucket::{
    CallAnswer, CheckCall, KeyBatch, KeyId, KeyState, KeyTable, KeyWrites, RequestRecord,
    StoredKey, busiest_first,
};
use tollgate_core::tier::{self, BucketDefinition, DefinedBy, TenantRecord, Tier};
use tollgate_core::{BucketKey, BucketName, TenantId, Timestamp};

use super::retry::TxError;
use super::{Inner, rows, settle, sql};
use crate::store::{KeyBucketSnapshot, KeyCounts, KeySweep, Record, StoreError};

/// A queued check.
pub(super) struct PendingCheck {
    pub(super) call: CheckCall,
    pub(super) reply: oneshot::Sender<Result<CallAnswer, StoreError>>,
}

/// What a committed batch of checks did.
pub(super) struct ChecksOutcome {
    /// Per call, in batch order: its answer, or why it was refused (a
    /// refused call changed nothing).
    pub(super) answers: Vec<Result<CallAnswer, StoreError>>,
    /// Key rows deleted for being full again.
    pub(super) keys_removed: u64,
}

/// The advisory lock id of a key: a 64-bit hash of (tenant id, bucket,
/// key) that every replica computes alike, whatever its version. It is
/// FNV-1a with a final mix (splitmix64's), not the standard library's
/// hasher, whose algorithm may change from one Rust release to the next.
/// A byte 0xFF, which UTF-8 never contains, ends each part, so two
/// different keys never hash the same bytes.
pub(super) fn lock_id(key: &KeyId) -> i64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = FNV_OFFSET;
    let parts = [
        key.bucket.tenant.as_str(),
        key.bucket.bucket.as_str(),
        key.key.as_str(),
    ];
    for byte in parts
        .iter()
        .flat_map(|part| part.bytes().chain(std::iter::once(0xFF)))
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Keys as the three parallel arrays the statements take.
struct KeyColumns<'a> {
    tenants: Vec<&'a str>,
    buckets: Vec<&'a str>,
    keys: Vec<&'a [u8]>,
}

impl<'a> KeyColumns<'a> {
    fn new(ids: impl IntoIterator<Item = &'a KeyId>) -> Self {
        let mut columns = KeyColumns {
            tenants: Vec::new(),
            buckets: Vec::new(),
            keys: Vec::new(),
        };
        for id in ids {
            columns.tenants.push(id.bucket.tenant.as_str());
            columns.buckets.push(id.bucket.bucket.as_str());
            columns.keys.push(id.key.as_bytes());
        }
        columns
    }
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: &'static str,
) -> Result<T, StoreError> {
    row.try_get(column)
        .map_err(|e| StoreError::internal("read a stored row", e))
}

/// The item of `items` a row answers for: its column `n`, the 1-based
/// place in the statement's arrays.
fn item_of<'a, T>(items: &'a [T], row: &Row) -> Result<&'a T, StoreError> {
    let n: i64 = get(row, "n")?;
    usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| items.get(i))
        .ok_or_else(|| StoreError::internal("read a stored row", format!("no item {n} was asked")))
}

fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::internal("decode a stored document", e))
}

fn encode<T: serde::Serialize>(what: &'static str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::internal(what, e))
}

type Definitions = BTreeMap<TenantId, BTreeMap<BucketName, BucketDefinition>>;

/// Each tenant's definitions (its tier's, its overrides on top), from the
/// rows of `read_definitions.sql`.
fn definitions_of(tenants: &[&TenantId], found: &[Row]) -> Result<Definitions, StoreError> {
    let mut out = BTreeMap::new();
    for row in found {
        let tenant = item_of(tenants, row)?;
        let record: Option<&str> = get(row, "record")?;
        // NULL only inside a first change's transaction: no record yet.
        let Some(record) = record.map(decode::<TenantRecord>).transpose()? else {
            continue;
        };
        let definition: Option<&str> = get(row, "definition")?;
        let tier = definition.map(decode::<Tier>).transpose()?;
        out.insert(
            (*tenant).clone(),
            tier::definitions(tier.as_ref(), &record.overrides),
        );
    }
    Ok(out)
}

/// Serves `pending` in one transaction: locks their keys, reads the rows,
/// answers each call in turn by the script of `tollgate_core::key_bucket`,
/// writes back and commits.
pub(super) async fn check_batch(
    store: &Inner,
    pending: &[PendingCheck],
) -> Result<ChecksOutcome, TxError> {
    let client = store.pool.get().await?;
    match in_transaction(store, &client, pending).await {
        Ok(outcome) => Ok(outcome),
        Err(e) => {
            // The transaction is BEGIN and COMMIT sent by hand (so that
            // each rides with other statements): on a failure, end it
            // before the connection goes back to the pool, or drop the
            // connection if even that fails.
            if client.batch_execute("ROLLBACK").await.is_err() {
                drop(deadpool_postgres::Object::take(client));
            }
            Err(e)
        }
    }
}

/// A batch's transaction: two round trips, BEGIN riding with the reads and
/// COMMIT with the writes.
async fn in_transaction(
    store: &Inner,
    client: &deadpool_postgres::Client,
    pending: &[PendingCheck],
) -> Result<ChecksOutcome, TxError> {
    let lock = client.prepare_cached(sql::LOCK_KEYS).await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let read_keys = client.prepare_cached(sql::READ_KEYS).await?;
    let read_records = client.prepare_cached(sql::READ_CHECK_REQUESTS).await?;
    let read_definitions = client.prepare_cached(sql::READ_DEFINITIONS).await?;
    let read_states = client.prepare_cached(sql::READ_TENANT_STATES).await?;
    let upsert_keys = client.prepare_cached(sql::UPSERT_KEYS).await?;
    let delete_keys = client.prepare_cached(sql::DELETE_KEYS).await?;
    let upsert_records = client.prepare_cached(sql::UPSERT_CHECK_REQUESTS).await?;
    let batch = KeyBatch::new(pending.iter().map(|p| &p.call));
    let keys: Vec<&KeyId> = batch.keys().into_iter().collect();
    let tenants: Vec<&TenantId> = batch.tenants().into_iter().collect();
    let wanted_records: Vec<(&KeyId, &str)> = batch.records().into_iter().collect();

    let mut lock_ids: Vec<i64> = keys.iter().map(|key| lock_id(key)).collect();
    lock_ids.sort_unstable();
    lock_ids.dedup();
    let key_columns = KeyColumns::new(keys.iter().copied());
    let record_columns = KeyColumns::new(wanted_records.iter().map(|(key, _)| *key));
    let request_ids: Vec<&[u8]> = wanted_records.iter().map(|(_, id)| id.as_bytes()).collect();
    let tenant_ids: Vec<&str> = tenants.iter().map(|t| t.as_str()).collect();
    let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_ids];
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let key_params: [&(dyn ToSql + Sync); 3] = [
        &key_columns.tenants,
        &key_columns.buckets,
        &key_columns.keys,
    ];
    let record_params: [&(dyn ToSql + Sync); 4] = [
        &record_columns.tenants,
        &record_columns.buckets,
        &record_columns.keys,
        &request_ids,
    ];
    let tenant_params: [&(dyn ToSql + Sync); 1] = [&tenant_ids];
    // One round trip: BEGIN (READ COMMITTED whatever the database's
    // default, see the module's docs), the locks, then (once they are
    // held) the clock, the rows and the tenants' states. Requests go out in the order the
    // futures are first polled, which `join` and `join_all` keep.
    let (begun, read) = futures_util::future::join(
        client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
        join_all([
            client.query(&lock, &lock_params[..]),
            client.query(&clock, &no_params[..]),
            client.query(&read_keys, &key_params[..]),
            client.query(&read_records, &record_params[..]),
            client.query(&read_definitions, &tenant_params[..]),
            client.query(&read_states, &tenant_params[..]),
        ]),
    )
    .await;
    begun?;
    let mut read = settle(read)?.into_iter().skip(1);
    let mut next = || read.next().unwrap_or_default();
    let (clock_rows, key_rows, record_rows, definition_rows, state_rows) =
        (next(), next(), next(), next(), next());
    let clock_row = clock_rows
        .first()
        .ok_or_else(|| StoreError::internal("read the clock", "no row"))?;
    let now = store.now(rows::clock(clock_row, "now")?);

    let stored = key_rows
        .iter()
        .map(|row| {
            let key = item_of(&keys, row)?;
            Ok(((*key).clone(), key_state(row)?))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let kept = record_rows
        .iter()
        .map(|row| {
            let (key, id) = item_of(&wanted_records, row)?;
            let record: RequestRecord = decode(get(row, "record")?)?;
            Ok(((*key).clone(), (*id).to_owned(), record))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let definitions = definitions_of(&tenants, &definition_rows)?;

    let mut table = KeyTable::new(stored, kept).with_states(super::states::from_rows(&state_rows)?);
    let answers = pending
        .iter()
        .map(|p| {
            table
                .serve(&p.call, &definitions, now)
                .map_err(StoreError::from)
        })
        .collect();
    let writes = table.writes();

    let upserts = UpsertColumns::new(&writes.upserts);
    let deletes = KeyColumns::new(&writes.deletes);
    let records = RecordColumns::new(&writes.records)?;
    let upsert_params = upserts.as_params();
    let delete_params: [&(dyn ToSql + Sync); 3] =
        [&deletes.tenants, &deletes.buckets, &deletes.keys];
    let record_params = records.as_params();
    // One round trip, with only the statements that have rows to write;
    // the delete's count comes back at `delete_at`.
    let mut statements = Vec::with_capacity(3);
    if !writes.upserts.is_empty() {
        statements.push((&upsert_keys, &upsert_params[..]));
    }
    let delete_at = (!writes.deletes.is_empty()).then(|| {
        statements.push((&delete_keys, &delete_params[..]));
        statements.len() - 1
    });
    if !writes.records.is_empty() {
        statements.push((&upsert_records, &record_params[..]));
    }
    // COMMIT rides with them. A write that failed aborted the
    // transaction, and PostgreSQL then answers COMMIT with a rollback, not
    // an error: the writes' results decide first.
    let (written, committed) = futures_util::future::join(
        join_all(
            statements
                .iter()
                .map(|(statement, params)| client.execute(*statement, params)),
        ),
        client.batch_execute("COMMIT"),
    )
    .await;
    let counts = match settle(written) {
        Ok(counts) => counts,
        // The database refused a write: the transaction is aborted and
        // the COMMIT behind it rolled back.
        Err(e) if e.code().is_some() => return Err(TxError::Db(e)),
        // The connection failed with COMMIT already sent: it may have
        // been applied.
        Err(e) => return Err(TxError::Commit(e)),
    };
    committed.map_err(TxError::Commit)?;
    let keys_removed = delete_at.and_then(|i| counts.get(i).copied()).unwrap_or(0);
    Ok(ChecksOutcome {
        answers,
        keys_removed,
    })
}

/// The parameters of `upsert_keys.sql`.
struct UpsertColumns<'a> {
    keys: KeyColumns<'a>,
    tokens: Vec<f64>,
    last_refill: Vec<i64>,
    full_at: Vec<Option<i64>>,
    quota_used: Vec<Option<f64>>,
    quota_cycle_end: Vec<Option<i64>>,
}

impl<'a> UpsertColumns<'a> {
    fn new(upserts: &'a [(KeyId, StoredKey)]) -> Self {
        let stored = || upserts.iter().map(|(_, stored)| stored);
        UpsertColumns {
            keys: KeyColumns::new(upserts.iter().map(|(id, _)| id)),
            tokens: stored().map(|s| s.state.tokens).collect(),
            last_refill: stored()
                .map(|s| s.state.last_refill.unix_micros())
                .collect(),
            full_at: stored()
                .map(|s| s.full_at.map(Timestamp::unix_micros))
                .collect(),
            quota_used: stored().map(|s| s.state.quota.map(|q| q.used)).collect(),
            quota_cycle_end: stored()
                .map(|s| s.state.quota.map(|q| q.cycle_end.unix_micros()))
                .collect(),
        }
    }

    fn as_params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.keys.tenants,
            &self.keys.buckets,
            &self.keys.keys,
            &self.tokens,
            &self.last_refill,
            &self.full_at,
            &self.quota_used,
            &self.quota_cycle_end,
        ]
    }
}

/// The parameters of `upsert_check_requests.sql`.
struct RecordColumns<'a> {
    keys: KeyColumns<'a>,
    request_ids: Vec<&'a [u8]>,
    records: Vec<String>,
    expires_at: Vec<i64>,
}

impl<'a> RecordColumns<'a> {
    fn new(records: &'a [(KeyId, String, RequestRecord)]) -> Result<Self, StoreError> {
        Ok(RecordColumns {
            keys: KeyColumns::new(records.iter().map(|(id, _, _)| id)),
            request_ids: records.iter().map(|(_, id, _)| id.as_bytes()).collect(),
            records: records
                .iter()
                .map(|(_, _, record)| encode("encode request record", record))
                .collect::<Result<_, _>>()?,
            expires_at: records
                .iter()
                .map(|(_, _, record)| record.expires_at.unix_micros())
                .collect(),
        })
    }

    fn as_params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.keys.tenants,
            &self.keys.buckets,
            &self.keys.keys,
            &self.request_ids,
            &self.records,
            &self.expires_at,
        ]
    }
}

/// Writes an import's keys and check records, `chunk` rows a statement.
pub(super) async fn import(
    txn: &deadpool_postgres::Transaction<'_>,
    writes: &KeyWrites,
    chunk: usize,
) -> Result<(), TxError> {
    let upsert_keys = txn.prepare_cached(sql::UPSERT_KEYS).await?;
    let upsert_records = txn.prepare_cached(sql::UPSERT_CHECK_REQUESTS).await?;
    for upserts in writes.upserts.chunks(chunk) {
        let columns = UpsertColumns::new(upserts);
        txn.execute(&upsert_keys, &columns.as_params()).await?;
    }
    for records in writes.records.chunks(chunk) {
        let columns = RecordColumns::new(records)?;
        txn.execute(&upsert_records, &columns.as_params()).await?;
    }
    Ok(())
}

/// A key's state from its row's columns (tokens, last_refill, quota_used,
/// quota_cycle_end).
fn key_state(row: &Row) -> Result<KeyState, StoreError> {
    let used: Option<f64> = get(row, "quota_used")?;
    let cycle_end: Option<i64> = get(row, "quota_cycle_end")?;
    Ok(KeyState {
        tokens: get(row, "tokens")?,
        last_refill: Timestamp::from_unix_micros(get(row, "last_refill")?),
        quota: used.zip(cycle_end).map(|(used, end)| QuotaUse {
            cycle_end: Timestamp::from_unix_micros(end),
            used,
        }),
    })
}

/// A row of `export_keys.sql` as an export's record.
pub(super) fn key_record(row: &Row) -> Result<Record, StoreError> {
    let id = key_id(row)?;
    let full_at: Option<i64> = get(row, "full_at")?;
    Ok(Record::key(
        id,
        StoredKey {
            state: key_state(row)?,
            full_at: full_at.map(Timestamp::from_unix_micros),
        },
    ))
}

/// A row of `export_check_requests.sql` as an export's record.
pub(super) fn check_request_record(row: &Row) -> Result<Record, StoreError> {
    let id = key_id(row)?;
    let request_id = utf8(get(row, "request_id")?, "request_id")?;
    let record: &str = get(row, "record")?;
    Ok(Record::check_request(id, request_id, decode(record)?))
}

fn key_id(row: &Row) -> Result<KeyId, StoreError> {
    Ok(KeyId {
        bucket: rows::bucket_key(row)?,
        key: utf8(get(row, "key")?, "key")?,
    })
}

fn utf8(bytes: Vec<u8>, column: &'static str) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|e| {
        StoreError::internal("read a stored key", format!("{column} is not UTF-8: {e}"))
    })
}

/// Removes up to `limit` key rows full by now and up to `limit` expired
/// records, in one transaction.
pub(super) async fn sweep(store: &Inner, limit: usize) -> Result<KeySweep, TxError> {
    if limit == 0 {
        return Ok(KeySweep::default());
    }
    let mut client = store.pool.get().await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let sweep_keys = client.prepare_cached(sql::SWEEP_KEYS).await?;
    let sweep_records = client.prepare_cached(sql::SWEEP_CHECK_REQUESTS).await?;
    // READ COMMITTED, so that a row a check changed since the statement
    // began is tested again, not deleted as it was.
    let txn = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    let now = store
        .now(rows::clock(&txn.query_one(&clock, &[]).await?, "now")?)
        .unix_micros();
    let most = i64::try_from(limit).unwrap_or(i64::MAX);
    let params: [&(dyn ToSql + Sync); 2] = [&now, &most];
    let counts = settle(
        join_all([
            txn.execute(&sweep_keys, &params),
            txn.execute(&sweep_records, &params),
        ])
        .await,
    )?;
    txn.commit().await.map_err(TxError::Commit)?;
    let (keys, records) = (
        counts.first().copied().unwrap_or(0),
        counts.get(1).copied().unwrap_or(0),
    );
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    Ok(KeySweep {
        keys,
        records,
        more: keys >= limit || records >= limit,
    })
}

/// Tenant records read per round trip while listing per-key buckets.
const LISTING_TENANTS: i64 = 1000;

/// Per-key buckets after `after` in tenant and bucket order, at most
/// `limit` (of `tenant` only, if given), with their keys counted and the
/// `busiest` busiest of them, from one snapshot.
pub(super) async fn list_buckets(
    store: &Inner,
    tenant: Option<&TenantId>,
    after: Option<&BucketKey>,
    limit: usize,
    busiest: usize,
) -> Result<Vec<KeyBucketSnapshot>, TxError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut client = store.pool.get().await?;
    let list_tenants = client.prepare_cached(sql::LIST_KEY_BUCKET_TENANTS).await?;
    let read = client.prepare_cached(sql::READ_KEY_BUCKETS).await?;
    let txn = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let mut wanted: Vec<(BucketKey, BucketDefinition, DefinedBy)> = Vec::new();
    // Per tenant, in order: its per-key definitions, those after `after`,
    // until `limit`. True once `limit` is reached.
    let mut take = |id: TenantId, record: TenantRecord, tier: Option<Tier>| {
        for (bucket, definition, by) in tier::key_buckets(tier.as_ref(), &record.overrides) {
            // `after`'s own tenant goes on after its bucket; the store
            // answered only tenants from `after`'s on, in its order.
            if after.is_some_and(|a| a.tenant == id && bucket <= a.bucket) {
                continue;
            }
            wanted.push((BucketKey::new(id.clone(), bucket), definition, by));
            if wanted.len() >= limit {
                return true;
            }
        }
        false
    };
    let decoded = |row: &Row,
                   id: &str|
     -> Result<Option<(TenantId, TenantRecord, Option<Tier>)>, StoreError> {
        let id = TenantId::parse("tenant_id", id)
            .map_err(|e| StoreError::internal("decode tenant id", e))?;
        let record: Option<&str> = get(row, "record")?;
        let Some(record) = record.map(decode::<TenantRecord>).transpose()? else {
            return Ok(None);
        };
        let definition: Option<&str> = get(row, "definition")?;
        Ok(Some((
            id,
            record,
            definition.map(decode::<Tier>).transpose()?,
        )))
    };
    if let Some(tenant) = tenant {
        let read = txn.prepare_cached(sql::READ_DEFINITIONS).await?;
        let ids = [tenant.as_str()];
        if let Some(row) = txn.query_opt(&read, &[&&ids[..]]).await?
            && let Some((id, record, tier)) = decoded(&row, tenant.as_str())?
        {
            take(id, record, tier);
        }
    } else {
        let (mut from, mut inclusive) = match after {
            Some(a) => (a.tenant.as_str().to_owned(), true),
            None => (String::new(), false),
        };
        'tenants: loop {
            let found = txn
                .query(&list_tenants, &[&from, &inclusive, &LISTING_TENANTS])
                .await?;
            for row in &found {
                let id: &str = get(row, "tenant_id")?;
                if let Some((id, record, tier)) = decoded(row, id)?
                    && take(id, record, tier)
                {
                    break 'tenants;
                }
            }
            match found.last() {
                Some(last) if found.len() as i64 == LISTING_TENANTS => {
                    from = get::<&str>(last, "tenant_id")?.to_owned();
                    inclusive = false;
                }
                _ => break,
            }
        }
    }
    if wanted.is_empty() {
        txn.commit().await.map_err(TxError::Commit)?;
        return Ok(Vec::new());
    }
    let tenants: Vec<&str> = wanted.iter().map(|(k, ..)| k.tenant.as_str()).collect();
    let buckets: Vec<&str> = wanted.iter().map(|(k, ..)| k.bucket.as_str()).collect();
    let most = i64::try_from(busiest).unwrap_or(i64::MAX);
    let found = txn.query(&read, &[&tenants, &buckets, &most]).await?;
    txn.commit().await.map_err(TxError::Commit)?;
    let mut out: Vec<KeyBucketSnapshot> = Vec::with_capacity(wanted.len());
    for (key, definition, defined_by) in &wanted {
        out.push(KeyBucketSnapshot {
            key: key.clone(),
            definition: definition.clone(),
            defined_by: *defined_by,
            keys_stored: 0,
            busiest: Vec::new(),
            read_at: Timestamp::EPOCH,
        });
    }
    for row in &found {
        let n: i64 = get(row, "n")?;
        let slot = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| out.get_mut(i))
            .ok_or_else(|| {
                StoreError::internal("read a stored row", format!("no bucket {n} was asked"))
            })?;
        let stored: i64 = get(row, "stored")?;
        slot.keys_stored =
            u64::try_from(stored).map_err(|e| StoreError::internal("count keys", e))?;
        slot.read_at = store.now(rows::clock(row, "read_at")?);
        let key: Option<Vec<u8>> = get(row, "key")?;
        if let Some(key) = key {
            let full_at: Option<i64> = get(row, "full_at")?;
            slot.busiest.push((
                utf8(key, "key")?,
                StoredKey {
                    state: key_state(row)?,
                    full_at: full_at.map(Timestamp::from_unix_micros),
                },
            ));
        }
    }
    for bucket in &mut out {
        bucket
            .busiest
            .sort_by(|a, b| busiest_first((&a.0, &a.1), (&b.0, &b.1)));
    }
    Ok(out)
}

/// Counts the rows of both tables.
pub(super) async fn counts(store: &Inner) -> Result<KeyCounts, TxError> {
    let client = store.pool.get().await?;
    let count = client.prepare_cached(sql::COUNT_KEYS).await?;
    let row = client.query_one(&count, &[]).await?;
    let count = |column| -> Result<u64, StoreError> {
        let n: i64 = get(&row, column)?;
        u64::try_from(n).map_err(|e| StoreError::internal("count keys", e))
    };
    Ok(KeyCounts {
        keys: count("keys")?,
        records: count("records")?,
    })
}

#[cfg(test)]
mod tests {
    use tollgate_core::BucketName;

    use super::*;

    fn key(tenant: &str, bucket: &str, key: &str) -> KeyId {
        KeyId::new(
            TenantId::parse("tenant_id", tenant).expect("valid id"),
            BucketName::parse("bucket", bucket).expect("valid name"),
            key,
        )
    }

    /// Replicas of different versions lock the same key only if they
    /// agree on its id: the hash must never change.
    #[test]
    fn lock_ids_are_fixed_for_good() {
        assert_eq!(
            lock_id(&key("acme", "per-user", "alice")),
            -4_767_483_218_994_791_805
        );
    }

    #[test]
    fn lock_ids_keep_the_parts_apart() {
        let ids = [
            lock_id(&key("ab", "c", "d")),
            lock_id(&key("a", "bc", "d")),
            lock_id(&key("a", "b", "cd")),
            lock_id(&key("a", "b", "c\0d")),
            lock_id(&key("a", "b", "c\u{ff}")),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
