//! Usage history: a bucket's exact totals over time.
//!
//! Billing reads a bucket's cumulative totals ([`Totals`]); a chart or an
//! impact preview needs them over time. The server samples every bucket's
//! totals every [`HistoryConfig::sample_interval`] and keeps one row per
//! bucket, [`Resolution`] and slot (a minute for 14 days, an hour for 13
//! months, by default). The totals only grow, so a slot's row is the
//! latest sample taken in it: rolling up is keeping, not summing, and a
//! row is written as often as a sample falls in its slot with no risk of
//! counting twice. Any replica may sample: rows are keyed by bucket,
//! resolution and slot, and of two samples of one slot the later is kept
//! ([`HistorySample::replaces`]).
//!
//! Rates are differences of consecutive rows ([`usage`]), so the usage a
//! history shows over any span is exactly the change of the billed totals
//! over it. A bucket deleted and created again starts from zero: a total
//! that falls is a reset, and the usage after it is the new total.
//! Rows outlive their bucket, for billing, and are pruned by age only
//! ([`Resolution::prune_before`]).
//!
//! Per-key buckets have no totals to sample: each replica counts the
//! checks it answers and writes them per slot ([`checks`]).

pub mod checks;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::consumption::Consumption;
use crate::global_bucket::Totals;
use crate::time::Timestamp;

/// How often a resolution keeps a row, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// The length of a slot; slots start at multiples of it since the
    /// Unix epoch.
    #[serde(with = "micros")]
    pub step: Duration,
    /// Rows whose slot ended longer ago than this are pruned.
    #[serde(with = "micros")]
    pub retention: Duration,
}

impl Resolution {
    /// The start of the slot `at` falls in.
    pub fn slot(&self, at: Timestamp) -> Timestamp {
        let step = step_micros(self.step);
        Timestamp::from_unix_micros(at.unix_micros().div_euclid(step) * step)
    }

    /// Slots starting before this, at `now`, are past retention.
    pub fn prune_before(&self, now: Timestamp) -> Timestamp {
        self.slot(now.saturating_sub(self.retention))
    }

    /// The step, in whole seconds (what the stores key rows by).
    pub fn step_secs(&self) -> u64 {
        self.step.as_secs().max(1)
    }
}

fn step_micros(step: Duration) -> i64 {
    i64::try_from(step.as_micros()).unwrap_or(i64::MAX).max(1)
}

/// What the server keeps of each bucket's totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryConfig {
    /// How often the totals are sampled.
    pub sample_interval: Duration,
    /// From the finest to the coarsest.
    pub resolutions: Vec<Resolution>,
}

/// The smallest step and sample interval accepted: history is for
/// charts and previews, not for gating.
pub const MIN_STEP: Duration = Duration::from_secs(1);

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            sample_interval: Duration::from_secs(10),
            resolutions: vec![
                Resolution {
                    step: Duration::from_secs(60),
                    retention: Duration::from_secs(14 * 86_400),
                },
                Resolution {
                    step: Duration::from_secs(3_600),
                    retention: Duration::from_secs(396 * 86_400),
                },
            ],
        }
    }
}

/// A history configuration that cannot work.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum HistoryConfigError {
    #[error("history: the sample interval must be at least {MIN_STEP:?}")]
    SampleInterval,
    #[error("history: at least one resolution is needed")]
    NoResolution,
    #[error("history: resolution {0}: the step must be whole seconds, at least {MIN_STEP:?}")]
    Step(usize),
    #[error("history: resolution {0}: the step must be a multiple of the one before")]
    NotAMultiple(usize),
    #[error("history: resolution {0}: retention must be at least one step")]
    Retention(usize),
    #[error("history: resolution {0}: the step must be at least the sample interval")]
    FinerThanSamples(usize),
}

