//! Generated organisation workloads: member tenants drawing on one
//! organisation's bucket, over the range the organisation goals are meant
//! for.
//!
//! [`generate`] draws, from a seed's own stream (apart from the
//! token-bucket workload of the same seed, which stays as it was), an
//! organisation of 10 to 10⁵ tokens/s with a burst of 0 (one in ten) or
//! 0.1 to 30 seconds of its refill, a draw period of 10 s (two in three)
//! or 2, 5 or 20 s, and 2 to 6 members; a member is a nested organisation
//! one time in six (two or three tenants of its own, rarely a third
//! level), with a ceiling of 0.2 to 3 × the organisation's rate and a
//! guaranteed rate one time in three. Each tenant has 1 to 40 pods
//! (log-uniform) whose demand is drawn as the token-bucket corpus draws a
//! group's (a base rate and up to three more terms), the tenants' means
//! adding up to 0.3 to 3 × the organisation's rate; a tenant is idle for
//! a while one time in four (an on/off term, or pods joining late).
//! Runs last 3 to 6 minutes, with round trips of 0 to 200 ms, no loss (two
//! in three) or 0.1 to 5 %, and one outage of 5 to 30 s one time in six.
//!
//! [`run_seed`] runs a workload and sums up what the organisation checks
//! measure: the organisation's bound, and the goals of every node.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{extra_terms, log_uniform, maybe_noise, millis, round3};
use crate::check::{self, CHECKED_POLICY};
use crate::organisation;
use crate::workload::{
    LimitsSpec, MemberSpec, Network, OrganisationSpec, Outage, PodGroup, Term, Workload,
};
use crate::{SimError, fuzz::Unit};

/// The stream of a seed's generator the organisation workload is drawn
/// from (the token-bucket workload uses the default, 0).
const STREAM: u64 = 1;

/// The shape of a generated organisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shape {
    /// Tenants only.
    Flat,
    /// A nested organisation among the members.
    Nested,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Flat => "flat",
            Shape::Nested => "nested",
        }
    }
}

/// A generated organisation workload.
#[derive(Clone, Debug)]
pub struct Generated {
    pub seed: u64,
    pub shape: Shape,
    pub workload: Workload,
}

/// What [`generate`] draws a member with: its weight in the demand, and
/// the organisation's rate and the run's length.
struct Draw<'a> {
    rng: &'a mut ChaCha8Rng,
    refill: f64,
    duration: f64,
    /// Demand per unit of weight.
    per_weight: f64,
    next_tenant: usize,
}

impl Draw<'_> {
    /// A tenant of weight `weight`.
    fn tenant(&mut self, weight: f64) -> MemberSpec {
        let rng = &mut *self.rng;
        let name = format!("t{}", self.next_tenant);
        self.next_tenant += 1;
        let pods = log_uniform(rng, 1.0, 40.49).round() as usize;
        let base = self.per_weight * weight / pods as f64;
        let mut group = PodGroup::new("pod", pods);
        group
            .demand
            .push(Term::Constant(round3(base * rng.random_range(0.5..1.0))));
        group.demand.extend(extra_terms(rng, base, self.duration));
        group.demand.extend(maybe_noise(rng, base));
        match rng.random_range(0..8) {
            // Idle for a while, then wanting: lending, then waking.
            0 => {
                let off = round3(rng.random_range(20.0..self.duration / 2.0));
                let on = round3(rng.random_range(20.0..self.duration / 2.0));
                group.demand = vec![Term::OnOff {
                    on: millis(on),
                    off: millis(off),
                    rate: round3(base * rng.random_range(0.5..2.0)),
                    start: millis(off),
                }];
            }
            // Its pods join late, spread out.
            1 => {
                group.join = millis(round3(rng.random_range(10.0..self.duration / 2.0)));
                group.join_spread = millis(round3(log_uniform(rng, 0.5, 30.0)));
            }
            _ => {}
        }
        self.member(name, vec![group], Vec::new())
    }

    /// A member named `name` with `pods` or `members`, and limits and a
    /// guarantee of its own.
    fn member(
        &mut self,
        name: String,
        pods: Vec<PodGroup>,
        members: Vec<MemberSpec>,
    ) -> MemberSpec {
        let rng = &mut *self.rng;
        let ceiling = round3(self.refill * log_uniform(rng, 0.2, 3.0));
        let burst = round3(ceiling * log_uniform(rng, 1.0, 10.0));
        let guaranteed = if rng.random_bool(1.0 / 3.0) {
            round3(self.refill * rng.random_range(0.05..0.5))
        } else {
            0.0
        };
        MemberSpec {
            name,
            limits: LimitsSpec {
                refill_rate: ceiling,
                burst_limit: burst,
                initial_tokens: None,
                budget: None,
            },
            guaranteed,
            pods,
            members,
        }
    }

    /// A nested organisation of weight `weight`, `levels` deep.
    fn nested(&mut self, weight: f64, levels: usize) -> MemberSpec {
        let name = format!("o{}", self.next_tenant);
        self.next_tenant += 1;
        let n = self.rng.random_range(2..=3usize);
        let members = (0..n)
            .map(|i| {
                if levels > 1 && i == 0 {
                    self.nested(weight / n as f64, levels - 1)
                } else {
                    self.tenant(weight / n as f64)
                }
            })
            .collect();
        self.member(name, Vec::new(), members)
    }
}

