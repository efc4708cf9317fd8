//! Generated token-bucket workloads: the policy measured on what nobody
//! tuned it for.
//!
//! [`generate`] draws one workload from a seed over the whole range the
//! goals are meant for — 1 to 1 000 pods, limits from 1 to 10⁶ tokens/s,
//! burst from 0 to 100 × the rate, demand made of every kind of term, pods
//! joining, leaving and churning, a hot spot moving between pods, round
//! trips to 500 ms, loss to 10 %, outages — as a [`Workload`], the type
//! `tollgate-sim run` reads; written as YAML ([`Workload::to_yaml`]), the
//! workload a seed stands for replays exactly. The draw does not depend on the outcome: the corpus is what it
//! is, whatever the policy does with it.
//!
//! [`run_corpus`] runs seeds under every policy and [`Corpus`] sums the
//! measures up: per policy and measure, the worst, the 99th percentile and
//! the median over the set, with the seed of the worst; and the share of
//! workloads meeting every goal under the checked policy.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::{self, CHECKED_POLICY};
use crate::engine::Policy;
use crate::measures::Measures;
use crate::workload::{LimitsSpec, Network, Outage, PodGroup, Term, Workload};
use crate::{SimError, run_workload};

pub mod organisation;

/// The share of seeds drawn as [`Family::Burst`].
const BURST_SHARE: f64 = 0.12;
/// Mixed into a seed for the stream that draws bursts.
const BURST_STREAM: u64 = 0xb0b5_7ed5_eed5_0000;

/// The families a generated workload's pods are drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// One to four groups, each with a base rate and up to three more
    /// terms, joining and leaving at random.
    Mix,
    /// Tens of pods in phase groups, their sines adding up around the
    /// limit.
    Oscillating,
    /// A few steady pods, then a herd joining within a second.
    Herd,
    /// Demand that moves from one group of pods to the next.
    MovingHotSpot,
    /// Waves of pods living a minute or two each.
    Churn,
    /// Identical pods, mostly idle, bursting together beyond what the
    /// bucket holds.
    Burst,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Mix => "mix",
            Family::Oscillating => "oscillating",
            Family::Herd => "herd",
            Family::MovingHotSpot => "moving hot spot",
            Family::Churn => "churn",
            Family::Burst => "burst",
        }
    }
}

/// A generated workload: the seed it came from, its family, and the
/// workload ([`Workload::to_yaml`] writes it for `run` to replay).
#[derive(Clone, Debug)]
pub struct Generated {
    pub seed: u64,
    pub family: Family,
    pub workload: Workload,
}

fn log_uniform(rng: &mut ChaCha8Rng, low: f64, high: f64) -> f64 {
    (low.ln() + rng.random::<f64>() * (high.ln() - low.ln())).exp()
}

/// `x` to three significant digits (the YAML stays readable).
fn round3(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powf(2.0 - x.abs().log10().floor());
    (x * scale).round() / scale
}

/// `s` seconds to the nearest millisecond: generated times are whole
/// milliseconds.
fn millis(s: f64) -> Duration {
    Duration::from_millis((s * 1000.0).round() as u64)
}

/// Up to three terms beside a pod's base rate `base`, over `duration` s.
fn extra_terms(rng: &mut ChaCha8Rng, base: f64, duration: f64) -> Vec<Term> {
    let n = rng.random_range(0..=3);
    (0..n)
        .map(|_| {
            let at = round3(rng.random_range(0.05..0.9) * duration);
            // Each field is drawn in the order it is written.
            match rng.random_range(0..6) {
                0 => {
                    let end = round3(at + rng.random_range(0.05..0.5) * duration);
                    let by = round3(base * rng.random_range(-1.0..2.0));
                    Term::Ramp {
                        start: millis(at),
                        end: millis(end.max(at + 1.0)),
                        by,
                    }
                }
                1 => Term::Step {
                    at: millis(at),
                    by: round3(base * rng.random_range(-1.0..3.0)),
                },
                2 => Term::Sine {
                    amplitude: round3(base * rng.random_range(0.1..1.0)),
                    period: millis(round3(rng.random_range(10.0..180.0))),
                    phase: round3(rng.random::<f64>()),
                },
                3 => Term::Bump {
                    at: millis(at),
                    width: millis(round3(rng.random_range(0.5..10.0))),
                    height: round3(base * log_uniform(rng, 1.0, 30.0)),
                },
                4 => Term::Noise {
                    stddev: round3(base * rng.random_range(0.05..0.5)),
                    every: millis(round3(log_uniform(rng, 0.1, 5.0))),
                },
                _ => {
                    let on = round3(rng.random_range(5.0..60.0));
                    let off = round3(rng.random_range(5.0..60.0));
                    Term::OnOff {
                        on: millis(on),
                        off: millis(off),
                        rate: round3(base * rng.random_range(0.5..3.0)),
                        start: millis(round3(rng.random_range(0.0..on + off))),
                    }
                }
            }
        })
        .collect()
}

/// Half the time, per-pod noise of 5 to 30 % of `base`, drawn anew every
/// second.
fn maybe_noise(rng: &mut ChaCha8Rng, base: f64) -> Option<Term> {
    rng.random_bool(0.5).then(|| Term::Noise {
        stddev: round3(base * rng.random_range(0.05..0.3)),
        every: Duration::from_secs(1),
    })
}

