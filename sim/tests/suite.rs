//! The simulator end to end: determinism, the shipped workloads, and the
//! `--check` gate as CI runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_sim::engine::Policy;
use tollgate_sim::workload::Workload;
use tollgate_sim::{check, plot, report, run_workload};

const SMALL: &str = "
name: small
duration: 90s
limits: { refill_rate: 500, burst_limit: 2000 }
network: { rtt: 20ms, loss: 0.05, request_timeout: 1s }
outages: [ { start: 40s, duration: 5s } ]
pods:
  - name: a
    count: 2
    demand:
      - constant: 200
      - noise: { stddev: 40 }
  - name: b
    join: 20s
    demand:
      - constant: 100
      - step: { at: 60s, by: 300 }
";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `text` and writes its report into `dir`; returns the files written.
fn report_into(text: &str, dir: &Path) -> Vec<PathBuf> {
    let workload = Workload::parse(text).expect("valid workload");
    let run = run_workload(workload, &Policy::ALL).expect("runs");
    let mut files = plot::write_plots(&run, dir).expect("plots");
    let checks = check::check(&run);
    let section = report::workload_section(&run, &files, &checks);
    std::fs::write(
        dir.join("summary.md"),
        report::document("t", &[section], &[]),
    )
    .expect("write summary");
    std::fs::write(dir.join("series.csv"), report::series_csv(&run)).expect("write csv");
    files.push("summary.md".into());
    files.push("series.csv".into());
    files
}

#[test]
fn the_same_seed_gives_the_same_report_byte_for_byte() {
    let (one, two) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let files = report_into(SMALL, one.path());
    assert_eq!(report_into(SMALL, two.path()), files);
    assert!(files.len() >= 7, "{files:?}");
    for file in &files {
        let a = std::fs::read(one.path().join(file)).expect("read");
        let b = std::fs::read(two.path().join(file)).expect("read");
        assert!(!a.is_empty(), "{file:?} is empty");
        assert!(a == b, "{file:?} differs between two runs of one seed");
    }
    // Another seed draws other noise and losses: another report.
    let other = tempfile::tempdir().expect("dir");
    report_into(
        &SMALL.replace("name: small", "name: small\nseed: 2"),
        other.path(),
    );
    let a = std::fs::read(one.path().join("series.csv")).expect("read");
    let c = std::fs::read(other.path().join("series.csv")).expect("read");
    assert_ne!(a, c);
}

#[test]
fn every_policy_is_measured_against_the_ideal() {
    let workload = Workload::parse(SMALL).expect("valid");
    let run = run_workload(workload, &Policy::ALL).expect("runs");
    assert_eq!(run.runs.len(), 3);
    for r in &run.runs {
        let m = &r.measures;
        assert!(m.admitted > 0.0, "{:?} admitted nothing", r.policy);
        assert!(m.divergence_end.is_finite());
        assert!(m.jain_index > 0.0 && m.jain_index <= 1.0 + 1e-12);
        assert!(m.requests_per_pod_minute > 0.0);
        assert!(
            m.failed_requests > 0,
            "5 % loss and an outage fail requests"
        );
    }
    // The ideal never exceeds what a token bucket allows.
    assert!(run.ideal_measures.overshoot_10s <= 1e-9);
    assert!(run.ideal_measures.overshoot_60s <= 1e-9);
}

#[test]
fn shipped_workloads_are_valid() {
    let mut count = 0;
    for dir in ["workloads", "scale"] {
        for entry in std::fs::read_dir(crate_dir().join(dir)).expect("read dir") {
            let path = entry.expect("entry").path();
            Workload::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            count += 1;
        }
    }
    assert!(
        count >= 8,
        "the suite's seven workloads and the scale check"
    );
}

#[test]
fn check_fails_with_a_clear_message_and_a_bad_file_with_another() {
    let dir = tempfile::tempdir().expect("dir");
    let impossible = format!(
        "{SMALL}thresholds:\n  cumulative_divergence: {{ limit: 0, reason: \"cannot be met\" }}\n"
    )
    .replace("network:", "seed: 3\nnetwork:");
    let file = dir.path().join("impossible.yaml");
    std::fs::write(&file, impossible).expect("write workload");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["run", "--check", "--no-plots", "--out"])
        .arg(dir.path().join("report"))
        .arg(&file)
        .output()
        .expect("run tollgate-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("FAILED: small: cumulative divergence"),
        "{stderr}"
    );
    assert!(stderr.contains("cannot be met"), "{stderr}");
    let summary = std::fs::read_to_string(dir.path().join("report/summary.md")).expect("summary");
    assert!(summary.contains("Failed checks"), "{summary}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, SMALL.replace("count: 2", "count: -2")).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["run", "--out"])
        .arg(dir.path().join("report"))
        .arg(&bad)
        .output()
        .expect("run tollgate-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("count"),
        "{stderr}"
    );
}
