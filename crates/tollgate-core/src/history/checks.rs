//! Per-key buckets in the usage history: their checks, refusals and
//! busiest keys per slot.
//!
//! A per-key bucket has no totals in the store to sample: a check writes
//! only its key's row, and a count per bucket would be a row every check
//! of every key writes, serialising them all (see [`crate::rate_window`]).
//! So each replica counts the checks it answers, per bucket and per slot
//! of each resolution, in memory ([`CheckTally`]), and writes what each
//! slot holds so far as the row of (bucket, resolution, slot, replica),
//! every sample interval. A row holds only its replica's counts in its
//! slot, written whole: writing it again (the next sample, or a retry)
//! puts counts that only grew in place of the same slot's earlier ones
//! ([`CheckCounts::replaces`]), so nothing is counted twice, and a slot's
//! history is the sum of its replicas' rows ([`per_slot`]). A replica that
//! stops without writing loses what it counted since its last write: at
//! most one sample interval of its checks, never counted at all rather
//! than counted twice.
//!
//! A check counts once per bucket it touches (a call of several keys of
//! one bucket is one check), in the slot of the store's clock when it was
//! answered; a retry answered from its record is not counted again.
//!
//! The busiest keys of each slot are kept with the Space-Saving algorithm
//! (Metwally, Agrawal and El Abbadi, 2005): at most [`TRACKED_KEYS`]
//! counters a bucket and slot; a key not tracked takes the counter of the
//! least counted one, inheriting its count as a possible over-count. So
//! any key with more than 1/[`TRACKED_KEYS`] of a slot's checks is among
//! them, and a key's true count lies between its count less its
//! over-count and its count. A row keeps the [`KEPT_KEYS`] busiest. Keys
//! summed over slots and replicas are given as lower bounds
//! ([`busiest`]): a key may have had more checks than shown, never fewer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Resolution;
use crate::BucketKey;
use crate::rate_window::Outcome;
use crate::time::Timestamp;

/// Keys counted a bucket and slot.
pub const TRACKED_KEYS: usize = 64;
/// Keys a row keeps, busiest first.
pub const KEPT_KEYS: usize = 5;

/// One replica's counts of one per-key bucket's checks in one slot: what
/// a row holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckCounts {
    /// Checks answered (allowed, refused or allowed in shadow mode).
    pub checks: u64,
    /// Of them, refused.
    pub refusals: u64,
    /// Of them, allowed only because the bucket was in shadow mode.
    pub shadow_refusals: u64,
    /// The busiest keys, busiest first, at most [`KEPT_KEYS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busiest: Vec<BusyKey>,
}

impl CheckCounts {
    /// Whether `self` should replace `kept` as the same replica's row of
    /// the same slot: counts only grow within a slot, so the row with more
    /// checks is the later.
    pub fn replaces(&self, kept: &CheckCounts) -> bool {
        (self.checks, self.refusals, self.shadow_refusals)
            >= (kept.checks, kept.refusals, kept.shadow_refusals)
    }

    fn count(&mut self, outcome: Outcome) {
        self.checks += 1;
        match outcome {
            Outcome::Allowed => {}
            Outcome::Refused => self.refusals += 1,
            Outcome::ShadowRefused => self.shadow_refusals += 1,
        }
    }
}

/// A key and its checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusyKey {
    pub key: String,
    /// Checks counted for it: at least its true count, in a row.
    pub checks: u64,
    /// How many of `checks` may have been other keys'.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub over: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl BusyKey {
    /// Checks it had at least.
    pub fn at_least(&self) -> u64 {
        self.checks.saturating_sub(self.over)
    }
}

/// The Space-Saving counters of one bucket and slot: at most
/// [`TRACKED_KEYS`], found by key through an index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopKeys {
    /// (key, count, over-count), in the order they took their counter.
    counters: Vec<(String, u64, u64)>,
    index: HashMap<String, usize>,
}