/// Splits `total` pods into `groups` groups of at least one each.
fn split(rng: &mut ChaCha8Rng, total: usize, groups: usize) -> Vec<usize> {
    let groups = groups.clamp(1, total.max(1));
    let mut counts = vec![1usize; groups];
    for _ in groups..total {
        let g = rng.random_range(0..groups);
        counts[g] += 1;
    }
    counts
}

/// The workload of `seed`.
pub fn generate(seed: u64) -> Result<Generated, SimError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pods = log_uniform(&mut rng, 1.0, 1000.49).round() as usize;
    let refill = round3(log_uniform(&mut rng, 1.0, 1e6));
    let burst = if rng.random_bool(0.1) {
        0.0
    } else {
        round3(refill * log_uniform(&mut rng, 0.01, 100.0))
    };
    let duration_secs = rng.random_range(18..=60u32) * 10;
    let duration = f64::from(duration_secs);
    let rtt_ms = rng.random_range(0..=500u64);
    let loss = if rng.random_bool(1.0 / 3.0) {
        0.0
    } else {
        f64::from(rng.random_range(1..=100u32)) / 1000.0
    };
    let mut outages = Vec::new();
    let count = match rng.random::<f64>() {
        x if x < 0.6 => 0,
        x if x < 0.9 => 1,
        _ => 2,
    };
    let mut from = 30.0;
    for _ in 0..count {
        let start =
            round3(rng.random_range(from..(from + (duration - from) * 0.6).max(from + 1.0)));
        let length = round3(rng.random_range(5.0..60.0));
        if start + length + 30.0 < duration {
            outages.push(Outage {
                start: millis(start),
                duration: millis(length),
            });
            from = start + length + 10.0;
        }
    }
    // Mean demand over the limit.
    let load = log_uniform(&mut rng, 0.2, 4.0);
    let family = match rng.random::<f64>() {
        x if x < 0.4 => Family::Mix,
        x if x < 0.55 => Family::Oscillating,
        x if x < 0.7 => Family::Herd,
        x if x < 0.85 => Family::MovingHotSpot,
        _ => Family::Churn,
    };
    // One seed in eight is a burst instead, decided by a stream of its
    // own, so that every other seed draws the workload it drew before
    // the family was added.
    let mut bursts = ChaCha8Rng::seed_from_u64(seed ^ BURST_STREAM);
    let family = if bursts.random_bool(BURST_SHARE) {
        Family::Burst
    } else {
        family
    };
    let per_pod = |n: usize| refill * load / n.max(1) as f64;
    let mut groups = Vec::new();
    match family {
        Family::Mix => {
            let n = rng.random_range(1..=4usize);
            let counts = split(&mut rng, pods, n);
            let weights: Vec<f64> = counts
                .iter()
                .map(|_| log_uniform(&mut rng, 0.2, 5.0))
                .collect();
            let weighted: f64 = counts
                .iter()
                .zip(&weights)
                .map(|(c, w)| *c as f64 * w)
                .sum();
            for (g, (&count, &weight)) in counts.iter().zip(&weights).enumerate() {
                let base = refill * load * weight / weighted;
                let mut group = PodGroup::new(format!("g{g}"), count);
                group
                    .demand
                    .push(Term::Constant(round3(base * rng.random_range(0.3..1.0))));
                group.demand.extend(extra_terms(&mut rng, base, duration));
                let join = if rng.random_bool(0.4) {
                    round3(rng.random_range(0.0..duration / 2.0))
                } else {
                    0.0
                };
                let spread = if rng.random_bool(0.6) {
                    round3(log_uniform(&mut rng, 0.5, 60.0))
                } else {
                    0.0
                };
                if rng.random_bool(0.2) {
                    let alive = join + spread + 30.0;
                    if alive < duration - 10.0 {
                        group.leave = Some(millis(round3(rng.random_range(alive..duration))));
                    }
                }
                group.join = millis(join);
                group.join_spread = millis(spread);
                groups.push(group);
            }
        }
        Family::Oscillating => {
            let pods = pods.max(2);
            let phases = rng.random_range(2..=6usize).min(pods);
            let period = round3(rng.random_range(20.0..120.0));
            let base = round3(per_pod(pods) * rng.random_range(0.8..1.25) / load);
            for (g, count) in split(&mut rng, pods, phases).into_iter().enumerate() {
                let mut group = PodGroup::new(format!("phase{g}"), count);
                group.demand.push(Term::Constant(base));
                group.demand.push(Term::Sine {
                    amplitude: round3(base * rng.random_range(0.5..1.0)),
                    period: millis(period),
                    phase: round3(g as f64 / phases as f64),
                });
                group.demand.extend(maybe_noise(&mut rng, base));
                groups.push(group);
            }
        }
        Family::Herd => {
            let pods = pods.max(2);
            let steady = rng.random_range(1..=5usize).min(pods - 1);
            let herd = pods - steady;
            let base = per_pod(pods);
            let mut first = PodGroup::new("steady", steady);
            first.demand.push(Term::Constant(round3(base)));
            first.demand.extend(extra_terms(&mut rng, base, duration));
            groups.push(first);
            let mut group = PodGroup::new("herd", herd);
            group.join = millis(round3(rng.random_range(20.0..duration / 2.0)));
            group.join_spread = millis(round3(rng.random_range(0.0..1.0)));
            group.demand.push(Term::Constant(round3(base)));
            group.demand.extend(maybe_noise(&mut rng, base));
            groups.push(group);
        }
        Family::MovingHotSpot => {
            let pods = pods.max(2);
            let spots = rng.random_range(2..=8usize).min(pods);
            let every = round3(rng.random_range(10.0..40.0));
            let hot = refill * load / spots as f64;
            for (g, count) in split(&mut rng, pods, spots).into_iter().enumerate() {
                let mut group = PodGroup::new(format!("spot{g}"), count);
                let cold = round3(hot / count as f64 * rng.random_range(0.02..0.2));
                group.demand.push(Term::Constant(cold));
                group.demand.push(Term::OnOff {
                    on: millis(every),
                    off: millis(every * (spots - 1) as f64),
                    rate: round3(hot * spots as f64 / count as f64),
                    start: millis(every * g as f64),
                });
                groups.push(group);
            }
        }
        Family::Burst => {
            let pods = pods.max(2);
            // Idle at 2 to 30 % of the refill between bursts, so the
            // bucket fills up; each burst asks 1.5 to 5 times what the
            // bucket holds, or a period of refill without a burst limit.
            let idle = round3(refill * log_uniform(&mut bursts, 0.02, 0.3) / pods as f64);
            let holds = burst.max(refill * 10.0);
            let every = bursts.random_range(30.0..90.0);
            let mut group = PodGroup::new("pods", pods);
            group.demand.push(Term::Constant(idle));
            let mut at = bursts.random_range(20.0..every);
            while at + 10.0 < duration {
                let width = round3(bursts.random_range(0.5..5.0));
                let total = holds * bursts.random_range(1.5..5.0);
                group.demand.push(Term::Bump {
                    at: millis(round3(at)),
                    width: millis(width),
                    // A gaussian bump of σ `width` holds height · width · √(2π).
                    height: round3(
                        total / (width * (2.0 * std::f64::consts::PI).sqrt()) / pods as f64,
                    ),
                });
                at += every * bursts.random_range(0.7..1.3);
            }
            groups.push(group);
        }
        Family::Churn => {
            let waves = rng.random_range(4..=20usize).min(pods);
            let lifetime = round3(rng.random_range(30.0..120.0));
            let every = (duration - lifetime - 5.0).max(1.0) / waves as f64;
            let live = (lifetime / every).clamp(1.0, waves as f64);
            for (g, count) in split(&mut rng, pods, waves).into_iter().enumerate() {
                let mut group = PodGroup::new(format!("wave{g}"), count);
                let join = round3(every * g as f64);
                let spread = round3(rng.random_range(0.0..every.max(0.5)));
                group.join = millis(join);
                group.join_spread = millis(spread);
                group.leave = Some(millis(round3(join + spread + lifetime)));
                let base = refill * load / (live * count as f64);
                group.demand.push(Term::Constant(round3(base)));
                group.demand.extend(extra_terms(&mut rng, base, duration));
                groups.push(group);
            }
        }
    }
    let mut workload = Workload::new(
        format!("fuzz-{seed}"),
        Duration::from_secs(u64::from(duration_secs)),
        groups,
    );
    workload.description = format!(
        "generated ({}; {} pods; demand {load:.2} x the refill rate on average)",
        family.name(),
        workload.pods.iter().map(|g| g.count).sum::<usize>(),
    );
    workload.seed = seed;
    workload.limits = Some(LimitsSpec {
        refill_rate: refill,
        burst_limit: burst,
        initial_tokens: None,
        budget: None,
    });
    workload.network = Network {
        rtt: Duration::from_millis(rtt_ms),
        loss,
        ..Network::default()
    };
    workload.outages = outages;
    workload.validate().map_err(|e| {
        SimError::Invalid(format!(
            "generated workload of seed {seed}: {e}\n{}",
            workload.to_yaml().unwrap_or_default()
        ))
    })?;
    Ok(Generated {
        seed,
        family,
        workload,
    })
}

