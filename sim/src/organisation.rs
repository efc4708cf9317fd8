//! Organisation workloads: several tenants, each with its pods, whose
//! buckets draw on one organisation's bucket, measured against the ideal
//! hierarchical bucket.
//!
//! [`run`] runs the tree ([`engine::simulate_tree`]: the members' buckets
//! drawing through the stores' transaction script) under each policy and
//! the ideal ([`engine::simulate_ideal_tree`]), then measures every node
//! of the tree as a tenant is measured: the organisation as the sum of
//! all its pods against its own limits, each nested organisation as the
//! sum of the pods below it, each tenant as its own pods against its own
//! limits (its ceiling). Each node is a [`WorkloadRun`] of its view
//! ([`Tree::view`]), so the measures, checks and plots of a tenant apply
//! to it unchanged.
//!
//! Beside those, [`OrganisationBound`] is the organisation's hard bound:
//! what all its members admit together over any window of 60 s or more,
//! against its burst plus its refill over the window.

use crate::engine::{self, Policy};
use crate::measures::Measures;
use crate::record::{Record, TreeRecord};
use crate::workload::{LimitsSpec, Tree, Workload};
use crate::{SimError, WorkloadRun};

/// The shortest window the organisation's bound is measured over,
/// seconds.
pub const BOUND_MIN_WINDOW_SECS: f64 = 60.0;

/// The most all members admitted together beyond the organisation's
/// bucket, over any window of [`BOUND_MIN_WINDOW_SECS`] or more.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct OrganisationBound {
    /// `(admitted − max(burst, initial) − R·T) / (R·T)`, the largest over
    /// every window; negative when no window reaches the bound.
    pub excess: f64,
    /// The window it was reached over, seconds, and where it ended.
    pub window_secs: f64,
    pub end_secs: f64,
}

impl OrganisationBound {
    /// Measures `admitted` (per sample of `sample_secs`, every member's
    /// pods together) against `limits`, over every window of whole
    /// samples at least [`BOUND_MIN_WINDOW_SECS`] long (the whole run if
    /// it is shorter).
    pub fn measure(limits: &LimitsSpec, admitted: &[f64], sample_secs: f64) -> OrganisationBound {
        let mut cumulative = Vec::with_capacity(admitted.len() + 1);
        let mut sum = 0.0;
        cumulative.push(0.0);
        for a in admitted {
            sum += a;
            cumulative.push(sum);
        }
        let n = admitted.len();
        let shortest = ((BOUND_MIN_WINDOW_SECS / sample_secs).round() as usize).clamp(1, n.max(1));
        let burst = limits.burst_limit.max(limits.initial());
        let mut worst = OrganisationBound {
            excess: f64::NEG_INFINITY,
            window_secs: 0.0,
            end_secs: 0.0,
        };
        for len in shortest..=n.max(shortest) {
            let secs = len as f64 * sample_secs;
            let refill = limits.refill_rate * secs;
            for end in len..=n {
                let got = cumulative[end] - cumulative[end - len];
                let excess = (got - burst - refill) / refill;
                if excess > worst.excess {
                    worst = OrganisationBound {
                        excess,
                        window_secs: secs,
                        end_secs: end as f64 * sample_secs,
                    };
                }
            }
        }
        worst
    }
}

/// One policy's run of an organisation.
#[derive(Debug)]
pub struct TreeRun {
    pub policy: Policy,
    pub record: TreeRecord,
    pub bound: OrganisationBound,
}

/// An organisation workload run under every policy, and the ideal.
#[derive(Debug)]
pub struct OrganisationRun {
    pub workload: Workload,
    pub tree: Tree,
    pub ideal: TreeRecord,
    /// The ideal's own bound (at most 0, up to rounding).
    pub ideal_bound: OrganisationBound,
    pub runs: Vec<TreeRun>,
    /// Per node of the tree (the organisation first): its pods measured
    /// against the ideal's as a tenant's are.
    pub nodes: Vec<WorkloadRun>,
}

impl OrganisationRun {
    pub fn policy(&self, policy: Policy) -> Option<&TreeRun> {
        self.runs.iter().find(|r| r.policy == policy)
    }

    /// The measures of node `node` under `policy`.
    pub fn measures(&self, node: usize, policy: Policy) -> Option<&Measures> {
        Some(&self.nodes.get(node)?.policy(policy)?.measures)
    }
}

/// Runs `workload`'s organisation under each of `policies` and against
/// the ideal.
pub fn run(workload: Workload, policies: &[Policy]) -> Result<OrganisationRun, SimError> {
    let spec = workload
        .organisation
        .as_ref()
        .ok_or_else(|| SimError::Invalid(format!("{}: no organisation to run", workload.name)))?;
    let tree = Tree::new(spec);
    let ideal = engine::simulate_ideal_tree(&workload, &tree);
    let mut runs = Vec::new();
    for &policy in policies {
        let record = engine::simulate_tree(&workload, &tree, policy)?;
        let whole = record.scope(&tree, 0);
        let bound = OrganisationBound::measure(
            &tree.nodes[0].limits,
            &whole.admitted_total(),
            whole.sample_secs,
        );
        runs.push(TreeRun {
            policy,
            record,
            bound,
        });
    }
    let whole = ideal.scope(&tree, 0);
    let ideal_bound = OrganisationBound::measure(
        &tree.nodes[0].limits,
        &whole.admitted_total(),
        whole.sample_secs,
    );
    let nodes = (0..tree.nodes.len())
        .map(|node| node_run(&workload, &tree, &ideal, &runs, node))
        .collect();
    Ok(OrganisationRun {
        workload,
        tree,
        ideal,
        ideal_bound,
        runs,
        nodes,
    })
}

/// Node `node` of the tree as a tenant's run: its view, its limits, its
/// pods' records.
fn node_run(
    workload: &Workload,
    tree: &Tree,
    ideal: &TreeRecord,
    runs: &[TreeRun],
    node: usize,
) -> WorkloadRun {
    let view = tree.view(workload, node);
    let limits = tree.nodes[node].limits.clone();
    let ideal: Record = ideal.scope(tree, node);
    let records = runs
        .iter()
        .map(|run| (run.policy, run.record.scope(tree, node)))
        .collect();
    WorkloadRun::new(view, limits, ideal, records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: f64, burst: f64) -> LimitsSpec {
        LimitsSpec {
            refill_rate: rate,
            burst_limit: burst,
            initial_tokens: None,
            budget: None,
        }
    }

    #[test]
    fn the_bound_is_the_worst_window_of_a_minute_or_more() {
        // 10/s, burst 100: 120 s at exactly 10/s after a burst of 100.
        let mut admitted = vec![10.0; 120];
        admitted[0] += 100.0;
        let b = OrganisationBound::measure(&limits(10.0, 100.0), &admitted, 1.0);
        assert!(b.excess.abs() < 1e-12, "{b:?}");
        // With no burst, 60 tokens too many in the second minute: 10 % of
        // a minute's refill over 60 s, less over longer windows.
        admitted[0] -= 100.0;
        admitted[100] += 60.0;
        let b = OrganisationBound::measure(&limits(10.0, 0.0), &admitted, 1.0);
        assert!((b.excess - 0.1).abs() < 1e-12, "{b:?}");
        assert_eq!((b.window_secs, b.end_secs), (60.0, 101.0));
        // A run shorter than a minute is measured whole.
        let b = OrganisationBound::measure(&limits(10.0, 0.0), &[20.0; 30], 1.0);
        assert!((b.excess - 1.0).abs() < 1e-12, "{b:?}");
    }
}