impl TopKeys {
    /// Counts one check of `key`.
    pub fn add(&mut self, key: &str) {
        if let Some(&i) = self.index.get(key) {
            self.counters[i].1 += 1;
            return;
        }
        if self.counters.len() < TRACKED_KEYS {
            self.index.insert(key.to_owned(), self.counters.len());
            self.counters.push((key.to_owned(), 1, 0));
            return;
        }
        // The least counted gives its counter up (the first of equals, so
        // that the outcome depends on the checks only).
        let Some((i, _)) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(i, c)| (c.1, *i))
        else {
            return;
        };
        let counter = &mut self.counters[i];
        self.index.remove(&counter.0);
        let count = counter.1;
        counter.0.clear();
        counter.0.push_str(key);
        *counter = (std::mem::take(&mut counter.0), count + 1, count);
        self.index.insert(key.to_owned(), i);
    }

    /// The `n` busiest, busiest first (by count, then by key).
    pub fn top(&self, n: usize) -> Vec<BusyKey> {
        let mut keys: Vec<&(String, u64, u64)> = self.counters.iter().collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        keys.into_iter()
            .take(n)
            .map(|(key, checks, over)| BusyKey {
                key: key.clone(),
                checks: *checks,
                over: *over,
            })
            .collect()
    }
}

/// What a replica counted of one bucket in one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SlotTally {
    slot: Timestamp,
    counts: CheckCounts,
    keys: TopKeys,
    /// Counted since last written.
    dirty: bool,
}

impl SlotTally {
    fn new(slot: Timestamp) -> Self {
        SlotTally {
            slot,
            counts: CheckCounts::default(),
            keys: TopKeys::default(),
            dirty: false,
        }
    }

    fn row(&self) -> CheckCounts {
        CheckCounts {
            busiest: self.keys.top(KEPT_KEYS),
            ..self.counts.clone()
        }
    }
}

/// One bucket's slots: the one open per resolution, and those closed but
/// not yet written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct BucketTally {
    open: Vec<Option<SlotTally>>,
    closed: Vec<(u64, Timestamp, CheckCounts)>,
}

impl BucketTally {
    /// Nothing counted yet, in `resolutions` resolutions.
    fn new(resolutions: usize) -> Self {
        BucketTally {
            open: vec![None; resolutions],
            closed: Vec::new(),
        }
    }
}

/// A row to write: a replica's counts of a bucket in a slot so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRow {
    pub bucket: BucketKey,
    /// The resolution's step, in whole seconds.
    pub step_secs: u64,
    /// The slot's start.
    pub slot: Timestamp,
    pub counts: CheckCounts,
}

/// A replica's counts of every per-key bucket it answered checks of, per
/// slot of each resolution, until they are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckTally {
    resolutions: Vec<Resolution>,
    buckets: BTreeMap<BucketKey, BucketTally>,
    /// The latest time counted at: what tells a slot has ended.
    latest: Timestamp,
}

impl CheckTally {
    pub fn new(resolutions: Vec<Resolution>) -> Self {
        CheckTally {
            resolutions,
            buckets: BTreeMap::new(),
            latest: Timestamp::from_unix_micros(i64::MIN),
        }
    }

