//! The `partitions:` part of a workload: a per-partition limit, and each
//! pod group's operations on hot and cold partitions.
//!
//! Hot partitions are named by number and moved by rule, so every pod of
//! every group that names the same hot spot sends its operations to the
//! same partition at the same time; they are numbered apart from cold
//! partitions. Cold traffic spreads over many partitions, uniformly or by a
//! Zipf law (partition 0 the most popular). Rates are per pod.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::is_default;

/// The most operations a workload may offer in all, local and coordinated
/// runs each: a bound on how long one run takes.
pub const MAX_OPERATIONS: f64 = 2e9;
/// The most partitions a cold spread may cover.
pub const MAX_COLD_PARTITIONS: u64 = 1 << 40;

/// The tenant's per-partition limit and how its pods apply it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PartitionSpec {
    /// Operations per second any one partition may get (one table, one
    /// operation: writes).
    pub limit: f64,
    /// How often each pod reports its hottest partitions [default: the
    /// client's target request period].
    #[serde(default, skip_serializing_if = "is_default", with = "humantime_serde")]
    pub report_period: Option<Duration>,
    /// How each pod's operations arrive.
    #[serde(default, skip_serializing_if = "is_default")]
    pub arrivals: Arrivals,
}

/// How operations arrive at a pod, per source.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Arrivals {
    /// Independent arrivals: exponential gaps.
    #[default]
    Poisson,
    /// Evenly spaced, each pod and source at a phase of its own.
    Even,
}

impl Arrivals {
    pub fn name(self) -> &'static str {
        match self {
            Arrivals::Poisson => "Poisson",
            Arrivals::Even => "evenly spaced",
        }
    }
}

/// A pod group's operations: each pod of the group sends all of these.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodPartitions {
    #[serde(default, skip_serializing_if = "is_default")]
    pub hot: Vec<HotSpec>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub cold: Option<ColdSpec>,
}

/// Operations on one hot spot: a fixed partition, or one that moves.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HotSpec {
    /// Operations per second from each pod.
    pub rate: f64,
    /// The hot partition's number; with `moving`, the first of those it
    /// moves among.
    #[serde(default, skip_serializing_if = "is_default")]
    pub partition: u64,
    #[serde(default, skip_serializing_if = "is_default")]
    pub moving: Option<Moving>,
}

/// A hot spot that moves to the next partition every `every`, cycling
/// through `among` partitions.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct Moving {
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    pub among: u64,
}

/// Cold traffic: operations spread over many partitions.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ColdSpec {
    /// Operations per second from each pod, over all the partitions.
    pub rate: f64,
    /// How many partitions (numbered from 0).
    pub partitions: u64,
    /// The Zipf exponent: partition `k` is chosen with weight
    /// `(k + 1)^-zipf` [default: uniform].
    #[serde(default, skip_serializing_if = "is_default")]
    pub zipf: Option<f64>,
}

impl ColdSpec {
    /// The share of the spread's operations that go to partition `k`.
    pub fn weight(&self, k: u64, normaliser: f64) -> f64 {
        if k >= self.partitions {
            return 0.0;
        }
        match self.zipf {
            None => 1.0 / self.partitions as f64,
            Some(s) => ((k + 1) as f64).powf(-s) / normaliser,
        }
    }

    /// `Σ (k + 1)^-s` over the partitions (1 for a uniform spread).
    pub fn normaliser(&self) -> f64 {
        match self.zipf {
            None => 1.0,
            Some(s) => generalised_harmonic(self.partitions, s),
        }
    }
}

/// `Σ_{k=1..n} k^-s`: exact up to a million terms, the rest by the
/// midpoint rule (its error is far below a part in a million there).
fn generalised_harmonic(n: u64, s: f64) -> f64 {
    const EXACT: u64 = 1_000_000;
    let exact = n.min(EXACT);
    let mut sum: f64 = (1..=exact).map(|k| (k as f64).powf(-s)).sum();
    if n > exact {
        let (a, b) = (exact as f64 + 0.5, n as f64 + 0.5);
        sum += if (s - 1.0).abs() < 1e-12 {
            (b / a).ln()
        } else {
            (b.powf(1.0 - s) - a.powf(1.0 - s)) / (1.0 - s)
        };
    }
    sum
}

/// A hot spot as the measures see it: every hot source with the same
/// partition and movement sends to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotSpot {
    pub partition: u64,
    pub moving: Option<Moving>,
}

impl HotSpot {
    pub fn of(spec: &HotSpec) -> HotSpot {
        HotSpot {
            partition: spec.partition,
            moving: spec.moving,
        }
    }

    /// The partition it is on at `t`.
    pub fn partition_at(&self, t: Duration) -> u64 {
        match self.moving {
            None => self.partition,
            Some(m) => {
                let step = (t.as_micros() / m.every.as_micros().max(1)) as u64;
                self.partition + step % m.among
            }
        }
    }

    /// When it moves, before `end`.
    pub fn moves(&self, end: Duration) -> Vec<Duration> {
        let Some(m) = self.moving else {
            return Vec::new();
        };
        let mut times = Vec::new();
        let mut t = m.every;
        while t < end {
            times.push(t);
            t += m.every;
        }
        times
    }