impl HistoryConfig {
    /// Checks that the resolutions go from fine to coarse, each a whole
    /// multiple of the one before, and none finer than the samples.
    pub fn validate(&self) -> Result<(), HistoryConfigError> {
        if self.sample_interval < MIN_STEP {
            return Err(HistoryConfigError::SampleInterval);
        }
        if self.resolutions.is_empty() {
            return Err(HistoryConfigError::NoResolution);
        }
        let mut before: Option<Duration> = None;
        for (i, r) in self.resolutions.iter().enumerate() {
            if r.step < MIN_STEP || r.step.subsec_nanos() != 0 {
                return Err(HistoryConfigError::Step(i));
            }
            if r.step < self.sample_interval {
                return Err(HistoryConfigError::FinerThanSamples(i));
            }
            if r.retention < r.step {
                return Err(HistoryConfigError::Retention(i));
            }
            if let Some(b) = before
                && (r.step <= b || r.step.as_secs() % b.as_secs() != 0)
            {
                return Err(HistoryConfigError::NotAMultiple(i));
            }
            before = Some(r.step);
        }
        Ok(())
    }

    /// The resolution to read a history from `since` at `now` with steps
    /// of about `step`: the coarsest whose step is at most `step`, of
    /// those that still keep `since`; the coarsest that does if none is
    /// that fine, and the coarsest of all if none keeps `since`.
    pub fn resolution_for(&self, since: Timestamp, now: Timestamp, step: Duration) -> Resolution {
        let kept: Vec<&Resolution> = self
            .resolutions
            .iter()
            .filter(|r| r.prune_before(now) <= since)
            .collect();
        let chosen = kept
            .iter()
            .rev()
            .find(|r| r.step <= step)
            .or_else(|| kept.first())
            .copied()
            .or_else(|| self.resolutions.last());
        chosen.copied().unwrap_or(Resolution {
            step: Duration::from_secs(60),
            retention: Duration::from_secs(86_400),
        })
    }
}

/// A bucket's totals as sampled at `at`, and its level then.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistorySample {
    pub at: Timestamp,
    pub totals: Totals,
    /// Tokens in the bucket at `at`, refill included (negative: debt);
    /// `None` where not known: a row closing a slot, or one written
    /// before levels were kept. Not part of what makes a row: a bucket
    /// whose totals did not change gets no row, however its level moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<f64>,
}

impl HistorySample {
    /// Whether `self` should replace `kept` as its slot's row: it was
    /// taken later. Two replicas sampling one slot agree on the row.
    pub fn replaces(&self, kept: &HistorySample) -> bool {
        (self.at, self.totals.granted_tokens.to_bits())
            > (kept.at, kept.totals.granted_tokens.to_bits())
    }
}

/// The rows a `sample` of a bucket created at `created_at` writes into
/// `resolution`, given the bucket's latest row there (`latest`), as
/// (slot, row):
/// - with no row yet, of a bucket created in the sample's slot or the one
///   before, first a row of zero totals closing the slot before the one
///   it was created in (it did not exist then), so its first use is seen;
///   a bucket older than that (one from before the history was kept)
///   starts at its sample, its earlier use not counted in any span;
/// - none if the totals are those of `latest`: a bucket that used nothing
///   costs no row, and a slot without a row means nothing was used;
/// - else the sample's slot's row, unless `latest` is of that slot and
///   taken later ([`HistorySample::replaces`]);
/// - and where slots were skipped since `latest`, first a row closing the
///   slot before the sample's with `latest`'s totals, so that what was
///   used falls in the slot it was sampled in, not spread over the gap.
pub fn rows_to_write(
    resolution: &Resolution,
    created_at: Timestamp,
    latest: Option<&HistorySample>,
    sample: &HistorySample,
) -> Vec<(Timestamp, HistorySample)> {
    let slot = resolution.slot(sample.at);
    let Some(latest) = latest else {
        let created = resolution.slot(created_at);
        let mut rows = Vec::with_capacity(2);
        if created >= slot.saturating_sub(resolution.step) && created <= slot {
            rows.push((
                created.saturating_sub(resolution.step),
                HistorySample {
                    at: created.saturating_sub(Duration::from_micros(1)),
                    totals: Totals::default(),
                    level: None,
                },
            ));
        }
        rows.push((slot, sample.clone()));
        return rows;
    };
    if latest.totals == sample.totals {
        return Vec::new();
    }
    let latest_slot = resolution.slot(latest.at);
    if latest_slot == slot {
        return if sample.replaces(latest) {
            vec![(slot, sample.clone())]
        } else {
            Vec::new()
        };
    }
    if latest_slot > slot {
        // A sample older than the latest row (a replica's clock behind).
        return Vec::new();
    }
    let before = slot.saturating_sub(resolution.step);
    let mut rows = Vec::with_capacity(2);
    if latest_slot < before {
        rows.push((
            before,
            HistorySample {
                at: slot.saturating_sub(Duration::from_micros(1)),
                totals: latest.totals.clone(),
                level: None,
            },
        ));
    }
    rows.push((slot, sample.clone()));
    rows
}

