//! The partition part of a workload's section: both modes side by side,
//! per hot spot, with the false positives, the exchanges and the checks.

use std::fmt::Write;
use std::path::PathBuf;

use crate::check::{self, Check};
use crate::humantime_short;
use crate::partitions::engine::WARM_FRACTION;
use crate::partitions::measures::{
    REACTION_BOUND, REACTION_WINDOW_OPERATIONS, REACTION_WINDOW_SECS, SETTLE_PERIODS, settle_secs,
};
use crate::partitions::{Mode, PartitionRun, SpotMeasures};
use crate::workload::Workload;

/// Moves whose reaction the summary lists one by one.
const REACTIONS_LISTED: usize = 20;

/// The partition part of `workload`'s section; with its heading when the
/// workload has no token-bucket part to open the section.
pub fn partition_section(
    workload: &Workload,
    run: &PartitionRun,
    plots: &[PathBuf],
    checks: &[Check],
    heading: bool,
) -> String {
    let w = workload;
    let mut out = String::new();
    if heading {
        let _ = writeln!(out, "## {}\n", w.name);
        if !w.description.is_empty() {
            let _ = writeln!(out, "{}\n", w.description.trim());
        }
    }
    let Some(spec) = &w.partitions else {
        return out;
    };
    let period = w.report_period();
    let _ = writeln!(
        out,
        "Partitions: {} pods, {} virtual, limit {} operations/s a partition, report period {}, {} arrivals, \
seed {}, round trip {}, loss {}%{}; steady state from {:.2} s after each change.\n",
        w.pod_specs().len(),
        humantime_short(w.duration),
        spec.limit,
        humantime_short(period),
        spec.arrivals.name(),
        w.seed,
        humantime_short(w.network.rtt),
        w.network.loss * 100.0,
        super::outages_text(w),
        settle_secs(w),
    );
    let period_secs = period.as_secs_f64();
    if !run.spots.is_empty() {
        let _ = writeln!(
            out,
            "| mode | hot spot | offered / limit | accepted / limit | each second p5 · p50 · p95 · max | pods alone (ScyllaDB) | reaction max | moves measured |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for mode_run in &run.runs {
            for spot in &mode_run.measures.spots {
                let _ = writeln!(out, "{}", spot_row(mode_run.mode, spot, period_secs));
            }
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "| mode | operations | rejected | false positives | of warm partitions | admitted before the limit was known | exchanges/pod/min | failed exchanges | on whole shares for want of an answer |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for mode_run in &run.runs {
        let m = &mode_run.measures;
        let exchanges = match mode_run.mode {
            Mode::Local => "| – | – | –".to_string(),
            Mode::Coordinated => format!(
                "| {:.1} | {} | {:.2}% of pod time ({} times)",
                m.exchanges_per_pod_minute,
                m.failed_exchanges,
                m.fallback_share * 100.0,
                m.fallbacks
            ),
        };
        let warm = if m.warm_operations > 0 {
            format!(
                "{:.3}% of {}",
                m.warm_false_positives * 100.0,
                m.warm_operations
            )
        } else {
            "–".into()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.3}% | {:.4}% of {} | {warm} | {:.3}% {exchanges} |",
            mode_run.mode.name(),
            m.operations,
            percent_of(m.rejected, m.operations),
            m.false_positives * 100.0,
            m.under_operations,
            m.unlimited * 100.0,
        );
    }
    out.push('\n');
    if let Some(coordinated) = run.mode(Mode::Coordinated) {
        for spot in coordinated
            .measures
            .spots
            .iter()
            .filter(|s| !s.reactions.is_empty())
        {
            let mut list: Vec<String> = spot
                .reactions
                .iter()
                .take(REACTIONS_LISTED)
                .map(|r| match r.after {
                    Some(after) => format!("{:.0} s → {after:.1} s", r.move_at),
                    None => format!("{:.0} s → not within {:.0} s", r.move_at, r.observed),
                })
                .collect();
            if spot.reactions.len() > REACTIONS_LISTED {
                list.push(format!(
                    "… {} more",
                    spot.reactions.len() - REACTIONS_LISTED
                ));
            }
            let _ = writeln!(
                out,
                "Reactions ({}, {}, windows of {} s): {}.\n",
                Mode::Coordinated.name(),
                spot.spot,
                spot.reaction_window,
                list.join("; ")
            );
        }
    }
    super::checks_and_plots(
        &mut out,
        "Checks (coordinated; local for sanity)",
        &w.name,
        checks,
        plots,
    );
    out
}

fn percent_of(part: u64, whole: u64) -> f64 {
    if whole > 0 {
        part as f64 / whole as f64 * 100.0
    } else {
        0.0
    }
}

