//! Organisation workloads end to end, through the crate's public API:
//! members' buckets drawing on their organisation's through the stores'
//! script, the ideal hierarchical bucket, the measures per node, the
//! organisation's bound and its check, the report, and the generated
//! corpus.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_sim::check::{self, CHECKED_POLICY};
use tollgate_sim::engine::{self, Policy};
use tollgate_sim::fuzz;
use tollgate_sim::organisation::{self, OrganisationBound};
use tollgate_sim::workload::{Tree, Workload};
use tollgate_sim::{plot, report};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shipped(name: &str) -> Workload {
    let path = crate_dir().join("workloads").join(format!("{name}.yaml"));
    Workload::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Tokens admitted by node `node`'s pods over the run, under `policy`
/// (`None`: the ideal).
fn admitted(run: &organisation::OrganisationRun, node: usize, policy: Option<Policy>) -> f64 {
    let node_run = &run.nodes[node];
    let record = match policy {
        Some(p) => &node_run.policy(p).expect("policy run").record,
        None => &node_run.ideal,
    };
    record.admitted_total().iter().sum()
}

const TWO: &str = "
name: two
duration: 2m
organisation:
  name: acme
  limits: { refill_rate: 100, burst_limit: 1000 }
  members:
    - name: acme-prod
      limits: { refill_rate: 1000, burst_limit: 1000 }
      pods: [ { name: web, count: 3, demand: [ { constant: 100 } ] } ]
    - name: acme-dev
      limits: { refill_rate: 1000, burst_limit: 1000 }
      pods: [ { name: batch, count: 2, demand: [ { constant: 50 } ] } ]
";

#[test]
fn members_draw_on_their_organisation_and_together_stay_within_its_bucket() {
    let workload = Workload::parse(TWO).expect("valid");
    let run = organisation::run(workload, &[CHECKED_POLICY]).expect("runs");
    let tree = &run.tree;
    assert_eq!(tree.nodes.len(), 3);
    // Both members drew about once per draw period (10 s) over 120 s.
    let draws = &run.runs[0].record.draws;
    assert_eq!(draws[0], 0, "the organisation draws on nobody");
    for &d in &draws[1..] {
        assert!((8..=14).contains(&d), "{draws:?}");
    }
    // Everything the members admitted came out of the organisation's
    // bucket: its burst and its refill, within the stated bound.
    let total = admitted(&run, 0, Some(CHECKED_POLICY));
    let limit = 1_000.0 + 100.0 * 120.0;
    assert!(total > 0.8 * limit, "{total}");
    assert!(
        total <= limit * (1.0 + check::ORGANISATION_BOUND),
        "{total}"
    );
    // The organisation's record is its tenants' put together.
    let tenants = admitted(&run, 1, Some(CHECKED_POLICY)) + admitted(&run, 2, Some(CHECKED_POLICY));
    assert!(
        (tenants - total).abs() < 1e-6 * total,
        "{tenants} vs {total}"
    );
    // The ideal splits the rate by demand, 3 to 1, and never passes the
    // organisation's bucket.
    let (prod, dev) = (admitted(&run, 1, None), admitted(&run, 2, None));
    let share = prod / (prod + dev);
    assert!((share - 0.75).abs() < 0.02, "{share}");
    assert!(run.ideal_bound.excess <= 1e-9, "{:?}", run.ideal_bound);
    // Each member's level is its own bucket's, the organisation's its own.
    let levels = &run.runs[0].record.levels;
    assert_eq!(levels.len(), 3);
    assert!(levels.iter().all(|l| l.len() == 120));
}

#[test]
fn the_organisation_bound_check_catches_a_run_that_admits_too_much() {
    let workload = Workload::parse(TWO).expect("valid");
    let mut run = organisation::run(workload, &[CHECKED_POLICY]).expect("runs");
    let bound = |run: &organisation::OrganisationRun| {
        check::check_organisation(run)
            .into_iter()
            .find(|c| c.measure == "organisation bound")
            .expect("the bound is checked")
    };
    let held = bound(&run);
    assert!(held.held && held.passed, "{held:?}");
    // The members' admissions, doubled: far over the organisation's
    // bucket, and the held check fails.
    let whole = run.nodes[0]
        .policy(CHECKED_POLICY)
        .expect("run")
        .record
        .admitted_total();
    let doubled: Vec<f64> = whole.iter().map(|a| 2.0 * a).collect();
    let limits = run.tree.nodes[0].limits.clone();
    run.runs[0].bound = OrganisationBound::measure(&limits, &doubled, 1.0);
    let over = bound(&run);
    assert!(over.value > 0.5 && over.failed(), "{over:?}");
    assert!(
        over.describe("two")
            .starts_with("FAILED: two: organisation bound")
    );
    // With lost messages the bound's premise does not hold: the same
    // excess is reported, not held.
    run.workload.network.loss = 0.01;
    let reported = bound(&run);
    assert!(!reported.passed && !reported.failed(), "{reported:?}");
    assert!(reported.describe("two").starts_with("missed: "));
}

#[test]
fn a_window_over_the_bound_is_found_wherever_it_lies() {
    let limits = tollgate_sim::workload::LimitsSpec {
        refill_rate: 100.0,
        burst_limit: 1_000.0,
        initial_tokens: None,
        budget: None,
    };
    // The burst at once, then the refill: exactly the bound.
    let mut admitted = vec![100.0; 300];
    admitted[0] += 1_000.0;
    let b = OrganisationBound::measure(&limits, &admitted, 1.0);
    assert!(b.excess.abs() < 1e-9, "{b:?}");
    // The burst again two minutes later, with no pause to refill it.
    admitted[150] += 1_000.0;
    let b = OrganisationBound::measure(&limits, &admitted, 1.0);
    assert!(b.excess > 0.0, "{b:?}");
    assert!(b.end_secs > 150.0 && b.window_secs >= 60.0, "{b:?}");
}

#[test]
fn an_idle_member_lends_and_a_guarantee_comes_first_in_the_ideal() {
    let run = organisation::run(shipped("org-idle-lends"), &[CHECKED_POLICY]).expect("runs");
    // The busy member, alone, runs at its 90/s ceiling in the ideal; the
    // sleepy one wakes at 2 minutes.
    let busy = &run.nodes[1].ideal;
    let rate = |r: &tollgate_sim::record::Record, from: usize, to: usize| -> f64 {
        r.admitted_total()[from..to].iter().sum::<f64>() / (to - from) as f64
    };
    assert!(
        (rate(busy, 30, 110) - 90.0).abs() < 1.0,
        "{}",
        rate(busy, 30, 110)
    );
    // Awake, the two split the 100/s by demand within the ceiling: 90
    // (capped) against 100.
    let sleepy = &run.nodes[2].ideal;
    let woke = rate(sleepy, 150, 290);
    assert!((woke - 100.0 * 100.0 / 190.0).abs() < 2.0, "{woke}");

    let run = organisation::run(shipped("org-guarantee"), &[CHECKED_POLICY]).expect("runs");
    // Guaranteed 40/s, wanting 60/s beside one wanting 300/s: 40, then
    // its 20 beyond against 300 for the 60 left.
    let reserved = &run.nodes[2].ideal;
    let got = rate(reserved, 90, 230);
    assert!((got - (40.0 + 60.0 * 20.0 / 320.0)).abs() < 1.5, "{got}");
}

#[test]
fn a_nested_organisation_draws_on_its_parent_and_lends_to_its_tenants() {
    let workload = shipped("org-nested");
    let tree = Tree::new(workload.organisation.as_ref().expect("organisation"));
    assert_eq!(tree.nodes[2].name, "labs");
    assert!(!tree.nodes[2].is_tenant() && tree.nodes[2].depth == 1);
    let record = engine::simulate_tree(&workload, &tree, CHECKED_POLICY).expect("runs");
    // The nested organisation and its tenants drew.
    for node in 1..tree.nodes.len() {
        assert!(record.draws[node] > 10, "{node}: {:?}", record.draws);
    }
    // In the ideal, the nested organisation's tenants never pass its
    // 80/s (and its burst, which it starts without) over any minute.
    let ideal = engine::simulate_ideal_tree(&workload, &tree);
    let labs = ideal.scope(&tree, 2).admitted_total();
    let bound = OrganisationBound::measure(&tree.nodes[2].limits, &labs, 1.0);
    assert!(bound.excess <= 1e-9, "{bound:?}");
}

/// A nested organisation whose id sorts before its members' (`labs`,
/// `labs-ml`) asks its parent for what they ask of it: it draws within
/// their draws, not before them.
#[test]
fn a_nested_organisation_asks_for_what_its_members_want() {
    let run = organisation::run(shipped("org-nested"), &[CHECKED_POLICY]).expect("runs");
    let labs = admitted(&run, 2, Some(CHECKED_POLICY)) / admitted(&run, 2, None);
    assert!(labs > 0.6, "labs admitted {labs:.2} of its ideal");
}

/// Runs the organisation workload in `file` through the command line
/// into `dir`; returns the files written, sorted.
fn report_into(file: &Path, dir: &Path) -> Vec<PathBuf> {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["run", "--check", "--csv", "--out"])
        .arg(dir.join("report"))
        .arg(file)
        .output()
        .expect("run tollgate-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("ok: two: organisation bound"), "{stderr}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("report"))
        .expect("read report")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
}