/// What a bucket used between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub from: Timestamp,
    pub to: Timestamp,
    pub consumption: Consumption,
    pub granted_tokens: f64,
    /// Time the pods spent throttled, summed over them.
    pub throttled_micros: u64,
    /// The bucket's level at `to`, if the row there kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<f64>,
}

impl Usage {
    /// Seconds from `from` to `to`.
    pub fn seconds(&self) -> f64 {
        self.to.seconds_since(self.from)
    }

    /// Request units per second over the span (0 over an empty span).
    pub fn request_units_per_second(&self) -> f64 {
        per_second(self.consumption.request_units(), self.seconds())
    }

    /// Tokens granted per second over the span.
    pub fn granted_per_second(&self) -> f64 {
        per_second(self.granted_tokens, self.seconds())
    }

    /// Pods throttled over the span, on average.
    pub fn throttled_pods(&self) -> f64 {
        per_second(self.throttled_micros as f64 / 1e6, self.seconds())
    }

    /// Adds `other`'s counters, saturating (spans of one bucket in turn, or
    /// several buckets' spans of one slot). The level is the later span's
    /// (a sum of several buckets' has none worth showing).
    pub fn add(&mut self, other: &Usage) {
        self.consumption.add(&other.consumption);
        self.granted_tokens += other.granted_tokens;
        self.throttled_micros = self.throttled_micros.saturating_add(other.throttled_micros);
        self.level = other.level.or(self.level);
    }
}

fn per_second(amount: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { amount / seconds } else { 0.0 }
}

/// The usage between each two consecutive `samples` (in time order). A
/// total that falls is a reset (the bucket was deleted and created
/// again): the usage after it is the new total.
pub fn usage(samples: &[HistorySample]) -> Vec<Usage> {
    samples
        .windows(2)
        .map(|pair| {
            let (before, after) = (&pair[0], &pair[1]);
            let reset = !after
                .totals
                .consumption
                .dominates(&before.totals.consumption)
                || after.totals.granted_tokens < before.totals.granted_tokens
                || after.totals.throttled_micros < before.totals.throttled_micros;
            let base = if reset {
                Totals::default()
            } else {
                before.totals.clone()
            };
            Usage {
                from: before.at,
                to: after.at,
                consumption: after.totals.consumption.saturating_sub(&base.consumption),
                granted_tokens: (after.totals.granted_tokens - base.granted_tokens).max(0.0),
                throttled_micros: after.totals.throttled_micros - base.throttled_micros,
                level: after.level,
            }
        })
        .collect()
}

/// The sum of `usage` (each span's counters added, saturating).
pub fn total_usage(usage: &[Usage]) -> Usage {
    let mut sum = Usage::default();
    for (i, u) in usage.iter().enumerate() {
        if i == 0 {
            sum.from = u.from;
        }
        sum.to = u.to;
        sum.add(u);
    }
    sum
}

