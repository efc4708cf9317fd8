//! Budgets from the command line against a served store: `budget set`,
//! `pod request` cut at the budget, `budget show` (text and JSON), `usage`
//! (JSON and CSV) agreeing with what the pods reported to the micro-unit,
//! `budget clear`, and bad input refused with the field named and nothing
//! on stdout.

mod support;

use std::process::Output;

use serde_json::Value;
use support::Server;

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Tokens a pod of acme is granted from `bucket`.
fn granted_from(server: &Server, bucket: &str, tokens: &str) -> f64 {
    let grant = server.json(&[
        "pod", "request", "--tenant", "acme", "--bucket", bucket, "--tokens", tokens, "--json",
    ]);
    grant["granted_tokens"].as_f64().expect("granted tokens")
}

fn granted(server: &Server, tokens: &str, report_ru: &str) -> f64 {
    let grant = server.json(&[
        "pod",
        "request",
        "--tenant",
        "acme",
        "--tokens",
        tokens,
        "--report-ru",
        report_ru,
        "--json",
    ]);
    grant["granted_tokens"].as_f64().expect("granted tokens")
}

#[test]
fn a_budget_caps_grants_and_its_cycle_keeps_what_the_pods_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    server.set_limits("acme", 10_000.0, 1_000.0, 10_000.0);

    let set = server.json(&[
        "budget",
        "set",
        "--tenant",
        "acme",
        "--amount",
        "100",
        "--cycle",
        "daily",
        "--time-zone",
        "Europe/Paris",
        "--at-limit",
        "stop",
        "--thresholds",
        "50,forecast:100",
        "--price",
        "2",
        "--currency",
        "EUR",
        "--json",
    ]);
    assert_eq!(set["amount"], 100.0);
    assert_eq!(set["period"], "daily");
    assert_eq!(set["time_zone"], "Europe/Paris");
    assert_eq!(set["state"], "under");
    assert_eq!(set["thresholds"], serde_json::json!(["50", "forecast:100"]));

    assert_eq!(granted(&server, "80", "3.5"), 80.0);
    assert_eq!(granted(&server, "80", "1.25"), 20.0, "cut to what remains");
    assert_eq!(granted(&server, "10", "0.000001"), 0.0, "stopped");

    let show = server.json(&["budget", "show", "--tenant", "acme", "--json"]);
    assert_eq!(show["state"], "stopped");
    assert_eq!(show["spend"], 100.0);
    assert_eq!(show["remaining"], 0.0);
    let fired: Vec<&str> = show["fired"]
        .as_array()
        .expect("fired")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(fired.contains(&"50"), "{fired:?}");
    let text = server.ok(&["budget", "show", "--tenant", "acme"]);
    assert!(text.contains("stopped"), "{text}");
    assert!(text.contains("(0.0002 EUR)"), "the spend's price: {text}");

    let usage = server.json(&["usage", "--tenant", "acme", "--json"]);
    let cycles = usage["cycles"].as_array().expect("cycles");
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0]["closed"], false);
    assert_eq!(cycles[0]["granted_tokens"], 100.0);
    assert_eq!(cycles[0]["request_unit_micros"], 4_750_001);
    let csv = server.ok(&["usage", "--tenant", "acme", "--csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let row: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(header.len(), row.len());
    let column = |name: &str| row[header.iter().position(|h| *h == name).expect(name)];
    assert_eq!(column("request_unit_micros"), "4750001");
    assert_eq!(column("spend"), "100");
    assert_eq!(column("closed"), "false");

    let cleared = server.json(&["budget", "clear", "--tenant", "acme", "--json"]);
    assert_eq!(cleared["closed_cycle"]["spend"], 100.0);
    assert_eq!(cleared["closed_cycle"]["request_unit_micros"], 4_750_001);
    let err = refused(&server.tollgate(&["budget", "show", "--tenant", "acme"]));
    assert!(err.contains("has no budget"), "{err}");
    assert!(granted(&server, "10", "0") > 0.0, "no budget, no cap");
    server.stop();
}

#[test]
fn bad_budgets_are_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    server.set_limits("acme", 10.0, 1.0, 10.0);
    let set = |extra: &[&str]| {
        let mut args = vec![
            "budget", "set", "--tenant", "acme", "--amount", "100", "--cycle", "monthly",
        ];
        args.extend_from_slice(extra);
        server.tollgate(&args)
    };
    let err = refused(&set(&[
        "--at-limit",
        "stop",
        "--time-zone",
        "Mars/Olympus_Mons",
    ]));
    assert!(err.contains("budget.cycle.time_zone"), "{err}");
    let err = refused(&set(&["--at-limit", "throttle"]));
    assert!(err.contains("--baseline-rate"), "{err}");
    let err = refused(&set(&["--at-limit", "stop", "--anchor-day", "32"]));
    assert!(err.contains("budget.cycle.anchor_day"), "{err}");
    let err = refused(&set(&["--at-limit", "stop", "--thresholds", "50,lots"]));
    assert!(err.contains("budget.thresholds[1]"), "{err}");
    let err = refused(&set(&["--at-limit", "stop", "--bucket", "schedule-email"]));
    assert!(
        err.contains("schedule-email") && err.contains("does not exist"),
        "{err}"
    );
    let err = refused(&server.tollgate(&["budget", "show", "--tenant", "acme"]));
    assert!(err.contains("has no budget"), "nothing was set: {err}");
    server.stop();
}

/// Budgets in the tiers file, end to end: `tier apply` creates them (the
/// free tier of the CockroachDB RFC, and a budget on a shared bucket), the
/// tier's tenants get them, applying the same file again changes nothing,
/// `tier update` keeps them, and a file without one shows it removed in
/// the plan and removes it (the cycle's record stays).
#[test]
fn the_tiers_file_carries_budgets_to_the_tiers_tenants() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let file = dir.path().join("tiers.toml");
    let path = file.to_str().expect("utf-8");
    let with_budgets = r#"
