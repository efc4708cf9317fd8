//! Per-key buckets: an exact token bucket for each key (a user, an API
//! key, an IP address) under a tenant's per-key bucket definition, checked
//! with a round trip per call.
//!
//! Unlike a tenant's global bucket, a per-key bucket has no pods and no
//! local buckets: every check takes its tokens in a store transaction, so
//! the answer is exact and the same on every replica. The rules:
//!
//! - **Refill**: `refill_rate` tokens per second, capped at `burst_limit`.
//!   Time comes from the store's clock; `last_refill` never moves back.
//! - **A key never seen is full**, and so is a key whose bucket has
//!   refilled to its burst: neither needs a stored row. [`check`] answers
//!   `None` for such a key's state, and a store deletes the row, so the
//!   store holds only keys that are below their burst.
//! - **All or nothing**: the items of one check are taken together or not
//!   at all (a per-user and a per-tenant limit checked as one). Items on
//!   the same key take from it in turn.
//! - **Reading**: an item asking for 0 tokens takes nothing and is always
//!   allowed.
//! - **The answer** per item: allowed, the tokens left, when the asked
//!   tokens will be there ([`ItemAnswer::retry_after`]) and when the bucket
//!   will be full again ([`ItemAnswer::reset_after`]).
//! - **Retries**: an item with a request id is recorded with its answer for
//!   [`REQUEST_RECORD_TTL`]; a retry with the same id on the same key gets
//!   that answer and takes nothing again.
//!
//! - **Operators' view**: a bucket's stored keys busiest first
//!   ([`busiest_first`]: furthest from full), each read as its level now
//!   under the definition in force ([`KeyReading`]).
//!
//! [`check`] is one call on loaded slots; [`KeyBatch`] and [`KeyTable`] are
//! the script a store follows for a batch of calls.
//!
//! The rules around a check:
//!
//! - **Definitions** are read in the check's own transaction, from the
//!   tenant's record and tier (`tier::definitions`), so a new definition
//!   applies to the next check. A stored row's `full_at` is computed under
//!   the definition it was written with ([`StoredKey`]); a key checked
//!   after a definition change is judged by the new one.
//! - **Refusals**: a call refused by an error ([`CheckError`]: an unknown
//!   bucket, a shared one, a deleted or suspended tenant, a request id used
//!   again for other tokens, bad input) takes nothing, for any of its items.
//! - **Retries** are keyed by tenant, bucket, key and request id, and kept
//!   [`REQUEST_RECORD_TTL`] (10 minutes).
//! - **Idle rows go**: a check that finds a key full deletes its row, and
//!   each replica's sweep (`store::sweep_idle_keys` in the server: every
//!   second, up to 10 000 rows of each table a transaction) deletes rows
//!   whose `full_at` has passed and records past their time.
//! - **A check writes only its key's rows** (and its records): checks of
//!   different keys never wait on each other. Checks per second are
//!   therefore counted by each replica in memory ([`crate::rate_window`]),
//!   never in a shared row.

mod batch;

pub use batch::{
    CallAnswer, CheckCall, CheckError, ItemResult, KeyBatch, KeyId, KeyTable, KeyWrites,
    MAX_REQUEST_ID_LEN, REQUEST_RECORD_TTL, RequestItem, RequestRecord, StoredKey, resolve,
    validate_item_count, validate_request_id,
};

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::budget::{Cycle, Quota, QuotaAnswer, QuotaUse};
use crate::global_bucket::{Limits, refilled_tokens};
use crate::time::Timestamp;
use crate::validate::{self, InvalidInput, MAX_TOKENS};

/// The most items one check carries.
pub const MAX_CHECK_ITEMS: usize = 64;
/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// A stored key's bucket (a key without one is full, its quota unused).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyState {
    /// Tokens as of `last_refill`, at most the burst limit.
    pub tokens: f64,
    pub last_refill: Timestamp,
    /// What the key took from its quota, in the cycle it last took in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaUse>,
}

impl KeyState {
    /// The level at `now` under `limits` (full if there is no state).
    pub fn level(state: Option<&KeyState>, limits: &Limits, now: Timestamp) -> f64 {
        match state {
            None => limits.burst_limit,
            Some(s) => refilled_tokens(s.tokens, limits, now.seconds_since(s.last_refill))
                .min(limits.burst_limit),
        }
    }