/// `usage` in slots of `step` from the slot `since` falls in to the one
/// `until` does, every slot present (none used: zeros). A span counts in
/// the slot its end falls in: a row is the last sample of its slot, so
/// what it adds was used since the row before, in that slot but for the
/// seconds between that row and the slot's start. Shared by time instead,
/// a rise seen in one sample would show a slot early. The sum over the
/// slots is the sum of the spans that end between them. Slots line up
/// whatever the bucket, so several buckets' add up slot by slot.
pub fn per_slot(usage: &[Usage], since: Timestamp, until: Timestamp, step: Duration) -> Vec<Usage> {
    let step = step_micros(step);
    let first = since.unix_micros().div_euclid(step) * step;
    let count = usize::try_from((until.unix_micros() - first).max(0) / step + 1).unwrap_or(0);
    let mut slots: Vec<Usage> = (0..count)
        .map(|i| {
            let from = first + step * i as i64;
            Usage {
                from: Timestamp::from_unix_micros(from),
                to: Timestamp::from_unix_micros(from + step),
                ..Usage::default()
            }
        })
        .collect();
    for u in usage {
        let to = u.to.unix_micros();
        if to < first {
            continue;
        }
        let Some(slot) = usize::try_from((to - first) / step)
            .ok()
            .and_then(|i| slots.get_mut(i))
        else {
            continue;
        };
        slot.add(u);
    }
    slots
}

/// Since when a bucket has been throttled, by its `slots` (in time order):
/// the start of the run of slots with throttled time that ends in one of
/// the last two (the last is still being sampled); `None` if neither has
/// any. `whole_span` says the run goes back to the first slot: throttled
/// since then at least.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottledSince {
    pub since: Timestamp,
    pub whole_span: bool,
}

pub fn throttled_since(slots: &[Usage]) -> Option<ThrottledSince> {
    let throttled = |s: &Usage| s.throttled_micros > 0;
    let last = slots.iter().rposition(throttled)?;
    if last + 2 < slots.len() {
        return None;
    }
    let start = slots[..=last]
        .iter()
        .rposition(|s| !throttled(s))
        .map_or(0, |i| i + 1);
    Some(ThrottledSince {
        since: slots[start].from,
        whole_span: start == 0,
    })
}

/// Serde of a [`Duration`] as whole microseconds.
mod micros {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_micros(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample(secs: f64, request_units: f64, granted: f64) -> HistorySample {
        HistorySample {
            at: Timestamp::from_secs_f64(secs),
            totals: Totals {
                consumption: Consumption::from_request_units(request_units),
                granted_tokens: granted,
                throttled_micros: 0,
            },
            level: Some(1.0),
        }
    }

    #[test]
    fn the_default_keeps_minutes_for_14_days_and_hours_for_13_months() {
        let c = HistoryConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.resolutions[0].step, Duration::from_secs(60));
        assert_eq!(
            c.resolutions[1].retention,
            Duration::from_secs(396 * 86_400)
        );
    }

    #[test]
    fn a_configuration_that_cannot_work_is_refused_by_name() {
        let mut c = HistoryConfig::default();
        c.resolutions[1].step = Duration::from_secs(90);
        assert_eq!(c.validate(), Err(HistoryConfigError::NotAMultiple(1)));
        let mut c = HistoryConfig::default();
        c.resolutions[0].retention = Duration::from_secs(10);
        assert_eq!(c.validate(), Err(HistoryConfigError::Retention(0)));
        let c = HistoryConfig {
            sample_interval: Duration::from_secs(120),
            ..HistoryConfig::default()
        };
        assert_eq!(c.validate(), Err(HistoryConfigError::FinerThanSamples(0)));
        let c = HistoryConfig {
            resolutions: Vec::new(),
            ..HistoryConfig::default()
        };
        assert_eq!(c.validate(), Err(HistoryConfigError::NoResolution));
    }

    #[test]
    fn slots_start_at_multiples_of_the_step() {
        let minute = HistoryConfig::default().resolutions[0];
        assert_eq!(
            minute.slot(Timestamp::from_secs_f64(125.5)),
            Timestamp::from_secs_f64(120.0)
        );
        assert_eq!(
            minute.slot(Timestamp::from_secs_f64(-1.0)),
            Timestamp::from_secs_f64(-60.0)
        );
        let now = Timestamp::from_secs_f64(20.0 * 86_400.0 + 30.0);
        assert_eq!(
            minute.prune_before(now),
            Timestamp::from_secs_f64(6.0 * 86_400.0)
        );
    }