/// A measure the corpus sums up, which way is worse, and how it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeasureKind {
    pub name: &'static str,
    /// Lower is worse (Jain's index).
    pub lower_is_worse: bool,
    pub unit: Unit,
}

/// How a measure's values are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A share, as a signed percentage.
    Share,
    /// A plain ratio (Jain's index).
    Index,
    /// Target periods; infinite reads "never".
    Periods,
    /// A count, such as requests per pod per minute.
    Count,
}

impl Unit {
    fn format(self, v: f64) -> String {
        match self {
            Unit::Share => format!("{:+.2}%", v * 100.0),
            Unit::Index => format!("{v:.4}"),
            Unit::Periods if v.is_infinite() => "never".into(),
            Unit::Periods | Unit::Count => format!("{v:.2}"),
        }
    }
}

const fn measure(name: &'static str, unit: Unit) -> MeasureKind {
    MeasureKind {
        name,
        lower_is_worse: false,
        unit,
    }
}

/// How many measures the corpus sums up.
pub const MEASURE_COUNT: usize = 9;

/// The measures summed up over a corpus, in the order they are reported.
pub const MEASURES: [MeasureKind; MEASURE_COUNT] = [
    measure("|divergence| end", Unit::Share),
    measure("|divergence| max", Unit::Share),
    measure("overshoot 10 s", Unit::Share),
    measure("overshoot 60 s", Unit::Share),
    measure("pod error max", Unit::Share),
    MeasureKind {
        name: "Jain (equal demand)",
        lower_is_worse: true,
        unit: Unit::Index,
    },
    measure("convergence, every change (periods)", Unit::Periods),
    measure("convergence, followable changes (periods)", Unit::Periods),
    measure("req/pod/min", Unit::Count),
];

