//! The script every store runs for checks, written once: which rows to
//! lock and read, how each call is answered from them (definitions
//! resolved, retries answered from their record, [`check`] run), and what
//! to write back.
//!
//! A store serves a batch of calls in one transaction: it locks and reads
//! the keys of [`KeyBatch::keys`] (in that order, so two batches never
//! deadlock), the records of [`KeyBatch::records`], and the definitions of
//! the tenants in [`KeyBatch::tenants`] with their state rows
//! ([`KeyTable::with_states`]: a deleted or suspended tenant's calls are
//! refused by [`tenant_state::admit`]); it then answers each call in turn
//! with [`KeyTable::serve`] (a later call sees what an earlier one took)
//! and writes [`KeyTable::writes`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{CheckItem, ItemAnswer, KeySlot, KeyState, MAX_CHECK_ITEMS, check, validate_key};
use crate::global_bucket::Limits;
use crate::tenant_state::{self, TenantRefused, TenantState};
use crate::tier::{BucketDefinition, BucketKind};
use crate::time::Timestamp;
use crate::validate::{BucketKey, BucketName, InvalidInput, TenantId};

/// How long a check's record is kept for its retries: a retry with the
/// same request id within this time gets the first answer; after it, the
/// retry is a new check.
pub const REQUEST_RECORD_TTL: Duration = Duration::from_secs(600);
/// The longest request id, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// One key of one per-key bucket of one tenant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyId {
    pub bucket: BucketKey,
    pub key: String,
}

impl KeyId {
    pub fn new(tenant: TenantId, bucket: BucketName, key: impl Into<String>) -> Self {
        KeyId {
            bucket: BucketKey::new(tenant, bucket),
            key: key.into(),
        }
    }
}

/// One item of a call, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestItem {
    pub key: KeyId,
    pub tokens: f64,
    /// The caller's name for this check: a retry with the same id (on the
    /// same key) gets the first answer and takes nothing again.
    pub request_id: Option<String>,
}

/// One call: items taken together or not at all.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckCall {
    pub items: Vec<RequestItem>,
}

impl CheckCall {
    /// Checks the call's shape: 1 to [`MAX_CHECK_ITEMS`] items, each with a
    /// valid key, tokens and request id. Field names are the wire's
    /// (`items[2].key`).
    pub fn new(items: Vec<RequestItem>) -> Result<CheckCall, InvalidInput> {
        validate_item_count(items.len())?;
        for (i, item) in items.iter().enumerate() {
            let field = |name: &str| format!("items[{i}].{name}");
            validate_key(&field("key"), &item.key.key)?;
            super::validate_tokens(&field("tokens"), item.tokens)?;
            if let Some(id) = &item.request_id {
                validate_request_id(&field("request_id"), id)?;
            }
        }
        Ok(CheckCall { items })
    }
}

/// Checks the number of items in a call: 1 to [`MAX_CHECK_ITEMS`].
pub fn validate_item_count(count: usize) -> Result<(), InvalidInput> {
    if count == 0 {
        return Err(InvalidInput::new("items", "must hold at least one item"));
    }
    if count > MAX_CHECK_ITEMS {
        return Err(InvalidInput::new(
            "items",
            format!("must hold at most {MAX_CHECK_ITEMS} items, got {count}"),
        ));
    }
    Ok(())
}

/// Checks a request id: not empty, at most [`MAX_REQUEST_ID_LEN`] bytes.
pub fn validate_request_id(field: &str, id: &str) -> Result<(), InvalidInput> {
    if id.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    if id.len() > MAX_REQUEST_ID_LEN {
        return Err(InvalidInput::new(
            field,
            format!(
                "must be at most {MAX_REQUEST_ID_LEN} bytes, got {}",
                id.len()
            ),
        ));
    }
    Ok(())
}

