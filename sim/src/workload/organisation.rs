//! The `organisation:` part of a workload: an organisation's limits, its
//! member tenants (each with its own limits, an optional guaranteed rate
//! and its pods), and nested organisations.
//!
//! A member with `pods` is a tenant; a member with `members` is an
//! organisation nested in its parent, at most
//! [`organisation::MAX_DEPTH`] organisations above any tenant, as the
//! server allows. Pods are the token-bucket workloads' pod groups, so
//! demand is written the same way in both. The simulator runs the
//! members' buckets drawing on their organisation's bucket through the
//! code the stores run (`crate::engine`), and measures every tenant and
//! organisation against an ideal hierarchical bucket
//! (`crate::ideal::tree`).
//!
//! [`Tree`] is the organisation flattened in depth-first order (the
//! organisation first, each member followed by what lies below it), which
//! is the order of the pods too: the pods under any node are one run of
//! consecutive indices, so a tenant's or a nested organisation's record is
//! a slice of the whole.

use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::organisation::{DEFAULT_DRAW_PERIOD, MAX_DEPTH};
use tollgate_core::validate::MAX_REFILL_RATE;

use super::{LimitsSpec, PodGroup, Workload, is_default};

/// The longest draw period a workload may ask for.
const MAX_DRAW_PERIOD: Duration = Duration::from_secs(600);

/// The organisation of an organisation workload.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OrganisationSpec {
    /// Its id [default: `org`].
    #[serde(default = "default_org_name")]
    pub name: String,
    /// Its bucket: what all its members admit together.
    pub limits: LimitsSpec,
    /// How often a member's bucket draws from its organisation's (the
    /// server's `--draw-period`) [default: 10s].
    #[serde(
        default = "default_draw_period",
        skip_serializing_if = "is_default_draw_period",
        with = "humantime_serde"
    )]
    pub draw_period: Duration,
    pub members: Vec<MemberSpec>,
}

fn default_org_name() -> String {
    "org".into()
}

fn default_draw_period() -> Duration {
    DEFAULT_DRAW_PERIOD
}

fn is_default_draw_period(d: &Duration) -> bool {
    *d == DEFAULT_DRAW_PERIOD
}

/// A member: a tenant (with `pods`) or a nested organisation (with
/// `members`).
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemberSpec {
    /// Its tenant id; unique in the workload.
    pub name: String,
    /// Its own limits: its refill rate is its ceiling. A member's bucket
    /// starts empty at its first draw, so `initial_tokens` is not read.
    pub limits: LimitsSpec,
    /// The rate its organisation reserves for it while it wants it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub guaranteed: f64,
    /// A tenant's pods.
    #[serde(default, skip_serializing_if = "is_default")]
    pub pods: Vec<PodGroup>,
    /// A nested organisation's members.
    #[serde(default, skip_serializing_if = "is_default")]
    pub members: Vec<MemberSpec>,
}

/// One node of a flattened [`Tree`].
#[derive(Clone, Debug, PartialEq)]
pub struct TreeNode {
    pub name: String,
    /// `None` for the organisation at the top.
    pub parent: Option<usize>,
    /// Organisations above it (0 for the top).
    pub depth: usize,
    pub limits: LimitsSpec,
    /// Its guarantee in its parent's bucket (0 for the top).
    pub guaranteed: f64,
    /// Its members, in the file's order (none for a tenant).
    pub children: Vec<usize>,
    /// A tenant's pod groups (none for an organisation).
    pub groups: Vec<PodGroup>,
    /// The pods below it (a tenant's own), as indices of
    /// [`Tree::pod_groups`]' pods.
    pub pods: Range<usize>,
}

impl TreeNode {
    pub fn is_tenant(&self) -> bool {
        self.children.is_empty()
    }
}

/// An organisation flattened: nodes in depth-first order, the top first.
#[derive(Clone, Debug, PartialEq)]
pub struct Tree {
    pub nodes: Vec<TreeNode>,
    pub draw_period: Duration,
}

impl Tree {
    /// Flattens `spec` (validated or not: it only walks it).
    pub fn new(spec: &OrganisationSpec) -> Tree {
        let mut tree = Tree {
            nodes: vec![TreeNode {
                name: spec.name.clone(),
                parent: None,
                depth: 0,
                limits: spec.limits.clone(),
                guaranteed: 0.0,
                children: Vec::new(),
                groups: Vec::new(),
                pods: 0..0,
            }],
            draw_period: spec.draw_period,
        };
        let mut pods = 0;
        for member in &spec.members {
            tree.add(0, member, &mut pods);
        }
        tree.nodes[0].pods = 0..pods;
        tree
    }

    fn add(&mut self, parent: usize, spec: &MemberSpec, pods: &mut usize) {
        let index = self.nodes.len();
        let first = *pods;
        self.nodes.push(TreeNode {
            name: spec.name.clone(),
            parent: Some(parent),
            depth: self.nodes[parent].depth + 1,
            limits: spec.limits.clone(),
            guaranteed: spec.guaranteed,
            children: Vec::new(),
            groups: spec.pods.clone(),
            pods: first..first,
        });
        self.nodes[parent].children.push(index);
        *pods += spec.pods.iter().map(|g| g.count).sum::<usize>();
        for member in &spec.members {
            self.add(index, member, pods);
        }
        self.nodes[index].pods = first..*pods;
    }

