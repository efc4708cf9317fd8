//! What a mode's run did with the limit, in numbers.
//!
//! - **Steady state**: every moment at least [`SETTLE_PERIODS`] report
//!   periods (and three round trips: an exchange's, the answer's and the
//!   next) after the last change — the start, a pod joining or leaving, the
//!   end of an outage (outages themselves are out), and for a hot spot its
//!   own moves. By then every pod has reported twice since the change, so
//!   the server's sums and the pods' shares are up to date.
//! - **Accepted / limit** of each hot spot in steady state: the mean, and
//!   the spread over each whole second; with the offered rate, and the
//!   **ScyllaDB figure** `Σ min(vᵢ, L) / L` over the pods' offered rates
//!   `vᵢ`, what pods counting alone accept.
//! - **Reaction** to a moved hot spot: from the move until the accepted
//!   rate over a trailing window (1 s, or longer for limits under
//!   [`REACTION_WINDOW_OPERATIONS`] per second, so that Poisson noise
//!   cannot pass for a miss) is within [`REACTION_BOUND`] × the limit, and
//!   stays so for a report period (or until the next move, if sooner).
//!   Windows step by one bin. A window over the bound later than that is
//!   the steady state's noise, not a reaction still under way: the steady
//!   state is judged by its own measures (its mean and its spread over
//!   each second). A move is not
//!   measured when the pods offer the hot spot less than
//!   [`REACTION_MIN_OFFERED`] × the limit (the accepted rate is then within
//!   the bound up to its noise whether the pods react or not), when its
//!   interval is shorter than two windows (a window about as long as the
//!   interval cannot tell a slow reaction from the move's own burst), when
//!   an outage interrupts it, or when the run ends before a whole interval
//!   has passed (the last move of a run that does not end on a move).
//! - **False positives**: of the operations on partitions that all pods
//!   together offer below the limit, the share rejected; and apart, of
//!   those on *warm* partitions (offered from half the limit up), where
//!   the noise of each pod's count meets its share of the limit.
//! - **Exchanges** answered per pod per minute, failed ones, and the share
//!   of pod time spent back on whole shares for want of an answer.

use std::time::Duration;

use serde::Serialize;

use super::engine::{PartitionRecord, SpotSeries};
use crate::workload::partitions::HotSpot;
use crate::workload::{PodSpec, Workload};

/// Report periods after a change before the steady state begins.
pub const SETTLE_PERIODS: f64 = 2.0;
/// The accepted rate a moved hot spot must come within, as a multiple of
/// the limit.
pub const REACTION_BOUND: f64 = 1.2;
/// The shortest reaction window, seconds.
pub const REACTION_WINDOW_SECS: f64 = 1.0;
/// Operations at the limit a reaction window holds at least (Poisson noise
/// of 5 %: a window 1.2 × over is four standard deviations out).
pub const REACTION_WINDOW_OPERATIONS: f64 = 400.0;
/// The least the pods must offer a moved hot spot, as a multiple of the
/// limit, for the reaction to be measured.
pub const REACTION_MIN_OFFERED: f64 = 1.5;

/// The spread of a series of per-second values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub p5: f64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        Some(Spread {
            p5: at(0.05),
            p50: at(0.5),
            p95: at(0.95),
            max: at(1.0),
        })
    }
}

/// The reaction to one move.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Reaction {
    /// When the hot spot moved, seconds.
    pub move_at: f64,
    /// Seconds until within the bound for good; `None` if it was not by
    /// the next move (or the end).
    pub after: Option<f64>,
    /// Seconds until the next move or the end.
    pub observed: f64,
}

/// One hot spot's measures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpotMeasures {
    pub spot: String,
    pub steady_secs: f64,
    /// Mean offered and accepted rates in steady state, over the limit.
    pub offered: f64,
    pub accepted: f64,
    /// Accepted / limit over each whole second of steady state.
    pub per_second: Option<Spread>,
    /// `Σ min(vᵢ, L) / L`, mean over the steady state.
    pub scylla: f64,
    /// The pods together offer at least the limit all through the steady
    /// state.
    pub offered_at_least_limit: bool,
    /// The reaction window, seconds.
    pub reaction_window: f64,
    pub reactions: Vec<Reaction>,
    /// Moves not measured: offered too little, shorter than two windows,
    /// cut short by the end of the run, or in an outage.
    pub unmeasured_moves: usize,
}

impl SpotMeasures {
    /// The slowest reaction, seconds (infinite if one never came within);
    /// `None` if no move was measured.
    pub fn reaction_max(&self) -> Option<f64> {
        self.reactions
            .iter()
            .map(|r| r.after.unwrap_or(f64::INFINITY))
            .reduce(f64::max)
    }
}