    /// True if the key's bucket has refilled to full by `now` and its
    /// quota use, if any, is over: its row can go.
    pub fn is_idle(&self, limits: &Limits, now: Timestamp) -> bool {
        KeyState::level(Some(self), limits, now) >= limits.burst_limit
            && !self.quota.is_some_and(|q| q.is_live(now))
    }
}

/// Checks a key: at most [`MAX_KEY_LEN`] bytes, not empty. Keys are the
/// caller's (user ids, API key hashes, addresses): any bytes of UTF-8.
pub fn validate_key(field: &str, key: &str) -> Result<(), InvalidInput> {
    if key.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(InvalidInput::new(
            field,
            format!("must be at most {MAX_KEY_LEN} bytes, got {}", key.len()),
        ));
    }
    Ok(())
}

/// Checks the tokens an item asks for.
pub fn validate_tokens(field: &str, tokens: f64) -> Result<(), InvalidInput> {
    validate::non_negative(field, tokens, MAX_TOKENS)
}

/// One key's bucket within a check: its definition's limits and quota,
/// and its state as stored (`None`: full, quota unused).
#[derive(Clone, Debug, PartialEq)]
pub struct KeySlot {
    pub limits: Limits,
    pub quota: Option<Quota>,
    pub state: Option<KeyState>,
    /// False: its bucket is in shadow mode ([`check`]).
    pub enforce: bool,
}

/// What one item of a check asks: `tokens` from the key in `slot`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckItem {
    pub slot: usize,
    pub tokens: f64,
}

/// The answer to one item.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemAnswer {
    /// True if the whole check was allowed (every item of a check gets the
    /// same verdict).
    pub allowed: bool,
    /// Allowed only because this item's bucket is in shadow mode: its
    /// tokens were not there, and enforcing, the check would be refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow_refused: bool,
    /// Tokens the key holds after the check.
    pub remaining: f64,
    /// When the tokens this item asked for will be there: zero if they are
    /// now, `None` if never (more than the burst, or no refill).
    pub retry_after: Option<Duration>,
    /// When the key's bucket will be full: zero if it is, `None` if never
    /// (no refill).
    pub reset_after: Option<Duration>,
    /// What is left of the key's quota and when it resets, if its bucket
    /// has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaAnswer>,
}

/// The outcome of [`check`]: an answer per item, in order, and each slot's
/// new state (`None`: full, no row needed).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOutcome {
    pub allowed: bool,
    pub answers: Vec<ItemAnswer>,
    pub states: Vec<Option<KeyState>>,
}

/// Runs a check: takes every item's tokens from its key's bucket and from
/// its key's quota, if it has one, if all of them are there; none
/// otherwise. Items must name slots of `slots`.
///
/// **Shadow mode**: a check that would be refused only for items of
/// buckets in shadow mode (`enforce` false) is allowed. Every bucket is
/// left as enforcing would leave it: the shadow buckets as by the refusal
/// (nothing taken), the enforcing ones as by their own items (taken, as
/// they would be were the shadow buckets not in the check), so switching
/// a bucket to enforcing keeps its keys' state and no enforcing bucket
/// ever lets a call through without its tokens. The short items of the
/// shadow buckets are marked [`ItemAnswer::shadow_refused`].
pub fn check(slots: &[KeySlot], items: &[CheckItem], now: Timestamp) -> CheckOutcome {
    let (all, short) = decide(slots, items, now);
    if all.allowed || slots.iter().all(|s| s.enforce) {
        return all;
    }
    let enforcing: Vec<usize> = (0..items.len())
        .filter(|&i| slots.get(items[i].slot).is_some_and(|s| s.enforce))
        .collect();
    let enforcing_items: Vec<CheckItem> = enforcing.iter().map(|&i| items[i]).collect();
    let (enforced, _) = decide(slots, &enforcing_items, now);
    if !enforced.allowed {
        return all;
    }
    let mut answers: Vec<ItemAnswer> = all
        .answers
        .iter()
        .zip(&short)
        .map(|(a, &short)| ItemAnswer {
            allowed: true,
            shadow_refused: short,
            ..*a
        })
        .collect();
    for (n, &i) in enforcing.iter().enumerate() {
        answers[i] = enforced.answers[n];
    }
    let states = slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s.enforce {
                enforced.states[i]
            } else {
                all.states[i]
            }
        })
        .collect();
    CheckOutcome {
        allowed: true,
        answers,
        states,
    }
}

