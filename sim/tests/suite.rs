//! The simulator end to end: determinism, the shipped workloads, the
//! `--check` gate as CI runs it, and the partition engine's two modes.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_sim::engine::Policy;
use tollgate_sim::partitions::{self, Mode};
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
            let workload =
                Workload::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // Written with serde and read back, it is the same workload:
            // the structs the files are read into write them too.
            let yaml = workload.to_yaml().expect("writes as YAML");
            let read = Workload::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
            assert_eq!(read, workload, "{}:\n{yaml}", path.display());
            count += 1;
        }
    }
    assert!(
        count >= 11,
        "the suite's seven bucket and three partition workloads, and the scale check"
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

const HOT_SPOT: &str = "
name: hot-spot
duration: 60s
network: { rtt: 20ms, loss: 0.02 }
partitions: { limit: 200, report_period: 2s }
pods:
  - name: pod
    count: 4
    join_spread: 2s
    partitions:
      hot: [ { rate: 200, partition: 0, moving: { every: 20s, among: 3 } } ]
      cold: { rate: 300, partitions: 100000, zipf: 0.8 }
";

/// Runs the partition workload in `file` through the command line into
/// `dir`; returns the files written, sorted.
fn partition_report_into(file: &Path, dir: &Path) -> Vec<PathBuf> {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["run", "--csv", "--out"])
        .arg(dir.join("report"))
        .arg(file)
        .output()
        .expect("run tollgate-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("partitions in 2 modes"), "{stderr}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("report"))
        .expect("read report")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
}

#[test]
fn a_partition_workload_reports_the_same_byte_for_byte() {
    let (one, two) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    // One workload file: the report's title names it.
    let workloads = tempfile::tempdir().expect("dir");
    let file = workloads.path().join("hot-spot.yaml");
    std::fs::write(&file, HOT_SPOT).expect("write workload");
    let files = partition_report_into(&file, one.path());
    let again = partition_report_into(&file, two.path());
    let names = |files: &[PathBuf]| -> Vec<_> {
        files
            .iter()
            .map(|f| f.file_name().map(ToOwned::to_owned))
            .collect()
    };
    assert_eq!(names(&files), names(&again));
    assert_eq!(files.len(), 3, "summary, CSV and one plot: {files:?}");
    for (file, other) in files.iter().zip(&again) {
        let (a, b) = (
            std::fs::read(file).expect("read"),
            std::fs::read(other).expect("read"),
        );
        assert!(!a.is_empty());
        assert!(a == b, "{file:?} differs between two runs of one seed");
    }
    let summary = std::fs::read_to_string(one.path().join("report/summary.md")).expect("summary");
    assert!(
        summary.contains("| coordinated | moving among 0–2 every 20s |"),
        "{summary}"
    );
    let other = tempfile::tempdir().expect("dir");
    let reseeded = workloads.path().join("reseeded.yaml");
    std::fs::write(
        &reseeded,
        HOT_SPOT.replace("duration:", "seed: 2\nduration:"),
    )
    .expect("write workload");
    partition_report_into(&reseeded, other.path());
    let csv = |dir: &Path| std::fs::read(dir.join("report/hot-spot-partitions.csv")).expect("csv");
    assert_ne!(csv(one.path()), csv(other.path()));
}

#[test]
fn pods_alone_accept_their_sum_and_coordinated_pods_the_limit() {
    let workload = Workload::parse(HOT_SPOT).expect("valid");
    let run = partitions::run(&workload, &Mode::ALL).expect("runs");
    let spot = |mode| &run.mode(mode).expect("mode").measures.spots[0];
    let (local, coordinated) = (spot(Mode::Local), spot(Mode::Coordinated));
    // Each of the four pods sees the whole limit.
    assert!((local.scylla - 4.0).abs() < 1e-9, "{}", local.scylla);
    assert!((3.6..=4.1).contains(&local.accepted), "{}", local.accepted);
    assert!(
        (0.8..=1.2).contains(&coordinated.accepted),
        "{}",
        coordinated.accepted
    );
    assert!(
        coordinated.steady_secs > 20.0,
        "{}",
        coordinated.steady_secs
    );
    assert_eq!(coordinated.reactions.len(), 2, "the moves at 20 s and 40 s");
    assert!(local.reaction_max() == Some(f64::INFINITY));
    // The same operations in both modes.
    assert_eq!(
        run.mode(Mode::Local).expect("local").measures.operations,
        run.mode(Mode::Coordinated)
            .expect("coordinated")
            .measures
            .operations
    );
}

