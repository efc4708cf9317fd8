//! The markdown summary: one table per workload, every policy side by side
//! with the ideal, the checks, and links to the plots; for partition
//! workloads, both modes side by side ([`partitions`]); for organisation
//! workloads, every tenant and organisation of the tree ([`organisation`]).

use std::fmt::Write;
use std::path::PathBuf;

use crate::check::{self, CHECKED_POLICY, Check};
use crate::measures::{CONVERGENCE_TOLERANCE, CONVERGENCE_WINDOW_SECS, Measures};
use crate::workload::Workload;
use crate::{WorkloadRun, humantime_short};

pub mod organisation;
pub mod partitions;

pub use organisation::organisation_section;
pub use partitions::{partition_section, partition_series_csv};

/// `, server down 30s from 1m, …` for a workload's outages (empty if none).
fn outages_text(w: &Workload) -> String {
    if w.outages.is_empty() {
        return String::new();
    }
    let outages: Vec<String> = w
        .outages
        .iter()
        .map(|o| {
            format!(
                "{} from {}",
                humantime_short(o.duration),
                humantime_short(o.start)
            )
        })
        .collect();
    format!(", server down {}", outages.join(", "))
}

/// One workload's section of the report.
pub fn workload_section(run: &WorkloadRun, plots: &[PathBuf], checks: &[Check]) -> String {
    let w = &run.workload;
    let mut out = String::new();
    let pods = w.pod_specs().len();
    let _ = writeln!(out, "## {}\n", w.name);
    if !w.description.is_empty() {
        let _ = writeln!(out, "{}\n", w.description.trim());
    }
    let _ = writeln!(
        out,
        "{pods} pods, {} virtual, refill {} tokens/s, burst {}, seed {}, round trip {}, loss {}%{}.\n",
        humantime_short(w.duration),
        run.limits.refill_rate,
        run.limits.burst_limit,
        w.seed,
        humantime_short(w.network.rtt),
        w.network.loss * 100.0,
        outages_text(w)
    );
    // Two tables: how close each policy comes to the ideal (ratios and
    // times), then what the pods saw (counts and waits), so that no column
    // mixes the two kinds.
    let _ = writeln!(
        out,
        "Against the ideal:\n\n\
         | policy | admitted / ideal | divergence end | divergence max | overshoot 10 s | overshoot 60 s | pod error max | Jain | convergence max |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    let _ = writeln!(out, "{}", ideal_accuracy_row(&run.ideal_measures));
    let _ = writeln!(
        out,
        "{}",
        accuracy_row("delayed ideal", &run.delayed_measures)
    );
    for policy_run in &run.runs {
        let _ = writeln!(
            out,
            "{}",
            accuracy_row(policy_run.policy.name(), &policy_run.measures)
        );
    }
    let _ = writeln!(
        out,
        "\nWhat the pods saw:\n\n\
         | policy | admitted tokens | req/pod/min | throttled | wait p50 | wait p99 | gave up |\n\
         |---|---|---|---|---|---|---|"
    );
    let _ = writeln!(out, "{}", service_row("ideal", &run.ideal_measures, None));
    let _ = writeln!(
        out,
        "{}",
        service_row("delayed ideal", &run.delayed_measures, None)
    );
    for policy_run in &run.runs {
        let m = &policy_run.measures;
        let _ = writeln!(
            out,
            "{}",
            service_row(policy_run.policy.name(), m, Some(m.requests_per_pod_minute))
        );
    }
    out.push('\n');
    if let Some(checked) = run.policy(CHECKED_POLICY)
        && !checked.measures.convergence.is_empty()
    {
        let list = convergence_list(&checked.measures);
        let _ = writeln!(
            out,
            "Convergence after each demand change ({}, beside the delayed ideal; a change \
             the delayed ideal never follows is not judged): {}.\n",
            CHECKED_POLICY.name(),
            list.join("; ")
        );
    }
    checks_and_plots(
        &mut out,
        &format!("Checks ({})", CHECKED_POLICY.name()),
        &w.name,
        checks,
        plots,
    );
    out
}

/// A section's checks, under `heading`, and links to its plots.
pub(crate) fn checks_and_plots(
    out: &mut String,
    heading: &str,
    workload: &str,
    checks: &[Check],
    plots: &[PathBuf],
) {
    if !checks.is_empty() {
        let _ = writeln!(out, "{heading}:\n");
        for c in checks {
            let _ = writeln!(out, "- {}", c.describe(workload));
        }
        out.push('\n');
    }
    if !plots.is_empty() {
        let links: Vec<String> = plots
            .iter()
            .map(|p| {
                let name = p.display().to_string();
                format!("[{name}]({name})")
            })
            .collect();
        let _ = writeln!(out, "Plots: {}\n", links.join(", "));
    }
}

fn percent(v: f64) -> String {
    if v.is_finite() {
        format!("{:+.2}%", v * 100.0)
    } else {
        "∞".into()
    }
}

fn seconds(v: f64) -> String {
    format!("{v:.2} s")
}

fn ideal_accuracy_row(m: &Measures) -> String {
    format!(
        "| ideal | 1 | | | {} | {} | | | |",
        percent(m.overshoot_10s),
        percent(m.overshoot_60s),
    )
}

/// Each demand change of `m`: when it came, how long the policy took to
/// follow it, and the delayed ideal's time.
fn convergence_list(m: &Measures) -> Vec<String> {
    m.convergence
        .iter()
        .map(|c| {
            let after = match c.after {
                Some(after) => format!("{after:.0} s"),
                None => format!("not within {:.0} s", c.observed),
            };
            let reference = match c.reference {
                Some(r) => format!("{r:.0} s"),
                None => "never, not judged".to_string(),
            };
            format!("{:.0} s → {after} (delayed ideal {reference})", c.change_at)
        })
        .collect()
}

fn accuracy_row(name: &str, m: &Measures) -> String {
    let convergence = match m.convergence_max() {
        None => "–".to_string(),
        Some(c) if c.is_finite() => seconds(c),
        Some(_) => "never".to_string(),
    };
    format!(
        "| {name} | {:.4} | {} | {} | {} | {} | {:.2}% | {:.4} | {convergence} |",
        if m.ideal_admitted > 0.0 {
            m.admitted / m.ideal_admitted
        } else {
            0.0
        },
        percent(m.divergence_end),
        percent(m.divergence_max),
        percent(m.overshoot_10s),
        percent(m.overshoot_60s),
        m.pod_error_max * 100.0,
        m.jain_index,
    )
}

/// Admitted tokens, requests (none for the ideal, which sends none) and
/// waits.
fn service_row(name: &str, m: &Measures, requests_per_pod_minute: Option<f64>) -> String {
    format!(
        "| {name} | {:.0} | {} | {:.1}% | {} | {} | {:.2}% |",
        m.admitted,
        requests_per_pod_minute.map_or_else(String::new, |r| format!("{r:.1}")),
        m.waits.throttled * 100.0,
        seconds(m.waits.p50),
        seconds(m.waits.p99),
        m.timed_out * 100.0,
    )
}

/// The explanation of the columns, once per report.
pub fn legend() -> String {
    format!(
        "Per workload, two tables: each policy against the ideal bucket (one instantly \
synchronised bucket, oldest demand first, ties split in proportion), in ratios and times; \
then what the pods saw, in counts and waits. Beside the ideal, the **delayed ideal**: every pod given at \
most its mean ideal allocation over the target period before, the best a protocol whose pods learn their \
rate once a period can do; where it misses a goal too, the checked policy is held to it (sim/README.md). \
Columns:\n\
- **divergence**: (admitted − ideal) / ideal, cumulative since the start; at the end, and the largest at any \
second after the first target request period.\n\
- **overshoot T**: the most admitted in any window of T, minus `max(burst, initial) + refill × T`, \
as a share of `refill × T`; negative when no window reaches the limit.\n\
- **pod error max**, **Jain**: per pod, admitted after the first target period over the ideal's; the largest \
relative error, and Jain's index of the ratios.\n\
- **convergence max**: after each abrupt demand change, the time until the allocation error \
(Σ over pods of |admitted − ideal| / Σ ideal, over {CONVERGENCE_WINDOW_SECS} s windows) is within \
{:.0}% and stays so for a target period; the slowest change.\n\
- **admitted tokens**: tokens admitted over the whole run.\n\
- **req/pod/min**: token-bucket requests answered per pod per minute.\n\
- **throttled**, **wait p50/p99**: share of admitted tokens that waited, and token-weighted wait percentiles.\n\
- **gave up**: share of demand that waited `max_wait` (or was refused at shutdown).\n",
        CONVERGENCE_TOLERANCE * 100.0
    )
}

/// A report of several workloads.
pub fn document(title: &str, sections: &[String], failures: &[String]) -> String {
    document_with(title, sections, failures, false)
}

/// A report of several workloads, explaining organisation sections too
/// if `organisations`.
pub fn document_with(
    title: &str,
    sections: &[String],
    failures: &[String],
    organisations: bool,
) -> String {
    let mut out = format!("# {title}\n\n{}\n", legend());
    let thresholds = format!(
        "Goal thresholds ({} policy): cumulative divergence ≤ {}%, overshoot over 60 s ≤ {}%, \
convergence ≤ {} target periods, Jain's index ≥ {} when every pod wants the same.\n\n",
        CHECKED_POLICY.name(),
        check::GOAL_CUMULATIVE_DIVERGENCE * 100.0,
        check::GOAL_OVERSHOOT_60S * 100.0,
        check::GOAL_CONVERGENCE_PERIODS,
        check::GOAL_JAIN_INDEX,
    );
    out.push_str(&thresholds);
    let _ = writeln!(out, "{}", partitions::legend());
    if organisations {
        let _ = writeln!(out, "{}", organisation::legend());
    }
    if failures.is_empty() {
        out.push_str("Every check passed.\n\n");
    } else {
        out.push_str("Failed checks:\n\n");
        for f in failures {
            let _ = writeln!(out, "- {f}");
        }
        out.push('\n');
    }
    for section in sections {
        out.push_str(section);
    }
    out
}

/// The run's main series as CSV, one row per sample: cumulative admitted
/// (ideal, then each policy) and bucket levels, for analysis elsewhere.
pub fn series_csv(run: &WorkloadRun) -> String {
    let mut out = String::from("time_s,ideal_admitted,ideal_level");
    for r in &run.runs {
        let _ = write!(out, ",{0}_admitted,{0}_level", r.policy.name());
    }
    out.push('\n');
    let ideal = run.ideal.admitted_total();
    let totals: Vec<Vec<f64>> = run.runs.iter().map(|r| r.record.admitted_total()).collect();
    let mut sums = vec![0.0; totals.len() + 1];
    for (k, t) in run.ideal.times.iter().enumerate() {
        sums[0] += ideal[k];
        let _ = write!(out, "{t},{:.3},{:.3}", sums[0], run.ideal.level[k]);
        for (i, r) in run.runs.iter().enumerate() {
            sums[i + 1] += totals[i].get(k).copied().unwrap_or(0.0);
            let level = r.record.level.get(k).copied().unwrap_or(0.0);
            let _ = write!(out, ",{:.3},{:.3}", sums[i + 1], level);
        }
        out.push('\n');
    }
    out
}