    /// The tenants, in order.
    pub fn tenants(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_tenant())
    }

    /// Every tenant's pod groups in order, each named `tenant/group`: the
    /// pods of the whole organisation, in the order of its records.
    pub fn pod_groups(&self) -> Vec<PodGroup> {
        self.groups_below(0)
    }

    /// The pod groups of the tenants at or below `node`.
    pub fn groups_below(&self, node: usize) -> Vec<PodGroup> {
        let mut out = Vec::new();
        self.collect_groups(node, &mut out);
        out
    }

    fn collect_groups(&self, node: usize, out: &mut Vec<PodGroup>) {
        let n = &self.nodes[node];
        for group in &n.groups {
            let mut group = group.clone();
            group.name = format!("{}/{}", n.name, group.name);
            out.push(group);
        }
        for &child in &n.children {
            self.collect_groups(child, out);
        }
    }

    /// `workload` seen from `node`: a plain token-bucket workload of the
    /// pods below it with its limits, which the measures of a tenant's
    /// bucket read (its demand changes, its pods' equal demand, its
    /// limits for the overshoot).
    pub fn view(&self, workload: &Workload, node: usize) -> Workload {
        let mut view = workload.clone();
        view.organisation = None;
        view.limits = Some(self.nodes[node].limits.clone());
        view.pods = self.groups_below(node);
        view
    }

    /// Whether `node` is `above` or lies below it.
    pub fn is_below(&self, node: usize, above: usize) -> bool {
        let mut at = Some(node);
        while let Some(n) = at {
            if n == above {
                return true;
            }
            at = self.nodes.get(n).and_then(|n| n.parent);
        }
        false
    }

    /// The node whose tenant pod `pod` belongs to.
    pub fn tenant_of(&self, pod: usize) -> Option<usize> {
        self.tenants().find(|&t| self.nodes[t].pods.contains(&pod))
    }
}

impl OrganisationSpec {
    /// Checks what serde cannot; errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        check_limits("organisation.limits", &self.limits)?;
        if self.draw_period > MAX_DRAW_PERIOD {
            return Err(format!(
                "organisation.draw_period: at most {}",
                humantime::format_duration(MAX_DRAW_PERIOD)
            ));
        }
        check_id("organisation.name", &self.name)?;
        if self.members.is_empty() {
            return Err("organisation.members: at least one".into());
        }
        let mut names = vec![self.name.clone()];
        for (i, member) in self.members.iter().enumerate() {
            member.validate(&format!("organisation.members[{i}]"), 1, &mut names)?;
        }
        Ok(())
    }
}

impl MemberSpec {
    fn validate(&self, at: &str, depth: usize, names: &mut Vec<String>) -> Result<(), String> {
        check_id(&format!("{at}.name"), &self.name)?;
        if names.contains(&self.name) {
            return Err(format!(
                "{at}.name: {:?} is used twice (a tenant id names one tenant)",
                self.name
            ));
        }
        names.push(self.name.clone());
        check_limits(&format!("{at}.limits"), &self.limits)?;
        if self.limits.initial_tokens.is_some() {
            return Err(format!(
                "{at}.limits.initial_tokens: a member's bucket starts empty at its first draw"
            ));
        }
        if !(self.guaranteed.is_finite() && (0.0..=MAX_REFILL_RATE).contains(&self.guaranteed)) {
            return Err(format!(
                "{at}.guaranteed: must be between 0 and {MAX_REFILL_RATE}"
            ));
        }
        match (self.pods.is_empty(), self.members.is_empty()) {
            (false, true) => Ok(()),
            (true, false) => {
                // An organisation here has `depth` above it and itself.
                if depth + 1 > MAX_DEPTH {
                    return Err(format!(
                        "{at}.members: a tenant below would have {} organisations above it, at most {MAX_DEPTH} may",
                        depth + 1
                    ));
                }
                for (i, member) in self.members.iter().enumerate() {
                    member.validate(&format!("{at}.members[{i}]"), depth + 1, names)?;
                }
                Ok(())
            }
            _ => Err(format!(
                "{at}: a tenant has pods, a nested organisation members: exactly one of the two"
            )),
        }
    }
}

fn check_id(at: &str, name: &str) -> Result<(), String> {
    tollgate_core::TenantId::parse(at, name)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn check_limits(at: &str, spec: &LimitsSpec) -> Result<(), String> {
    let limits = tollgate_core::global_bucket::Limits {
        refill_rate: spec.refill_rate,
        burst_limit: spec.burst_limit,
    };
    limits.validate().map_err(|e| format!("{at}.{e}"))?;
    if spec.refill_rate <= 0.0 {
        return Err(format!("{at}.refill_rate: must be more than zero"));
    }
    if let Some(initial) = spec.initial_tokens
        && !(initial.is_finite() && initial >= 0.0)
    {
        return Err(format!(
            "{at}.initial_tokens: must be finite and non-negative"
        ));
    }
    if spec.budget.is_some() {
        return Err(format!(
            "{at}.budget: budgets of organisations are not simulated (the server's tests cover them)"
        ));
    }
    Ok(())
}