    /// The partitions it may be on.
    pub fn partitions(&self) -> std::ops::Range<u64> {
        let among = self.moving.map_or(1, |m| m.among);
        self.partition..self.partition.saturating_add(among)
    }

    /// How the report names it.
    pub fn describe(&self) -> String {
        match self.moving {
            None => format!("partition {}", self.partition),
            Some(m) => format!(
                "moving among {}–{} every {}",
                self.partition,
                self.partition + m.among - 1,
                crate::humantime_short(m.every)
            ),
        }
    }
}

impl PartitionSpec {
    /// Checks the section's numbers; `default_period` is the client's.
    pub fn validate(&self, default_period: Duration) -> Result<(), String> {
        if !(self.limit.is_finite()
            && self.limit > 0.0
            && self.limit <= tollgate_core::partition::MAX_OPS_PER_SECOND)
        {
            return Err(format!(
                "partitions.limit: must be above 0 and at most {:e} operations per second",
                tollgate_core::partition::MAX_OPS_PER_SECOND
            ));
        }
        tollgate_core::validate::target_request_period(
            "partitions.report_period",
            self.report_period(default_period),
        )
        .map_err(|e| e.to_string())?;
        Ok(())
    }

    pub fn report_period(&self, default_period: Duration) -> Duration {
        self.report_period.unwrap_or(default_period)
    }
}

impl PodPartitions {
    /// Checks a group's operations; `at` names the field.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        let rate = |field: String, rate: f64| {
            if rate.is_finite() && rate >= 0.0 {
                Ok(())
            } else {
                Err(format!("{field}: must be finite and non-negative"))
            }
        };
        for (i, hot) in self.hot.iter().enumerate() {
            rate(format!("{at}.hot[{i}].rate"), hot.rate)?;
            if let Some(m) = hot.moving {
                if m.every < Duration::from_millis(100) {
                    return Err(format!(
                        "{at}.hot[{i}].moving.every: must be at least 100ms"
                    ));
                }
                if m.among < 2 {
                    return Err(format!("{at}.hot[{i}].moving.among: must be at least 2"));
                }
                if hot.partition.checked_add(m.among).is_none() {
                    return Err(format!("{at}.hot[{i}].moving.among: too many partitions"));
                }
            }
        }
        if let Some(cold) = &self.cold {
            rate(format!("{at}.cold.rate"), cold.rate)?;
            if !(1..=MAX_COLD_PARTITIONS).contains(&cold.partitions) {
                return Err(format!(
                    "{at}.cold.partitions: must be between 1 and {MAX_COLD_PARTITIONS}"
                ));
            }
            if let Some(s) = cold.zipf
                && !(s.is_finite() && s > 0.0 && s <= 10.0)
            {
                return Err(format!("{at}.cold.zipf: must be above 0 and at most 10"));
            }
        }
        Ok(())
    }

    /// Operations per second each pod sends, in all.
    pub fn rate(&self) -> f64 {
        self.hot.iter().map(|h| h.rate).sum::<f64>() + self.cold.as_ref().map_or(0.0, |c| c.rate)
    }
}

/// The distinct hot spots of `groups`' operations, in order of first
/// mention; refused if two different ones could share a partition.
pub fn hot_spots<'a>(
    groups: impl IntoIterator<Item = (usize, &'a PodPartitions)>,
) -> Result<Vec<HotSpot>, String> {
    let mut spots: Vec<HotSpot> = Vec::new();
    for (g, partitions) in groups {
        for (i, hot) in partitions.hot.iter().enumerate() {
            let spot = HotSpot::of(hot);
            if spots.contains(&spot) {
                continue;
            }
            let range = spot.partitions();
            if let Some(other) = spots.iter().find(|o| {
                let r = o.partitions();
                r.start < range.end && range.start < r.end
            }) {
                return Err(format!(
                    "pods[{g}].partitions.hot[{i}]: its partitions overlap those of the hot spot on {} \
                     (name the same partition and movement to share a hot spot)",
                    other.describe()
                ));
            }
            spots.push(spot);
        }
    }
    Ok(spots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_hot_spot_cycles_through_its_partitions() {
        let spot = HotSpot {
            partition: 10,
            moving: Some(Moving {
                every: Duration::from_secs(20),
                among: 3,
            }),
        };
        let at = |s| spot.partition_at(Duration::from_secs(s));
        assert_eq!(
            [at(0), at(19), at(20), at(45), at(60)],
            [10, 10, 11, 12, 10]
        );
        assert_eq!(
            spot.moves(Duration::from_secs(60)),
            [Duration::from_secs(20), Duration::from_secs(40)]
        );
    }

    #[test]
    fn cold_weights_add_up_to_one() {
        for zipf in [None, Some(0.8), Some(1.0), Some(1.3)] {
            for partitions in [1, 7, 1000, 3_000_000] {
                let cold = ColdSpec {
                    rate: 1.0,
                    partitions,
                    zipf,
                };
                let norm = cold.normaliser();
                let sum: f64 = (0..partitions).map(|k| cold.weight(k, norm)).sum();
                assert!(
                    (sum - 1.0).abs() < 1e-6,
                    "{zipf:?} over {partitions}: {sum}"
                );
                assert_eq!(cold.weight(partitions, norm), 0.0);
            }
        }
    }
}