fn spot_row(mode: Mode, spot: &SpotMeasures, period: f64) -> String {
    let seconds = match &spot.per_second {
        Some(s) => format!("{:.3} · {:.3} · {:.3} · {:.3}", s.p5, s.p50, s.p95, s.max),
        None => "–".into(),
    };
    let reaction = match spot.reaction_max() {
        None => "–".to_string(),
        Some(r) if r.is_finite() => format!("{:.2} periods ({r:.1} s)", r / period),
        Some(_) => "never".to_string(),
    };
    let moves = if spot.reactions.is_empty() && spot.unmeasured_moves == 0 {
        "–".to_string()
    } else {
        format!(
            "{} of {}",
            spot.reactions.len(),
            spot.reactions.len() + spot.unmeasured_moves
        )
    };
    let steady = if spot.steady_secs > 0.0 {
        format!("{:.3}", spot.accepted)
    } else {
        "no steady state".into()
    };
    format!(
        "| {} | {} | {:.3} | {steady} | {seconds} | {:.3} | {reaction} | {moves} |",
        mode.name(),
        spot.spot,
        spot.offered,
        spot.scylla,
    )
}

/// The explanation of the partition columns, and the goals, once per
/// report.
pub fn legend() -> String {
    format!(
        "Partition workloads run every pod's operations twice: **local**, each pod applying the whole \
limit to what it sees (ScyllaDB's per-replica rule), and **coordinated**, the client as it is (reports \
of its hottest partitions, shares from the server, whole shares after two periods without an answer). \
Columns:\n\
- **offered / limit**, **accepted / limit**: a hot spot's mean rates in steady state (from {SETTLE_PERIODS} \
report periods and three round trips after the start, a pod joining or leaving, the hot spot moving, or an \
outage's end; outages excluded), and the accepted rate over each whole second of it.\n\
- **pods alone (ScyllaDB)**: `Σ min(vᵢ, L) / L` over the pods' offered rates, what pods counting alone accept.\n\
- **reaction max**: after each move, the time until the accepted rate over a trailing window ({REACTION_WINDOW_SECS} s, \
or {REACTION_WINDOW_OPERATIONS} operations at the limit if longer) is within {REACTION_BOUND} × the limit \
and stays so for a report period (or until the next move); the slowest move, in report periods.\n\
- **false positives**: rejected operations on partitions that all pods together offer below the limit, \
as a share of their operations; **of warm partitions**: the same for those offered from {WARM_FRACTION} × the \
limit up, where the noise of each pod's count meets its share of the limit.\n\
- **on whole shares for want of an answer**: pod time after a failed exchange two periods or more after \
the last answer, until the next.\n\n\
Partition goals (coordinated): accepted / limit ≤ {} (and ≥ {} when the pods offer at least the limit), \
reaction ≤ {} report periods, false positives ≤ {}%; local, as a sanity check: accepted within {}% of the \
ScyllaDB figure.\n",
        check::GOAL_HOT_ACCEPTED_MAX,
        check::GOAL_HOT_ACCEPTED_MIN,
        check::GOAL_REACTION_PERIODS,
        check::GOAL_FALSE_POSITIVES * 100.0,
        check::SANITY_LOCAL_FIGURE * 100.0,
    )
}

/// The partition runs' series as CSV, one row per second: for each hot
/// spot, operations offered and accepted in each mode.
pub fn partition_series_csv(run: &PartitionRun) -> String {
    let mut out = String::from("time_s");
    for s in 0..run.spots.len() {
        let _ = write!(out, ",spot{s}_offered");
        for r in &run.runs {
            let _ = write!(out, ",spot{s}_{}_accepted", r.mode.name());
        }
    }
    out.push('\n');
    let Some(first) = run.runs.first() else {
        return out;
    };
    let per_second = (1.0 / first.record.bin_secs).round() as usize;
    let bins = first.record.spots.first().map_or(0, |s| s.offered.len());
    for k in 0..bins.div_ceil(per_second) {
        let range = k * per_second..((k + 1) * per_second).min(bins);
        let _ = write!(out, "{}", k + 1);
        for s in 0..run.spots.len() {
            let offered: u64 = first.record.spots[s].offered[range.clone()]
                .iter()
                .map(|&v| u64::from(v))
                .sum();
            let _ = write!(out, ",{offered}");
            for r in &run.runs {
                let accepted: u64 = r.record.spots[s].accepted[range.clone()]
                    .iter()
                    .map(|&v| u64::from(v))
                    .sum();
                let _ = write!(out, ",{accepted}");
            }
        }
        out.push('\n');
    }
    out
}
