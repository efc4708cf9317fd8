//! Hot-partition limits: per-partition read and write rates, enforced at
//! the pods.
//!
//! A tenant's total rate can be within its bucket while one partition (a
//! row, a customer, a key range) takes a disproportionate share of it and
//! overloads the storage node that owns it. An operator sets, per tenant and
//! table, the most reads and writes per second any one partition may get
//! ([`TableLimits`]; a tenant's are its tier's with its overrides on top,
//! [`tier::tenant_limits`](crate::tier::tenant_limits)). Every pod
//! counts the operations it sees per (table, partition, operation) in a
//! fixed-size [`CounterTable`] and rejects some of them once a partition
//! runs above its limit, so that the accepted rate is, statistically, the
//! limit.
//!
//! **The rule** is ScyllaDB's: with a counter `x` that every operation,
//! accepted or not, adds one to, and that halves every second, an operation
//! is accepted with probability `L / (x · ln 2)`. ScyllaDB halves its
//! counters at each second's tick, so a counter swings between `V` and `2V`
//! for a steady rate `V`, and a partition offered between 0.72 and 1 times
//! its limit loses some operations at the top of each swing (about 4 % at
//! 0.9 ×). Here the counter decays continuously with the same half-life
//! (`x · 2^(-Δt)` on each access), which is what the formula assumes:
//! at a steady rate `V` the counter holds at `V / ln 2`, so `x · ln 2` is
//! the partition's rate, and a partition below its limit is never rejected
//! by the counter's swing, only by the noise of its own arrivals.
//!
//! **Counting rejections** keeps a persistent hot partition limited:
//! callers whose operations are rejected do not lower the rate the counter
//! sees, so the probability stays at `L / V`.
//!
//! **Coordinated** (what ScyllaDB cannot do): each pod reports its hottest
//! partitions with their rates ([`CounterTable::hottest`]); the server adds
//! up the reports of a tenant's pods and tells each pod its share of each
//! partition's limit, in proportion to the rate it sees ([`shares`]). With
//! `N` pods serving one hot partition, each then accepts `L · v_i / V` and
//! the tenant about `L`, not `N · L`. A pod without a recent answer falls
//! back to its local counters alone ([`CounterTable::clear_shares`]).
//!
//! Everything here is pure: time and the random draw are passed in, so the
//! client, the server and the simulator run the same rule. Tiers are above
//! this module, not in it: [`crate::tier`] holds table limits in its tiers
//! and tenant records, and nothing here knows a tier.
//!
//! Where the limits live: a tier's `tables` and a tenant record's
//! `table_overrides`, inside the JSON documents the stores keep for tiers
//! and records; `tier::tenant_limits` gives a tenant's from its record and
//! tier. The counter table is fixed-size, in sets of [`WAYS`] slots.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::validate::{InvalidInput, TableName};

/// The most bytes of a partition key.
pub const MAX_PARTITION_KEY_LEN: usize = 4096;
/// The highest per-partition limit, operations per second.
pub const MAX_OPS_PER_SECOND: f64 = 1e9;
/// The most tables with limits in one list: a tier's, or a tenant's own (its
/// pods may so apply up to twice as many).
pub const MAX_TABLES: usize = 1000;
/// The most hot partitions a pod reports at a time.
pub const MAX_REPORTED_PARTITIONS: usize = 64;
/// A partition is reported only from this fraction of its limit up: below
/// it, its share could hardly matter (a hundred pods each under 0.1 % of
/// the limit add up to under a tenth of it).
pub const MIN_REPORTED_FRACTION: f64 = 0.001;
/// Slots per set of the counter table: a new partition may take the place
/// of the coldest of these.
pub const WAYS: usize = 8;
/// The counter table's slots when nothing else is said: 256 KiB.
pub const DEFAULT_CAPACITY: usize = 8192;
/// Operations at the limit that a counter's half-life spans at least: a
/// counter halves every second, or every `WINDOW_OPERATIONS / limit`
/// seconds for limits under `WINDOW_OPERATIONS` per second, so that a
/// partition limited to 1/s is not judged on the one or two operations of
/// its last second.
pub const WINDOW_OPERATIONS: f64 = 16.0;

/// The half-life of the counters of a partition limited to `limit`
/// operations per second, in seconds.
pub fn half_life(limit: f64) -> f64 {
    if limit > 0.0 {
        (WINDOW_OPERATIONS / limit).max(1.0)
    } else {
        1.0
    }
}

/// What an operation does to a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Read,
    Write,
}

impl Op {
    pub const ALL: [Op; 2] = [Op::Read, Op::Write];