/// One mode's measures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionMeasures {
    pub spots: Vec<SpotMeasures>,
    pub operations: u64,
    pub rejected: u64,
    pub under_operations: u64,
    pub under_rejected: u64,
    /// `under_rejected / under_operations`.
    pub false_positives: f64,
    /// Of the operations on warm partitions (offered from half the limit
    /// up, below it), the share rejected.
    pub warm_operations: u64,
    pub warm_false_positives: f64,
    /// Share of operations admitted before the pod knew the limit.
    pub unlimited: f64,
    pub exchanges_per_pod_minute: f64,
    pub failed_exchanges: u64,
    pub fallbacks: u64,
    /// Share of pod time on whole shares for want of an answer.
    pub fallback_share: f64,
}

/// Seconds after a change before the steady state: two report periods of
/// the client's cadence (a period and a round trip each), and the round
/// trip of the exchange that brings the last shares.
pub fn settle_secs(workload: &Workload) -> f64 {
    let period = workload.report_period().as_secs_f64();
    let rtt = workload.network.rtt.as_secs_f64();
    SETTLE_PERIODS * (period + rtt) + rtt
}

/// What the measures of one run need to know of its workload.
struct Run<'a> {
    limit: f64,
    /// Seconds per bin, and bins.
    bin: f64,
    bins: usize,
    settle: f64,
    /// The pods' report period, seconds.
    period: f64,
    duration: f64,
    pods: &'a [PodSpec],
    /// Outages, each with the settling after it: `(from, to)` seconds.
    outages: &'a [(f64, f64)],
}

impl Run<'_> {
    /// Marks the bins that overlap `from..to` (seconds) as unsettled.
    fn exclude(&self, unsettled: &mut [bool], from: f64, to: f64) {
        let first = ((from / self.bin) + 1e-9).floor().max(0.0) as usize;
        let last = ((to / self.bin) - 1e-9).ceil().max(0.0) as usize;
        for b in unsettled.iter_mut().take(last.min(self.bins)).skip(first) {
            *b = true;
        }
    }

    /// Per bin, what the running pods offer `spot` in all, and what they
    /// would accept counting alone (`Σ min(vᵢ, L)`), operations per second.
    fn expected(&self, spot: &HotSpot) -> Vec<(f64, f64)> {
        let rates: Vec<f64> = self
            .pods
            .iter()
            .map(|p| {
                p.partitions.as_ref().map_or(0.0, |ops| {
                    ops.hot
                        .iter()
                        .filter(|h| HotSpot::of(h) == *spot)
                        .map(|h| h.rate)
                        .sum()
                })
            })
            .collect();
        (0..self.bins)
            .map(|b| {
                let t = b as f64 * self.bin;
                self.pods
                    .iter()
                    .zip(&rates)
                    .filter(|(p, _)| {
                        p.join.as_secs_f64() <= t && p.leave.is_none_or(|l| t < l.as_secs_f64())
                    })
                    .fold((0.0, 0.0), |(offered, alone), (_, &r)| {
                        (offered + r, alone + r.min(self.limit))
                    })
            })
            .collect()
    }

    /// One hot spot's measures; `unsettled` marks the bins out of the
    /// steady state for every hot spot.
    fn spot(&self, spot: &HotSpot, series: &SpotSeries, unsettled: &[bool]) -> SpotMeasures {
        let (bin, limit) = (self.bin, self.limit);
        let mut unsettled = unsettled.to_vec();
        let moves: Vec<f64> = spot
            .moves(Duration::from_secs_f64(self.duration))
            .iter()
            .map(Duration::as_secs_f64)
            .collect();
        for &m in &moves {
            self.exclude(&mut unsettled, m, m + self.settle);
        }
        let expected = self.expected(spot);
        let steady: Vec<usize> = (0..self.bins).filter(|&b| !unsettled[b]).collect();
        let steady_secs = steady.len() as f64 * bin;
        let mean_over_limit = |sum: f64| {
            if steady.is_empty() {
                0.0
            } else {
                sum / steady_secs / limit
            }
        };
        let offered = steady.iter().map(|&b| f64::from(series.offered[b])).sum();
        let accepted = steady.iter().map(|&b| f64::from(series.accepted[b])).sum();
        let alone: f64 = steady.iter().map(|&b| expected[b].1 * bin).sum();
        let per_second = (1.0 / bin).round() as usize;
        let seconds: Vec<f64> = (0..self.bins / per_second)
            .map(|k| k * per_second..(k + 1) * per_second)
            .filter(|r| r.clone().all(|b| !unsettled[b]))
            .map(|r| {
                r.map(|b| f64::from(series.accepted[b])).sum::<f64>()
                    / (per_second as f64 * bin)
                    / limit
            })
            .collect();
        let window_secs = REACTION_WINDOW_SECS.max(REACTION_WINDOW_OPERATIONS / limit);
        let window = (window_secs / bin - 1e-9).ceil() as usize;
        let offered_rates: Vec<f64> = expected.iter().map(|e| e.0).collect();
        let (reactions, unmeasured_moves) = reactions(
            &series.accepted,
            &offered_rates,
            &Moves {
                at: &moves,
                every: spot.moving.map_or(0.0, |m| m.every.as_secs_f64()),
                end: self.duration,
                hold: (self.period / bin).round() as usize,
            },
            self.outages,
            window,
            bin,
            limit,
        );
        SpotMeasures {
            spot: spot.describe(),
            steady_secs,
            offered: mean_over_limit(offered),
            accepted: mean_over_limit(accepted),
            per_second: Spread::of(seconds),
            scylla: mean_over_limit(alone),
            offered_at_least_limit: !steady.is_empty()
                && steady.iter().all(|&b| expected[b].0 >= limit),
            reaction_window: window as f64 * bin,
            reactions,
            unmeasured_moves,
        }
    }
}