/// What a check with a request id answered, kept for its retries.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The tokens the item asked for: a retry must ask the same.
    pub tokens: f64,
    pub answer: ItemAnswer,
    pub limits: Limits,
    /// When the record may go.
    pub expires_at: Timestamp,
}

/// A stored key: its bucket and when its row may go: when it will be full
/// (under the limits it was written with) and its quota use, if any, is
/// over.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredKey {
    pub state: KeyState,
    /// `None`: never (no refill).
    pub full_at: Option<Timestamp>,
}

impl StoredKey {
    pub fn new(state: KeyState, limits: &Limits) -> StoredKey {
        let missing = limits.burst_limit - state.tokens;
        let full_at = if missing <= 0.0 {
            Some(state.last_refill)
        } else if limits.refill_rate > 0.0 {
            Duration::try_from_secs_f64(missing / limits.refill_rate)
                .ok()
                .map(|d| state.last_refill.saturating_add(d))
        } else {
            None
        };
        // A quota in use keeps the row until its cycle ends.
        let full_at = match state.quota.filter(|q| q.used > 0.0) {
            Some(q) => full_at.map(|at| at.max(q.cycle_end)),
            None => full_at,
        };
        StoredKey { state, full_at }
    }
}

/// Why a call could not be answered; nothing was taken.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// The tenant has no definition of that name (or is not on a tier and
    /// has no overrides).
    #[error("{field}: tenant \"{}\" has no bucket \"{}\"", .key.tenant, .key.bucket)]
    BucketNotFound { field: String, key: BucketKey },
    /// The definition is a shared bucket, checked with token-bucket
    /// requests, not per key.
    #[error("{field}: bucket \"{}\" of tenant \"{}\" is a shared bucket, not a per-key bucket", .key.bucket, .key.tenant)]
    NotPerKey { field: String, key: BucketKey },
    /// The tenant is deleted or suspended.
    #[error(transparent)]
    TenantRefused(#[from] TenantRefused),
}

impl CheckError {
    /// The same error, the field it names renamed by `rename` (the native
    /// API's `items[i].…` into another API's names).
    pub fn renamed(self, rename: impl FnOnce(&str) -> String) -> Self {
        match self {
            CheckError::InvalidInput(e) => CheckError::InvalidInput(e.renamed(rename)),
            CheckError::BucketNotFound { field, key } => CheckError::BucketNotFound {
                field: rename(&field),
                key,
            },
            CheckError::NotPerKey { field, key } => CheckError::NotPerKey {
                field: rename(&field),
                key,
            },
            e @ CheckError::TenantRefused(_) => e,
        }
    }
}

/// One item's answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ItemResult {
    pub answer: ItemAnswer,
    /// The definition the key was checked under.
    pub limits: Limits,
    /// True if this is a retry answered from the first check's record.
    pub replayed: bool,
}

/// A call's answer: allowed if every item was.
#[derive(Clone, Debug, PartialEq)]
pub struct CallAnswer {
    pub allowed: bool,
    pub items: Vec<ItemResult>,
    /// The store's clock when the call was answered.
    pub at: Timestamp,
}

/// A batch of calls, as a store receives them.
#[derive(Clone, Debug, Default)]
pub struct KeyBatch<'a> {
    calls: Vec<&'a CheckCall>,
}

impl<'a> KeyBatch<'a> {
    pub fn new(calls: impl IntoIterator<Item = &'a CheckCall>) -> Self {
        KeyBatch {
            calls: calls.into_iter().collect(),
        }
    }

    /// Every key the batch touches, in the order to lock them.
    pub fn keys(&self) -> BTreeSet<&'a KeyId> {
        self.items().map(|item| &item.key).collect()
    }

    /// The tenants whose definitions the batch needs, in order.
    pub fn tenants(&self) -> BTreeSet<&'a TenantId> {
        self.items().map(|item| &item.key.bucket.tenant).collect()
    }

    /// The records retries may be answered from, in key order.
    pub fn records(&self) -> BTreeSet<(&'a KeyId, &'a str)> {
        self.items()
            .filter_map(|item| Some((&item.key, item.request_id.as_deref()?)))
            .collect()
    }

    fn items(&self) -> impl Iterator<Item = &'a RequestItem> + '_ {
        self.calls.iter().flat_map(|call| call.items.iter())
    }
}