/// `m`'s value of each of [`MEASURES`] (`None` where it does not apply).
fn values(m: &Measures, period: f64, equal_demand: bool) -> [Option<f64>; MEASURE_COUNT] {
    [
        Some(m.divergence_end.abs()),
        Some(m.divergence_max.abs()),
        Some(m.overshoot_10s),
        Some(m.overshoot_60s),
        Some(m.pod_error_max),
        equal_demand.then_some(m.jain_index),
        m.convergence_max().map(|c| c / period),
        m.convergence_max_reachable(check::GOAL_CONVERGENCE_PERIODS * period)
            .map(|c| c / period),
        Some(m.requests_per_pod_minute),
    ]
}

/// Where an outcome's values keep the delayed ideal's measures: after
/// every policy's.
pub const DELAYED: usize = Policy::ALL.len();

/// The name of the run at index `p` of an outcome's values.
pub fn run_name(p: usize) -> &'static str {
    Policy::ALL
        .get(p)
        .map_or("delayed ideal", |policy| policy.name())
}

/// One workload's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub family: Family,
    /// Per policy (in [`Policy::ALL`]'s order), then for the delayed
    /// ideal ([`DELAYED`]), each measure's value.
    pub values: Vec<[Option<f64>; MEASURE_COUNT]>,
    /// The checked policy's goals it missed (the checks' measures), under
    /// the rule of [`check::check`].
    pub missed: Vec<String>,
    /// The goals the delayed ideal itself missed.
    pub delayed_missed: Vec<String>,
    /// Where the server was down: the delayed ideal run through the
    /// outages, with the split pods can know and with foresight.
    pub under_outages: Option<[OutageReference; 2]>,
    /// The server was down at times.
    pub outage: bool,
    /// Messages were lost.
    pub loss: bool,
    /// The checked policy's convergence, change by change.
    pub changes: ChangeTally,
    /// The stated bound for this workload's faults, as a share of `R·60 s`
    /// ([`check::stated_bound`]).
    pub bound: f64,
}

/// The delayed ideal run through a workload's outages with one split
/// ([`crate::UnderOutages`]).
#[derive(Clone, Debug, PartialEq)]
pub struct OutageReference {
    /// The goals it missed under the checked policy's rule
    /// ([`check::check_under_outages`]).
    pub missed: Vec<String>,
    /// Its divergence from the ideal at the end.
    pub divergence: f64,
}

/// Demand changes counted as the checks judge them: a change the delayed
/// ideal converged after is judged, and met when the checked policy
/// converged within what it allows ([`check::convergence_allowed`]); one
/// it never converged after is not judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangeTally {
    pub judged: usize,
    pub met: usize,
    /// Judged changes the delayed ideal itself took longer than the goal
    /// after, and of those, the ones the checked policy met.
    pub delayed_slow: usize,
    pub delayed_slow_met: usize,
    pub unjudged: usize,
}

impl ChangeTally {
    fn of(m: &Measures, period: f64) -> ChangeTally {
        let mut tally = ChangeTally::default();
        for c in &m.convergence {
            let Some(delayed) = c.reference.map(|r| r / period) else {
                tally.unjudged += 1;
                continue;
            };
            let after = c.after.map_or(f64::INFINITY, |a| a / period);
            let met = after <= check::convergence_allowed(delayed) + 1e-9;
            tally.judged += 1;
            tally.met += usize::from(met);
            if delayed > check::GOAL_CONVERGENCE_PERIODS + 1e-9 {
                tally.delayed_slow += 1;
                tally.delayed_slow_met += usize::from(met);
            }
        }
        tally
    }

    fn add(&mut self, other: ChangeTally) {
        self.judged += other.judged;
        self.met += other.met;
        self.delayed_slow += other.delayed_slow;
        self.delayed_slow_met += other.delayed_slow_met;
        self.unjudged += other.unjudged;
    }
}

impl Outcome {
    /// Whether the stated bound without faults applies: no outage, no
    /// lost message.
    pub fn bound_applies(&self) -> bool {
        !self.outage && !self.loss
    }

    /// The checked policy's 60 s overshoot less the stated bound of the
    /// workload's faults (positive: over it).
    pub fn beyond_bound(&self) -> Option<f64> {
        let over = self.values.get(checked())?[OVERSHOOT_60S]?;
        Some(over - self.bound)
    }
}

/// Runs the workload of `seed` under `policies`.
pub fn run_seed(seed: u64, policies: &[Policy]) -> Result<Outcome, SimError> {
    let generated = generate(seed)?;
    let period = generated
        .workload
        .client
        .config()
        .target_request_period
        .as_secs_f64();
    let equal = generated.workload.equal_demand();
    let outage = !generated.workload.outages.is_empty();
    let loss = generated.workload.network.loss > 0.0;
    let run = run_workload(generated.workload, policies)?;
    let bound = check::stated_bound(
        outage,
        loss,
        run.policy(CHECKED_POLICY)
            .map_or(0.0, |r| r.record.outage_excess),
        run.limits.refill_rate,
    );
    let values = Policy::ALL
        .iter()
        .map(|&p| {
            run.policy(p).map_or([None; MEASURE_COUNT], |r| {
                values(&r.measures, period, equal)
            })
        })
        .chain([values(&run.delayed_measures, period, equal)])
        .collect();
    let changes = run
        .policy(CHECKED_POLICY)
        .map_or_else(ChangeTally::default, |r| {
            ChangeTally::of(&r.measures, period)
        });
    let misses = |checks: Vec<check::Check>| {
        checks
            .into_iter()
            .filter(|c| !c.passed)
            .map(|c| c.measure)
            .collect()
    };
    Ok(Outcome {
        seed,
        family: generated.family,
        values,
        missed: misses(check::check(&run)),
        delayed_missed: misses(check::check_delayed(&run)),
        under_outages: run.under_outages.as_ref().map(|u| {
            [&u.fallback, &u.foresight].map(|m| OutageReference {
                missed: misses(check::check_under_outages(&run, m)),
                divergence: m.divergence_end,
            })
        }),
        outage,
        loss,
        changes,
        bound,
    })
}