/// The organisation workload of `seed`.
pub fn generate(seed: u64) -> Result<Generated, SimError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(STREAM);
    let refill = round3(log_uniform(&mut rng, 10.0, 1e5));
    let burst = if rng.random_bool(0.1) {
        0.0
    } else {
        round3(refill * log_uniform(&mut rng, 0.1, 30.0))
    };
    let draw_period = match rng.random_range(0..6) {
        0 => 2,
        1 => 5,
        2 => 20,
        _ => 10,
    };
    let duration_secs = rng.random_range(18..=36u32) * 10;
    let duration = f64::from(duration_secs);
    let rtt_ms = rng.random_range(0..=200u64);
    let loss = if rng.random_bool(2.0 / 3.0) {
        0.0
    } else {
        f64::from(rng.random_range(1..=50u32)) / 1000.0
    };
    let outages = if rng.random_bool(1.0 / 6.0) {
        let start = round3(rng.random_range(30.0..duration - 60.0));
        let length = round3(rng.random_range(5.0..30.0));
        vec![Outage {
            start: millis(start),
            duration: millis(length),
        }]
    } else {
        Vec::new()
    };
    let load = log_uniform(&mut rng, 0.3, 3.0);
    let count = rng.random_range(2..=6usize);
    let weights: Vec<f64> = (0..count)
        .map(|_| log_uniform(&mut rng, 0.2, 5.0))
        .collect();
    let total: f64 = weights.iter().sum();
    let nested_at = rng
        .random_bool(1.0 / 6.0)
        .then(|| rng.random_range(0..count));
    let levels = if rng.random_bool(0.2) { 2 } else { 1 };
    let mut draw = Draw {
        rng: &mut rng,
        refill,
        duration,
        per_weight: refill * load / total,
        next_tenant: 0,
    };
    let members = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            if nested_at == Some(i) {
                draw.nested(w, levels)
            } else {
                draw.tenant(w)
            }
        })
        .collect();
    let mut workload = Workload::new(
        format!("fuzz-org-{seed}"),
        Duration::from_secs(u64::from(duration_secs)),
        Vec::new(),
    );
    workload.organisation = Some(OrganisationSpec {
        name: "org".into(),
        limits: LimitsSpec {
            refill_rate: refill,
            burst_limit: burst,
            initial_tokens: None,
            budget: None,
        },
        draw_period: Duration::from_secs(draw_period),
        members,
    });
    let shape = if nested_at.is_some() {
        Shape::Nested
    } else {
        Shape::Flat
    };
    let tree = crate::workload::Tree::new(workload.organisation.as_ref().ok_or_else(|| {
        SimError::Invalid("generated organisation workload without an organisation".into())
    })?);
    workload.description = format!(
        "generated organisation ({}; {} tenants, {} pods; demand {load:.2} x the organisation's refill rate on average)",
        shape.name(),
        tree.tenants().count(),
        tree.nodes[0].pods.len(),
    );
    workload.seed = seed;
    workload.network = Network {
        rtt: Duration::from_millis(rtt_ms),
        loss,
        ..Network::default()
    };
    workload.outages = outages;
    workload.validate().map_err(|e| {
        SimError::Invalid(format!(
            "generated organisation workload of seed {seed}: {e}\n{}",
            workload.to_yaml().unwrap_or_default()
        ))
    })?;
    Ok(Generated {
        seed,
        shape,
        workload,
    })
}

