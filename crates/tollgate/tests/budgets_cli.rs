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

/// `tier apply` from a file, which cannot carry budgets yet, refuses to
/// touch a tier that has them (set through PutTier) rather than remove
/// them, and changes nothing.
#[test]
fn tier_apply_refuses_a_tier_with_budgets_it_would_remove() {
    use tollgate_proto::v1;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let tier = v1::Tier {
        name: "free".into(),
        buckets: vec![v1::BucketDefinition {
            bucket: "schedule-email".into(),
            refill_rate: 1.0,
            burst_limit: 10.0,
            initial_tokens: None,
            kind: v1::BucketKind::Shared.into(),
        }],
        budgets: vec![v1::Budget {
            bucket: "schedule-email".into(),
            amount: 1_000.0,
            cycle: Some(v1::BudgetCycle {
                period: v1::BudgetPeriod::Monthly.into(),
                ..Default::default()
            }),
            at_limit: v1::BudgetAtLimit::Stop.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let url = server.url.clone();
    let budgets_kept = move |tier: Option<v1::Tier>| {
        runtime.block_on(async {
            let mut admin = v1::admin_client::AdminClient::connect(url.clone())
                .await
                .expect("connect");
            if let Some(tier) = tier {
                admin
                    .put_tier(v1::PutTierRequest {
                        tier: Some(tier),
                        dry_run: false,
                    })
                    .await
                    .expect("put tier");
            }
            admin
                .get_tier(v1::GetTierRequest {
                    name: "free".into(),
                })
                .await
                .expect("get tier")
                .into_inner()
                .tier
                .expect("tier")
                .budgets
                .len()
        })
    };
    assert_eq!(budgets_kept(Some(tier)), 1);
    let file = dir.path().join("tiers.toml");
    std::fs::write(
        &file,
        "[tiers.free.buckets.schedule-email]\nrefill_rate = 2\nburst_limit = 20\n",
    )
    .expect("write the tiers file");
    let err = refused(&server.tollgate(&[
        "tier",
        "apply",
        "-f",
        file.to_str().expect("utf-8"),
        "--yes",
    ]));
    assert!(
        err.contains("tier free has budgets") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(budgets_kept(None), 1, "the tier kept its budget");
    server.stop();
}
