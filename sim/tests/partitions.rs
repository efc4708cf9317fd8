//! Partition workloads nobody tuned: generated from seeds over the whole
//! range the goals are meant for, run coordinated, held to the gates.
//!
//! Each seed draws a workload: 1 to 50 pods (sending the hot spot evenly,
//! or a third of them 2 to 10 times more), a limit of 1 to 10 000
//! operations/s, the hot spot offered 1.1 to 50 times it, a round trip of
//! 0 to 500 ms, 0 to 10 % of messages lost, a fixed or a moving hot spot
//! (every 20 to 40 s), pods starting together or spread over up to 20 s,
//! Poisson or evenly spaced arrivals, and cold traffic (uniform over a
//! million partitions, or Zipf with its head below half the limit).
//!
//! A gate may be missed only for one of the reasons in [`Known`], each a
//! property of the client as it is, checked on the evidence: a miss is put
//! down to lost messages only if the same workload without loss meets that
//! gate. Any other miss fails the test and prints the workload as YAML,
//! which `tollgate-sim run` replays exactly.
//!
//! The quick test runs the first cheap seeds in a debug build. The whole
//! range: `cargo test --release -p tollgate-sim --test partitions --
//! --ignored --nocapture` (`TOLLGATE_SIM_SEEDS=N` for another number of
//! seeds, `TOLLGATE_SIM_HOT_SPOT=fixed|moving` and `TOLLGATE_SIM_LOSS=none`
//! to draw from one family only); it prints every workload's measures, and
//! per family (fixed or moving hot spot, with or without loss) how many
//! workloads missed a gate and for which reason.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate_core::partition::{MIN_REPORTED_FRACTION, half_life};
use tollgate_sim::check::{self, Check};
use tollgate_sim::partitions::{self, Mode, PartitionMeasures};
use tollgate_sim::workload::partitions::{Arrivals, ColdSpec, HotSpec, Moving};
use tollgate_sim::workload::{Network, PartitionSpec, PodGroup, PodPartitions, Workload};

/// The report period of every generated workload (the client's default).
const PERIOD: f64 = 10.0;

/// One generated workload, and what it was drawn from.
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    pods: usize,
    limit: f64,
    multiple: f64,
    rtt_ms: u64,
    loss: f64,
    moving: Option<(u64, u64)>,
    aligned: bool,
    /// Operations per second each pod offers the hot spot, by group:
    /// `(pods, rate)`.
    hot: Vec<(usize, f64)>,
    /// Operations offered in all: what a run costs.
    operations: f64,
}

