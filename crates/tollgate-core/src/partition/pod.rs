//! A pod's side of hot-partition limits, whole: the counters, the limits
//! it learned, and when it talks to the server. The client runs it behind
//! a lock with the real clock; the simulator runs it in virtual time.
//!
//! The exchange cadence:
//! - the first exchange goes out when the limiter starts; until the first
//!   answer the pod knows no limit and admits everything;
//! - after an answer, the next exchange goes out within one report period
//!   (between 0.8 and 1 period, drawn, so that pods started together do
//!   not report in step), so a changed limit reaches every pod within one
//!   period; and within half that while the pod's last report had a
//!   partition at or over its part of the limit, so that a hot spot that
//!   moves is caught sooner. A partition the server has not divided yet
//!   counts as hot from the smallest share the last answer gave: after a
//!   move, the new partition is hot at the pod's old part of the limit, so
//!   the pod stays on the quick cadence until it has the new share;
//! - after a failure, the pod tries again soon ([`RETRY_AFTER_FAILURE`],
//!   or the period if shorter, halved to doubled by a draw), so that one
//!   lost message neither leaves a new pod without limits for a period nor
//!   lets its report go stale at the server;
//! - once two periods have passed without an answer, every share goes back
//!   to whole: the pod applies each limit it knows on its own.

use std::time::Duration;

use super::{
    CounterKey, CounterTable, Exchange, ExchangeAnswer, Op, ReportedPartition, TableLimitSet,
    TableLimits, Verdict, table_seed,
};
use crate::pushback::pushback_wait;
use crate::time::Timestamp;
use crate::validate::TableName;

/// How soon a pod tries an exchange again after one failed (before the
/// jitter draw).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// A table the pod applies limits to.
#[derive(Clone, Debug)]
struct Limited {
    seed: u64,
    /// Its index in the counters (stable for the limiter's life).
    index: u16,
    limits: TableLimits,
}

/// What admission decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodVerdict {
    /// The table (or the operation) has no limit the pod knows of.
    Unlimited,
    Accepted,
    /// Over the partition's limit: the table's index, for
    /// [`PodLimiter::table_name`].
    Rejected(u16),
}

/// A pod's counters, limits and exchange cadence.
#[derive(Clone, Debug)]
pub struct PodLimiter {
    counters: CounterTable,
    /// The limited tables, by seed (sorted, searched by halves).
    tables: Vec<Limited>,
    /// Every table ever limited, by index: the names reports give.
    names: Vec<TableName>,
    version: u64,
    period: Duration,
    top_k: usize,
    last_answer: Option<Timestamp>,
    /// The last report had a partition at or over the pod's part of its
    /// limit (its share of it).
    hot: bool,
    /// The smallest share the last answer gave (1 if none): the part of
    /// the limit a partition without a share of its own is judged hot
    /// against.
    least_share: f64,
}

impl PodLimiter {
    /// A limiter with `capacity` counter slots, reporting its `top_k`
    /// hottest partitions every `period`.
    pub fn new(capacity: usize, period: Duration, top_k: usize) -> Self {
        PodLimiter {
            counters: CounterTable::new(capacity),
            tables: Vec::new(),
            names: Vec::new(),
            version: 0,
            period,
            top_k,
            last_answer: None,
            hot: false,
            least_share: 1.0,
        }
    }

    fn table(&self, seed: u64) -> Option<&Limited> {
        self.tables
            .binary_search_by_key(&seed, |t| t.seed)
            .ok()
            .map(|i| &self.tables[i])
    }

    /// Counts one `op` on partition `partition` of the table whose seed is
    /// `table` ([`table_seed`]) and decides it; `draw` is uniform in
    /// [0, 1).
    #[inline]
    pub fn admit(
        &mut self,
        table: u64,
        partition: u64,
        op: Op,
        now: Timestamp,
        draw: f64,
    ) -> PodVerdict {
        let Ok(i) = self.tables.binary_search_by_key(&table, |t| t.seed) else {
            return PodVerdict::Unlimited;
        };
        let limited = &self.tables[i];
        let Some(limit) = limited.limits.limit(op) else {
            return PodVerdict::Unlimited;
        };
        let key = CounterKey {
            table: limited.index,
            op,
            partition,
        };
        match self.counters.admit(&key, limit, now, draw) {
            Verdict::Accepted => PodVerdict::Accepted,
            Verdict::Rejected => PodVerdict::Rejected(limited.index),
        }
    }

    /// The name of the table at `index` (from [`PodVerdict::Rejected`]).
    pub fn table_name(&self, index: u16) -> Option<&TableName> {
        self.names.get(usize::from(index))
    }