/// [`check`] as if every bucket enforced; and, per item, whether its
/// tokens (or its quota) were short when its turn came.
fn decide(slots: &[KeySlot], items: &[CheckItem], now: Timestamp) -> (CheckOutcome, Vec<bool>) {
    let levels: Vec<f64> = slots
        .iter()
        .map(|s| KeyState::level(s.state.as_ref(), &s.limits, now))
        .collect();
    // Each quota's cycle now, and what is left of it (none out of the
    // calendar: the quota allows nothing).
    let cycles: Vec<Option<Cycle>> = slots
        .iter()
        .map(|s| {
            let quota = s.quota.as_ref()?;
            let used = s.state.and_then(|st| st.quota);
            quota.cycle_of(used.as_ref(), now)
        })
        .collect();
    let quota_left: Vec<Option<f64>> = slots
        .iter()
        .zip(&cycles)
        .map(|(s, cycle)| {
            let quota = s.quota.as_ref()?;
            Some(cycle.as_ref().map_or(0.0, |c| {
                quota.left(s.state.as_ref().and_then(|st| st.quota.as_ref()), c)
            }))
        })
        .collect();
    // Take in turn from copies; keep them only if every item was covered.
    let mut after = levels.clone();
    let mut quota_after = quota_left.clone();
    let mut allowed = true;
    let mut wanting = Vec::with_capacity(items.len());
    let mut short = Vec::with_capacity(items.len());
    for item in items {
        let level = after.get(item.slot).copied().unwrap_or(0.0);
        let left = quota_after.get(item.slot).copied().flatten();
        wanting.push((level, left));
        let is_short = item.tokens > level || left.is_some_and(|left| item.tokens > left);
        short.push(is_short);
        if is_short {
            allowed = false;
        } else {
            if let Some(level) = after.get_mut(item.slot) {
                *level -= item.tokens;
            }
            if let Some(Some(left)) = quota_after.get_mut(item.slot) {
                *left -= item.tokens;
            }
        }
    }
    let (final_levels, final_quota) = if allowed {
        (after, quota_after)
    } else {
        (levels.clone(), quota_left.clone())
    };
    let answers = items
        .iter()
        .zip(&wanting)
        .map(|(item, &(before, quota_before))| {
            let slot = slots.get(item.slot);
            let limits = slot.map_or(
                Limits {
                    refill_rate: 0.0,
                    burst_limit: 0.0,
                },
                |s| s.limits,
            );
            let remaining = final_levels.get(item.slot).copied().unwrap_or(0.0);
            // Refill starts at the key's `last_refill`, which a clock that
            // stepped back (another replica's, say) may put after `now`.
            let lag = slot
                .and_then(|s| s.state)
                .map_or(Duration::ZERO, |s| s.last_refill.duration_since(now));
            let from_now = |wait: Option<Duration>| {
                wait.map(|w| {
                    if w.is_zero() {
                        w
                    } else {
                        w.saturating_add(lag)
                    }
                })
            };
            let cycle = cycles.get(item.slot).copied().flatten();
            let quota = slot.and_then(|s| s.quota.as_ref());
            let retry_after = if allowed {
                Some(Duration::ZERO)
            } else {
                let bucket_wait = if item.tokens <= before {
                    Some(Duration::ZERO)
                } else {
                    from_now(time_to(item.tokens - before, item.tokens, &limits))
                };
                // Short of quota: not before the next cycle, and never if
                // the item asks for more than a whole cycle's quota.
                let quota_wait = match (quota, quota_before, cycle) {
                    (Some(q), Some(left), _) if item.tokens > left && item.tokens > q.amount => {
                        None
                    }
                    (Some(_), Some(left), Some(c)) if item.tokens > left => {
                        Some(c.end.duration_since(now))
                    }
                    (Some(_), Some(left), None) if item.tokens > left => None,
                    _ => Some(Duration::ZERO),
                };
                bucket_wait.zip(quota_wait).map(|(a, b)| a.max(b))
            };
            ItemAnswer {
                allowed,
                shadow_refused: false,
                remaining,
                retry_after,
                reset_after: from_now(time_to(
                    limits.burst_limit - remaining,
                    limits.burst_limit,
                    &limits,
                )),
                quota: match (final_quota.get(item.slot).copied().flatten(), cycle) {
                    (Some(remaining), Some(c)) => Some(QuotaAnswer {
                        remaining,
                        resets_at: c.end,
                        reset_after: c.end.duration_since(now),
                    }),
                    _ => None,
                },
            }
        })
        .collect();
    // A full key with no quota in use needs no row; a refused check leaves
    // the others as they were (they keep refilling from there: nothing to
    // write).
    let states = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            let level = final_levels[i];
            let quota = match (&slot.quota, cycles[i], final_quota[i]) {
                (Some(q), Some(c), Some(left)) => Some(QuotaUse {
                    cycle_end: c.end,
                    used: q.amount - left,
                })
                .filter(|u| u.used > 0.0),
                _ => None,
            };
            if level >= slot.limits.burst_limit && quota.is_none() {
                None
            } else if !allowed {
                slot.state
            } else {
                Some(KeyState {
                    tokens: level,
                    last_refill: slot.state.map_or(now, |s| s.last_refill.max(now)),
                    quota,
                })
            }
        })
        .collect();
    (
        CheckOutcome {
            allowed,
            answers,
            states,
        },
        short,
    )
}

