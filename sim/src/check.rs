//! The goal thresholds, and whether a run meets them.
//!
//! The checks apply to the policy the server runs by default
//! ([`CHECKED_POLICY`]); the others are reported for comparison. A workload
//! may override a threshold only with a written reason, which the report
//! shows next to the goal.
//!
//! Per-partition limits are held to their goals in the coordinated mode,
//! the client as it is ([`check_partitions`]); the local mode only to a
//! sanity check of the simulation: pods counting alone accept what
//! ScyllaDB's rule says they do.
//!
//! Organisations do not meet the token-bucket goals (sim/README.md says by
//! how much and why): [`check_organisation`] holds what is promised instead
//! (the organisation's bound and each tenant's ceiling, within
//! [`organisation_bound`]) and reports every node against the goals
//! without holding them ([`Check::held`]).

use std::time::Duration;

use serde::Serialize;

use crate::WorkloadRun;
use crate::engine::Policy;
use crate::organisation::OrganisationRun;
use crate::partitions::{Mode, PartitionRun};
use crate::workload::{Override, Workload};

/// The policy the checks hold to the thresholds: the server's default.
pub const CHECKED_POLICY: Policy = Policy::Shares;

/// |cumulative divergence| at the end of the run.
pub const GOAL_CUMULATIVE_DIVERGENCE: f64 = 0.01;
/// Overshoot over any 60 s window, as a fraction of refill × 60 s.
pub const GOAL_OVERSHOOT_60S: f64 = 0.02;
/// Slowest convergence after a demand change, in target request periods;
/// judged after the changes the delayed ideal (each pod given its mean
/// ideal allocation over the period before) converges after within this too.
pub const GOAL_CONVERGENCE_PERIODS: f64 = 2.0;
/// Jain's index of per-pod admitted/ideal, when every pod wants the same.
pub const GOAL_JAIN_INDEX: f64 = 0.99;
/// The stated bound: with no outage and no lost message, over any window
/// of 60 s or more, the checked policy admits at most
/// `max(burst, initial) + R·T` plus this share of `R·T`. It is the worst 60 s
/// overshoot measured over 1 000 generated workloads (`tollgate-sim fuzz
/// --count 1000 --seed 0`: 11.85 %, seed 715), rounded up; the goal is
/// [`GOAL_OVERSHOOT_60S`]. CI holds a fixed sample of the corpus to it.
pub const STATED_OVERSHOOT_BOUND: f64 = 0.12;
/// The organisation's stated bound ([`organisation_bound`]) when members
/// draw once per pods' target request period or less often (the server's
/// default, 10 s, for pods asking every 10 s).
pub const ORGANISATION_BOUND: f64 = 0.25;
/// The organisation's stated bound when members draw more often than
/// their pods ask.
pub const ORGANISATION_BOUND_SHORT_DRAWS: f64 = 0.50;
/// Coordinated: a hot spot's mean accepted rate in steady state, at most
/// this many times its limit.
pub const GOAL_HOT_ACCEPTED_MAX: f64 = 1.2;
/// Coordinated: and at least this many times, when the pods together
/// offer it at least the limit.
pub const GOAL_HOT_ACCEPTED_MIN: f64 = 0.8;
/// Coordinated: slowest reaction to a moved hot spot, in report periods.
pub const GOAL_REACTION_PERIODS: f64 = 2.0;
/// Coordinated: share of the operations on partitions offered below their
/// limit that are rejected.
pub const GOAL_FALSE_POSITIVES: f64 = 0.001;
/// Local, a sanity check: a hot spot's accepted rate at most this far (as
/// a share) from the ScyllaDB figure, `Σ min(vᵢ, L)`.
pub const SANITY_LOCAL_FIGURE: f64 = 0.2;

/// One measure held to one threshold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    pub measure: String,
    pub value: f64,
    /// `value` must be at most this (or at least, for Jain's index).
    pub limit: f64,
    pub at_least: bool,
    pub goal: f64,
    /// Why this workload overrides the goal.
    pub reason: Option<String>,
    pub passed: bool,
    /// Whether a miss fails the run (`--check`). An organisation's
    /// accuracy goals are reported against the token-bucket goals but
    /// not held: what is promised instead is held ([`check_organisation`]).
    pub held: bool,
}

impl Check {
    fn new(
        measure: impl Into<String>,
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
            measure: measure.into(),
            value,
            limit,
            at_least,
            goal,
            reason: o.map(|o| o.reason.clone()),
            passed,
            held: true,
        }
    }

    /// This check reported against its goal, not held.
    fn not_held(mut self) -> Check {
        self.held = false;
        self
    }

    /// Whether it fails the run: held and missed.
    pub fn failed(&self) -> bool {
        self.held && !self.passed
    }

    /// A line saying what was measured against what.
    pub fn describe(&self, workload: &str) -> String {
        let op = if self.at_least { ">=" } else { "<=" };
        let verdict = match (self.passed, self.held) {
            (true, _) => "ok",
            (false, true) => "FAILED",
            (false, false) => "missed",
        };
        let mut line = format!(
            "{workload}: {} = {} (must be {op} {})",
            self.measure,
            format_value(&self.measure, self.value),
            format_value(&self.measure, self.limit),
        );
        if let Some(reason) = &self.reason {
            line.push_str(&format!(
                "; goal {} overridden: {reason}",
                format_value(&self.measure, self.goal)
            ));
        }
        if !self.held {
            line.push_str("; a goal, not held (sim/README.md, organisation workloads)");
        }
        format!("{verdict}: {line}")
    }
}