/// Runs `seeds` under `policies` on `threads` threads; the outcomes in
/// seed order.
pub fn run_corpus(
    seeds: &[u64],
    policies: &[Policy],
    threads: usize,
) -> Result<Vec<Outcome>, SimError> {
    parallel(seeds, threads, |seed| run_seed(seed, policies))
}

/// `run` of each of `seeds` on `threads` threads; the outcomes in seed
/// order.
fn parallel<T: Send>(
    seeds: &[u64],
    threads: usize,
    run: impl Fn(u64) -> Result<T, SimError> + Sync,
) -> Result<Vec<T>, SimError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<T, SimError>)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let outcome = run(seed);
                    results
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((i, outcome));
                }
            });
        }
    });
    let mut results = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// One measure of one policy over the corpus.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub worst: f64,
    pub worst_seed: u64,
    pub p99: f64,
    pub median: f64,
    /// Workloads it applies to.
    pub count: usize,
}

/// The worst, p99 and median of measure `k` of `policy` over `outcomes`.
pub fn spread(outcomes: &[Outcome], policy: usize, k: usize) -> Option<Spread> {
    let kind = MEASURES[k];
    let mut values: Vec<(f64, u64)> = outcomes
        .iter()
        .filter_map(|o| Some((o.values.get(policy)?[k]?, o.seed)))
        .collect();
    if values.is_empty() {
        return None;
    }
    // Worst last.
    values.sort_by(|a, b| {
        if kind.lower_is_worse {
            b.0.total_cmp(&a.0)
        } else {
            a.0.total_cmp(&b.0)
        }
    });
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize].0;
    let (worst, worst_seed) = values[values.len() - 1];
    Some(Spread {
        worst,
        worst_seed,
        p99: at(0.99),
        median: at(0.5),
        count: values.len(),
    })
}

/// The corpus summary, in markdown: per policy and measure the worst (and
/// its seed), p99 and median; the share meeting every goal, per family.
pub fn summary(outcomes: &[Outcome], first_seed: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} generated workloads, seeds {first_seed} to {}.\n",
        outcomes.len(),
        first_seed + outcomes.len().saturating_sub(1) as u64
    );
    let met = outcomes.iter().filter(|o| o.missed.is_empty()).count();
    let _ = writeln!(
        out,
        "Meeting every goal under `{}`: **{met} of {} ({:.1} %)**.\n",
        CHECKED_POLICY.name(),
        outcomes.len(),
        100.0 * met as f64 / outcomes.len().max(1) as f64
    );
    let delayed_met = outcomes
        .iter()
        .filter(|o| o.delayed_missed.is_empty())
        .count();
    let _ = writeln!(
        out,
        "The delayed ideal meets every goal itself in {delayed_met} ({:.1} %). \
         `{}` meets a goal when it meets it outright or, where the delayed ideal misses it \
         too, is no worse than the delayed ideal by more than {:.1} percentage points \
         (divergence, overshoot), {} target period (convergence) or {} (Jain's index).\n",
        100.0 * delayed_met as f64 / outcomes.len().max(1) as f64,
        CHECKED_POLICY.name(),
        check::DELAYED_MARGIN_SHARE * 100.0,
        check::DELAYED_MARGIN_PERIODS,
        check::DELAYED_MARGIN_JAIN,
    );
    let mut families: Vec<Family> = outcomes.iter().map(|o| o.family).collect();
    families.sort();
    families.dedup();
    // Which goal each family misses, as the checks name them.
    let mut goals: Vec<&str> = outcomes
        .iter()
        .flat_map(|o| o.missed.iter().map(String::as_str))
        .collect();
    goals.sort_unstable();
    goals.dedup();
    let _ = write!(
        out,
        "| family | workloads | meeting every goal | delayed ideal meeting every goal |"
    );
    for goal in &goals {
        let _ = write!(out, " missing {goal} |");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "|---|---:|---:|---:|{}", "---:|".repeat(goals.len()));
    let share = |n: usize, of: usize| format!("{n} ({:.1} %)", 100.0 * n as f64 / of.max(1) as f64);
    let row = |name: &str, of: &[&Outcome], out: &mut String| {
        let met = of.iter().filter(|o| o.missed.is_empty()).count();
        let delayed_met = of.iter().filter(|o| o.delayed_missed.is_empty()).count();
        let _ = write!(
            out,
            "| {name} | {} | {} | {} |",
            of.len(),
            share(met, of.len()),
            share(delayed_met, of.len())
        );
        for goal in &goals {
            let missing = of
                .iter()
                .filter(|o| o.missed.iter().any(|m| m == goal))
                .count();
            let _ = write!(out, " {missing} |");
        }
        let _ = writeln!(out);
    };
    for &family in &families {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.family == family).collect();
        row(family.name(), &of, &mut out);
    }
    let all: Vec<&Outcome> = outcomes.iter().collect();
    row("all", &all, &mut out);
    let _ = writeln!(out);
    faults_section(outcomes, &mut out);
    changes_section(outcomes, &families, &mut out);
    side_by_side(outcomes, &families, &mut out);
    for p in 0..=DELAYED {
        if (0..MEASURES.len()).all(|k| spread(outcomes, p, k).is_none()) {
            continue;
        }
        let _ = writeln!(out, "### {}\n", run_name(p));
        let _ = writeln!(
            out,
            "| measure | worst | seed of the worst | p99 | median | workloads |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        for (k, kind) in MEASURES.iter().enumerate() {
            if let Some(s) = spread(outcomes, p, k) {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    kind.name,
                    kind.unit.format(s.worst),
                    s.worst_seed,
                    kind.unit.format(s.p99),
                    kind.unit.format(s.median),
                    s.count
                );
            }
        }
        let _ = writeln!(out);
    }
    out
}

