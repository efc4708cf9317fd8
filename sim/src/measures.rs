//! How close a run came to the ideal bucket, in numbers.
//!
//! Every measure compares a policy's [`Record`] with the ideal's, sample by
//! sample (both runs see the same demand):
//! - **Cumulative divergence**: (admitted − ideal admitted) / ideal admitted,
//!   counted from the start; at the end, and the largest magnitude at any
//!   sample after the first target request period.
//! - **Overshoot** over windows of T (10 s and 60 s): the most admitted in
//!   any window of length T, minus what a token bucket can allow in T
//!   (`max(burst, initial) + refill × T`), as a fraction of `refill × T`.
//!   Negative when no window reaches the limit.
//! - **Fairness**: per pod, tokens admitted after the first target period
//!   over the ideal's for the same pod; the largest relative error and
//!   Jain's index of those ratios (1 when every pod gets the same fraction
//!   of its ideal).
//! - **Convergence** after each abrupt demand change: how long until the
//!   allocation error — Σ over pods of |admitted − ideal| over Σ ideal, in
//!   windows of [`CONVERGENCE_WINDOW_SECS`] — falls to
//!   [`CONVERGENCE_TOLERANCE`] and stays there for a target period (or until
//!   the next change). The end of an outage counts as a change; a change
//!   an outage interrupts is not measured (the ideal has no outage).
//!   Each change is measured for the **delayed ideal** too
//!   ([`crate::ideal::delayed`]): every pod given at most its mean ideal
//!   allocation over the target period before, the allocation of a policy
//!   that knew every pod's ideal rate but, like any pod asking once a
//!   period, learnt it as the last period's average. Where even that does
//!   not converge in time, demand moves faster than a once-a-period
//!   protocol can follow (see [`Convergence::reference`]).
//! - **Load**: token-bucket requests per pod per minute.
//! - **Waits**: the token-weighted distribution of throttled waits, and the
//!   share of demand that gave up.

use serde::Serialize;

use crate::record::{Record, WaitSummary};
use crate::workload::{LimitsSpec, Workload};

/// Width of the windows the convergence error is computed over, seconds.
pub const CONVERGENCE_WINDOW_SECS: f64 = 5.0;
/// The window of the overshoot the goal and the stated bounds are about.
pub const OVERSHOOT_WINDOW_SECS: f64 = 60.0;
/// The allocation error below which a run counts as converged.
pub const CONVERGENCE_TOLERANCE: f64 = 0.10;

/// Convergence after one demand change.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Convergence {
    /// When demand changed, seconds.
    pub change_at: f64,
    /// Seconds until converged, or `None` if it did not before the next
    /// change (or the end).
    pub after: Option<f64>,
    /// Seconds until the next change or the end: the most `after` could be.
    pub observed: f64,
    /// Seconds the delayed ideal took, or `None` if it did not converge.
    pub reference: Option<f64>,
}