    /// Counts one check of `bucket` answered at `at`, of `keys` (each
    /// item's key; a key named twice counts twice among the busiest).
    pub fn record<'k>(
        &mut self,
        bucket: &BucketKey,
        at: Timestamp,
        keys: impl IntoIterator<Item = &'k str> + Clone,
        outcome: Outcome,
    ) {
        self.latest = self.latest.max(at);
        let resolutions = &self.resolutions;
        // Looked up before it is cloned: most checks find their bucket.
        if !self.buckets.contains_key(bucket) {
            self.buckets
                .insert(bucket.clone(), BucketTally::new(resolutions.len()));
        }
        let Some(tally) = self.buckets.get_mut(bucket) else {
            return;
        };
        for (resolution, open) in resolutions.iter().zip(tally.open.iter_mut()) {
            let slot = resolution.slot(at);
            // A check answered at an earlier slot's time (a clock behind)
            // counts in the open one: never in a closed slot already
            // written.
            if open.as_ref().is_none_or(|current| current.slot < slot) {
                if let Some(ended) = open.take()
                    && ended.dirty
                {
                    tally
                        .closed
                        .push((resolution.step_secs(), ended.slot, ended.row()));
                }
                *open = Some(SlotTally::new(slot));
            }
            let Some(current) = open.as_mut() else {
                continue;
            };
            current.counts.count(outcome);
            for key in keys.clone() {
                current.keys.add(key);
            }
            current.dirty = true;
        }
    }

    /// The rows to write: every closed slot not yet written, and every open
    /// one counted since it was last written. They are taken as written;
    /// give them back with [`CheckTally::unwritten`] if the write failed.
    /// Forgets buckets whose every slot was written and ended a slot ago.
    pub fn take_rows(&mut self) -> Vec<CheckRow> {
        let latest = self.latest;
        let resolutions = &self.resolutions;
        let mut rows = Vec::new();
        self.buckets.retain(|bucket, tally| {
            for (step_secs, slot, counts) in tally.closed.drain(..) {
                rows.push(CheckRow {
                    bucket: bucket.clone(),
                    step_secs,
                    slot,
                    counts,
                });
            }
            for (resolution, open) in resolutions.iter().zip(tally.open.iter_mut()) {
                let Some(current) = open else { continue };
                if current.dirty {
                    rows.push(CheckRow {
                        bucket: bucket.clone(),
                        step_secs: resolution.step_secs(),
                        slot: current.slot,
                        counts: current.row(),
                    });
                    current.dirty = false;
                } else if current.slot.saturating_add(resolution.step * 2) <= latest {
                    *open = None;
                }
            }
            tally.open.iter().any(Option::is_some)
        });
        rows
    }

    /// Gives back rows [`CheckTally::take_rows`] took whose write failed:
    /// they are written with the next.
    pub fn unwritten(&mut self, rows: Vec<CheckRow>) {
        for row in rows {
            let resolutions = &self.resolutions;
            let tally = self
                .buckets
                .entry(row.bucket.clone())
                .or_insert_with(|| BucketTally::new(resolutions.len()));
            let open = resolutions
                .iter()
                .position(|r| r.step_secs() == row.step_secs)
                .and_then(|i| tally.open.get_mut(i))
                .and_then(Option::as_mut)
                .filter(|open| open.slot == row.slot);
            if let Some(open) = open {
                open.dirty = true;
            } else if !tally
                .closed
                .iter()
                .any(|(step, slot, _)| *step == row.step_secs && *slot == row.slot)
            {
                // Closed since, with nothing counted after the write that
                // failed: the row is the slot's last word.
                tally.closed.push((row.step_secs, row.slot, row.counts));
            }
        }
    }

    /// Buckets with slots kept.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// A stored row as read back: its slot, the replica that wrote it, and
/// its counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCheckRow {
    pub slot: Timestamp,
    pub replica: String,
    pub counts: CheckCounts,
}

/// One slot's checks, summed over the replicas that answered any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckSlot {
    pub from: Timestamp,
    pub to: Timestamp,
    pub checks: u64,
    pub refusals: u64,
    pub shadow_refusals: u64,
    /// Replicas whose rows were summed.
    pub replicas: usize,
}

impl CheckSlot {
    /// Adds a replica's row of the slot.
    fn add(&mut self, counts: &CheckCounts) {
        self.checks = self.checks.saturating_add(counts.checks);
        self.refusals = self.refusals.saturating_add(counts.refusals);
        self.shadow_refusals = self.shadow_refusals.saturating_add(counts.shadow_refusals);
    }

