//! The section of an organisation workload: its tree, every node against
//! the ideal hierarchical bucket, the organisation's bound, what each
//! tenant's pods saw, and the checks.

use std::fmt::Write;
use std::path::PathBuf;

use super::{accuracy_row, checks_and_plots, convergence_list, outages_text, percent, seconds};
use crate::check::{self, CHECKED_POLICY, Check};
use crate::humantime_short;
use crate::organisation::{BOUND_MIN_WINDOW_SECS, OrganisationBound, OrganisationRun};

/// One organisation workload's section of the report.
pub fn organisation_section(run: &OrganisationRun, plots: &[PathBuf], checks: &[Check]) -> String {
    let w = &run.workload;
    let tree = &run.tree;
    let top = &tree.nodes[0];
    let mut out = String::new();
    let _ = writeln!(out, "## {}\n", w.name);
    if !w.description.is_empty() {
        let _ = writeln!(out, "{}\n", w.description.trim());
    }
    let tenants = tree.tenants().count();
    let _ = writeln!(
        out,
        "Organisation `{}` of {tenants} tenants ({} pods), {} virtual, refill {} tokens/s, burst {}, \
draw period {}, seed {}, round trip {}, loss {}%{}.\n",
        top.name,
        top.pods.len(),
        humantime_short(w.duration),
        top.limits.refill_rate,
        top.limits.burst_limit,
        humantime_short(tree.draw_period),
        w.seed,
        humantime_short(w.network.rtt),
        w.network.loss * 100.0,
        outages_text(w)
    );
    let checked = run.policy(CHECKED_POLICY);
    let _ = writeln!(
        out,
        "| node | member of | refill (ceiling) | burst | guaranteed | pods | draws ({}) |\n|---|---|---|---|---|---|---|",
        CHECKED_POLICY.name()
    );
    for (i, node) in tree.nodes.iter().enumerate() {
        let indent = "· ".repeat(node.depth);
        let parent = node.parent.map_or("–", |p| tree.nodes[p].name.as_str());
        let draws = match (node.parent, checked) {
            (Some(_), Some(c)) => c.record.draws.get(i).copied().unwrap_or(0).to_string(),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {indent}{}{} | {parent} | {} | {} | {} | {} | {draws} |",
            node.name,
            if node.is_tenant() {
                ""
            } else {
                " (organisation)"
            },
            node.limits.refill_rate,
            node.limits.burst_limit,
            if node.parent.is_some() {
                node.guaranteed.to_string()
            } else {
                "–".into()
            },
            node.pods.len(),
        );
    }
    let epsilon =
        check::organisation_bound(tree.draw_period, w.client.config().target_request_period);
    let _ = writeln!(
        out,
        "\nThe organisation's bound: the most all its members admitted together over any window of \
{BOUND_MIN_WINDOW_SECS:.0} s or more, beyond `max(burst, initial) + R·T`, as a share of `R·T` \
(stated: ≤ {:.0} % with this draw period, without outages or loss):\n\n| policy | excess | over | ending at |\n|---|---|---|---|",
        epsilon * 100.0
    );
    let _ = writeln!(out, "{}", bound_row("ideal", &run.ideal_bound));
    for r in &run.runs {
        let _ = writeln!(out, "{}", bound_row(r.policy.name(), &r.bound));
    }
    let _ = writeln!(
        out,
        "\nEvery node against the ideal hierarchical bucket ({}; an organisation is the sum of the pods \
below it, measured against its own limits; a tenant against its own, its ceiling):\n\n\
| node | admitted / ideal | divergence end | divergence max | overshoot 10 s | overshoot 60 s | pod error max | Jain | convergence max |\n\
|---|---|---|---|---|---|---|---|---|",
        CHECKED_POLICY.name()
    );
    for (node, node_run) in tree.nodes.iter().zip(&run.nodes) {
        if let Some(p) = node_run.policy(CHECKED_POLICY) {
            let _ = writeln!(out, "{}", accuracy_row(&node.name, &p.measures));
        }
    }
    if run.runs.len() > 1 {
        let _ = writeln!(
            out,
            "\nThe organisation under every policy:\n\n\
| policy | admitted / ideal | divergence end | divergence max | overshoot 10 s | overshoot 60 s | pod error max | Jain | convergence max |\n\
|---|---|---|---|---|---|---|---|---|"
        );
        for p in &run.nodes[0].runs {
            let _ = writeln!(out, "{}", accuracy_row(p.policy.name(), &p.measures));
        }
    }
    let _ = writeln!(
        out,
        "\nWhat each tenant's pods saw ({}; ideal in brackets):\n\n\
| tenant | demand | admitted tokens | ideal | req/pod/min | throttled | wait p50 | wait p99 | gave up |\n\
|---|---|---|---|---|---|---|---|---|",
        CHECKED_POLICY.name()
    );
    for t in tree.tenants() {
        let node_run = &run.nodes[t];
        if let Some(p) = node_run.policy(CHECKED_POLICY) {
            let m = &p.measures;
            let i = &node_run.ideal_measures;
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1}% ({:.1}%) | {} ({}) | {} ({}) | {:.2}% ({:.2}%) |",
                tree.nodes[t].name,
                m.demand,
                m.admitted,
                m.ideal_admitted,
                m.requests_per_pod_minute,
                m.waits.throttled * 100.0,
                i.waits.throttled * 100.0,
                seconds(m.waits.p50),
                seconds(i.waits.p50),
                seconds(m.waits.p99),
                seconds(i.waits.p99),
                m.timed_out * 100.0,
                i.timed_out * 100.0,
            );
        }
    }
    out.push('\n');
    if let Some(m) = run.measures(0, CHECKED_POLICY)
        && !m.convergence.is_empty()
    {
        let list = convergence_list(m);
        let _ = writeln!(
            out,
            "Convergence of the organisation's pods after each demand change ({}): {}.\n",
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

fn bound_row(name: &str, b: &OrganisationBound) -> String {
    format!(
        "| {name} | {} | {} | {} |",
        percent(b.excess),
        seconds(b.window_secs),
        seconds(b.end_secs)
    )
}

/// The explanation of organisation sections, once per report that has
/// one.
pub fn legend() -> String {
    format!(
        "Organisation workloads run member tenants, each with its own pods and limits (its ceiling), \
whose buckets draw their refill from the organisation's bucket once per draw period through the \
stores' transaction script, against an **ideal hierarchical bucket**: every tick the organisation's \
tokens are split between the members by the server's rule (`organisation::allocate`: guarantees first, \
then by shares, each member up to its ceiling) over what each member's waiting demand needs, and each \
tenant serves its own pods' queue with what it was handed (sim/README.md). Every node of the tree is \
measured as a tenant is: the organisation as the sum of all its pods against its own limits, a tenant \
as its own pods against its own. The **organisation's bound** is the most all members admitted \
together over any window of {BOUND_MIN_WINDOW_SECS:.0} s or more beyond `max(burst, initial) + R·T`, \
as a share of `R·T`. Held (with no outage and no lost message): that bound within ε = {:.0} % ({:.0} % when \
members draw more often than their pods ask), and each tenant's **ceiling**, its 60 s overshoot against its own \
limits, within the same ε. Every node's divergence, overshoot, convergence and Jain's index are reported against \
the token-bucket goals and marked *missed* when they miss them, but not held: the draws do not meet them \
(sim/README.md says by how much and why).\n",
        check::ORGANISATION_BOUND * 100.0,
        check::ORGANISATION_BOUND_SHORT_DRAWS * 100.0,
    )
}