/// Measures `record`, a run of `workload` whose hot spots are `spots`.
pub fn measure(
    workload: &Workload,
    spots: &[HotSpot],
    record: &PartitionRecord,
) -> PartitionMeasures {
    let settle = settle_secs(workload);
    let outages: Vec<(f64, f64)> = workload
        .outages
        .iter()
        .map(|o| {
            let start = o.start.as_secs_f64();
            (start, start + o.duration.as_secs_f64() + settle)
        })
        .collect();
    let pods = workload.pod_specs();
    let run = Run {
        limit: workload.partitions.as_ref().map_or(1.0, |p| p.limit),
        bin: record.bin_secs,
        bins: record.spots.first().map_or(0, |s| s.offered.len()),
        settle,
        period: workload.report_period().as_secs_f64(),
        duration: workload.duration.as_secs_f64(),
        pods: &pods,
        outages: &outages,
    };
    // Out of the steady state for every hot spot: after pods join or
    // leave, and outages with their settling.
    let mut unsettled = vec![false; run.bins];
    for pod in &pods {
        let join = pod.join.as_secs_f64();
        run.exclude(&mut unsettled, join, join + settle);
        if let Some(leave) = pod.leave {
            let leave = leave.as_secs_f64();
            run.exclude(&mut unsettled, leave, leave + settle);
        }
    }
    for &(from, to) in &outages {
        run.exclude(&mut unsettled, from, to);
    }
    let spots = spots
        .iter()
        .zip(&record.spots)
        .map(|(spot, series)| run.spot(spot, series, &unsettled))
        .collect();

    let pod_minutes = record.pod_secs / 60.0;
    PartitionMeasures {
        spots,
        operations: record.operations,
        rejected: record.rejected,
        under_operations: record.under_operations,
        under_rejected: record.under_rejected,
        false_positives: ratio(record.under_rejected as f64, record.under_operations as f64),
        warm_operations: record.warm_operations,
        warm_false_positives: ratio(record.warm_rejected as f64, record.warm_operations as f64),
        unlimited: ratio(record.unlimited as f64, record.operations as f64),
        exchanges_per_pod_minute: ratio(record.exchanges as f64, pod_minutes),
        failed_exchanges: record.failed_exchanges,
        fallbacks: record.fallbacks,
        fallback_share: ratio(record.fallback_secs, record.pod_secs),
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// A hot spot's moves: when, how far apart, and when the run ends
/// (seconds).
struct Moves<'a> {
    at: &'a [f64],
    every: f64,
    end: f64,
    /// Bins the accepted rate must stay within the bound for the reaction
    /// to be over (a report period).
    hold: usize,
}

/// The reaction to each move measurable in `accepted` (per bin, with the
/// pods' `offered` rate at each), with trailing windows of `window` bins;
/// and how many moves were not.
fn reactions(
    accepted: &[u32],
    offered: &[f64],
    moves: &Moves<'_>,
    outages: &[(f64, f64)],
    window: usize,
    bin: f64,
    limit: f64,
) -> (Vec<Reaction>, usize) {
    let mut sums = Vec::with_capacity(accepted.len() + 1);
    sums.push(0u64);
    for &a in accepted {
        sums.push(sums[sums.len() - 1] + u64::from(a));
    }
    let bound = REACTION_BOUND * limit * window as f64 * bin;
    let mut out = Vec::new();
    let mut unmeasured = 0;
    for (i, &m) in moves.at.iter().enumerate() {
        let next = moves.at.get(i + 1).copied().unwrap_or(moves.end);
        let first = ((m / bin) - 1e-9).ceil() as usize;
        let last = (((next / bin) + 1e-9).floor() as usize).min(accepted.len());
        let interrupted = outages.iter().any(|&(a, b)| a < next && m < b);
        let cut_short = next - m < moves.every - 1e-9;
        let bins = &offered[first.min(last)..last];
        let too_little =
            bins.iter().sum::<f64>() < REACTION_MIN_OFFERED * limit * bins.len() as f64;
        if interrupted || cut_short || too_little || last < first + 2 * window {
            unmeasured += 1;
            continue;
        }
        // The end of the last window over the bound before a run of
        // `hold` bins (or the rest of the interval) within it.
        let mut over = None;
        for e in first + window..=last {
            if (sums[e] - sums[e - window]) as f64 > bound {
                over = Some(e);
            } else if e - over.unwrap_or(first + window - 1) >= moves.hold {
                break;
            }
        }
        let after = match over {
            None => Some(0.0),
            // Over to the next move: never within.
            Some(e) if e == last => None,
            Some(e) => Some(e as f64 * bin - m),
        };
        out.push(Reaction {
            move_at: m,
            after,
            observed: next - m,
        });
    }
    (out, unmeasured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaction_ends_with_the_last_window_over_the_bound() {
        // Limit 1 000/s, bins of 100 ms: 100 a bin is the limit.
        let mut accepted = vec![100u32; 300];
        // Moved at 10 s; 3 × the limit until 14 s, then the limit.
        for a in &mut accepted[100..140] {
            *a = 300;
        }
        let moves = |at: &'static [f64], every: f64| Moves {
            at,
            every,
            end: 30.0,
            hold: 30,
        };
        let offered = vec![3000.0; 300];
        // Moved at 10 s and at 20 s, no outage.
        let two_moves = |accepted: &[u32]| {
            reactions(
                accepted,
                &offered,
                &moves(&[10.0, 20.0], 10.0),
                &[],
                10,
                0.1,
                1000.0,
            )
        };
        let (r, unmeasured) = two_moves(&accepted);
        assert_eq!(unmeasured, 0);
        assert_eq!(r.len(), 2);
        // The last window over 1.2 × ends at 14.8 s: two bins of 3 × and
        // eight of 1 × make 1.4 ×; one and nine make 1.2 ×, not over.
        let after = r[0].after.expect("came within");
        assert!((after - 4.8).abs() < 1e-9, "{after}");
        assert_eq!(r[1].after, Some(0.0));
        // Back over the bound within a period of coming within (held 3 s
        // here): the reaction ends with the relapse. Back over later: the
        // steady state's noise, not the reaction.
        let first_after = |accepted: &[u32]| two_moves(accepted).0[0].after.expect("came within");
        let mut relapse = accepted.clone();
        relapse[170] = 400;
        let after = first_after(&relapse);
        assert!((after - 8.0).abs() < 1e-9, "{after}");
        let mut noise = accepted.clone();
        noise[185] = 400;
        let after = first_after(&noise);
        assert!((after - 4.8).abs() < 1e-9, "{after}");
        // Over to the next move: never within.
        let (r, _) = reactions(
            &[300; 300],
            &offered,
            &moves(&[10.0], 10.0),
            &[],
            10,
            0.1,
            1000.0,
        );
        assert_eq!(r[0].after, None);
        // A move in an outage, closer to the next than two windows, or cut
        // short by the end of the run, is not measured.
        let (r, unmeasured) = reactions(
            &accepted,
            &offered,
            &moves(&[10.0, 20.0, 21.5], 1.5),
            &[(18.0, 19.0)],
            10,
            0.1,
            1000.0,
        );
        assert_eq!((r.len(), unmeasured), (1, 2));
        let ends_early = Moves {
            at: &[10.0, 20.0],
            every: 10.0,
            end: 25.0,
            hold: 30,
        };
        let (r, unmeasured) = reactions(&accepted, &offered, &ends_early, &[], 10, 0.1, 1000.0);
        assert_eq!((r.len(), unmeasured), (1, 1));
        // Offered 1.4 × the limit: within 1.2 × up to the noise anyway.
        let (r, unmeasured) = reactions(
            &accepted,
            &[1400.0; 300],
            &moves(&[10.0, 20.0], 10.0),
            &[],
            10,
            0.1,
            1000.0,
        );
        assert_eq!((r.len(), unmeasured), (0, 2));
    }

    #[test]
    fn spreads_take_percentiles_of_what_they_are_given() {
        let s = Spread::of((1..=100).map(f64::from).collect()).expect("values");
        assert_eq!((s.p5, s.p50, s.p95, s.max), (6.0, 51.0, 95.0, 100.0));
        assert!(Spread::of(Vec::new()).is_none());
    }
}