[tiers.free.budget]
amount = 50_000_000
cycle = "monthly"
at_limit = "throttle"
baseline_rate = 100

[tiers.pro.buckets.schedule-email]
refill_rate = 10
burst_limit = 100

[tiers.pro.buckets.schedule-email.budget]
amount = 100_000
cycle = "daily"
time_zone = "Europe/Paris"
at_limit = "stop"
"#;
    std::fs::write(&file, with_budgets).expect("write the tiers file");
    let applied = server.json(&["tier", "apply", "-f", path, "--yes", "--json"]);
    assert_eq!(applied["changes"], 2, "{applied}");
    let free = server.json(&["tier", "show", "--tier", "free", "--json"]);
    assert_eq!(free["budgets"][0]["bucket"], "", "{free}");
    assert_eq!(free["budgets"][0]["budget"]["amount"], 50_000_000.0);
    let again = server.json(&["tier", "apply", "-f", path, "--yes", "--json"]);
    assert_eq!(again["changes"], 0, "the same file plans nothing: {again}");

    // The tier's tenants get its budgets.
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "pro"]);
    let shown = server.json(&[
        "budget",
        "show",
        "--tenant",
        "acme",
        "--bucket",
        "schedule-email",
        "--json",
    ]);
    assert_eq!(shown["amount"], 100_000.0, "{shown}");
    assert_eq!(shown["time_zone"], "Europe/Paris");
    assert_eq!(shown["at_limit"], "stop");
    granted_from(&server, "schedule-email", "30");

    // `tier update` from flags keeps the tier's budgets.
    server.ok(&[
        "tier",
        "update",
        "--tier",
        "pro",
        "--bucket",
        "schedule-email=20/200",
        "--yes",
    ]);
    let pro = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(pro["budgets"][0]["bucket"], "schedule-email", "{pro}");

    // A file without the budget plans its removal, then removes it.
    let without = with_budgets.replace(
        "[tiers.pro.buckets.schedule-email.budget]\namount = 100_000\ncycle = \"daily\"\ntime_zone = \"Europe/Paris\"\nat_limit = \"stop\"\n",
        "",
    );
    assert_ne!(without, with_budgets);
    std::fs::write(&file, &without).expect("write the tiers file");
    let plan = server.ok(&["tier", "apply", "-f", path, "--dry-run"]);
    assert!(plan.contains("- budget schedule-email"), "{plan}");
    server.ok(&["tier", "apply", "-f", path, "--yes"]);
    let err = refused(&server.tollgate(&[
        "budget",
        "show",
        "--tenant",
        "acme",
        "--bucket",
        "schedule-email",
    ]));
    assert!(err.contains("has no budget"), "{err}");
    let usage = server.json(&[
        "usage",
        "--tenant",
        "acme",
        "--bucket",
        "schedule-email",
        "--json",
    ]);
    assert_eq!(
        usage["cycles"][0]["granted_tokens"], 30.0,
        "the closed cycle's record stays: {usage}"
    );
    server.stop();
}

/// A tiers file with a bad budget is refused whole, naming the key, and
/// changes nothing.
#[test]
fn a_bad_budget_in_the_tiers_file_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let file = dir.path().join("tiers.toml");
    std::fs::write(
        &file,
        "[tiers.free.budget]\namount = 1000\ncycle = \"monthly\"\ntime_zone = \"Europe/Pariss\"\nat_limit = \"stop\"\n",
    )
    .expect("write");
    let err = refused(&server.tollgate(&[
        "tier",
        "apply",
        "-f",
        file.to_str().expect("utf-8"),
        "--yes",
    ]));
    assert!(
        err.contains("tiers.toml:4:13: tiers.free.budget.time_zone"),
        "{err}"
    );
    let tiers = server.json(&["tier", "list", "--json"]);
    assert_eq!(tiers, serde_json::json!([]), "nothing was created");
    server.stop();
}

/// A per-key quota from the tiers file, as `tollgate check` reports it:
/// what is left of the key's month and when it resets, then a refusal
/// once it is spent (exit status 3).
#[test]
fn tollgate_check_reports_a_keys_quota() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let file = dir.path().join("tiers.toml");
    std::fs::write(
        &file,
        "[tiers.api.buckets.calls]\nkind = \"per-key\"\nrefill_rate = 100\nburst_limit = 100\n\
         [tiers.api.buckets.calls.quota]\namount = 5\ncycle = \"monthly\"\n",
    )
    .expect("write the tiers file");
    server.ok(&[
        "tier",
        "apply",
        "-f",
        file.to_str().expect("utf-8"),
        "--yes",
    ]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "api"]);
    let check = |tokens: &str| {
        server.tollgate(&[
            "check", "--tenant", "acme", "--bucket", "calls", "--key", "k1", "--tokens", tokens,
            "--json",
        ])
    };
    let first = check("3");
    assert!(first.status.success(), "{first:?}");
    let answer: Value = serde_json::from_slice(&first.stdout).expect("JSON");
    assert_eq!(answer["quota_remaining"], 2.0, "{answer}");
    let resets = answer["quota_resets_at"].as_str().expect("a reset time");
    assert!(
        resets.ends_with("-01T00:00:00.000Z"),
        "the 1st of a month, UTC: {resets}"
    );
    let refused = check("3");
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let answer: Value = serde_json::from_slice(&refused.stdout).expect("JSON");
    assert_eq!(
        answer["quota_remaining"], 2.0,
        "a refusal takes nothing: {answer}"
    );
    server.stop();
}