/// A stored key as operators see it.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyReading {
    pub key: String,
    /// Its level now under the definition in force.
    pub tokens: f64,
    /// How long until it is full (and its row may go): `None` if never
    /// (no refill).
    pub full_in: Option<Duration>,
}

impl KeyReading {
    /// `stored` read at `now` under `limits` (the definition in force,
    /// which may differ from the one the row was written under).
    pub fn new(key: String, stored: &StoredKey, limits: &Limits, now: Timestamp) -> KeyReading {
        let tokens = KeyState::level(Some(&stored.state), limits, now);
        KeyReading {
            key,
            tokens,
            full_in: time_to(limits.burst_limit - tokens, limits.burst_limit, limits),
        }
    }
}

/// The order operators see a bucket's stored keys in, busiest first: the
/// keys furthest from full (the latest `full_at`, a key that never
/// refills first), then by key. Under one definition, the latest to be
/// full is the one with the fewest tokens now. A store that sorts in its
/// query (`ORDER BY full_at DESC NULLS FIRST, key`) follows the same
/// order.
pub fn busiest_first(a: (&str, &StoredKey), b: (&str, &StoredKey)) -> std::cmp::Ordering {
    // `None` (never full) above every time.
    let later = |at: Option<Timestamp>| at.map_or(i64::MAX, Timestamp::unix_micros);
    later(b.1.full_at)
        .cmp(&later(a.1.full_at))
        .then_with(|| a.0.cmp(b.0))
}

/// The `n` busiest of a bucket's stored keys, by [`busiest_first`], from
/// a walk over all of them, in memory for about `2 n` keys.
#[derive(Clone, Debug)]
pub struct BusiestKeys {
    n: usize,
    keys: Vec<(String, StoredKey)>,
}

impl BusiestKeys {
    pub fn new(n: usize) -> BusiestKeys {
        BusiestKeys {
            n,
            keys: Vec::new(),
        }
    }

    pub fn push(&mut self, key: String, stored: StoredKey) {
        if self.n == 0 {
            return;
        }
        self.keys.push((key, stored));
        if self.keys.len() >= 2 * self.n {
            self.trim();
        }
    }

    fn trim(&mut self) {
        self.keys
            .sort_by(|a, b| busiest_first((&a.0, &a.1), (&b.0, &b.1)));
        self.keys.truncate(self.n);
    }

    /// The busiest, busiest first.
    pub fn into_vec(mut self) -> Vec<(String, StoredKey)> {
        self.trim();
        self.keys
    }
}

/// How long refill takes to add `missing` tokens to reach `target`:
/// zero if nothing is missing, `None` if it never will (no refill, or a
/// target above the burst).
fn time_to(missing: f64, target: f64, limits: &Limits) -> Option<Duration> {
    if missing <= 0.0 {
        return Some(Duration::ZERO);
    }
    if limits.refill_rate <= 0.0 || target > limits.burst_limit {
        return None;
    }
    Duration::try_from_secs_f64(missing / limits.refill_rate).ok()
}

#[cfg(test)]
mod tests;
