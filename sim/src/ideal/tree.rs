//! The ideal hierarchical bucket: an organisation's bucket shared between
//! its members instantly, the reference an organisation's run is measured
//! against.
//!
//! The real members learn what each other want once per draw period, and
//! their pods once per target period; the ideal knows every tenant's
//! demand at every tick and applies the organisation's rules at once:
//!
//! - The organisation's bucket refills at its rate up to its burst, as the
//!   ideal token bucket does (`super::IdealBucket`): the refill of a tick
//!   flows to demand first, and only what is left is capped at the burst.
//! - Each tick, each node (the organisation, and each nested organisation
//!   below it, top down) splits the tokens it holds between its members by
//!   [`organisation::allocate`], the server's rule: guarantees first (cut
//!   in proportion when they exceed what there is), then the rest by
//!   shares, each member up to its ceiling. A member asks for what its
//!   waiting demand needs this tick (a tenant: the tokens of its queue
//!   beyond those it holds; an organisation: what its members ask, each
//!   up to its ceiling, beyond what it holds), at most its own refill rate
//!   (its ceiling); its shares are what the server's draws weigh it by,
//!   its demand rate (of the tick, at most its ceiling) beyond its
//!   guarantee; its guarantee is reserved while it wants it.
//! - Each tenant's bucket serves its own pods' demand with what it was
//!   handed, as the ideal token bucket does: one queue per tenant, oldest
//!   first, ties in proportion, giving up after `max_wait`.
//!
//! So nothing is ever held back from a member below its ceiling while the
//! organisation holds tokens (what one member leaves is lent to the
//! others the same tick), everything the members admit together comes out
//! of the organisation's bucket (at most its burst + its refill over any
//! window), a member never admits more than its refill rate in a tick
//! once its queue is served, and a member's bucket holds nothing between
//! ticks: it starts empty, as a member's bucket does at its first draw,
//! and takes only what its demand needs. A member's burst limit therefore
//! plays no part in the ideal: in the real tree it bounds what a member
//! keeps of what it drew ahead.

use tollgate_core::organisation::{self, ChildAsk};

use super::{IdealTick, Queue};
use crate::workload::{Tree, Workload};

/// One node of the ideal tree.
#[derive(Debug)]
struct Node {
    children: Vec<usize>,
    refill_rate: f64,
    burst_limit: f64,
    guaranteed: f64,
    tokens: f64,
    /// A tenant's waiting demand (none for an organisation).
    queue: Option<Queue>,
    /// This tick: tokens it asks its parent for, and its demand rate.
    need: f64,
    rate: f64,
}

/// The ideal hierarchical bucket between ticks.
#[derive(Debug)]
pub struct IdealTree {
    nodes: Vec<Node>,
    /// Per pod, its tenant's node.
    tenant_of: Vec<usize>,
    max_wait: f64,
    /// Seconds per tick: demand rates are a tick's demand over it.
    tick: f64,
    last: f64,
}

