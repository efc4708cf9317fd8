//! The delayed ideal is no strawman: where demand changes less often than
//! every two target periods, it meets every goal itself, so the checks
//! hold a policy to the goals there, not to a weaker reference.
//!
//! The workloads are drawn from seeds over the range the goals are meant
//! for (1 to 300 pods in up to three groups, refill 1 to 10⁶ tokens/s,
//! burst 0 to 100 × the rate, demand 0.2 to 4 × the rate), with steps of
//! demand and groups joining at least two periods and a second apart.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate_sim::check;
use tollgate_sim::run_workload;
use tollgate_sim::workload::Workload;

/// Target request period of the drawn workloads (the default), seconds.
const PERIOD: f64 = 10.0;

fn log_uniform(rng: &mut ChaCha8Rng, low: f64, high: f64) -> f64 {
    (low.ln() + rng.random::<f64>() * (high.ln() - low.ln())).exp()
}

/// The workload of `seed`, as YAML.
fn draw(seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rate = log_uniform(&mut rng, 1.0, 1e6);
    let burst = if rng.random_bool(0.2) {
        0.0
    } else {
        rate * log_uniform(&mut rng, 0.01, 100.0)
    };
    let duration = rng.random_range(180..=420);
    let groups = rng.random_range(1..=3);
    let mean = rate * log_uniform(&mut rng, 0.2, 4.0);
    // Changes at least two periods and a second apart, from the start.
    let mut changes = Vec::new();
    let mut at = 0.0;
    loop {
        at += 2.0 * PERIOD + 1.0 + rng.random_range(0.0..40.0);
        if at > f64::from(duration) - 2.0 * PERIOD || changes.len() == 6 {
            break;
        }
        changes.push(at.round());
    }
    let mut steps: Vec<Vec<String>> = vec![Vec::new(); groups];
    let mut joins = vec![0.0; groups];
    for &at in &changes {
        let g = rng.random_range(0..groups);
        if g > 0 && joins[g] == 0.0 && steps[g].is_empty() && rng.random_bool(0.3) {
            joins[g] = at;
        } else {
            steps[g].push(format!("{{ step: {{ at: {at}s, by: BY{g} }} }}"));
        }
    }
    let mut yaml = format!(
        "name: delayed-{seed}\nduration: {duration}s\nseed: {seed}\n\
         limits: {{ refill_rate: {rate:.3}, burst_limit: {burst:.3} }}\npods:\n"
    );
    for g in 0..groups {
        let count = log_uniform(&mut rng, 1.0, 300.0 / groups as f64).round() as usize;
        let base = mean / groups as f64 / count as f64;
        let mut terms = vec![format!("{{ constant: {base:.6} }}")];
        for step in &steps[g] {
            let by = base * rng.random_range(-0.8..3.0);
            terms.push(step.replace(&format!("BY{g}"), &format!("{by:.6}")));
        }
        yaml.push_str(&format!(
            "  - name: g{g}\n    count: {count}\n    join: {}s\n    demand: [ {} ]\n",
            joins[g],
            terms.join(", ")
        ));
    }
    yaml
}

#[test]
fn where_demand_changes_less_often_than_every_two_periods_it_meets_every_goal() {
    let mut failures = Vec::new();
    for seed in 0..40 {
        let yaml = draw(seed);
        let workload = Workload::parse(&yaml).expect("a drawn workload is valid");
        let changes = workload.demand_changes();
        assert!(
            changes
                .windows(2)
                .all(|w| (w[1] - w[0]).as_secs_f64() > 2.0 * PERIOD),
            "{yaml}"
        );
        let run = run_workload(workload, &[]).expect("runs");
        for c in check::check_delayed(&run) {
            if !c.passed {
                failures.push(format!(
                    "seed {seed}: {}\n{yaml}",
                    c.describe("delayed ideal")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