    #[test]
    fn a_history_is_read_from_the_finest_resolution_that_keeps_its_start() {
        let c = HistoryConfig::default();
        let now = Timestamp::from_secs_f64(100.0 * 86_400.0);
        let day_ago = now.saturating_sub(Duration::from_secs(86_400));
        let month_ago = now.saturating_sub(Duration::from_secs(30 * 86_400));
        let minute = Duration::from_secs(60);
        let hour = Duration::from_secs(3_600);
        assert_eq!(c.resolution_for(day_ago, now, minute).step, minute);
        // Asked for hours over a day: the hourly rows.
        assert_eq!(c.resolution_for(day_ago, now, hour).step, hour);
        // Minutes asked over a month: only the hourly rows keep it.
        assert_eq!(c.resolution_for(month_ago, now, minute).step, hour);
        // Finer than any: the finest that keeps the start.
        assert_eq!(
            c.resolution_for(day_ago, now, Duration::from_secs(1)).step,
            minute
        );
    }

    #[test]
    fn the_later_sample_of_a_slot_is_kept() {
        let early = sample(10.0, 5.0, 5.0);
        let late = sample(20.0, 7.0, 7.0);
        assert!(late.replaces(&early));
        assert!(!early.replaces(&late));
        assert!(!late.replaces(&late));
    }

    #[test]
    fn usage_is_the_difference_of_totals_and_a_fall_is_a_reset() {
        let samples = [
            sample(0.0, 10.0, 12.0),
            sample(60.0, 70.0, 72.0),
            // Deleted and created again: counting from zero.
            sample(120.0, 5.0, 6.0),
        ];
        let u = usage(&samples);
        assert_eq!(u.len(), 2);
        assert!((u[0].request_units_per_second() - 1.0).abs() < 1e-9);
        assert!((u[0].granted_per_second() - 1.0).abs() < 1e-9);
        assert!((u[1].consumption.request_units() - 5.0).abs() < 1e-9);
        assert!((u[1].granted_tokens - 6.0).abs() < 1e-9);
    }