impl IdealTree {
    pub fn new(workload: &Workload, tree: &Tree) -> IdealTree {
        let nodes = tree
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Node {
                children: n.children.clone(),
                refill_rate: n.limits.refill_rate,
                burst_limit: n.limits.burst_limit,
                guaranteed: n.guaranteed,
                tokens: if i == 0 { n.limits.initial() } else { 0.0 },
                queue: n.is_tenant().then(Queue::default),
                need: 0.0,
                rate: 0.0,
            })
            .collect();
        let pods = tree.nodes.first().map_or(0, |n| n.pods.end);
        let tenant_of = (0..pods).map(|p| tree.tenant_of(p).unwrap_or(0)).collect();
        IdealTree {
            nodes,
            tenant_of,
            max_wait: workload.max_wait.as_secs_f64(),
            tick: workload.tick.as_secs_f64(),
            last: 0.0,
        }
    }

    /// Tokens in each node's bucket as of the last tick, in the tree's
    /// order.
    pub fn levels(&self) -> impl Iterator<Item = f64> + '_ {
        self.nodes.iter().map(|n| n.tokens)
    }

    /// Advances to `now` (seconds): this tick's `arrivals` (`(pod,
    /// tokens)`, pods numbered as in the tree) join their tenants'
    /// queues, the organisation refills and hands its tokens down, and
    /// each tenant serves its queue. Pods in `gone` have left.
    pub fn tick(&mut self, now: f64, arrivals: Vec<(usize, f64)>, gone: &[usize]) -> IdealTick {
        let mut out = IdealTick::default();
        let dt = self.tick;
        let root = &mut self.nodes[0];
        let ceiling = root.tokens.max(root.burst_limit);
        if root.tokens < root.burst_limit || root.burst_limit == 0.0 {
            let elapsed = (now - self.last).max(0.0);
            root.tokens += root.refill_rate * elapsed;
        }
        self.last = now;

        // Each tenant's demand joins its queue: its need and rate.
        let mut by_tenant: Vec<Vec<(usize, f64)>> = vec![Vec::new(); self.nodes.len()];
        for (pod, tokens) in arrivals {
            if let Some(&t) = self.tenant_of.get(pod) {
                by_tenant[t].push((pod, tokens));
            }
        }
        for (node, arrivals) in self.nodes.iter_mut().zip(by_tenant) {
            let Some(queue) = node.queue.as_mut() else {
                continue;
            };
            queue.drop_gone(gone, &mut out);
            node.rate = arrivals.iter().map(|a| a.1).sum::<f64>() / dt;
            queue.push(now, arrivals);
            node.need = (queue.waiting() - node.tokens).max(0.0);
        }
        // An organisation's need and rate: its members', each up to its
        // ceiling (children come after their parent: bottom up is
        // backwards).
        for i in (1..self.nodes.len()).rev() {
            if self.nodes[i].queue.is_some() {
                continue;
            }
            let (mut need, mut rate) = (0.0, 0.0);
            for &c in &self.nodes[i].children {
                let child = &self.nodes[c];
                need += child.need.min(child.refill_rate * dt);
                rate += child.rate.min(child.refill_rate);
            }
            let node = &mut self.nodes[i];
            node.need = (need - node.tokens).max(0.0);
            node.rate = rate;
        }
        // Top down (a parent comes before its children): each
        // organisation splits what it holds between its members.
        for i in 0..self.nodes.len() {
            if self.nodes[i].queue.is_some() {
                continue;
            }
            let children = self.nodes[i].children.clone();
            let asks: Vec<ChildAsk> = children
                .iter()
                .map(|&c| {
                    let child = &self.nodes[c];
                    let rate = child.rate.min(child.refill_rate);
                    ChildAsk {
                        wants: child.need / dt,
                        guaranteed: child.guaranteed,
                        ceiling: child.refill_rate,
                        shares: (rate - child.guaranteed).max(0.0),
                    }
                })
                .collect();
            let given = organisation::allocate(self.nodes[i].tokens / dt, &asks);
            let mut handed = 0.0;
            for (&c, rate) in children.iter().zip(given) {
                let tokens = rate * dt;
                self.nodes[c].tokens += tokens;
                handed += tokens;
            }
            let node = &mut self.nodes[i];
            node.tokens = (node.tokens - handed).max(0.0);
        }
        for node in &mut self.nodes {
            if let Some(queue) = node.queue.as_mut() {
                queue.serve(&mut node.tokens, now, &mut out);
                queue.expire(now, self.max_wait, &mut out);
            }
        }
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let cap = if i == 0 { ceiling } else { node.burst_limit };
            node.tokens = node.tokens.min(cap);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(yaml: &str) -> (Workload, Tree) {
        let workload = Workload::parse(yaml).expect("valid");
        let tree = Tree::new(workload.organisation.as_ref().expect("an organisation"));
        (workload, tree)
    }

    const TWO: &str = "
name: t
duration: 60s
organisation:
  limits: { refill_rate: 100, burst_limit: 0 }
  members:
    - name: a
      limits: { refill_rate: 1000, burst_limit: 1000 }
      pods: [ { demand: [ { constant: 300 } ] } ]
    - name: b
      limits: { refill_rate: 1000, burst_limit: 1000 }
      guaranteed: GUARANTEE
      pods: [ { demand: [ { constant: 100 } ] } ]
";

    /// Tokens each pod was admitted over `secs` seconds of `demand`
    /// (tokens per second per pod).
    fn run(ideal: &mut IdealTree, demand: &[f64], secs: u32) -> Vec<f64> {
        let mut admitted = vec![0.0; demand.len()];
        for k in 0..secs * 10 {
            let now = f64::from(k) / 10.0;
            let arrivals = demand
                .iter()
                .enumerate()
                .map(|(p, d)| (p, d / 10.0))
                .collect();
            for (p, tokens, _) in ideal.tick(now, arrivals, &[]).admitted {
                admitted[p] += tokens;
            }
        }
        admitted
    }

    #[test]
    fn two_busy_members_split_the_rate_by_demand() {
        let (w, t) = tree(&TWO.replace("GUARANTEE", "0"));
        let mut ideal = IdealTree::new(&w, &t);
        let got = run(&mut ideal, &[300.0, 100.0], 60);
        let total: f64 = got.iter().sum();
        // 100/s over 59.9 s of refill (no burst).
        assert!((total - 5_990.0).abs() < 1e-6, "{got:?}");
        assert!((got[0] / total - 0.75).abs() < 1e-9, "{got:?}");
    }

    #[test]
    fn a_guarantee_comes_first_and_an_idle_member_lends_everything() {
        let (w, t) = tree(&TWO.replace("GUARANTEE", "40"));
        let mut ideal = IdealTree::new(&w, &t);
        // b guaranteed 40 of 100, then the 60 left by demand beyond it:
        // a's 300 against b's 60.
        let got = run(&mut ideal, &[300.0, 100.0], 60);
        let rate_b = got[1] / 59.9;
        assert!(
            (rate_b - (40.0 + 60.0 * 60.0 / 360.0)).abs() < 1e-6,
            "{got:?}"
        );
        // b idle: a has all of it.
        let mut ideal = IdealTree::new(&w, &t);
        let got = run(&mut ideal, &[300.0, 0.0], 60);
        assert!((got[0] - 5_990.0).abs() < 1e-6, "{got:?}");
    }

    #[test]
    fn a_ceiling_holds_and_the_burst_is_lent_within_it() {
        let yaml = TWO
            .replace("GUARANTEE", "0")
            .replace("burst_limit: 0", "burst_limit: 1000")
            .replace(
                "- name: a\n      limits: { refill_rate: 1000",
                "- name: a\n      limits: { refill_rate: 50",
            );
        let (w, t) = tree(&yaml);
        let mut ideal = IdealTree::new(&w, &t);
        let got = run(&mut ideal, &[300.0, 100.0], 10);
        // a never passes its 50/s; b takes all it wants from the burst.
        assert!(got[0] <= 50.0 * 10.0 + 1e-9, "{got:?}");
        assert!((got[1] - 1_000.0).abs() < 1e-6, "{got:?}");
    }

    #[test]
    fn a_nested_organisation_is_a_member_with_members() {
        let yaml = "
name: t
duration: 60s
organisation:
  limits: { refill_rate: 100, burst_limit: 0 }
  members:
    - name: a
      limits: { refill_rate: 1000, burst_limit: 1000 }
      pods: [ { demand: [ { constant: 100 } ] } ]
    - name: sub
      limits: { refill_rate: 30, burst_limit: 300 }
      members:
        - name: b
          limits: { refill_rate: 1000, burst_limit: 1000 }
          pods: [ { demand: [ { constant: 100 } ] } ]
        - name: c
          limits: { refill_rate: 1000, burst_limit: 1000 }
          pods: [ { demand: [ { constant: 100 } ] } ]
";
        let (w, t) = tree(yaml);
        let mut ideal = IdealTree::new(&w, &t);
        let got = run(&mut ideal, &[100.0, 100.0, 100.0], 60);
        // sub asks for its members' demand up to its 30/s ceiling: the
        // 100/s split 100 to 30, sub's part evenly between b and c.
        let secs = 59.9;
        assert!(
            (got[0] / secs - 100.0 * 100.0 / 130.0).abs() < 1e-6,
            "{got:?}"
        );
        assert!(
            (got[1] / secs - 100.0 * 15.0 / 130.0).abs() < 1e-6,
            "{got:?}"
        );
        assert!(
            (got[2] / secs - 100.0 * 15.0 / 130.0).abs() < 1e-6,
            "{got:?}"
        );
    }
}