/// The rows a batch read, changed as its calls are served.
#[derive(Clone, Debug, Default)]
pub struct KeyTable {
    keys: BTreeMap<KeyId, Option<KeyState>>,
    loaded: BTreeMap<KeyId, Option<KeyState>>,
    records: BTreeMap<(KeyId, String), RequestRecord>,
    new_records: BTreeSet<(KeyId, String)>,
    limits: BTreeMap<KeyId, Limits>,
    states: BTreeMap<TenantId, TenantState>,
}

/// What a batch writes back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyWrites {
    /// Keys below their burst: insert or replace the row.
    pub upserts: Vec<(KeyId, StoredKey)>,
    /// Keys back at their burst whose row existed: delete it.
    pub deletes: Vec<KeyId>,
    /// New records for retries (insert or replace an expired one).
    pub records: Vec<(KeyId, String, RequestRecord)>,
}

impl KeyWrites {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty() && self.records.is_empty()
    }
}

impl KeyTable {
    /// The rows as read: each key of [`KeyBatch::keys`] with its stored
    /// state (absent or `None`: no row), and the records found.
    pub fn new(
        keys: impl IntoIterator<Item = (KeyId, KeyState)>,
        records: impl IntoIterator<Item = (KeyId, String, RequestRecord)>,
    ) -> KeyTable {
        let keys: BTreeMap<KeyId, Option<KeyState>> =
            keys.into_iter().map(|(k, s)| (k, Some(s))).collect();
        KeyTable {
            loaded: keys.clone(),
            keys,
            records: records.into_iter().map(|(k, id, r)| ((k, id), r)).collect(),
            new_records: BTreeSet::new(),
            limits: BTreeMap::new(),
            states: BTreeMap::new(),
        }
    }

    /// The state rows read for the batch's tenants (a tenant without one is
    /// served).
    pub fn with_states(mut self, states: BTreeMap<TenantId, TenantState>) -> KeyTable {
        self.states = states;
        self
    }