/// Which of an outcome's faults a summary row counts.
type FaultClass = (&'static str, fn(&Outcome) -> bool);

/// The rows of the summaries per fault class.
const FAULT_CLASSES: [FaultClass; 4] = [
    ("no outage, no loss", |o| o.bound_applies()),
    ("loss, no outage", |o| o.loss && !o.outage),
    ("outage", |o| o.outage),
    ("all", |_| true),
];

/// Per fault class, the share meeting every goal, beside the delayed
/// ideal's and, around outages, what the delayed ideal run through them
/// meets: the most a protocol that never fails open could meet, with the
/// split pods can know, and with foresight.
fn faults_section(outcomes: &[Outcome], out: &mut String) {
    let share = |n: usize, of: usize| format!("{n} ({:.1} %)", 100.0 * n as f64 / of.max(1) as f64);
    let policy = CHECKED_POLICY.name();
    let _ = writeln!(
        out,
        "Per fault class, and what outages alone cost. *Within reach*: workloads the delayed \
         ideal still meets every goal of (by `{policy}`'s rule) when run through the workload's \
         outages as a protocol that never fails open must: while the server is down, each pod \
         serves its work from its part of the refill rate and of what the bucket held when it \
         went down, and none lends to another. *Fallback split*: the parts split as the pods' \
         fallback rates are, from the shares learnt before (what a pod can know). *Foresight*: \
         split by what the ideal gave each pod over the outage (what no pod can know): a \
         workload missed even so is out of reach of any protocol whose fallback rates sum to \
         the refill rate.\n"
    );
    let _ = writeln!(
        out,
        "| faults | workloads | `{policy}` meeting every goal | delayed ideal | within reach, fallback split | within reach, foresight | `{policy}` meeting every goal out of fallback-split reach |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    let reach = |o: &Outcome, r: usize| {
        o.under_outages
            .as_ref()
            .is_none_or(|u| u[r].missed.is_empty())
    };
    for (name, member) in FAULT_CLASSES {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| member(o)).collect();
        let count = |f: &dyn Fn(&Outcome) -> bool| of.iter().filter(|o| f(o)).count();
        let met = count(&|o| o.missed.is_empty());
        let beyond = count(&|o| o.missed.is_empty() && !reach(o, 0));
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {beyond} |",
            of.len(),
            share(met, of.len()),
            share(count(&|o| o.delayed_missed.is_empty()), of.len()),
            share(count(&|o| reach(o, 0)), of.len()),
            share(count(&|o| reach(o, 1)), of.len()),
        );
    }
    let _ = writeln!(out);
    for (r, name) in ["fallback split", "foresight"].iter().enumerate() {
        let references: Vec<&OutageReference> = outcomes
            .iter()
            .filter_map(|o| o.under_outages.as_ref().map(|u| &u[r]))
            .collect();
        if references.is_empty() {
            continue;
        }
        let mut goals: Vec<&str> = references
            .iter()
            .flat_map(|u| u.missed.iter().map(String::as_str))
            .collect();
        goals.sort_unstable();
        let mut missed: Vec<(&str, usize)> = Vec::new();
        for goal in goals {
            match missed.last_mut() {
                Some((g, n)) if *g == goal => *n += 1,
                _ => missed.push((goal, 1)),
            }
        }
        let missed: Vec<String> = missed.iter().map(|(g, n)| format!("{g} {n}")).collect();
        let mut divergences: Vec<f64> = references.iter().map(|u| u.divergence.abs()).collect();
        divergences.sort_by(f64::total_cmp);
        let at = |q: f64| divergences[((divergences.len() - 1) as f64 * q).round() as usize];
        let _ = writeln!(
            out,
            "- Through the outages, {name}: |divergence| at the end worst {:.2} %, p99 {:.2} %, \
             median {:.2} % ({} workloads); goals missed: {}.",
            at(1.0) * 100.0,
            at(0.99) * 100.0,
            at(0.5) * 100.0,
            divergences.len(),
            if missed.is_empty() {
                "none".to_string()
            } else {
                missed.join(", ")
            }
        );
    }
    let _ = writeln!(out);
}