    /// Its name in metrics, files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One table's per-partition limits, operations per second; unset means no
/// limit for that operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TableLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reads_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_writes_per_second: Option<f64>,
}

impl TableLimits {
    /// Checks the numbers: each set limit positive, finite and at most
    /// [`MAX_OPS_PER_SECOND`], and at least one set. `field` prefixes the
    /// field names.
    pub fn validate(&self, field: &str) -> Result<(), InvalidInput> {
        let named = |name: &str| {
            if field.is_empty() {
                name.to_owned()
            } else {
                format!("{field}.{name}")
            }
        };
        if self.max_reads_per_second.is_none() && self.max_writes_per_second.is_none() {
            return Err(InvalidInput::new(
                named("max_reads_per_second"),
                "set max_reads_per_second, max_writes_per_second or both (to remove a table's limits, clear them)",
            ));
        }
        for (name, value) in [
            ("max_reads_per_second", self.max_reads_per_second),
            ("max_writes_per_second", self.max_writes_per_second),
        ] {
            let Some(value) = value else { continue };
            if !value.is_finite() || value <= 0.0 || value > MAX_OPS_PER_SECOND {
                return Err(InvalidInput::new(
                    named(name),
                    format!(
                        "must be a number above 0 and at most {MAX_OPS_PER_SECOND:e} operations per second, got {value}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The limit of `op`, if any.
    pub fn limit(&self, op: Op) -> Option<f64> {
        match op {
            Op::Read => self.max_reads_per_second,
            Op::Write => self.max_writes_per_second,
        }
    }
}

/// A tenant's limits by table.
pub type TableLimitSet = BTreeMap<TableName, TableLimits>;

/// A version of a set of limits: equal sets have equal versions on every
/// replica, without storing one. A pod refetches the limits when the
/// version it is told differs from the one it has; 0 is never a version,
/// so a pod that has none asks with 0.
pub fn limits_version(limits: &TableLimitSet) -> u64 {
    let mut bytes = Vec::with_capacity(limits.len() * 32);
    for (name, table) in limits {
        bytes.extend_from_slice(name.as_str().as_bytes());
        bytes.push(0);
        for limit in [table.max_reads_per_second, table.max_writes_per_second] {
            bytes.extend_from_slice(&limit.map_or(u64::MAX, f64::to_bits).to_le_bytes());
        }
    }
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

/// The seed of a table's partition hashes.
pub fn table_seed(table: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(table.as_bytes())
}

/// A partition's hash within its table (`seed` from [`table_seed`]): the
/// same on every pod, so the server can add up what pods report without
/// ever seeing a key.
pub fn partition_hash(seed: u64, key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, seed)
}

/// Checks a partition key's length; `field` names it.
pub fn validate_partition_key(field: &str, key: &[u8]) -> Result<(), InvalidInput> {
    if key.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    if key.len() > MAX_PARTITION_KEY_LEN {
        return Err(InvalidInput::new(
            field,
            format!(
                "must be at most {MAX_PARTITION_KEY_LEN} bytes, got {}",
                key.len()
            ),
        ));
    }
    Ok(())
}

/// What a counter counts: a partition (by hash) of a table (by the pod's
/// index of it) for one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CounterKey {
    pub table: u16,
    pub op: Op,
    pub partition: u64,
}

/// Whether an operation may go ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Over the partition's limit: not to be retried.
    Rejected,
}

/// A partition a pod reports as hot: its estimated rate of operations
/// (accepted or not), per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HotPartition {
    pub key: CounterKey,
    pub rate: f64,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    partition: u64,
    /// When `value` was last decayed.
    at: Timestamp,
    /// The decayed count of operations.
    value: f64,
    /// This pod's share of the partition's limit (1 when alone).
    share: f32,
    table: u16,
    /// 0: empty; otherwise 1 + the op.
    op: u8,
}

impl Slot {
    const EMPTY: Slot = Slot {
        partition: 0,
        at: Timestamp::EPOCH,
        value: 0.0,
        share: 1.0,
        table: 0,
        op: 0,
    };

    fn holds(&self, key: &CounterKey) -> bool {
        self.op == op_tag(key.op) && self.partition == key.partition && self.table == key.table
    }

    fn key(&self) -> Option<CounterKey> {
        let op = match self.op {
            1 => Op::Read,
            2 => Op::Write,
            _ => return None,
        };
        Some(CounterKey {
            table: self.table,
            op,
            partition: self.partition,
        })
    }

    /// The count decayed to `now` with half-life `half_life` seconds
    /// (never grown by a clock going back).
    fn value_at(&self, now: Timestamp, half_life: f64) -> f64 {
        let elapsed = now.seconds_since(self.at);
        if elapsed <= 0.0 {
            self.value
        } else {
            self.value * (-elapsed / half_life).exp2()
        }
    }
}

/// `log2(x)` for `x >= 0` to within 0.09, from the float's bits (the
/// exponent, and the mantissa as a linear fraction); very negative for 0.
#[inline]
fn approx_log2(x: f64) -> f64 {
    // Signed: one instruction on x86-64 (the bits of x >= 0 are below 2^63).
    (x.to_bits() as i64) as f64 / (1u64 << 52) as f64 - 1023.0
}

fn op_tag(op: Op) -> u8 {
    match op {
        Op::Read => 1,
        Op::Write => 2,
    }
}

/// Per-partition counters in a fixed amount of memory, whatever the number
/// of partitions: slots in sets of [`WAYS`], a partition's set chosen by
/// its hash; a partition not in its set takes the place of the set's
/// coldest (lowest decayed count). A hot partition is not pushed out by
/// cold ones, only by hotter ones in its own set.
#[derive(Clone, Debug)]
pub struct CounterTable {
    slots: Box<[Slot]>,
    /// Sets minus one (their number is a power of two).
    set_mask: usize,
}

impl CounterTable {
    /// A table of at least `capacity` slots (rounded up to a power of two,
    /// at least [`WAYS`]).
    pub fn new(capacity: usize) -> Self {
        let sets = capacity.div_ceil(WAYS).max(1).next_power_of_two();
        CounterTable {
            slots: vec![Slot::EMPTY; sets * WAYS].into_boxed_slice(),
            set_mask: sets - 1,
        }
    }

    /// Its slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The bytes its slots take.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.slots)
    }

    fn set(&self, key: &CounterKey) -> std::ops::Range<usize> {
        // The hash's high bits pick the set; the low ones are in the slot.
        let mixed = key.partition ^ (u64::from(key.table) << 1 | u64::from(op_tag(key.op)));
        let start = ((mixed >> 32) as usize & self.set_mask) * WAYS;
        start..start + WAYS
    }

    /// The slot of `key`, claimed if missing: an empty slot of its set, or
    /// the coldest one's (by counts decayed at one half-life per second).
    ///
    /// Counts are compared as `log2(value) + at` (in seconds): the log of
    /// the count decayed to any common time, less that time, so no slot is
    /// decayed (no `exp2` per way on every new partition). The log is read
    /// off the float's bits, to within 0.09: close enough to pick the
    /// coldest.
    fn slot_mut(&mut self, key: &CounterKey, now: Timestamp) -> &mut Slot {
        let set = self.set(key);
        let mut victim = set.start;
        let mut coldest = f64::INFINITY;
        for i in set {
            let slot = &self.slots[i];
            if slot.holds(key) {
                return &mut self.slots[i];
            }
            let value = if slot.op == 0 {
                f64::NEG_INFINITY
            } else {
                approx_log2(slot.value) + slot.at.unix_micros() as f64 / 1e6
            };
            if value < coldest {
                coldest = value;
                victim = i;
            }
        }
        let slot = &mut self.slots[victim];
        *slot = Slot {
            partition: key.partition,
            at: now,
            value: 0.0,
            share: 1.0,
            table: key.table,
            op: op_tag(key.op),
        };
        slot
    }

    /// Counts one operation on `key`, whose limit is `limit` operations per
    /// second, and decides it: accepted with probability
    /// `limit · share / rate`, where `rate` is the partition's decayed count
    /// times ln 2 over the [`half_life`] and `share` this pod's share of
    /// the limit. `draw` is uniform in [0, 1).
    pub fn admit(&mut self, key: &CounterKey, limit: f64, now: Timestamp, draw: f64) -> Verdict {
        let half_life = half_life(limit);
        let slot = self.slot_mut(key, now);
        let value = slot.value_at(now, half_life) + 1.0;
        slot.value = value;
        if now > slot.at {
            slot.at = now;
        }
        let allowed = limit * f64::from(slot.share);
        // The count just after an operation is half an operation above the
        // count's average between operations: for evenly spaced arrivals
        // at `V`, `(value - 0.5) · ln 2` is `V` to within `ln² 2 / (12 V)`,
        // where `value · ln 2` would be `V + ln 2 / 2`, over a limit of
        // 1/s at 0.7/s.
        let rate = (value - 0.5) * std::f64::consts::LN_2 / half_life;
        if rate <= allowed || draw * rate < allowed {
            Verdict::Accepted
        } else {
            Verdict::Rejected
        }
    }

    /// The slot of `key`, if it is counted.
    fn slot(&self, key: &CounterKey) -> Option<&Slot> {
        self.slots[self.set(key)].iter().find(|s| s.holds(key))
    }

    /// The estimated rate of `key`'s operations per second, under a limit
    /// of `limit` (0 if not counted).
    pub fn rate(&self, key: &CounterKey, limit: f64, now: Timestamp) -> f64 {
        let half_life = half_life(limit);
        self.slot(key).map_or(0.0, |s| {
            s.value_at(now, half_life) * std::f64::consts::LN_2 / half_life
        })
    }

    /// This pod's share of `key`'s limit (1 unless the server said less).
    pub fn share(&self, key: &CounterKey) -> f64 {
        self.slot(key).map_or(1.0, |s| f64::from(s.share))
    }

    /// The `k` partitions running closest to (or furthest over) their
    /// limits, hottest first, each at least [`MIN_REPORTED_FRACTION`] of its
    /// limit; `limit` gives a counter's limit (`None`: not limited, not
    /// reported).
    pub fn hottest(
        &self,
        k: usize,
        now: Timestamp,
        limit: impl Fn(&CounterKey) -> Option<f64>,
    ) -> Vec<HotPartition> {
        let mut hot: Vec<(f64, HotPartition)> = self
            .slots
            .iter()
            .filter_map(|slot| {
                let key = slot.key()?;
                let limit = limit(&key)?;
                let half_life = half_life(limit);
                let rate = slot.value_at(now, half_life) * std::f64::consts::LN_2 / half_life;
                let load = rate / limit;
                (load >= MIN_REPORTED_FRACTION).then_some((load, HotPartition { key, rate }))
            })
            .collect();
        hot.sort_by(|a, b| b.0.total_cmp(&a.0));
        hot.truncate(k);
        hot.into_iter().map(|(_, partition)| partition).collect()
    }

    /// Takes the server's shares: every counter's share is reset to 1, then
    /// each listed one set (claiming a slot if needed). Shares are clamped
    /// to (0, 1].
    pub fn set_shares(&mut self, shares: &[(CounterKey, f64)], now: Timestamp) {
        self.clear_shares();
        for (key, share) in shares {
            let share = if share.is_finite() {
                share.clamp(f64::MIN_POSITIVE, 1.0)
            } else {
                1.0
            };
            self.slot_mut(key, now).share = share as f32;
        }
    }

    /// Back to local counting alone: every share 1.
    pub fn clear_shares(&mut self) {
        for slot in self.slots.iter_mut() {
            slot.share = 1.0;
        }
    }
}

impl Default for CounterTable {
    fn default() -> Self {
        CounterTable::new(DEFAULT_CAPACITY)
    }
}

/// One partition one pod reported, as the server adds them up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportedPartition {
    pub table: TableName,
    pub op: Op,
    pub partition: u64,
    pub rate: f64,
}

/// A partition's place in the server's sums.
type PartitionId<'a> = (&'a TableName, Op, u64);