/// How many measures an organisation corpus sums up.
pub const MEASURE_COUNT: usize = 8;

/// The measures summed up over organisation workloads (checked policy),
/// in the order reported: the name, and how it reads.
pub const MEASURES: [(&str, Unit); MEASURE_COUNT] = [
    ("organisation bound (excess over ≥ 60 s)", Unit::Share),
    ("organisation |divergence| end", Unit::Share),
    ("organisation overshoot 60 s", Unit::Share),
    (
        "organisation convergence, followable (periods)",
        Unit::Periods,
    ),
    ("tenant |divergence| end, worst tenant", Unit::Share),
    (
        "tenant overshoot 60 s over its ceiling, worst tenant",
        Unit::Share,
    ),
    (
        "tenant convergence, followable (periods), slowest",
        Unit::Periods,
    ),
    ("draws per member per minute", Unit::Count),
];

/// One organisation workload's outcome under the checked policy.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub shape: Shape,
    pub values: [Option<f64>; MEASURE_COUNT],
    /// The organisation checks it missed, named without the node.
    pub missed: Vec<String>,
    /// Those of them that are held (the bound, a ceiling), as described.
    pub failed: Vec<String>,
    pub outage: bool,
    pub loss: bool,
    /// The draw period, seconds.
    pub draw_period: u64,
}

impl Outcome {
    /// Whether the organisation's stated bound applies: no outage, no
    /// lost message.
    pub fn bound_applies(&self) -> bool {
        !self.outage && !self.loss
    }
}

/// The largest of `values`, `None` if there are none.
fn worst(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.reduce(f64::max)
}

/// Runs the organisation workload of `seed` under the checked policy.
pub fn run_seed(seed: u64) -> Result<Outcome, SimError> {
    let generated = generate(seed)?;
    let workload = generated.workload;
    let outage = !workload.outages.is_empty();
    let loss = workload.network.loss > 0.0;
    let draw_period = workload
        .organisation
        .as_ref()
        .map_or(0, |o| o.draw_period.as_secs());
    let target = workload.client.config().target_request_period;
    let period = target.as_secs_f64();
    let goal = check::GOAL_CONVERGENCE_PERIODS * period;
    let run = organisation::run(workload, &[CHECKED_POLICY])?;
    let whole = run.measures(0, CHECKED_POLICY);
    let tenants: Vec<usize> = run.tree.tenants().collect();
    let tenant_measures = || {
        tenants
            .iter()
            .filter_map(|&t| run.measures(t, CHECKED_POLICY))
    };
    let members = run.tree.nodes.len().saturating_sub(1);
    let minutes = run.workload.duration.as_secs_f64() / 60.0;
    let draws = run
        .policy(CHECKED_POLICY)
        .map(|r| r.record.draws.iter().sum::<u64>() as f64);
    let values = [
        run.policy(CHECKED_POLICY).map(|r| r.bound.excess),
        whole.map(|m| m.divergence_end.abs()),
        whole.map(|m| m.overshoot_60s),
        whole.and_then(|m| m.convergence_max_reachable(goal).map(|c| c / period)),
        worst(tenant_measures().map(|m| m.divergence_end.abs())),
        worst(tenant_measures().map(|m| m.overshoot_60s)),
        worst(
            tenant_measures().filter_map(|m| m.convergence_max_reachable(goal).map(|c| c / period)),
        ),
        draws.map(|d| d / members.max(1) as f64 / minutes),
    ];
    let checks = check::check_organisation(&run);
    let name = run.workload.name.clone();
    let failed = checks
        .iter()
        .filter(|c| c.failed())
        .map(|c| c.describe(&name))
        .collect();
    // Named by what missed it: the organisation (or a nested one), or a
    // tenant.
    let mut missed: Vec<String> = checks
        .into_iter()
        .filter(|c| !c.passed)
        .map(|c| match c.measure.split_once(": ") {
            Some((node, measure)) => {
                let tenant = run
                    .tree
                    .nodes
                    .iter()
                    .any(|n| n.name == node && n.is_tenant());
                format!(
                    "{} {measure}",
                    if tenant { "tenant" } else { "organisation" }
                )
            }
            None => c.measure,
        })
        .collect();
    missed.sort();
    missed.dedup();
    Ok(Outcome {
        seed,
        shape: generated.shape,
        values,
        missed,
        failed,
        outage,
        loss,
        draw_period,
    })
}