/// Per family, the checked policy's spread of each measure beside the
/// delayed ideal's.
fn side_by_side(outcomes: &[Outcome], families: &[Family], out: &mut String) {
    let _ = writeln!(
        out,
        "Per family, `{}` beside the delayed ideal (worst / p99 / median):\n",
        CHECKED_POLICY.name()
    );
    let cell = |kind: &MeasureKind, s: Option<Spread>| {
        s.map_or_else(
            || "–".to_string(),
            |s| {
                format!(
                    "{} / {} / {}",
                    kind.unit.format(s.worst),
                    kind.unit.format(s.p99),
                    kind.unit.format(s.median)
                )
            },
        )
    };
    for &family in families {
        let of: Vec<Outcome> = outcomes
            .iter()
            .filter(|o| o.family == family)
            .cloned()
            .collect();
        let _ = writeln!(
            out,
            "**{}** ({} workloads)\n\n| measure | `{}` | delayed ideal |\n|---|---:|---:|",
            family.name(),
            of.len(),
            CHECKED_POLICY.name()
        );
        for (k, kind) in MEASURES.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                kind.name,
                cell(kind, spread(&of, checked(), k)),
                cell(kind, spread(&of, DELAYED, k)),
            );
        }
        let _ = writeln!(out);
    }
}

/// Convergence change by change, per family, as the checks judge it.
fn changes_section(outcomes: &[Outcome], families: &[Family], out: &mut String) {
    let _ = writeln!(
        out,
        "Convergence change by change under `{}`: a change is judged when the delayed \
         ideal converges after it at all, and met within {} periods or, where the delayed \
         ideal took longer, within its time and {} period.\n",
        CHECKED_POLICY.name(),
        check::GOAL_CONVERGENCE_PERIODS,
        check::DELAYED_MARGIN_PERIODS,
    );
    let _ = writeln!(
        out,
        "| family | changes | judged | met | the delayed ideal slower than the goal | met there | not judged |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    let share = |n: usize, of: usize| {
        if of == 0 {
            "–".to_string()
        } else {
            format!("{n} ({:.0} %)", 100.0 * n as f64 / of as f64)
        }
    };
    let rows = families
        .iter()
        .map(|&f| (f.name(), Some(f)))
        .chain([("all", None)]);
    for (name, family) in rows {
        let mut t = ChangeTally::default();
        for o in outcomes
            .iter()
            .filter(|o| family.is_none_or(|f| o.family == f))
        {
            t.add(o.changes);
        }
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            t.judged + t.unjudged,
            t.judged,
            share(t.met, t.judged),
            t.delayed_slow,
            share(t.delayed_slow_met, t.delayed_slow),
            t.unjudged,
        );
    }
    let _ = writeln!(out);
}

/// The index of the checked policy in [`Policy::ALL`].
fn checked() -> usize {
    Policy::ALL
        .iter()
        .position(|p| *p == CHECKED_POLICY)
        .unwrap_or(0)
}

/// One line per workload and policy run: the seed, the family, whether
/// the server was down or messages were lost, the policy, every measure
/// (empty where it does not apply) and the goals the checked policy
/// missed, for comparing two corpora workload by workload.
pub fn csv(outcomes: &[Outcome]) -> String {
    let mut out = String::from("seed,family,outage,loss,policy");
    for kind in MEASURES {
        out.push(',');
        // Measure names hold commas: quoted, as RFC 4180 has it.
        let _ = write!(out, "\"{}\"", kind.name.replace('"', "\"\""));
    }
    out.push_str(",missed\n");
    for o in outcomes {
        for (p, values) in o.values.iter().enumerate() {
            if values.iter().all(Option::is_none) {
                continue;
            }
            let _ = write!(
                out,
                "{},{},{},{},{}",
                o.seed,
                o.family.name(),
                o.outage,
                o.loss,
                run_name(p)
            );
            for v in values {
                out.push(',');
                if let Some(v) = v {
                    let _ = write!(out, "{v}");
                }
            }
            let missed = if p == checked() {
                o.missed.join("; ")
            } else if p == DELAYED {
                o.delayed_missed.join("; ")
            } else {
                String::new()
            };
            let _ = writeln!(out, ",{missed}");
        }
    }
    out
}

/// The index of the 60 s overshoot in [`MEASURES`].
const OVERSHOOT_60S: usize = 3;

/// The workloads whose checked policy admitted more than the stated bound
/// of their faults over some 60 s window.
pub fn over_bound(outcomes: &[Outcome]) -> Vec<&Outcome> {
    outcomes
        .iter()
        .filter(|o| o.beyond_bound().is_some_and(|beyond| beyond > 0.0))
        .collect()
}