    /// Seconds from `from` to `to`.
    pub fn seconds(&self) -> f64 {
        self.to.seconds_since(self.from)
    }

    /// `n` per second over the slot (0 over an empty one).
    pub fn per_second(&self, n: u64) -> f64 {
        let seconds = self.seconds();
        if seconds > 0.0 {
            n as f64 / seconds
        } else {
            0.0
        }
    }
}

/// The slots of `rows` (one resolution's, of one bucket, any order), each
/// summed over its replicas, oldest first. A slot ends `step` after it
/// starts, or at `now` if that falls in it (the slot in progress). A slot
/// without a row has no entry.
pub fn per_slot(rows: &[StoredCheckRow], step: Duration, now: Timestamp) -> Vec<CheckSlot> {
    let mut slots: BTreeMap<Timestamp, CheckSlot> = BTreeMap::new();
    for row in rows {
        let end = row.slot.saturating_add(step);
        let slot = slots.entry(row.slot).or_insert_with(|| CheckSlot {
            from: row.slot,
            to: if now > row.slot && now < end {
                now
            } else {
                end
            },
            ..CheckSlot::default()
        });
        slot.add(&row.counts);
        slot.replicas += 1;
    }
    slots.into_values().collect()
}

/// `rows` summed into slots of `step` from the one `since` falls in to the
/// one `until` does, every slot present (none checked: zeros), for a
/// chart; a row counts in the slot its own slot starts in, and the last
/// slot ends at `until`. `replicas` counts the replicas with rows in a
/// slot.
pub fn chart(
    rows: &[StoredCheckRow],
    since: Timestamp,
    until: Timestamp,
    step: Duration,
) -> Vec<CheckSlot> {
    let chart = Resolution {
        step,
        retention: step,
    };
    let first = chart.slot(since);
    let step_micros = i64::try_from(step.as_micros()).unwrap_or(i64::MAX).max(1);
    let count =
        usize::try_from((until.unix_micros() - first.unix_micros()).max(0) / step_micros + 1)
            .unwrap_or(0);
    let mut slots: Vec<CheckSlot> = (0..count)
        .map(|i| {
            let from = first.saturating_add(step * u32::try_from(i).unwrap_or(u32::MAX));
            CheckSlot {
                from,
                to: from.saturating_add(step).min(until.max(from)),
                ..CheckSlot::default()
            }
        })
        .collect();
    let mut replicas: Vec<BTreeSet<&str>> = vec![BTreeSet::new(); slots.len()];
    for row in rows {
        let i = (row.slot.unix_micros() - first.unix_micros()).div_euclid(step_micros);
        let Some(i) = usize::try_from(i).ok().filter(|&i| i < slots.len()) else {
            continue;
        };
        slots[i].add(&row.counts);
        replicas[i].insert(row.replica.as_str());
    }
    for (slot, replicas) in slots.iter_mut().zip(replicas) {
        slot.replicas = replicas.len();
    }
    slots
}

/// The `n` busiest keys of `rows` (any slots and replicas): each key's
/// checks at least, summed, busiest first (then by key). A key may have had
/// more, where it was not among a row's busiest; never fewer.
pub fn busiest(rows: &[StoredCheckRow], n: usize) -> Vec<BusyKey> {
    let mut sums: HashMap<&str, u64> = HashMap::new();
    for key in rows.iter().flat_map(|r| &r.counts.busiest) {
        let sum = sums.entry(key.key.as_str()).or_default();
        *sum = sum.saturating_add(key.at_least());
    }
    let mut keys: Vec<BusyKey> = sums
        .into_iter()
        .filter(|(_, checks)| *checks > 0)
        .map(|(key, checks)| BusyKey {
            key: key.to_owned(),
            checks,
            over: 0,
        })
        .collect();
    keys.sort_by(|a, b| b.checks.cmp(&a.checks).then_with(|| a.key.cmp(&b.key)));
    keys.truncate(n);
    keys
}

#[cfg(test)]
mod tests;