impl Convergence {
    /// Whether the delayed ideal converged within `secs`: only then does
    /// a goal of `secs` judge the policy's convergence rather than how far
    /// demand moves within a period.
    pub fn reachable_within(&self, secs: f64) -> bool {
        self.reference.is_some_and(|r| r <= secs + 1e-9)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measures {
    pub demand: f64,
    pub admitted: f64,
    pub ideal_admitted: f64,
    pub divergence_end: f64,
    /// Signed: the divergence of largest magnitude.
    pub divergence_max: f64,
    pub overshoot_10s: f64,
    pub overshoot_60s: f64,
    pub pod_error_max: f64,
    pub jain_index: f64,
    pub convergence: Vec<Convergence>,
    pub requests_per_pod_minute: f64,
    pub failed_requests: u64,
    pub waits: WaitSummary,
    pub timed_out: f64,
    pub fallback_tokens: f64,
}

impl Measures {
    /// The slowest convergence, seconds; infinite if one never converged.
    pub fn convergence_max(&self) -> Option<f64> {
        slowest(self.convergence.iter())
    }

    /// The slowest convergence, seconds, over the changes the delayed ideal
    /// followed within `secs` (see [`Convergence::reachable_within`]).
    pub fn convergence_max_reachable(&self, secs: f64) -> Option<f64> {
        slowest(self.convergence.iter().filter(|c| c.reachable_within(secs)))
    }
}

/// The slowest of `changes`' convergences, infinite if one never converged.
fn slowest<'a>(changes: impl Iterator<Item = &'a Convergence>) -> Option<f64> {
    changes
        .map(|c| c.after.unwrap_or(f64::INFINITY))
        .reduce(f64::max)
}

/// Measures `run` against `ideal` (both of `workload`, with `limits`);
/// each convergence beside the `delayed` ideal's.
pub fn measure(
    workload: &Workload,
    limits: &LimitsSpec,
    run: &Record,
    ideal: &Record,
    delayed: &Record,
) -> Measures {
    let period = workload.client.config().target_request_period.as_secs_f64();
    let total = run.admitted_total();
    let ideal_total = ideal.admitted_total();
    let cumulative = prefix_sums(&total);
    let ideal_cumulative = prefix_sums(&ideal_total);

    let admitted = cumulative.last().copied().unwrap_or(0.0);
    let ideal_admitted = ideal_cumulative.last().copied().unwrap_or(0.0);
    let divergence_end = relative(admitted, ideal_admitted);
    let mut divergence_max: f64 = 0.0;
    for (k, &t) in run.times.iter().enumerate() {
        if t + 1e-9 < period {
            continue;
        }
        let d = relative(cumulative[k + 1], ideal_cumulative[k + 1]);
        if d.abs() > divergence_max.abs() {
            divergence_max = d;
        }
    }

    let (pod_error_max, jain_index) = fairness(run, ideal, period);
    let demand: f64 = run.demand_total().iter().sum();
    Measures {
        demand,
        admitted,
        ideal_admitted,
        divergence_end,
        divergence_max,
        overshoot_10s: overshoot(limits, &cumulative, run.sample_secs, 10.0),
        overshoot_60s: overshoot(limits, &cumulative, run.sample_secs, OVERSHOOT_WINDOW_SECS),
        pod_error_max,
        jain_index,
        convergence: convergence(workload, run, ideal, delayed, period),
        requests_per_pod_minute: if run.pod_minutes > 0.0 {
            run.server_requests as f64 / run.pod_minutes
        } else {
            0.0
        },
        failed_requests: run.failed_requests,
        waits: run.waits.summary(),
        timed_out: if demand > 0.0 {
            run.timed_out / demand
        } else {
            0.0
        },
        fallback_tokens: run.fallback_tokens,
    }
}

/// `out[0] = 0`, `out[k + 1] = values[0] + … + values[k]`.
fn prefix_sums(values: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(values.len() + 1);
    let mut sum = 0.0;
    out.push(0.0);
    for v in values {
        sum += v;
        out.push(sum);
    }
    out
}

fn relative(actual: f64, ideal: f64) -> f64 {
    if ideal > 0.0 {
        (actual - ideal) / ideal
    } else if actual > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// The largest excess over the token-bucket bound in any window of `window`
/// seconds, as a fraction of the refill over the window.
fn overshoot(limits: &LimitsSpec, cumulative: &[f64], sample: f64, window: f64) -> f64 {
    let samples = (window / sample).round() as usize;
    let refill = limits.refill_rate * window;
    let bound = limits.burst_limit.max(limits.initial()) + refill;
    if samples == 0 || cumulative.len() <= samples {
        // The run is shorter than the window: measure the whole run.
        let admitted = cumulative.last().copied().unwrap_or(0.0);
        return (admitted - bound) / refill;
    }
    let most = (samples..cumulative.len())
        .map(|end| cumulative[end] - cumulative[end - samples])
        .fold(f64::NEG_INFINITY, f64::max);
    (most - bound) / refill
}

/// Per-pod totals after `skip` seconds: the largest relative error and
/// Jain's index of admitted/ideal.
fn fairness(run: &Record, ideal: &Record, skip: f64) -> (f64, f64) {
    let first = run
        .times
        .iter()
        .position(|&t| t - run.sample_secs + 1e-9 >= skip)
        .unwrap_or(run.times.len());
    let mut ratios = Vec::new();
    for (real, reference) in run.admitted.iter().zip(&ideal.admitted) {
        let r: f64 = real[first.min(real.len())..].iter().sum();
        let i: f64 = reference[first.min(reference.len())..].iter().sum();
        if i > 0.0 {
            ratios.push(r / i);
        }
    }
    if ratios.is_empty() {
        return (0.0, 1.0);
    }
    let error = ratios.iter().map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
    let sum: f64 = ratios.iter().sum();
    let squares: f64 = ratios.iter().map(|x| x * x).sum();
    let jain = if squares > 0.0 {
        sum * sum / (ratios.len() as f64 * squares)
    } else {
        1.0
    };
    (error, jain)
}

/// Allocation error per window ending at each sample: Σ|admitted − ideal|
/// over Σ ideal, across pods, over the last `window` samples.
fn allocation_error(run: &Record, ideal: &Record, window: usize) -> Vec<f64> {
    let samples = run.times.len();
    let pods = run.pods();
    let mut errors = vec![0.0; samples];
    let real_sums: Vec<Vec<f64>> = run.admitted.iter().map(|s| prefix_sums(s)).collect();
    let ideal_sums: Vec<Vec<f64>> = ideal.admitted.iter().map(|s| prefix_sums(s)).collect();
    for (k, error) in errors.iter_mut().enumerate() {
        let from = (k + 1).saturating_sub(window);
        let mut diff = 0.0;
        let mut reference = 0.0;
        for p in 0..pods {
            let r = real_sums[p][k + 1] - real_sums[p][from];
            let i = ideal_sums[p][k + 1] - ideal_sums[p][from];
            diff += (r - i).abs();
            reference += i;
        }
        *error = if reference > 0.0 {
            diff / reference
        } else if diff > 1e-9 {
            1.0
        } else {
            0.0
        };
    }
    errors
}

fn convergence(
    workload: &Workload,
    run: &Record,
    ideal: &Record,
    delayed: &Record,
    period: f64,
) -> Vec<Convergence> {
    let sample = run.sample_secs;
    let window = ((CONVERGENCE_WINDOW_SECS / sample).round() as usize).max(1);
    let errors = allocation_error(run, ideal, window);
    let reference_errors = allocation_error(delayed, ideal, window);
    let end = workload.duration.as_secs_f64();
    // The end of an outage is a change too: pods come back from their
    // fallback rate to grants. A change whose interval an outage cuts is
    // not measured: the ideal has no outage, so no allocation during one
    // can be judged against it.
    let outages: Vec<(f64, f64)> = workload
        .outages
        .iter()
        .map(|o| {
            let start = o.start.as_secs_f64();
            (start, start + o.duration.as_secs_f64())
        })
        .collect();
    let mut changes: Vec<f64> = workload
        .demand_changes()
        .iter()
        .map(|d| d.as_secs_f64())
        .chain(outages.iter().map(|&(_, to)| to).filter(|&to| to < end))
        .collect();
    changes.sort_by(f64::total_cmp);
    changes.dedup();
    let mut out = Vec::new();
    for (c, &change) in changes.iter().enumerate() {
        let next = changes.get(c + 1).copied().unwrap_or(end);
        if outages.iter().any(|&(from, to)| from < next && change < to) {
            continue;
        }
        let interval = Interval {
            change,
            next,
            window_secs: window as f64 * sample,
            period,
        };
        out.push(Convergence {
            change_at: change,
            after: interval.converged(&run.times, &errors),
            observed: next - change,
            reference: interval.converged(&run.times, &reference_errors),
        });
    }
    out
}

/// The stretch between one demand change and the next.
struct Interval {
    change: f64,
    next: f64,
    window_secs: f64,
    period: f64,
}

impl Interval {
    /// Seconds from the change until the allocation error (`errors`, per
    /// window ending at each of `times`) is within tolerance in every
    /// window for a target period (or until the next change), counting only
    /// windows wholly after the change and ending before the next one.
    fn converged(&self, times: &[f64], errors: &[f64]) -> Option<f64> {
        let candidates: Vec<(f64, f64)> = times
            .iter()
            .zip(errors)
            .map(|(&t, &e)| (t - self.window_secs, e))
            .filter(|&(start, _)| start + 1e-9 >= self.change)
            .filter(|&(start, _)| start + self.window_secs <= self.next + 1e-9)
            .collect();
        candidates.iter().enumerate().find_map(|(i, &(start, _))| {
            candidates[i..]
                .iter()
                .take_while(|&&(s, _)| s <= start + self.period + 1e-9)
                .all(|&(_, e)| e <= CONVERGENCE_TOLERANCE)
                .then_some(start - self.change)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Workload {
        Workload::parse(
            "name: t\nduration: 100s\nlimits: { refill_rate: 10, burst_limit: 100 }\npods:\n  - count: 2\n    demand: [ { constant: 20 }, { step: { at: 50s, by: 5 } } ]\n",
        )
        .expect("valid")
    }

    /// A record of pods admitted `per_pod` per 1 s sample, all they asked.
    fn record(per_pod: &[Vec<f64>]) -> Record {
        let mut r = Record::new(per_pod.len(), 1.0, 10.0);
        let samples = per_pod[0].len();
        for k in 0..samples {
            let mut demand: Vec<f64> = per_pod.iter().map(|s| s[k]).collect();
            let mut admitted = demand.clone();
            r.push_sample((k + 1) as f64, &mut demand, &mut admitted, 0.0);
        }
        r
    }

    /// `run` measured against `ideal` and its delayed ideal.
    fn measure_against(w: &Workload, run: &Record, ideal: &Record) -> Measures {
        let limits = w.limits.as_ref().expect("limits");
        let delayed = crate::ideal::delayed::simulate_delayed(w, limits, ideal);
        measure(w, limits, run, ideal, &delayed)
    }

    #[test]
    fn a_perfect_run_measures_zero_error() {
        let w = workload();
        let ideal = record(&[vec![5.0; 100], vec![5.0; 100]]);
        let m = measure_against(&w, &ideal, &ideal);
        assert_eq!(m.divergence_end, 0.0);
        assert_eq!(m.divergence_max, 0.0);
        assert_eq!(m.pod_error_max, 0.0);
        assert_eq!(m.jain_index, 1.0);
        assert_eq!(m.convergence.len(), 1);
        assert_eq!(m.convergence[0].after, Some(0.0));
        // Steady demand: the delayed ideal follows the change at once.
        assert_eq!(m.convergence[0].reference, Some(0.0));
        assert_eq!(m.convergence_max_reachable(20.0), Some(0.0));
        // 10/s over 10 s, burst 100: 100 admitted of 200 allowed.
        assert!(
            (m.overshoot_10s - (-1.0)).abs() < 1e-9,
            "{}",
            m.overshoot_10s
        );
    }

    #[test]
    fn unfair_and_late_runs_are_measured_as_such() {
        let w = workload();
        let ideal = record(&[vec![5.0; 100], vec![5.0; 100]]);
        // Pod 0 takes everything for 20 s after the change, then all is right.
        let mut a = vec![5.0; 100];
        let mut b = vec![5.0; 100];
        a[50..70].fill(10.0);
        b[50..70].fill(0.0);
        let run = record(&[a, b]);
        let m = measure_against(&w, &run, &ideal);
        assert_eq!(m.divergence_end, 0.0);
        assert!(
            m.pod_error_max > 0.2 && m.pod_error_max < 0.25,
            "{}",
            m.pod_error_max
        );
        assert!(m.jain_index < 1.0);
        assert_eq!(m.convergence[0].after, Some(20.0));
        assert_eq!(m.convergence_max_reachable(20.0), Some(20.0));
        // Too much in a burst: 20/s for 10 s against 10/s + burst 100.
        let mut burst = vec![vec![5.0; 100], vec![5.0; 100]];
        burst[0][10..20].fill(25.0);
        let m = measure_against(&w, &record(&burst), &ideal);
        // Window of 10 s: 300 admitted vs 100 + 100.
        assert!((m.overshoot_10s - 1.0).abs() < 1e-9, "{}", m.overshoot_10s);
        assert!(m.divergence_end > 0.0);
    }

    #[test]
    fn a_change_the_delayed_ideal_cannot_follow_is_not_judged() {
        let w = workload();
        // Both pods always want more than they get. After the change the
        // ideal moves the whole allocation between them every 5 s: its
        // mean over the last period is always half of it, so no split
        // learnt a period late is ever within 10 %.
        let mut a = vec![5.0; 100];
        let mut b = vec![5.0; 100];
        for k in 50..100 {
            let first = (k / 5) % 2 == 0;
            a[k] = if first { 10.0 } else { 0.0 };
            b[k] = if first { 0.0 } else { 10.0 };
        }
        let mut ideal = record(&[a, b]);
        ideal.demand = vec![vec![20.0; 100]; 2];
        let run = record(&[vec![5.0; 100], vec![5.0; 100]]);
        let m = measure_against(&w, &run, &ideal);
        assert_eq!(m.convergence[0].reference, None);
        assert!(!m.convergence[0].reachable_within(20.0));
        assert_eq!(m.convergence_max(), Some(f64::INFINITY));
        assert_eq!(m.convergence_max_reachable(20.0), None);
    }
}