impl ReportedPartition {
    fn id(&self) -> PartitionId<'_> {
        (&self.table, self.op, self.partition)
    }
}

/// The shares of a pod that reported `mine`, given every report of its
/// tenant's pods that is still fresh (`all`, its own included): for each
/// partition it reported, its rate over the sum of all pods' rates for it.
/// Left out (whole): partitions it is alone on, and partitions whose pods
/// together see less than their limit (`limit` of a reported partition):
/// dividing a limit nobody reaches would only make each pod's share as
/// noisy as its own few operations, and reject some of them.
pub fn shares<'a>(
    mine: &'a [ReportedPartition],
    all: impl IntoIterator<Item = &'a [ReportedPartition]>,
    limit: impl Fn(&ReportedPartition) -> Option<f64>,
) -> Vec<(ReportedPartition, f64)> {
    let mut totals: BTreeMap<PartitionId<'a>, f64> = mine.iter().map(|p| (p.id(), 0.0)).collect();
    for report in all {
        for p in report {
            if let Some(total) = totals.get_mut(&p.id()) {
                *total += p.rate.max(0.0);
            }
        }
    }
    mine.iter()
        .filter_map(|p| {
            let total = *totals.get(&p.id())?;
            if limit(p).is_none_or(|limit| total < limit) {
                return None;
            }
            let share = if total > 0.0 {
                p.rate.max(0.0) / total
            } else {
                1.0
            };
            (share < 1.0).then(|| (p.clone(), share))
        })
        .collect()
}

mod load;
mod pod;

pub use load::{
    Exchange, ExchangeAnswer, MAX_REPORTED_RATE, MAX_TENANT_REPORTED, PartitionReports, PodReport,
    exchange,
};
pub use pod::{PodLimiter, PodVerdict, RETRY_AFTER_FAILURE};

#[cfg(test)]
mod tests;