/// The worst, p99 and median of measure `k` over `outcomes`: `(worst,
/// seed, p99, median, count)`.
pub fn spread(outcomes: &[&Outcome], k: usize) -> Option<(f64, u64, f64, f64, usize)> {
    let mut values: Vec<(f64, u64)> = outcomes
        .iter()
        .filter_map(|o| Some((o.values[k]?, o.seed)))
        .collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize].0;
    let (worst, seed) = values[values.len() - 1];
    Some((worst, seed, at(0.99), at(0.5), values.len()))
}

/// The organisation workloads' summary, in markdown.
pub fn summary(outcomes: &[Outcome]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let seeds: Vec<String> = outcomes.iter().map(|o| o.seed.to_string()).collect();
    let _ = writeln!(
        out,
        "{} generated organisation workloads (seeds {}), `{}` policy.\n",
        outcomes.len(),
        if seeds.len() > 6 {
            format!(
                "{}, …, {}",
                seeds[..3].join(", "),
                seeds[seeds.len() - 1..].join(", ")
            )
        } else {
            seeds.join(", ")
        },
        CHECKED_POLICY.name()
    );
    let met = outcomes.iter().filter(|o| o.missed.is_empty()).count();
    let _ = writeln!(
        out,
        "Meeting every organisation goal: **{met} of {}**.\n",
        outcomes.len()
    );
    let mut goals: Vec<&str> = outcomes
        .iter()
        .flat_map(|o| o.missed.iter().map(String::as_str))
        .collect();
    goals.sort_unstable();
    goals.dedup();
    let _ = write!(out, "| shape | workloads | meeting every goal |");
    for goal in &goals {
        let _ = write!(out, " missing {goal} |");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "|---|---:|---:|{}", "---:|".repeat(goals.len()));
    for (name, shape) in [
        ("flat", Some(Shape::Flat)),
        ("nested", Some(Shape::Nested)),
        ("all", None),
    ] {
        let of: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| shape.is_none_or(|s| o.shape == s))
            .collect();
        if of.is_empty() {
            continue;
        }
        let met = of.iter().filter(|o| o.missed.is_empty()).count();
        let _ = write!(out, "| {name} | {} | {met} |", of.len());
        for goal in &goals {
            let n = of
                .iter()
                .filter(|o| o.missed.iter().any(|m| m == goal))
                .count();
            let _ = write!(out, " {n} |");
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "\n| measure | worst | seed of the worst | p99 | median | workloads |\n|---|---:|---:|---:|---:|---:|"
    );
    let all: Vec<&Outcome> = outcomes.iter().collect();
    for (k, (name, unit)) in MEASURES.iter().enumerate() {
        if let Some((worst, seed, p99, median, count)) = spread(&all, k) {
            let _ = writeln!(
                out,
                "| {name} | {} | {seed} | {} | {} | {count} |",
                unit.format(worst),
                unit.format(p99),
                unit.format(median)
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThe organisation's bound (`{}`): with no outage and no lost message, over any window of T ≥ {:.0} s, \
everything the members admit together ≤ max(burst, initial) + R·T + ε·R·T with ε = {:.0} % \
({:.0} % when members draw more often than every {} s, their pods' target period).\n\n\
| workloads | count | worst excess | seed | p99 | median |\n|---|---:|---:|---:|---:|---:|",
        CHECKED_POLICY.name(),
        organisation::BOUND_MIN_WINDOW_SECS,
        check::ORGANISATION_BOUND * 100.0,
        check::ORGANISATION_BOUND_SHORT_DRAWS * 100.0,
        crate::workload::ClientSpec::default()
            .config()
            .target_request_period
            .as_secs()
    );
    type Filter = fn(&&Outcome) -> bool;
    let groups: [(&str, Filter); 4] = [
        ("no outage, no loss (the bound)", |o| o.bound_applies()),
        ("loss, no outage", |o| o.loss && !o.outage),
        ("outage", |o| o.outage),
        ("all", |_| true),
    ];
    for (name, keep) in groups {
        let of: Vec<&Outcome> = outcomes.iter().filter(keep).collect();
        if let Some((worst, seed, p99, median, count)) = spread(&of, 0) {
            let _ = writeln!(
                out,
                "| {name} | {count} | {} | {seed} | {} | {} |",
                Unit::Share.format(worst),
                Unit::Share.format(p99),
                Unit::Share.format(median)
            );
        }
    }
    let mut periods: Vec<u64> = outcomes.iter().map(|o| o.draw_period).collect();
    periods.sort_unstable();
    periods.dedup();
    for period in periods {
        let of: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.bound_applies() && o.draw_period == period)
            .collect();
        if let Some((worst, seed, p99, median, count)) = spread(&of, 0) {
            let _ = writeln!(
                out,
                "| the bound, draw period {period} s | {count} | {} | {seed} | {} | {} |",
                Unit::Share.format(worst),
                Unit::Share.format(p99),
                Unit::Share.format(median)
            );
        }
    }
    let over = over_held(outcomes);
    let _ = writeln!(
        out,
        "\n{} of {} organisation workloads the bound applies to miss what is held (the bound, or a \
tenant's ceiling within the same ε).",
        over.len(),
        outcomes.iter().filter(|o| o.bound_applies()).count()
    );
    for o in &over {
        for f in &o.failed {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

/// One line per organisation workload: the seed, its shape, whether the
/// server was down or messages were lost, every measure (empty where it
/// does not apply) and the goals missed.
pub fn csv(outcomes: &[Outcome]) -> String {
    use std::fmt::Write;
    let mut out = String::from("seed,shape,outage,loss,draw_period");
    for (name, _) in MEASURES {
        let _ = write!(out, ",\"{}\"", name.replace('"', "\"\""));
    }
    out.push_str(",missed\n");
    for o in outcomes {
        let _ = write!(
            out,
            "{},{},{},{},{}",
            o.seed,
            o.shape.name(),
            o.outage,
            o.loss,
            o.draw_period
        );
        for v in &o.values {
            out.push(',');
            if let Some(v) = v {
                let _ = write!(out, "{v}");
            }
        }
        let _ = writeln!(out, ",{}", o.missed.join("; "));
    }
    out
}

/// The organisation workloads that miss a held check: with no outage and
/// no lost message, the organisation's bound or a tenant's ceiling.
pub fn over_held(outcomes: &[Outcome]) -> Vec<&Outcome> {
    outcomes.iter().filter(|o| !o.failed.is_empty()).collect()
}

/// The seeds worth replaying: the worst of each measure.
pub fn worst_seeds(outcomes: &[Outcome]) -> Vec<u64> {
    let all: Vec<&Outcome> = outcomes.iter().collect();
    let mut seeds: Vec<u64> = (0..MEASURE_COUNT)
        .filter_map(|k| Some(spread(&all, k)?.1))
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    seeds
}

/// Which seeds of `seeds` draw an organisation workload, one in `every`
/// (none if 0).
pub fn seeds(seeds: &[u64], every: u64) -> Vec<u64> {
    if every == 0 {
        return Vec::new();
    }
    seeds.iter().copied().filter(|s| s % every == 0).collect()
}

/// Runs the organisation workloads of `seeds` on `threads` threads; the
/// outcomes in seed order.
pub fn run_corpus(seeds: &[u64], threads: usize) -> Result<Vec<Outcome>, SimError> {
    super::parallel(seeds, threads, run_seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_valid_organisation_every_time() {
        let mut nested = 0;
        for seed in 0..200 {
            let a = generate(seed).expect("valid");
            let b = generate(seed).expect("valid");
            let yaml = a.workload.to_yaml().expect("writes");
            assert_eq!(yaml, b.workload.to_yaml().expect("writes"));
            assert_eq!(Workload::parse(&yaml).expect("parses"), a.workload);
            nested += usize::from(a.shape == Shape::Nested);
        }
        assert!(nested >= 15, "{nested} nested of 200");
    }

    #[test]
    fn one_seed_in_every_few_draws_an_organisation() {
        assert_eq!(seeds(&[0, 1, 5, 7, 10], 5), vec![0, 5, 10]);
        assert_eq!(seeds(&[3, 4], 1), vec![3, 4]);
        assert!(seeds(&[0, 1], 0).is_empty());
    }
}
