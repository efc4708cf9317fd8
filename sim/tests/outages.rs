//! What an outage allows beyond the stated bound (`Record::outage_excess`):
//! the pods' fallback rates beyond the refill rate over the outage, and
//! the initial allowances of the pods that start during it. Measured on a
//! workload where both are known, and held against the measured overshoot.

use tollgate_sim::check::{self, CHECKED_POLICY};
use tollgate_sim::run_workload;
use tollgate_sim::workload::Workload;

/// Four steady pods at the refill rate; `late` pods join 10 s into a 40 s
/// outage, each with an initial allowance of `allowance`.
fn workload(late: usize, allowance: f64, outage: bool) -> Workload {
    let outages = if outage {
        "outages: [ { start: 1m, duration: 40s } ]\n"
    } else {
        ""
    };
    Workload::parse(&format!(
        "name: outage-joins
duration: 4m
seed: 3
limits: {{ refill_rate: 20, burst_limit: 100 }}
{outages}client: {{ initial_tokens: {allowance} }}
pods:
  - name: steady
    count: 4
    demand: [ {{ constant: 5 }} ]
  - name: late
    count: {late}
    join: 70s
    demand: [ {{ constant: 5 }} ]
"
    ))
    .expect("a valid workload")
}

#[test]
fn an_outage_allows_the_allowances_of_the_pods_started_in_it_and_the_fallback_beyond_the_refill() {
    for (late, allowance) in [(1, 10.0), (6, 50.0), (12, 200.0)] {
        let run = run_workload(workload(late, allowance, true), &[CHECKED_POLICY]).expect("runs");
        let shares = run.policy(CHECKED_POLICY).expect("run");
        let excess = shares.record.outage_excess;
        let allowances = late as f64 * allowance;
        // The allowances, and at most the late pods' pre-answer rates
        // (their allowance per 10 s period) over the outage's 30 s left:
        // the steady pods' fallback rates sum to the refill rate.
        assert!(
            excess >= allowances - 1e-6 && excess <= allowances * (1.0 + 40.0 / 10.0) + 1e-6,
            "{late} late pods of {allowance}: excess {excess}"
        );
        let over = shares.measures.overshoot_60s;
        let bound = check::stated_bound(true, false, excess, 20.0);
        assert!(
            over <= bound,
            "{late} × {allowance}: overshoot {over} > bound {bound}"
        );
    }
    // Without an outage, nothing is allowed beyond the bound.
    let run = run_workload(workload(6, 50.0, false), &[CHECKED_POLICY]).expect("runs");
    assert_eq!(
        run.policy(CHECKED_POLICY)
            .expect("run")
            .record
            .outage_excess,
        0.0
    );
}