    fn index_of(&mut self, name: &TableName) -> Option<u16> {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return u16::try_from(i).ok();
        }
        let index = u16::try_from(self.names.len()).ok()?;
        self.names.push(name.clone());
        Some(index)
    }

    fn limit_of(&self, key: &CounterKey) -> Option<f64> {
        let name = self.names.get(usize::from(key.table))?;
        self.table(table_seed(name.as_str()))
            .filter(|t| t.index == key.table)?
            .limits
            .limit(key.op)
    }

    /// Applies `limits` (all the tenant's, replacing what the pod had).
    pub fn set_limits(&mut self, limits: &TableLimitSet) {
        let mut tables = Vec::with_capacity(limits.len());
        for (name, table_limits) in limits {
            if let Some(index) = self.index_of(name) {
                tables.push(Limited {
                    seed: table_seed(name.as_str()),
                    index,
                    limits: *table_limits,
                });
            }
        }
        tables.sort_by_key(|t| t.seed);
        self.tables = tables;
    }

    /// The limits the pod applies.
    pub fn limits(&self) -> TableLimitSet {
        self.tables
            .iter()
            .map(|t| (self.names[usize::from(t.index)].clone(), t.limits))
            .collect()
    }

    /// The version of those limits (0 before the first answer).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The pod's hottest partitions, as the server takes them.
    pub fn report(&self, now: Timestamp) -> Vec<ReportedPartition> {
        self.counters
            .hottest(self.top_k, now, |key| self.limit_of(key))
            .into_iter()
            .filter_map(|hot| {
                Some(ReportedPartition {
                    table: self.names.get(usize::from(hot.key.table))?.clone(),
                    op: hot.key.op,
                    partition: hot.key.partition,
                    rate: hot.rate,
                })
            })
            .collect()
    }

    /// The exchange pod `pod` sends now (remembering whether it reports a
    /// partition at or over its part of the limit).
    pub fn exchange(&mut self, pod: u32, now: Timestamp) -> Exchange {
        let partitions = self.report(now);
        self.hot = partitions.iter().any(|p| {
            let Some(table) = self
                .names
                .iter()
                .position(|n| *n == p.table)
                .and_then(|i| u16::try_from(i).ok())
            else {
                return false;
            };
            let key = CounterKey {
                table,
                op: p.op,
                partition: p.partition,
            };
            let share = match self.counters.share(&key) {
                whole if whole >= 1.0 => self.least_share,
                share => share,
            };
            self.limit_of(&key)
                .is_some_and(|limit| p.rate >= limit * share)
        });
        Exchange {
            pod,
            partitions,
            period: self.period,
            known_version: self.version,
        }
    }

    /// Takes the server's answer; returns how long until the next
    /// exchange (`draw` uniform in [0, 1)).
    pub fn on_answer(&mut self, answer: &ExchangeAnswer, now: Timestamp, draw: f64) -> Duration {
        if let Some(limits) = &answer.limits {
            self.set_limits(limits);
        }
        self.version = answer.version;
        let shares: Vec<(CounterKey, f64)> = answer
            .shares
            .iter()
            .filter_map(|(p, share)| {
                let index = self.names.iter().position(|n| *n == p.table)?;
                let key = CounterKey {
                    table: u16::try_from(index).ok()?,
                    op: p.op,
                    partition: p.partition,
                };
                Some((key, *share))
            })
            .collect();
        self.counters.set_shares(&shares, now);
        self.least_share = shares
            .iter()
            .map(|(_, share)| *share)
            .filter(|share| share.is_finite())
            .fold(1.0, f64::min)
            .max(0.0);
        self.last_answer = Some(now);
        // While a partition runs over the pod's part of its limit, twice as
        // often: a hot spot that moves is caught sooner.
        let cadence = if self.hot { 0.5 } else { 1.0 };
        self.period
            .mul_f64(cadence * (0.8 + 0.2 * draw.clamp(0.0, 1.0)))
    }

    /// Takes a failed exchange; returns how long until the next try
    /// (`draw` uniform in [0, 1); not before `pushback` when an overloaded
    /// server asked for that pause), and whether the pod now applies whole
    /// limits for want of an answer (two periods or more without one).
    pub fn on_failure(
        &mut self,
        now: Timestamp,
        draw: f64,
        pushback: Option<Duration>,
    ) -> (Duration, bool) {
        let stale = self
            .last_answer
            .is_none_or(|at| now.duration_since(at) >= self.period * 2);
        if stale {
            self.counters.clear_shares();
        }
        let draw = draw.clamp(0.0, 1.0);
        let retry = RETRY_AFTER_FAILURE
            .min(self.period)
            .mul_f64(0.5 + 1.5 * draw)
            .max(pushback_wait(pushback.unwrap_or_default(), draw));
        (retry, stale)
    }

    /// This pod's share (0 to 1) of a partition's `op` limit.
    pub fn share(&self, table: u64, partition: u64, op: Op) -> f64 {
        self.table(table).map_or(1.0, |t| {
            self.counters.share(&CounterKey {
                table: t.index,
                op,
                partition,
            })
        })
    }

    /// When the pod last heard from the server.
    pub fn last_answer(&self) -> Option<Timestamp> {
        self.last_answer
    }
}