    #[test]
    fn an_unchanged_bucket_writes_nothing_and_a_gap_is_closed_before_the_change() {
        let minute = HistoryConfig::default().resolutions[0];
        let first = sample(5.0, 1.0, 1.0);
        // A bucket from before the history: no baseline.
        let long_ago = Timestamp::from_secs_f64(-3_600.0);
        assert_eq!(
            rows_to_write(&minute, long_ago, None, &first),
            vec![(Timestamp::EPOCH, first.clone())]
        );
        // A new bucket: zero totals before it was created.
        let rows = rows_to_write(&minute, Timestamp::from_secs_f64(2.0), None, &first);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, Timestamp::from_secs_f64(-60.0));
        assert_eq!(rows[0].1.totals, Totals::default());
        let spans = usage(&[rows[0].1.clone(), rows[1].1.clone()]);
        assert!((spans[0].consumption.request_units() - 1.0).abs() < 1e-9);
        let created = long_ago;
        // Unchanged ten minutes on: nothing.
        assert!(rows_to_write(&minute, created, Some(&first), &sample(605.0, 1.0, 1.0)).is_empty());
        // Later in the same slot: the slot's row again.
        let later = sample(50.0, 2.0, 2.0);
        assert_eq!(
            rows_to_write(&minute, created, Some(&first), &later).len(),
            1
        );
        // Changed after ten idle minutes: the minute before closes with
        // the old totals, so all the use falls in the last minute.
        let changed = sample(605.0, 31.0, 31.0);
        let rows = rows_to_write(&minute, created, Some(&first), &changed);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, Timestamp::from_secs_f64(540.0));
        assert_eq!(rows[0].1.totals, first.totals);
        assert_eq!(rows[1].0, Timestamp::from_secs_f64(600.0));
        let spans = usage(&[first.clone(), rows[0].1.clone(), rows[1].1.clone()]);
        assert_eq!(spans[0].consumption.request_unit_micros, 0);
        assert!((spans[1].consumption.request_units() - 30.0).abs() < 1e-9);
        // A sample behind the latest row writes nothing.
        assert!(
            rows_to_write(&minute, created, Some(&changed), &sample(65.0, 9.0, 9.0)).is_empty()
        );
    }

    fn throttled(from: f64, to: f64, pod_seconds: f64) -> Usage {
        Usage {
            from: Timestamp::from_secs_f64(from),
            to: Timestamp::from_secs_f64(to),
            throttled_micros: (pod_seconds * 1e6) as u64,
            ..Usage::default()
        }
    }

    #[test]
    fn a_span_counts_in_the_slot_its_end_falls_in() {
        let spans = usage(&[
            sample(50.0, 0.0, 0.0),
            sample(58.0, 20.0, 10.0),
            // 110 used from 58 s to 110 s: all in the slot [60, 120).
            sample(110.0, 130.0, 10.0),
            sample(170.0, 180.0, 60.0),
        ]);
        let minute = Duration::from_secs(60);
        let slots = per_slot(
            &spans,
            Timestamp::from_secs_f64(30.0),
            Timestamp::from_secs_f64(250.0),
            minute,
        );
        let starts: Vec<f64> = slots
            .iter()
            .map(|s| s.from.unix_micros() as f64 / 1e6)
            .collect();
        assert_eq!(starts, [0.0, 60.0, 120.0, 180.0, 240.0]);
        let used: Vec<f64> = slots
            .iter()
            .map(|s| s.consumption.request_units())
            .collect();
        for (got, want) in used.iter().zip([20.0, 110.0, 50.0, 0.0, 0.0]) {
            assert!((got - want).abs() < 1e-9, "{used:?}");
        }
        assert!((slots[1].request_units_per_second() - 110.0 / 60.0).abs() < 1e-9);
        assert!((slots[0].granted_per_second() - 10.0 / 60.0).abs() < 1e-9);
        // Nothing lost or made up.
        let sum: f64 = used.iter().sum();
        assert!((sum - 180.0).abs() < 1e-9);
    }

    #[test]
    fn throttled_since_is_the_start_of_the_run_that_reaches_now() {
        let minute = Duration::from_secs(60);
        let at = |s: f64| Timestamp::from_secs_f64(s);
        // Throttled from 120 s to the end (the last slot not sampled yet).
        let spans = [
            throttled(0.0, 50.0, 5.0),
            throttled(115.0, 170.0, 30.0),
            throttled(170.0, 230.0, 60.0),
        ];
        let slots = per_slot(&spans, at(0.0), at(290.0), minute);
        assert_eq!(
            throttled_since(&slots),
            Some(ThrottledSince {
                since: at(120.0),
                whole_span: false
            })
        );
        // Throttled in every slot read: since the first at least.
        let slots = per_slot(&spans[1..], at(120.0), at(230.0), minute);
        assert_eq!(
            throttled_since(&slots).map(|t| (t.since, t.whole_span)),
            Some((at(120.0), true))
        );
        // Throttled only two slots before the last: not now.
        let slots = per_slot(&spans, at(0.0), at(350.0), minute);
        assert_eq!(throttled_since(&slots), None);
        assert_eq!(throttled_since(&[]), None);
    }

    #[test]
    fn a_span_and_its_slot_carry_the_level_of_the_later_row() {
        let mut rows = vec![
            sample(0.0, 0.0, 0.0),
            sample(30.0, 5.0, 5.0),
            sample(50.0, 9.0, 9.0),
        ];
        rows[1].level = Some(40.0);
        rows[2].level = Some(25.0);
        let spans = usage(&rows);
        assert_eq!(spans[0].level, Some(40.0));
        assert_eq!(spans[1].level, Some(25.0));
        let slots = per_slot(
            &spans,
            Timestamp::from_secs_f64(0.0),
            Timestamp::from_secs_f64(50.0),
            Duration::from_secs(60),
        );
        assert_eq!(slots[0].level, Some(25.0), "the slot's last row's");
        // A row closing an idle stretch knows no level: the slot keeps the
        // one it has.
        let mut closing = spans[1];
        closing.level = None;
        let mut slot = spans[0];
        slot.add(&closing);
        assert_eq!(slot.level, Some(40.0));
    }

    proptest! {
        /// Slots of any step add up to the spans they cover.
        #[test]
        fn slots_add_up_to_the_spans(
            gaps in proptest::collection::vec((1u32..400, 0u32..1000), 1..40),
            step in 1u64..600,
        ) {
            let mut at = 1_000.0;
            let mut total = 0.0;
            let mut samples = vec![sample(at, 0.0, 0.0)];
            for (gap, used) in &gaps {
                at += f64::from(*gap);
                total += f64::from(*used);
                samples.push(sample(at, total, total));
            }
            let spans = usage(&samples);
            let slots = per_slot(
                &spans,
                Timestamp::from_secs_f64(1_000.0),
                Timestamp::from_secs_f64(at),
                Duration::from_secs(step),
            );
            let sum: f64 = slots.iter().map(|s| s.consumption.request_units()).sum();
            prop_assert!((sum - total).abs() < 1e-6 * total.max(1.0), "{sum} vs {total}");
            prop_assert!(slots.windows(2).all(|w| w[0].to == w[1].from));
        }
    }

    proptest! {
        /// Two replicas sampling the same totals write the rows one
        /// would, and the usage the rows give sums to the change of the
        /// totals from the first row to the last.
        #[test]
        fn rows_written_twice_are_the_rows_written_once(
            deltas in proptest::collection::vec((1i64..200_000_000, 0u64..1_000_000), 1..40),
        ) {
            let minute = HistoryConfig::default().resolutions[0];
            let mut at = 0i64;
            let mut micros = 0u64;
            let mut samples = Vec::new();
            for (dt, d) in deltas {
                at += dt;
                micros += d;
                samples.push(HistorySample {
                    at: Timestamp::from_unix_micros(at),
                    totals: Totals {
                        consumption: Consumption { request_unit_micros: micros, ..Consumption::default() },
                        granted_tokens: micros as f64,
                        throttled_micros: micros,
                    },
                    level: Some(1.0),
                });
            }
            let created = Timestamp::from_unix_micros(-1);
            let apply = |order: &[HistorySample]| {
                let mut rows: std::collections::BTreeMap<Timestamp, HistorySample> = Default::default();
                for s in order {
                    let latest = rows.values().next_back().cloned();
                    for (slot, row) in rows_to_write(&minute, created, latest.as_ref(), s) {
                        rows.insert(slot, row);
                    }
                }
                rows
            };
            let in_order = apply(&samples);
            // Each sample twice, as two replicas in step would.
            let doubled: Vec<HistorySample> =
                samples.iter().flat_map(|s| [s.clone(), s.clone()]).collect();
            prop_assert_eq!(&apply(&doubled), &in_order);
            let rows: Vec<HistorySample> = in_order.into_values().collect();
            let sum = total_usage(&usage(&rows));
            let first = rows.first().map_or(0, |r| r.totals.consumption.request_unit_micros);
            prop_assert_eq!(sum.consumption.request_unit_micros, micros - first);
        }

        /// Over any growing totals, the usage summed over the spans is
        /// exactly the change of the totals from the first to the last.
        #[test]
        fn summed_usage_is_the_change_of_the_totals(
            steps in proptest::collection::vec((1u64..1_000_000, 0u64..10_000_000), 1..50),
        ) {
            let mut at = 0i64;
            let mut micros = 0u64;
            let mut samples = vec![HistorySample::default()];
            for (dt, d) in steps {
                at += i64::try_from(dt).expect("small");
                micros += d;
                samples.push(HistorySample {
                    at: Timestamp::from_unix_micros(at),
                    totals: Totals {
                        consumption: Consumption { request_unit_micros: micros, ..Consumption::default() },
                        granted_tokens: 0.0,
                        throttled_micros: 0,
                    },
                    level: Some(1.0),
                });
            }
            let sum = total_usage(&usage(&samples));
            prop_assert_eq!(sum.consumption.request_unit_micros, micros);
            prop_assert_eq!(sum.to, Timestamp::from_unix_micros(at));
        }
    }
}