/// A restriction of the generated family, from the environment.
fn family(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn log_uniform(rng: &mut ChaCha8Rng, low: f64, high: f64) -> f64 {
    (low.ln() + rng.random::<f64>() * (high.ln() - low.ln())).exp()
}

/// Seconds after a change before the steady state, as the measures count.
fn settle(rtt_ms: u64) -> f64 {
    let rtt = rtt_ms as f64 / 1000.0;
    2.0 * (PERIOD + rtt) + rtt
}

/// `x` rounded to `places` decimals, in decimal: the rates these seeds
/// have always drawn (arithmetic on binary floats rounds some halves the
/// other way).
fn decimals(x: f64, places: usize) -> f64 {
    format!("{x:.places$}").parse().unwrap_or(x)
}

/// The workload of `seed`.
fn generate(seed: u64) -> (Case, Workload) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pods = log_uniform(&mut rng, 1.0, 50.49).round() as usize;
    let limit = (log_uniform(&mut rng, 1.0, 10_000.0) * 10.0).round() / 10.0;
    let multiple = (log_uniform(&mut rng, 1.1, 50.0) * 100.0).round() / 100.0;
    let rtt_ms = rng.random_range(0..=500u64);
    // A third of the networks lose nothing.
    let loss = if rng.random_bool(1.0 / 3.0) {
        0.0
    } else {
        (rng.random::<f64>() * 100.0).round().max(1.0) / 1000.0
    };
    // Drawn whatever the restrictions, so a seed keeps its other draws.
    let moves = rng.random_bool(0.5);
    let moving = match family("TOLLGATE_SIM_HOT_SPOT").as_deref() {
        Some("fixed") => false,
        Some("moving") => true,
        _ => moves,
    }
    .then(|| (rng.random_range(20..=40u64), rng.random_range(2..=8u64)));
    let loss = if family("TOLLGATE_SIM_LOSS").as_deref() == Some("none") {
        0.0
    } else {
        loss
    };
    let aligned = pods > 1 && rng.random_bool(0.3);
    let spread = if aligned {
        0
    } else {
        rng.random_range(0..=20u64)
    };
    let arrivals = if rng.random_bool(0.2) {
        Arrivals::Even
    } else {
        Arrivals::Poisson
    };
    // Uneven: a third of the pods send `weight` times what the others do.
    let (heavy, weight) = if pods >= 3 && rng.random_bool(0.5) {
        (pods.div_ceil(3), rng.random_range(2.0..10.0))
    } else {
        (0, 1.0)
    };
    let light = multiple * limit / (heavy as f64 * weight + (pods - heavy) as f64);
    let cold_total = rng.random::<f64>() * 3.0 * limit;
    let cold = if rng.random_bool(0.5) {
        ColdSpec {
            rate: decimals(cold_total / pods as f64, 4),
            partitions: 1_000_000,
            zipf: None,
        }
    } else {
        let s: f64 = rng.random_range(0.7..1.1);
        let harmonic: f64 = (1..=1_000_000u64).map(|k| (k as f64).powf(-s)).sum();
        let total = cold_total.min(0.45 * limit * harmonic);
        ColdSpec {
            rate: decimals(total / pods as f64, 4),
            partitions: 1_000_000,
            zipf: Some(decimals(s, 3)),
        }
    };
    // Long enough for the steady mean to hold a thousand operations at the
    // limit; a moving hot spot's run ends on its seventh move or later, so
    // six whole intervals are measured.
    let duration = match moving {
        Some((every, _)) => {
            ((spread as f64 + settle(rtt_ms)) / every as f64).ceil() * every as f64
                + (6 * every) as f64
        }
        None => (spread as f64 + settle(rtt_ms) + (60.0f64).max(1000.0 / limit)).ceil(),
    };
    let group = |name: &str, count: usize, rate: f64| {
        let mut group = PodGroup::new(name, count);
        group.join_spread = Duration::from_secs(spread);
        let hot = HotSpec {
            rate: decimals(rate, 4),
            partition: 0,
            moving: moving.map(|(every, among)| Moving {
                every: Duration::from_secs(every),
                among,
            }),
        };
        group.partitions = Some(PodPartitions {
            hot: vec![hot],
            cold: Some(cold.clone()),
        });
        group
    };
    let mut groups = Vec::new();
    if heavy > 0 {
        groups.push(group("heavy", heavy, light * weight));
    }
    if pods > heavy {
        groups.push(group("pod", pods - heavy, light));
    }
    let mut workload = Workload::new(
        format!("generated-{seed}"),
        Duration::from_secs_f64(duration),
        groups,
    );
    workload.seed = seed;
    workload.network = Network {
        rtt: Duration::from_millis(rtt_ms),
        loss,
        ..Network::default()
    };
    workload.partitions = Some(PartitionSpec {
        limit,
        report_period: None,
        arrivals,
    });
    let case = Case {
        seed,
        pods,
        limit,
        multiple,
        rtt_ms,
        loss,
        moving,
        aligned,
        hot: [(heavy, light * weight), (pods - heavy, light)]
            .into_iter()
            .filter(|g| g.0 > 0)
            .collect(),
        operations: (multiple * limit + cold_total) * duration,
    };
    (case, workload)
}

/// `workload` as YAML, which `tollgate-sim run` replays.
fn yaml(workload: &Workload) -> String {
    workload.to_yaml().expect("a workload writes as YAML")
}

/// `workload` with no message lost.
fn without_loss(workload: &Workload) -> Workload {
    let mut lossless = workload.clone();
    lossless.network.loss = 0.0;
    lossless
}

/// The coordinated run of `workload`: its measures and the gates it missed.
fn run(workload: &Workload) -> (PartitionMeasures, Vec<Check>) {
    // What a miss prints must replay this very workload.
    let yaml = yaml(workload);
    let read = Workload::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(&read, workload, "{yaml}");
    let run = partitions::run(workload, &[Mode::Coordinated]).expect("runs");
    let missed = check::check_partitions(workload, &run)
        .into_iter()
        .filter(|c| !c.passed)
        .collect();
    let measures = run.runs.into_iter().next().expect("one mode").measures;
    (measures, missed)
}