/// The stated bounds, and how the corpus stands against them: the worst
/// 60 s overshoot of the checked policy without faults, with loss and
/// around outages, and how far the worst came to its workload's bound.
pub fn bound_section(outcomes: &[Outcome], over: &[&Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Stated bounds (`{}`): over any window of T ≥ 60 s, admitted ≤ max(burst, initial) + R·T + ε·R·T, with ε = {:.1} % without faults, {loss:.1} % with lost messages (up to 10 %) and no outage; around outages, ε = {outage:.1} % plus Σ over the outages of (F − R)⁺·L + n·A (F: the most the pods' fallback rates summed to during an outage of length L, a pod not yet answered counting at its initial allowance per target period; n·A: the initial allowances of the n pods that started during it).\n",
        CHECKED_POLICY.name(),
        check::STATED_OVERSHOOT_BOUND * 100.0,
        loss = check::STATED_OVERSHOOT_BOUND_LOSS * 100.0,
        outage = check::STATED_OVERSHOOT_BOUND_OUTAGE * 100.0,
    );
    let _ = writeln!(
        out,
        "| workloads | count | worst overshoot over 60 s | seed | p99 | median | closest to its bound (overshoot − bound) | seed | over it |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let groups = FAULT_CLASSES;
    let unit = MEASURES[OVERSHOOT_60S].unit;
    for (name, keep) in groups {
        let of: Vec<Outcome> = outcomes.iter().filter(|o| keep(o)).cloned().collect();
        let Some(s) = spread(&of, checked(), OVERSHOOT_60S) else {
            continue;
        };
        let closest = of
            .iter()
            .filter_map(|o| Some((o.beyond_bound()?, o.seed)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let (closest, closest_seed) = closest
            .map_or(("–".to_owned(), "–".to_owned()), |(v, seed)| {
                (unit.format(v), seed.to_string())
            });
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {closest} | {closest_seed} | {} |",
            s.count,
            unit.format(s.worst),
            s.worst_seed,
            unit.format(s.p99),
            unit.format(s.median),
            over.iter().filter(|o| keep(o)).count(),
        );
    }
    let _ = writeln!(
        out,
        "\n{} of {} workloads are over their stated bound.",
        over.len(),
        outcomes.len()
    );
    out
}

/// The seeds worth replaying: the worst of each measure, every policy.
pub fn worst_seeds(outcomes: &[Outcome]) -> Vec<u64> {
    let mut seeds: Vec<u64> = (0..=DELAYED)
        .flat_map(|p| {
            (0..MEASURES.len()).filter_map(move |k| Some(spread(outcomes, p, k)?.worst_seed))
        })
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_valid_workload_every_time() {
        for seed in 0..300 {
            let a = generate(seed).expect("valid");
            let b = generate(seed).expect("valid");
            let yaml = a.workload.to_yaml().expect("writes");
            assert_eq!(yaml, b.workload.to_yaml().expect("writes"));
            // The YAML is the workload: replaying it gives the same one.
            assert_eq!(Workload::parse(&yaml).expect("parses"), a.workload);
        }
    }

    #[test]
    fn the_corpus_covers_the_range() {
        let drawn: Vec<Generated> = (0..1000).map(|s| generate(s).expect("valid")).collect();
        let pods: Vec<usize> = drawn.iter().map(|g| g.workload.pod_specs().len()).collect();
        assert!(pods.contains(&1) && pods.iter().any(|&p| p >= 500));
        let refill: Vec<f64> = drawn
            .iter()
            .filter_map(|g| Some(g.workload.limits.as_ref()?.refill_rate))
            .collect();
        assert!(refill.iter().any(|&r| r < 3.0) && refill.iter().any(|&r| r > 3e5));
        assert!(drawn.iter().any(|g| {
            g.workload
                .limits
                .as_ref()
                .is_some_and(|l| l.burst_limit == 0.0)
        }));
        assert!(drawn.iter().any(|g| !g.workload.outages.is_empty()));
        assert!(drawn.iter().any(|g| g.workload.network.loss > 0.09));
        for family in [
            Family::Mix,
            Family::Oscillating,
            Family::Herd,
            Family::MovingHotSpot,
            Family::Churn,
            Family::Burst,
        ] {
            assert!(
                drawn.iter().filter(|g| g.family == family).count() >= 50,
                "{family:?}"
            );
        }
    }

    #[test]
    fn every_csv_line_has_as_many_fields_as_the_header() {
        let outcome = Outcome {
            seed: 7,
            family: Family::Herd,
            values: vec![[Some(0.5); MEASURE_COUNT]; DELAYED + 1],
            missed: vec!["cumulative divergence".into(), "jain index".into()],
            delayed_missed: vec!["convergence in target periods".into()],
            under_outages: None,
            outage: true,
            loss: false,
            changes: ChangeTally::default(),
            bound: check::STATED_OVERSHOOT_BOUND,
        };
        let text = csv(&[outcome]);
        // Fields split on commas outside quotes.
        let fields = |line: &str| {
            let mut quoted = false;
            1 + line
                .chars()
                .filter(|&c| {
                    if c == '"' {
                        quoted = !quoted;
                    }
                    c == ',' && !quoted
                })
                .count()
        };
        let mut lines = text.lines();
        let header = fields(lines.next().expect("a header"));
        assert_eq!(header, 5 + MEASURE_COUNT + 1);
        let rows: Vec<&str> = lines.collect();
        // Every policy's, then the delayed ideal's.
        assert_eq!(rows.len(), DELAYED + 1);
        assert!(rows[DELAYED].contains("delayed ideal"));
        assert!(rows[DELAYED].ends_with(",convergence in target periods"));
        for row in rows {
            assert_eq!(fields(row), header, "{row}");
        }
    }

    #[test]
    fn spreads_put_the_worst_last_whichever_way_is_worse() {
        let outcome = |seed: u64, v: f64| Outcome {
            seed,
            family: Family::Mix,
            values: vec![[Some(v); MEASURE_COUNT]],
            missed: Vec::new(),
            delayed_missed: Vec::new(),
            under_outages: None,
            outage: false,
            loss: false,
            changes: ChangeTally::default(),
            bound: check::STATED_OVERSHOOT_BOUND,
        };
        let outcomes: Vec<Outcome> = (0..101).map(|s| outcome(s, s as f64)).collect();
        let over = spread(&outcomes, 0, 3).expect("applies");
        assert_eq!(
            (over.worst, over.worst_seed, over.median),
            (100.0, 100, 50.0)
        );
        assert_eq!(over.p99, 99.0);
        let jain = spread(&outcomes, 0, 5).expect("applies");
        assert_eq!((jain.worst, jain.worst_seed, jain.p99), (0.0, 0, 1.0));
    }
}
