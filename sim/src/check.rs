//! The goal thresholds, and whether a run meets them.
//!
//! The checks apply to the policy the server runs by default
//! ([`CHECKED_POLICY`]); the others are reported for comparison. A workload
//! may override a threshold only with a written reason, which the report
//! shows next to the goal.

use serde::Serialize;

use crate::WorkloadRun;
use crate::engine::Policy;
use crate::workload::Override;

/// The policy the checks hold to the thresholds: the server's default.
pub const CHECKED_POLICY: Policy = Policy::Shares;

/// |cumulative divergence| at the end of the run.
pub const GOAL_CUMULATIVE_DIVERGENCE: f64 = 0.01;
/// Overshoot over any 60 s window, as a fraction of refill × 60 s.
pub const GOAL_OVERSHOOT_60S: f64 = 0.02;
/// Slowest convergence after a demand change, in target request periods.
pub const GOAL_CONVERGENCE_PERIODS: f64 = 2.0;
/// Jain's index of per-pod admitted/ideal, when every pod wants the same.
pub const GOAL_JAIN_INDEX: f64 = 0.99;

/// One measure held to one threshold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    pub measure: &'static str,
    pub value: f64,
    /// `value` must be at most this (or at least, for Jain's index).
    pub limit: f64,
    pub at_least: bool,
    pub goal: f64,
    /// Why this workload overrides the goal.
    pub reason: Option<String>,
    pub passed: bool,
}

impl Check {
    fn new(
        measure: &'static str,
        value: f64,
        goal: f64,
        at_least: bool,
        o: Option<&Override>,
    ) -> Check {
        let limit = o.map_or(goal, |o| o.limit);
        let passed = if at_least {
            value >= limit
        } else {
            value <= limit
        };
        Check {
            measure,
            value,
            limit,
            at_least,
            goal,
            reason: o.map(|o| o.reason.clone()),
            passed,
        }
    }

    /// A line saying what was measured against what.
    pub fn describe(&self, workload: &str) -> String {
        let op = if self.at_least { ">=" } else { "<=" };
        let verdict = if self.passed { "ok" } else { "FAILED" };
        let mut line = format!(
            "{workload}: {} = {} (must be {op} {})",
            self.measure,
            format_value(self.measure, self.value),
            format_value(self.measure, self.limit),
        );
        if let Some(reason) = &self.reason {
            line.push_str(&format!(
                "; goal {} overridden: {reason}",
                format_value(self.measure, self.goal)
            ));
        }
        format!("{verdict}: {line}")
    }
}

fn format_value(measure: &str, value: f64) -> String {
    if measure.contains("periods") || measure.contains("jain") {
        if value.is_infinite() {
            "never".into()
        } else {
            format!("{value:.3}")
        }
    } else {
        format!("{:.2}%", value * 100.0)
    }
}

/// Holds the checked policy's measures of `run` to their thresholds.
pub fn check(run: &WorkloadRun) -> Vec<Check> {
    let Some(checked) = run.policy(CHECKED_POLICY) else {
        return Vec::new();
    };
    let m = &checked.measures;
    let w = &run.workload;
    let t = &w.thresholds;
    let period = w.client.config().target_request_period.as_secs_f64();
    let mut checks = vec![
        Check::new(
            "cumulative divergence",
            m.divergence_end.abs(),
            GOAL_CUMULATIVE_DIVERGENCE,
            false,
            t.cumulative_divergence.as_ref(),
        ),
        Check::new(
            "overshoot over 60 s",
            m.overshoot_60s,
            GOAL_OVERSHOOT_60S,
            false,
            t.overshoot_60s.as_ref(),
        ),
    ];
    if let Some(slowest) = m.convergence_max() {
        checks.push(Check::new(
            "convergence in target periods",
            slowest / period,
            GOAL_CONVERGENCE_PERIODS,
            false,
            t.convergence_periods.as_ref(),
        ));
    }
    if w.equal_demand() {
        checks.push(Check::new(
            "jain index",
            m.jain_index,
            GOAL_JAIN_INDEX,
            true,
            t.jain_index.as_ref(),
        ));
    }
    checks
}