/// Why the client as it is misses a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Known {
    /// Lost messages. A failed exchange is learnt after the request
    /// timeout and tried again about a second later, so a pod whose
    /// exchanges keep failing for two periods goes back to whole shares,
    /// the whole limit alone, until an answer; a pod whose first exchanges
    /// are lost knows no limit and admits everything meanwhile; and a
    /// failure after a move delays the new shares.
    Loss,
    /// A moving hot spot at a limit under 16/s: the counters' half-life,
    /// 16/limit s, is longer than a second, and after a move they take
    /// several half-lives, longer than two report periods, to see the new
    /// partition's rate; each pod counts few operations, so its rate and
    /// its share are noisy for longer, and the accepted rate strays either
    /// way.
    SlowCounters,
    /// Pods that see the hot spot at under twice `MIN_REPORTED_FRACTION`
    /// of the limit carry a tenth of the limit or more between them. Such
    /// a pod leaves the partition out of its report whenever its count
    /// dips under the floor, so the server's sum misses its traffic and it
    /// keeps a whole share: those pods accept all they see, on top of the
    /// limit the reporting pods share (and after a move, the accepted rate
    /// may never come within the bound).
    ReportFloor,
    /// Reaction to a move past two periods, within what the client's
    /// cadence allows: a move is judged after every pod has reported the
    /// new partition and then heard back, which takes up to two rounds of
    /// exchanges (a period and a round trip each) and a round trip, plus a
    /// counter's half-life to see the new partition and the measure's
    /// window.
    TwoRounds,
    /// Too few accepted: every pod sees the hot spot at under two
    /// operations per counter half-life. A pod's share of the limit is then
    /// decided on the one or two operations its counter holds, whose rate
    /// reads high just after each of them, and each pod rejects more than
    /// its excess (measured down to 0.67 × with 31 pods at 0.37/s each on
    /// a limit of 9.4/s).
    SparseShares,
}

fn is_reaction(c: &Check) -> bool {
    c.measure.contains("reaction")
}

fn is_accepted_max(c: &Check) -> bool {
    c.measure.ends_with("accepted / limit") && !c.at_least
}

/// The reason a miss of `case` belongs to, apart from loss.
fn known_without_loss(case: &Case, c: &Check, m: &PartitionMeasures) -> Option<Known> {
    let floor = 2.0 * MIN_REPORTED_FRACTION * case.limit;
    let unseen: f64 = case
        .hot
        .iter()
        .filter(|(_, rate)| *rate < floor)
        .map(|(pods, rate)| *pods as f64 * rate)
        .sum();
    if (is_accepted_max(c) || is_reaction(c)) && unseen >= 0.1 * case.limit {
        return Some(Known::ReportFloor);
    }
    let sparse = case
        .hot
        .iter()
        .all(|(_, rate)| rate * half_life(case.limit) < 2.0);
    if c.at_least && sparse {
        return Some(Known::SparseShares);
    }
    case.moving?;
    if !is_reaction(c) && half_life(case.limit) > 1.0 {
        return Some(Known::SlowCounters);
    }
    if is_reaction(c) {
        let rtt = case.rtt_ms as f64 / 1000.0;
        let window = m.spots.first().map_or(1.0, |s| s.reaction_window);
        let bound = 2.0 * (PERIOD + rtt) + rtt + half_life(case.limit) + window;
        let every = case.moving.map_or(0.0, |(every, _)| every as f64);
        // Never within before the next move: the hot spot moved on before
        // the cadence allowed.
        if c.value * PERIOD <= bound || (c.value.is_infinite() && every <= bound) {
            return Some(Known::TwoRounds);
        }
    }
    None
}

/// Runs `seed` and sorts its misses: explained (by reason) or not.
fn judge(seed: u64) -> (Case, PartitionMeasures, Vec<(Check, Option<Known>)>) {
    let (case, workload) = generate(seed);
    let (measures, missed) = run(&workload);
    let mut lossless: Option<(PartitionMeasures, Vec<Check>)> = None;
    let mut judged = Vec::new();
    for c in missed {
        let mut known = known_without_loss(&case, &c, &measures);
        if known.is_none() && case.loss > 0.0 {
            let (m, missed) = lossless.get_or_insert_with(|| run(&without_loss(&workload)));
            let same = missed
                .iter()
                .find(|o| o.measure == c.measure && o.at_least == c.at_least);
            let explained_without = same.is_none_or(|o| known_without_loss(&case, o, m).is_some());
            if explained_without {
                known = Some(Known::Loss);
            }
        }
        judged.push((c, known));
    }
    (case, measures, judged)
}

fn describe(case: &Case) -> String {
    format!(
        "seed {:>3}: {:>2} pods, limit {:>7.1}/s × {:>5.2}, rtt {:>3} ms, loss {:>4.1}%, {}, {}",
        case.seed,
        case.pods,
        case.limit,
        case.multiple,
        case.rtt_ms,
        case.loss * 100.0,
        match case.moving {
            Some((every, among)) => format!("moving every {every}s among {among}"),
            None => "fixed".into(),
        },
        if case.aligned {
            "started together"
        } else {
            "started apart"
        },
    )
}