#[test]
fn without_answers_coordinated_pods_go_back_to_the_whole_limit() {
    // The server is down from 20 s to 40 s; the report period is 2 s, so
    // from about 24 s the pods apply the limit alone, as the client does.
    let text = HOT_SPOT
        .replace("loss: 0.02", "loss: 0")
        .replace(", moving: { every: 20s, among: 3 }", "")
        .replace(
            "network:",
            "outages: [ { start: 20s, duration: 20s } ]\nnetwork:",
        );
    let workload = Workload::parse(&text).expect("valid");
    let run = partitions::run(&workload, &[Mode::Coordinated]).expect("runs");
    let coordinated = &run.runs[0];
    let series = &coordinated.record.spots[0];
    let bins = |from: f64, to: f64| {
        let per = |t: f64| (t / coordinated.record.bin_secs).round() as usize;
        let accepted: u32 = series.accepted[per(from)..per(to)].iter().sum();
        f64::from(accepted) / (to - from) / 200.0
    };
    let before = bins(10.0, 20.0);
    let alone = bins(26.0, 40.0);
    let after = bins(48.0, 60.0);
    assert!((0.8..=1.2).contains(&before), "{before}");
    assert!((3.6..=4.1).contains(&alone), "{alone}");
    assert!((0.8..=1.2).contains(&after), "{after}");
    let m = &coordinated.measures;
    assert_eq!(m.fallbacks, 4, "each pod once");
    assert!(m.fallback_share > 0.2, "{}", m.fallback_share);
    assert!(m.failed_exchanges >= 4 * 5);
    // The outage and its settling are out of the steady state.
    assert!((0.8..=1.2).contains(&m.spots[0].accepted));

    // A pod that starts while the server is down knows no limit: it
    // admits everything until the first answer.
    let text = text.replace("start: 20s", "start: 0s");
    let workload = Workload::parse(&text).expect("valid");
    let run = partitions::run(&workload, &[Mode::Coordinated]).expect("runs");
    let m = &run.runs[0].measures;
    assert!((0.3..0.4).contains(&m.unlimited), "{}", m.unlimited);
    assert_eq!(m.fallbacks, 0, "never had an answer to fall back from");
}

#[test]
fn fuzz_sums_up_a_corpus_and_its_emitted_workloads_replay() {
    let dir = tempfile::tempdir().expect("dir");
    let emit = dir.path().join("worst");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["fuzz", "--count", "4", "--seed", "0", "--policy", "shares"])
        .arg("--out")
        .arg(dir.path())
        .arg("--emit")
        .arg(&emit)
        .output()
        .expect("run tollgate-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let summary = std::fs::read_to_string(dir.path().join("fuzz.md")).expect("summary");
    assert!(
        summary.contains("4 generated workloads, seeds 0 to 3") && summary.contains("Stated bound"),
        "{summary}"
    );
    // Only the policy asked for is run.
    assert!(!summary.contains("### greedy"), "{summary}");
    let mut emitted: Vec<PathBuf> = std::fs::read_dir(&emit)
        .expect("emitted")
        .map(|e| e.expect("entry").path())
        .collect();
    emitted.sort();
    assert!(!emitted.is_empty());
    for file in &emitted {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
            .args(["run", "--no-plots", "--out"])
            .arg(dir.path().join("replay"))
            .arg(file)
            .output()
            .expect("run tollgate-sim");
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["fuzz", "--count", "1", "--policy", "fastest"])
        .output()
        .expect("run tollgate-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown policy") && stderr.contains("shares"),
        "{stderr}"
    );
}