fn format_value(measure: &str, value: f64) -> String {
    // What a check measures, after the node or hot spot it names.
    let measure = measure.rsplit(": ").next().unwrap_or(measure);
    if measure.ends_with("/ limit") {
        format!("{value:.3}×")
    } else if measure.contains("periods") || measure.contains("jain") {
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
    // Judged only after changes the delayed ideal follows in time: where
    // even it does not, the measure is of how far demand moves within a
    // period, not of how fast the policy follows.
    let goal_secs = GOAL_CONVERGENCE_PERIODS * period;
    if let Some(slowest) = m.convergence_max_reachable(goal_secs) {
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

/// Holds the checked policy's run of an organisation to what is promised
/// of it, and reports every node against a tenant's goals.
///
/// Held, when no message is lost and the server is never down (the
/// premise of the stated bounds): the organisation's bound (everything
/// its members admit together, over any window of 60 s or more) and each
/// tenant's ceiling (what it admits over any 60 s window, against its own
/// limits), both within [`organisation_bound`]. Reported against the
/// token-bucket goals and not held: every node's cumulative divergence,
/// 60 s overshoot, convergence and Jain's index against the ideal
/// hierarchical bucket, which the organisations' draws do not meet
/// (sim/README.md says by how much and why).
pub fn check_organisation(run: &OrganisationRun) -> Vec<Check> {
    let w = &run.workload;
    let faults = !w.outages.is_empty() || w.network.loss > 0.0;
    let epsilon = organisation_bound(
        run.tree.draw_period,
        w.client.config().target_request_period,
    );
    let held = |c: Check| if faults { c.not_held() } else { c };
    let mut checks = Vec::new();
    if let Some(checked) = run.policy(CHECKED_POLICY) {
        checks.push(held(Check::new(
            "organisation bound",
            checked.bound.excess,
            epsilon,
            false,
            None,
        )));
    }
    for (node, node_run) in run.tree.nodes.iter().zip(&run.nodes) {
        if node.is_tenant()
            && let Some(p) = node_run.policy(CHECKED_POLICY)
        {
            checks.push(held(Check::new(
                format!("{}: ceiling over 60 s", node.name),
                p.measures.overshoot_60s,
                epsilon,
                false,
                None,
            )));
        }
        for mut c in check(node_run) {
            c.measure = format!("{}: {}", node.name, c.measure);
            checks.push(c.not_held());
        }
    }
    checks
}

/// The organisation's stated bound ε for a draw period: everything its
/// members admit together over any window of T ≥ 60 s is at most
/// `max(burst, initial) + R·T + ε·R·T`, and each member tenant admits
/// over any 60 s at most its own `max(burst, initial) + r·60 + ε·r·60`,
/// with no outage and no lost message. It is the worst measured over
/// 1 000 generated organisation workloads (`tollgate-sim fuzz --count 1000
/// --organisations-only --organisation-every 1`) and the shipped ones
/// under seeds 1 to 8, rounded up (sim/README.md): a member's bucket
/// grants its pods a target period ahead at the rate it last drew, so a
/// draw period shorter than the pods' target period lets members admit
/// more beyond their draws.
pub fn organisation_bound(draw_period: Duration, target_request_period: Duration) -> f64 {
    if draw_period >= target_request_period {
        ORGANISATION_BOUND
    } else {
        ORGANISATION_BOUND_SHORT_DRAWS
    }
}

/// Holds the partition run of `workload` to the goals: the coordinated
/// mode's hot spots and false positives, and the local mode's sanity.
pub fn check_partitions(workload: &Workload, run: &PartitionRun) -> Vec<Check> {
    let mut checks = Vec::new();
    let period = workload.report_period().as_secs_f64();
    if let Some(coordinated) = run.mode(Mode::Coordinated) {
        let m = &coordinated.measures;
        for spot in m.spots.iter().filter(|s| s.steady_secs > 0.0) {
            let name = format!("coordinated {}: accepted / limit", spot.spot);
            checks.push(Check::new(
                name.clone(),
                spot.accepted,
                GOAL_HOT_ACCEPTED_MAX,
                false,
                None,
            ));
            if spot.offered_at_least_limit {
                checks.push(Check::new(
                    name,
                    spot.accepted,
                    GOAL_HOT_ACCEPTED_MIN,
                    true,
                    None,
                ));
            }
        }
        for spot in &m.spots {
            if let Some(slowest) = spot.reaction_max() {
                checks.push(Check::new(
                    format!("coordinated {}: reaction in report periods", spot.spot),
                    slowest / period,
                    GOAL_REACTION_PERIODS,
                    false,
                    None,
                ));
            }
        }
        if m.under_operations > 0 {
            checks.push(Check::new(
                "coordinated false positives",
                m.false_positives,
                GOAL_FALSE_POSITIVES,
                false,
                None,
            ));
        }
    }
    if let Some(local) = run.mode(Mode::Local) {
        for spot in local
            .measures
            .spots
            .iter()
            .filter(|s| s.steady_secs > 0.0 && s.scylla > 0.0)
        {
            checks.push(Check::new(
                format!("local {}: accepted off the ScyllaDB figure", spot.spot),
                (spot.accepted / spot.scylla - 1.0).abs(),
                SANITY_LOCAL_FIGURE,
                false,
                None,
            ));
        }
    }
    checks
}