/// The measures the gates hold, in a line.
fn summary(m: &PartitionMeasures) -> String {
    let mut out = String::new();
    for s in &m.spots {
        let _ = write!(
            out,
            "accepted {:.3} (p95 of seconds {:.3}, {:.0} s steady)",
            s.accepted,
            s.per_second.map_or(f64::NAN, |p| p.p95),
            s.steady_secs
        );
        if let Some(r) = s.reaction_max() {
            let _ = write!(out, ", reaction {:.2} periods", r / PERIOD);
        }
        if s.unmeasured_moves > 0 {
            let _ = write!(
                out,
                ", {} of {} moves not measured (window {:.1} s)",
                s.unmeasured_moves,
                s.unmeasured_moves + s.reactions.len(),
                s.reaction_window
            );
        }
    }
    let _ = write!(
        out,
        ", false positives {:.4}%, on whole shares {:.2}% of pod time",
        m.false_positives * 100.0,
        m.fallback_share * 100.0
    );
    out
}

/// What one family of workloads did: how many, how many missed a gate,
/// and per reason and gate the count and the worst value.
#[derive(Default)]
struct Tally {
    workloads: usize,
    missed: usize,
    by_reason: BTreeMap<(Known, String), (usize, f64, u64)>,
}

/// Runs `seeds`, prints each (all of them when `verbose`) and a tally per
/// family, and returns the unexplained misses.
fn run_seeds(seeds: impl IntoIterator<Item = u64>, verbose: bool) -> Vec<String> {
    let mut unexplained = Vec::new();
    let mut families: BTreeMap<&str, Tally> = BTreeMap::new();
    for seed in seeds {
        let (case, measures, judged) = judge(seed);
        let family = match (case.moving.is_some(), case.loss > 0.0) {
            (false, false) => "fixed hot spot, no loss",
            (false, true) => "fixed hot spot, loss",
            (true, false) => "moving hot spot, no loss",
            (true, true) => "moving hot spot, loss",
        };
        let tally = families.entry(family).or_default();
        tally.workloads += 1;
        tally.missed += usize::from(!judged.is_empty());
        if verbose {
            println!("{}\n    {}", describe(&case), summary(&measures));
        }
        for (c, known) in &judged {
            let line = c.describe(&format!("generated-{seed}"));
            match known {
                Some(reason) => {
                    let gate = if is_reaction(c) {
                        "reaction"
                    } else {
                        "accepted"
                    };
                    let entry = tally
                        .by_reason
                        .entry((*reason, gate.to_string()))
                        .or_insert((0, 0.0, seed));
                    entry.0 += 1;
                    if c.value > entry.1 {
                        (entry.1, entry.2) = (c.value, seed);
                    }
                    if verbose {
                        println!("    {line} [{reason:?}]");
                    }
                }
                None => {
                    let (_, workload) = generate(seed);
                    unexplained.push(format!(
                        "{}\n  {line}\n  {}\n{}",
                        describe(&case),
                        summary(&measures),
                        yaml(&workload)
                    ));
                }
            }
        }
    }
    for (family, tally) in &families {
        println!(
            "{family}: {} workloads, {} missed a gate",
            tally.workloads, tally.missed
        );
        for ((reason, gate), (count, worst, seed)) in &tally.by_reason {
            println!("  {reason:?} ({gate}): {count}, the worst {worst:.3} (seed {seed})");
        }
    }
    println!("unexplained: {}", unexplained.len());
    unexplained
}

#[test]
fn generated_workloads_miss_the_coordinated_gates_only_for_known_reasons() {
    // The first seeds cheap enough for a debug build.
    let seeds: Vec<u64> = (0..)
        .filter(|&s| generate(s).0.operations < 3e5)
        .take(8)
        .collect();
    let unexplained = run_seeds(seeds, false);
    assert!(unexplained.is_empty(), "{}", unexplained.join("\n"));
}

#[test]
fn the_gates_hold_without_loss_for_fixed_hot_spots() {
    // No reason is needed here: every gate holds.
    let mut checked = 0;
    for seed in 0.. {
        let (case, workload) = generate(seed);
        if case.moving.is_some() || case.operations >= 3e5 {
            continue;
        }
        let workload = without_loss(&workload);
        let (measures, missed) = run(&workload);
        assert!(
            missed.is_empty(),
            "{}\n  {}\n  {missed:?}\n{}",
            describe(&case),
            summary(&measures),
            yaml(&workload)
        );
        checked += 1;
        if checked == 6 {
            break;
        }
    }
}

#[test]
#[ignore = "the whole range: run with --release -- --ignored --nocapture"]
fn generated_workloads_over_the_whole_range() {
    let seeds: u64 = std::env::var("TOLLGATE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let unexplained = run_seeds(0..seeds, true);
    assert!(unexplained.is_empty(), "{}", unexplained.join("\n"));
}