    /// Answers one call at `now`, taking from the table's keys.
    /// `definitions` gives each tenant's definitions (a tenant missing
    /// from it has none).
    pub fn serve(
        &mut self,
        call: &CheckCall,
        definitions: &BTreeMap<TenantId, BTreeMap<BucketName, BucketDefinition>>,
        now: Timestamp,
    ) -> Result<CallAnswer, CheckError> {
        // A deleted or suspended tenant is refused before anything is taken.
        for item in &call.items {
            let tenant = &item.key.bucket.tenant;
            tenant_state::admit(tenant, self.states.get(tenant))?;
        }
        // Resolve every item's limits first: an unknown bucket refuses the
        // whole call before anything is taken.
        let mut resolved = Vec::with_capacity(call.items.len());
        for (i, item) in call.items.iter().enumerate() {
            resolved.push(resolve(definitions, &item.key.bucket, i)?);
        }
        let limits: Vec<Limits> = resolved.iter().map(|d| d.limits).collect();
        // Retries: answered from their record if it is still kept.
        let mut replays: Vec<Option<ItemResult>> = Vec::with_capacity(call.items.len());
        for (i, item) in call.items.iter().enumerate() {
            let record = item.request_id.as_ref().and_then(|id| {
                self.records
                    .get(&(item.key.clone(), id.clone()))
                    .filter(|r| r.expires_at > now)
            });
            match record {
                Some(record) if record.tokens != item.tokens => {
                    return Err(InvalidInput::new(
                        format!("items[{i}].request_id"),
                        format!(
                            "was first used to ask for {} tokens, not {}: a retry must ask the same",
                            record.tokens, item.tokens
                        ),
                    )
                    .into());
                }
                Some(record) => replays.push(Some(ItemResult {
                    answer: record.answer,
                    limits: record.limits,
                    replayed: true,
                })),
                None => replays.push(None),
            }
        }
        // The rest are checked together.
        let mut slot_of: BTreeMap<&KeyId, usize> = BTreeMap::new();
        let mut slots = Vec::new();
        let mut items = Vec::new();
        let mut fresh = Vec::new();
        for (i, item) in call.items.iter().enumerate() {
            if replays[i].is_some() {
                continue;
            }
            let next = slots.len();
            let slot = *slot_of.entry(&item.key).or_insert(next);
            if slot == next {
                slots.push(KeySlot {
                    limits: limits[i],
                    quota: resolved[i].quota.clone(),
                    state: self.keys.get(&item.key).copied().flatten(),
                    enforce: resolved[i].enforce,
                });
            }
            items.push(CheckItem {
                slot,
                tokens: item.tokens,
            });
            fresh.push(i);
        }
        let outcome = check(&slots, &items, now);
        for (key, slot) in &slot_of {
            self.keys.insert((*key).clone(), outcome.states[*slot]);
            self.limits.insert((*key).clone(), slots[*slot].limits);
        }
        let mut results = replays;
        for (n, &i) in fresh.iter().enumerate() {
            let item = &call.items[i];
            let result = ItemResult {
                answer: outcome.answers[n],
                limits: limits[i],
                replayed: false,
            };
            if let Some(id) = &item.request_id {
                let id = (item.key.clone(), id.clone());
                self.records.insert(
                    id.clone(),
                    RequestRecord {
                        tokens: item.tokens,
                        answer: result.answer,
                        limits: result.limits,
                        expires_at: now.saturating_add(REQUEST_RECORD_TTL),
                    },
                );
                self.new_records.insert(id);
            }
            results[i] = Some(result);
        }
        let items: Vec<ItemResult> = results.into_iter().flatten().collect();
        Ok(CallAnswer {
            allowed: items.iter().all(|r| r.answer.allowed),
            items,
            at: now,
        })
    }

    /// The rows to write: keys whose state changed, and new records.
    pub fn writes(&self) -> KeyWrites {
        let mut writes = KeyWrites::default();
        for (key, state) in &self.keys {
            let before = self.loaded.get(key).copied().flatten();
            if *state == before {
                continue;
            }
            match state {
                Some(state) => {
                    let limits = self.limits.get(key).copied().unwrap_or(Limits {
                        refill_rate: 0.0,
                        burst_limit: 0.0,
                    });
                    writes
                        .upserts
                        .push((key.clone(), StoredKey::new(*state, &limits)));
                }
                None => writes.deletes.push(key.clone()),
            }
        }
        for id in &self.new_records {
            if let Some(record) = self.records.get(id) {
                writes.records.push((id.0.clone(), id.1.clone(), *record));
            }
        }
        writes
    }
}

/// The definition of the per-key bucket `key` names, from its tenant's
/// definitions; `index` is the item's place in the call, for the error.
pub fn resolve<'d>(
    definitions: &'d BTreeMap<TenantId, BTreeMap<BucketName, BucketDefinition>>,
    key: &BucketKey,
    index: usize,
) -> Result<&'d BucketDefinition, CheckError> {
    let field = || format!("items[{index}].bucket");
    let definition = definitions
        .get(&key.tenant)
        .and_then(|d| d.get(&key.bucket))
        .ok_or_else(|| CheckError::BucketNotFound {
            field: field(),
            key: key.clone(),
        })?;
    if definition.kind != BucketKind::PerKey {
        return Err(CheckError::NotPerKey {
            field: field(),
            key: key.clone(),
        });
    }
    Ok(definition)
}