#[test]
fn an_organisation_reports_the_same_byte_for_byte() {
    let (one, two) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    // One workload file: the report's title names it.
    let workloads = tempfile::tempdir().expect("dir");
    let file = workloads.path().join("two.yaml");
    std::fs::write(&file, TWO).expect("write workload");
    let files = report_into(&file, one.path());
    let again = report_into(&file, two.path());
    assert_eq!(files.len(), again.len());
    assert!(files.len() >= 9, "{files:?}");
    for (a, b) in files.iter().zip(&again) {
        assert_eq!(a.file_name(), b.file_name());
        let (x, y) = (
            std::fs::read(a).expect("read"),
            std::fs::read(b).expect("read"),
        );
        assert!(!x.is_empty() && x == y, "{a:?} differs between two runs");
    }
    let summary = std::fs::read_to_string(one.path().join("report/summary.md")).expect("summary");
    for part in [
        "| · acme-prod | acme | 1000 |",
        "The organisation's bound",
        "| acme-dev |",
        "ideal hierarchical bucket",
        "two-tenants.svg",
    ] {
        assert!(summary.contains(part), "{part} not in\n{summary}");
    }
}

#[test]
fn the_shipped_organisation_workloads_meet_what_is_held() {
    for name in [
        "org-two-busy",
        "org-idle-lends",
        "org-guarantee",
        "org-nested",
    ] {
        let run = organisation::run(shipped(name), &Policy::ALL).expect("runs");
        let checks = check::check_organisation(&run);
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| c.failed())
            .map(|c| c.describe(name))
            .collect();
        assert!(failed.is_empty(), "{failed:#?}");
        // Every node is measured, the organisation first.
        assert_eq!(run.nodes.len(), run.tree.nodes.len());
        assert!(
            checks
                .iter()
                .any(|c| c.measure.ends_with("ceiling over 60 s"))
        );
        // The section and the plots write.
        let dir = tempfile::tempdir().expect("dir");
        let plots = plot::write_organisation_plots(&run, dir.path()).expect("plots");
        let section = report::organisation_section(&run, &plots, &checks);
        assert!(section.starts_with(&format!("## {name}")), "{section}");
    }
}

#[test]
fn generated_organisations_replay_and_meet_the_stated_bound() {
    // The organisation workloads of a few seeds of the corpus CI runs.
    let outcomes = fuzz::organisation::run_corpus(&[0, 5, 10, 15], 2).expect("runs");
    assert_eq!(outcomes.len(), 4);
    assert!(fuzz::organisation::over_held(&outcomes).is_empty());
    let summary = fuzz::organisation::summary(&outcomes);
    assert!(
        summary.contains("4 generated organisation workloads"),
        "{summary}"
    );
    // A generated workload written as YAML is the workload.
    let generated = fuzz::organisation::generate(5).expect("valid");
    let yaml = generated.workload.to_yaml().expect("writes");
    assert_eq!(Workload::parse(&yaml).expect("parses"), generated.workload);
}
