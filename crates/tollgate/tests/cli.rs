//! The `tollgate` binary end to end: `serve` on a store file, the tenant
//! commands against it, a graceful stop on SIGTERM, and a restart; and the
//! `--json` output of every command that prints a result, parsed as one
//! JSON document; the text of a grant, a closed stdout, and `tenant watch`
//! through a server restart.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};
use support::{BIN, Server};

#[test]
fn tenant_commands_work_against_a_served_store_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tollgate.redb");
    let server = Server::start(&store);

    let set = server.json(&[
        "tenant",
        "set-limits",
        "--tenant",
        "acme",
        "--available",
        "500",
        "--refill-rate",
        "0",
        "--burst-limit",
        "1000",
        "--json",
    ]);
    assert_eq!(set["tenant_id"], "acme");
    assert_eq!(set["configured"], true);
    assert_eq!(set["current_tokens"], 500.0);

    let grant = server.ok(&[
        "pod",
        "request",
        "--tenant",
        "acme",
        "--instance",
        "3",
        "--tokens",
        "120",
        "--report-ru",
        "42.5",
    ]);
    assert!(grant.contains("granted tokens    120\n"), "{grant}");

    let shown = server.json(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ]);
    assert_eq!(shown["current_tokens"], 380.0);
    assert_eq!(shown["consumption"]["request_units"], 42.5);
    assert_eq!(shown["live_instances"], 1);
    assert_eq!(shown["instances"][0]["instance_id"], 3);

    let table = server.ok(&["tenant", "show", "--tenant", "acme"]);
    assert!(table.contains("request units   42.5"), "{table}");
    assert!(table.contains("INSTANCE"), "{table}");

    server.set_limits("beta", 1.0, 2.0, 3.0);
    let listed = server.json(&["tenant", "list", "--json"]);
    let ids: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|t| t["tenant_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["acme", "beta"]);
    let table = server.ok(&["tenant", "list"]);
    assert!(table.starts_with("TENANT"), "{table}");

    // Bad input: a clear message naming the field, a failing exit code.
    let bad = server.tollgate(&[
        "tenant",
        "set-limits",
        "--tenant",
        "acme",
        "--available",
        "10",
        "--refill-rate",
        "-1",
        "--burst-limit",
        "5",
    ]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("InvalidArgument") && stderr.contains("refill_rate"),
        "{stderr}"
    );
    let missing = server.tollgate(&["tenant", "show", "--tenant", "nobody"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"));

    server.ok(&["tenant", "delete", "--tenant", "beta", "--yes"]);
    server.stop();

    // Same file, new process: everything is still there.
    let server = Server::start(&store);
    let shown = server.json(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ]);
    assert_eq!(shown["current_tokens"], 380.0);
    assert_eq!(shown["consumption"]["request_units"], 42.5);
    let listed = server.json(&["tenant", "list", "--json"]);
    assert_eq!(listed.as_array().expect("array").len(), 1);
    server.stop();
}

#[test]
fn serve_refuses_bad_defaults_with_a_clear_message() {
    let out = Command::new(BIN)
        .args(["serve", "--in-memory", "--default-refill-rate", "NaN"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--default-refill-rate"), "{stderr}");
}

/// A server on a fresh store file; the directory lives as long as the pair.
fn fresh_server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    (dir, server)
}

/// Limits with a burst of 1 000.
fn set_limits(server: &Server, tenant: &str, available: f64, refill_rate: f64) {
    server.set_limits(tenant, available, refill_rate, 1000.0);
}

fn pod_request(server: &Server, tenant: &str, tokens: &str) -> Value {
    server.json(&[
        "pod", "request", "--tenant", tenant, "--tokens", tokens, "--json",
    ])
}

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// A failed command: non-zero exit, nothing on stdout, the reason on stderr.
fn assert_failed_with(out: &Output, reason: &str) {
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(reason), "{stderr}");
}

#[test]
fn pod_request_json_reports_the_grant_and_whether_the_pod_was_throttled() {
    let (_dir, server) = fresh_server();
    // No refill: every grant comes out of the 500 tokens there are.
    set_limits(&server, "acme", 500.0, 0.0);

    let full = pod_request(&server, "acme", "120");
    assert_eq!(full["tenant_id"], "acme");
    assert_eq!(full["instance_id"], 1);
    assert_eq!(full["requested_tokens"], 120.0);
    assert_eq!(full["granted_tokens"], 120.0);
    assert_eq!(full["trickle_duration_seconds"], 0.0);
    assert_eq!(full["max_burst_tokens"], 0.0);
    assert!(number(&full["fallback_rate"]) >= 0.0, "{full:#}");
    assert_eq!(full["throttled"], false, "{full:#}");

    // 380 tokens left: a request for 1000 gets them, at once, and is throttled.
    let short = pod_request(&server, "acme", "1000");
    assert_eq!(short["granted_tokens"], 380.0, "{short:#}");
    assert_eq!(short["trickle_duration_seconds"], 0.0, "{short:#}");
    assert_eq!(short["throttled"], true, "{short:#}");

    // 100 tokens and 10 per second: 500 tokens cannot come at once; the
    // pod gets what the bucket holds and its refill adds, over a trickle. A
    // new pod's shares are new to the bucket, so its first trickle is a
    // quarter of the target period (2.5 s); the next, with the same
    // shares, a whole period (10 s).
    set_limits(&server, "slow", 100.0, 10.0);
    let trickled = pod_request(&server, "slow", "500");
    assert_eq!(trickled["trickle_duration_seconds"], 2.5, "{trickled:#}");
    assert!(number(&trickled["granted_tokens"]) < 500.0, "{trickled:#}");
    assert!(number(&trickled["max_burst_tokens"]) > 0.0, "{trickled:#}");
    assert_eq!(trickled["throttled"], true, "{trickled:#}");
    let again = pod_request(&server, "slow", "500");
    assert_eq!(again["trickle_duration_seconds"], 10.0, "{again:#}");
    assert_eq!(again["throttled"], true, "{again:#}");

    // 100 tokens and 100 per second: 150 tokens come in full, but over the
    // shortest trickle (1 s) rather than at once, which throttles too.
    set_limits(&server, "brisk", 100.0, 100.0);
    let spread = pod_request(&server, "brisk", "150");
    assert!(number(&spread["granted_tokens"]) >= 150.0, "{spread:#}");
    assert_eq!(spread["trickle_duration_seconds"], 1.0, "{spread:#}");
    assert_eq!(spread["throttled"], true, "{spread:#}");

    // The table says the same.
    let empty = server.ok(&["pod", "request", "--tenant", "acme", "--tokens", "50"]);
    assert!(
        empty.contains("throttled         yes: granted 0 of 50 tokens"),
        "{empty}"
    );
    set_limits(&server, "slow-too", 100.0, 10.0);
    let trickled = server.ok(&["pod", "request", "--tenant", "slow-too", "--tokens", "500"]);
    // A new pod: 100 held and 2.5 s of refill, over a quarter of the period.
    assert!(
        trickled.contains("throttled         yes: granted 12")
            && trickled.contains("of 500 tokens, tokens arrive over 2.5 s"),
        "{trickled}"
    );
    set_limits(&server, "plenty", 1000.0, 0.0);
    let granted = server.ok(&["pod", "request", "--tenant", "plenty", "--tokens", "5"]);
    assert!(granted.contains("throttled         no"), "{granted}");

    // Refused input: stdout stays empty, the reason goes to stderr.
    let refused = server.tollgate(&[
        "pod", "request", "--tenant", "acme", "--tokens", "-1", "--json",
    ]);
    assert_failed_with(&refused, "InvalidArgument");
}

#[test]
fn tenant_delete_json_names_the_deleted_tenant_and_a_failed_delete_prints_nothing() {
    let (_dir, server) = fresh_server();
    set_limits(&server, "gone", 10.0, 1.0);

    // Not without asking, and there is no terminal to ask on.
    assert_failed_with(
        &server.tollgate(&["tenant", "delete", "--tenant", "gone", "--json"]),
        "pass --yes",
    );
    server.ok(&["tenant", "show", "--tenant", "gone", "--bucket", ""]);

    let deleted = server.json(&["tenant", "delete", "--tenant", "gone", "--yes", "--json"]);
    assert_eq!(deleted["tenant_id"], "gone");
    assert_eq!(deleted["deleted"], true);
    let closed = deleted["closed"].as_array().expect("closed records");
    assert_eq!(closed.len(), 1, "{deleted:#}");
    assert_eq!(closed[0]["bucket"], "");
    assert_eq!(closed[0]["reason"], "tenant-deleted");
    assert_failed_with(
        &server.tollgate(&[
            "tenant", "show", "--tenant", "gone", "--bucket", "", "--json",
        ]),
        "NotFound",
    );
    assert_failed_with(
        &server.tollgate(&["tenant", "delete", "--tenant", "gone", "--yes", "--json"]),
        "NotFound",
    );
}

fn migrate(store: &str, json: bool) -> Output {
    let mut command = support::command();
    command
        .args(["migrate", "--store", store])
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn");
    if json {
        command.arg("--json");
    }
    command.output().expect("run tollgate migrate")
}

fn migrate_json(store: &Path) -> Value {
    let out = migrate(&store.display().to_string(), true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

#[test]
fn migrate_without_a_store_refuses_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = support::command()
        .arg("migrate")
        .env_remove("DATABASE_URL")
        .current_dir(dir.path())
        .output()
        .expect("run tollgate migrate");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--store"), "{said}");
    assert!(
        std::fs::read_dir(dir.path())
            .expect("read dir")
            .next()
            .is_none(),
        "migrate left a file behind"
    );
}

#[test]
fn migrate_json_names_the_store_file_and_whether_it_created_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("state").join("tollgate.redb");
    let path = store.display().to_string();

    let created = migrate_json(&store);
    assert_eq!(
        created,
        json!({"store": {"kind": "file", "path": path}, "created": true})
    );
    assert!(store.exists());

    let again = migrate_json(&store);
    assert_eq!(again["created"], false, "{again:#}");
    assert_eq!(again["store"]["path"], path.as_str());

    let text = migrate(&path, false);
    assert_eq!(
        String::from_utf8_lossy(&text.stdout),
        format!("file {path}: schema is up to date\n")
    );

    assert_failed_with(
        &migrate("postgres://user@host:notaport/db", true),
        "not a valid PostgreSQL URL",
    );
}

#[test]
fn bench_json_is_one_document_with_durations_in_seconds() {
    let (_dir, server) = fresh_server();
    let report = server.json(&[
        "bench",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
        "--tenants",
        "1",
        "--instances-per-tenant",
        "2",
        "--tenant-prefix",
        "json",
        "--json",
    ]);
    assert_eq!(report["warmup_seconds"], 0.1, "{report:#}");
    assert_eq!(report["measured_seconds"], 0.3, "{report:#}");
    assert_eq!(report["pods"], 2, "{report:#}");
    assert!(report["latency_us"]["p50"].is_u64(), "{report:#}");
    let tenant = &report["tenants"]["json-0"];
    assert!(number(&tenant["granted_tokens"]) > 0.0, "{report:#}");
}

/// A tenant's buckets from the command line: created with `set-limits
/// --bucket`, gated with `pod request --bucket`, shown all at once by
/// `tenant show` and one by one with `--bucket`, listed with their names.
#[test]
fn bucket_options_reach_each_bucket_and_show_lists_them_all() {
    let (_dir, server) = fresh_server();
    for (bucket, burst) in [("schedule-email", "100"), ("invoke-doc-summary-ai", "20")] {
        server.ok(&[
            "tenant",
            "set-limits",
            "--tenant",
            "t1234",
            "--bucket",
            bucket,
            "--available",
            burst,
            "--refill-rate",
            "1",
            "--burst-limit",
            burst,
        ]);
    }
    let bulk = server.json(&[
        "pod",
        "request",
        "--tenant",
        "t1234",
        "--bucket",
        "schedule-email",
        "--tokens",
        "50",
        "--json",
    ]);
    assert_eq!(bulk["bucket"], "schedule-email");
    assert_eq!(bulk["granted_tokens"], 50.0);
    assert_eq!(bulk["throttled"], false);
    let missing = server.tollgate(&[
        "pod", "request", "--tenant", "t1234", "--bucket", "nope", "--tokens", "1",
    ]);
    assert_failed_with(&missing, "NotFound");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nope"));

    let all = server.json(&["tenant", "show", "--tenant", "t1234", "--json"]);
    let buckets: Vec<&str> = all
        .as_array()
        .expect("a list of buckets")
        .iter()
        .map(|b| b["bucket"].as_str().expect("name"))
        .collect();
    assert_eq!(buckets, vec!["invoke-doc-summary-ai", "schedule-email"]);
    let email = &all[1];
    assert_eq!(number(&email["current_tokens"]).round(), 50.0);
    assert_eq!(email["instances"][0]["instance_id"], 1);
    let one = server.json(&[
        "tenant",
        "show",
        "--tenant",
        "t1234",
        "--bucket",
        "invoke-doc-summary-ai",
        "--json",
    ]);
    assert_eq!(one["current_tokens"], 20.0);
    let text = server.ok(&["tenant", "show", "--tenant", "t1234"]);
    assert!(
        text.contains("schedule-email") && text.contains("invoke-doc-summary-ai"),
        "{text}"
    );
    let table = server.ok(&["tenant", "list"]);
    assert!(
        table.contains("BUCKET") && table.contains("schedule-email"),
        "{table}"
    );
    assert_failed_with(
        &server.tollgate(&["tenant", "show", "--tenant", "t1234", "--bucket", "a b"]),
        "bucket",
    );
}

#[test]
fn completions_load_in_bash_and_name_the_commands() {
    let completions = |shell: &str| {
        let out = support::command()
            .args(["completions", shell])
            .output()
            .expect("run tollgate completions");
        assert!(out.status.success(), "{shell}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let script = completions("bash");
    assert!(script.contains("set-limits") && script.contains("--as-of-consumed"));
    // bash itself takes the script and registers the completion.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tollgate.bash");
    std::fs::write(&file, &script).expect("write the script");
    let registered = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p tollgate", file.display()))
        .output()
        .expect("run bash");
    assert!(
        registered.status.success(),
        "{}",
        String::from_utf8_lossy(&registered.stderr)
    );
    assert!(String::from_utf8_lossy(&registered.stdout).contains("tollgate"));
    for shell in ["zsh", "fish"] {
        assert!(completions(shell).contains("set-limits"), "{shell}");
    }
}

#[test]
fn the_manual_has_a_page_for_every_command() {
    let out = support::command()
        .arg("man")
        .output()
        .expect("run tollgate man");
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        page.starts_with(".ie") || page.contains(".TH tollgate"),
        "{page}"
    );
    assert!(page.contains("tenant"), "{page}");

    let dir = tempfile::tempdir().expect("tempdir");
    let pages = dir.path().join("man1");
    let out = support::command()
        .args(["man", "--out-dir"])
        .arg(&pages)
        .output()
        .expect("run tollgate man --out-dir");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "tollgate.1",
        "tollgate-tenant.1",
        "tollgate-tenant-set-limits.1",
        "tollgate-serve.1",
    ] {
        assert!(pages.join(page).is_file(), "{page} missing");
    }
}

#[test]
fn help_shows_connection_options_apart_and_pod_request_has_no_admin_token() {
    let out = support::command()
        .args(["tenant", "set-limits", "--help"])
        .output()
        .expect("run tollgate");
    let help = String::from_utf8(out.stdout).expect("utf-8");
    let connection = help.find("Connection:").expect("a Connection heading");
    for option in ["--server", "--ca-file", "--token"] {
        let at = help
            .find(option)
            .unwrap_or_else(|| panic!("{option} in {help}"));
        assert!(at > connection, "{option} under Connection: {help}");
    }
    let at = help.find("--refill-rate").expect("--refill-rate");
    assert!(at < connection, "own options first: {help}");

    let out = support::command()
        .args(["pod", "request", "--help"])
        .output()
        .expect("run tollgate");
    let help = String::from_utf8(out.stdout).expect("utf-8");
    assert!(help.contains("--pod-token"), "{help}");
    assert!(!help.contains("--token "), "{help}");
}

#[test]
fn a_dead_server_or_the_metrics_port_gives_one_error_with_a_hint() {
    let port = support::free_port();
    let out = support::command()
        .args([
            "tenant",
            "list",
            "--server",
            &format!("http://127.0.0.1:{port}"),
        ])
        .output()
        .expect("run tollgate");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("is `tollgate serve` running"), "{said}");
    assert_eq!(
        said.matches("tcp connect error").count(),
        1,
        "the cause once: {said}"
    );

    // An HTTP server that is not gRPC: the metrics port of a real server.
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = support::free_port();
    let server = Server::start_with(
        &dir.path().join("tollgate.redb"),
        &["--metrics-listen", &format!("127.0.0.1:{metrics}")],
    );
    let out = support::command()
        .args([
            "tenant",
            "list",
            "--server",
            &format!("http://127.0.0.1:{metrics}"),
        ])
        .output()
        .expect("run tollgate");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("metrics port"), "{said}");
    server.stop();
}

#[test]
fn set_limits_changes_only_what_it_is_given() {
    let (_dir, server) = fresh_server();
    set_limits(&server, "acme", 500.0, 0.0);
    let set = server.json(&[
        "tenant",
        "set-limits",
        "--tenant",
        "acme",
        "--burst-limit",
        "2000",
        "--json",
    ]);
    assert_eq!(set["refill_rate"], 0.0, "{set}");
    assert_eq!(set["burst_limit"], 2000.0, "{set}");
    assert_eq!(set["current_tokens"], 500.0, "{set}");
    // A bucket that does not exist needs all three, and the error names
    // the flags, not the request's fields.
    let partial = server.tollgate(&[
        "tenant",
        "set-limits",
        "--tenant",
        "new",
        "--bucket",
        "sms",
        "--refill-rate",
        "7",
    ]);
    assert_failed_with(
        &partial,
        "InvalidArgument: bucket \"sms\" of tenant \"new\" does not exist yet: creating it needs all of --available, --refill-rate and --burst-limit (given: --refill-rate)",
    );
    let said = String::from_utf8_lossy(&partial.stderr);
    assert!(
        !said.contains("update_mask") && !said.contains("available_tokens"),
        "{said}"
    );
    // Nothing at all is a usage error.
    assert!(
        !server
            .tollgate(&["tenant", "set-limits", "--tenant", "acme"])
            .status
            .success()
    );
    // --as-of without --as-of-consumed, or in the future: refused.
    assert!(
        !server
            .tollgate(&[
                "tenant",
                "set-limits",
                "--tenant",
                "acme",
                "--available",
                "5",
                "--as-of",
                "2026-01-02T03:04:05Z",
            ])
            .status
            .success()
    );
    assert_failed_with(
        &server.tollgate(&[
            "tenant",
            "set-limits",
            "--tenant",
            "acme",
            "--available",
            "5",
            "--as-of",
            "2999-01-02T03:04:05Z",
            "--as-of-consumed",
            "0",
        ]),
        "as_of",
    );
    let shown = server.json(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ]);
    assert_eq!(
        shown["current_tokens"], 500.0,
        "refusals changed nothing: {shown}"
    );

    let set = server.json(&[
        "tenant",
        "set-limits",
        "--tenant",
        "acme",
        "--refill-rate",
        "7",
        "--json",
    ]);
    assert_eq!(set["refill_rate"], 7.0, "{set}");
    assert_eq!(set["burst_limit"], 2000.0, "{set}");
    let tokens = set["current_tokens"].as_f64().expect("tokens");
    assert!((500.0..510.0).contains(&tokens), "tokens kept: {set}");
}

#[test]
fn tenant_watch_shows_request_units_per_second_between_frames() {
    use std::io::BufRead;
    let (_dir, server) = fresh_server();
    set_limits(&server, "acme", 1000.0, 100.0);
    set_limits(&server, "idle", 10.0, 1.0);
    let mut watching = Command::new(support::BIN)
        .args(["tenant", "watch", "--interval", "2s", "--count", "2"])
        .env("TOLLGATE_SERVER", &server.url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run tollgate tenant watch");
    let mut lines = std::io::BufReader::new(watching.stdout.take().expect("stdout")).lines();
    let mut next = || lines.next().expect("more output").expect("a line");
    // The first frame: its header, a blank line, the table's head and both
    // rows (by tenant id before there are rates).
    let first: Vec<String> = (0..5).map(|_| next()).collect();
    assert!(
        first[0].contains("2 tenants, 2 buckets, – request units/s"),
        "{first:?}"
    );
    assert!(
        first[3].starts_with("acme") && first[4].starts_with("idle"),
        "{first:?}"
    );
    // Between the first frame and the second.
    server.ok(&[
        "pod",
        "request",
        "--tenant",
        "acme",
        "--tokens",
        "10",
        "--report-ru",
        "100",
    ]);
    let second: Vec<String> = (0..6).map(|_| next()).collect();
    assert!(
        second[0].is_empty(),
        "a blank line between frames: {second:?}"
    );
    let window: f64 = second[1]
        .split("over the last ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the time the rates cover: {second:?}"));
    // The busiest first.
    let (acme, idle) = (&second[4], &second[5]);
    assert!(
        acme.starts_with("acme") && idle.starts_with("idle"),
        "{second:?}"
    );
    let ru: f64 = acme
        .split_whitespace()
        .nth(6)
        .expect("RU/S")
        .parse()
        .expect("a number");
    // 100 request units over the window, shown with one decimal; the
    // window is shown to the millisecond, so the rate lies between what
    // the window's rounding bounds allow, give or take the last decimal.
    let (fastest, slowest) = (100.0 / (window - 0.0005), 100.0 / (window + 0.0005));
    assert!(
        ru <= fastest + 0.051 && ru >= slowest - 0.051,
        "{acme} over {window} s"
    );
    assert!(idle.contains(" 0.0 "), "{idle}");
    assert!(watching.wait().expect("watch ends").success());

    assert_failed_with(
        &server.tollgate(&["tenant", "watch", "--tenant", "nobody", "--count", "1"]),
        "NotFound",
    );
}

/// `pod request` for `tenant`'s request-unit bucket, as instance 3 asking
/// for 3 000 tokens.
fn pod_asks(server: &Server, tenant: &str) -> Output {
    server.tollgate(&[
        "pod",
        "request",
        "--tenant",
        tenant,
        "--instance",
        "3",
        "--tokens",
        "3000",
    ])
}

#[test]
fn a_deleted_tenant_stays_deleted_until_created_again() {
    let (_dir, server) = fresh_server();
    set_limits(&server, "acme", 500.0, 0.0);
    let first = pod_asks(&server, "acme");
    assert!(first.status.success(), "{first:?}");
    let deleted = server.ok(&["tenant", "delete", "--tenant", "acme", "--yes"]);
    assert!(
        deleted.contains("refused until it is created again"),
        "{deleted}"
    );

    // Before tombstones, this request re-created the tenant with the
    // server's defaults and was granted 3 000 tokens.
    let refused = pod_asks(&server, "acme");
    assert_failed_with(&refused, "NotFound: tenant \"acme\" was deleted at ");
    assert_failed_with(
        &server.tollgate(&["tenant", "show", "--tenant", "acme"]),
        "NotFound",
    );
    let listed = server.json(&["tenant", "list", "--json"]);
    assert_eq!(listed, json!([]), "nothing granted, nothing created");

    set_limits(&server, "acme", 500.0, 0.0);
    let served = pod_asks(&server, "acme");
    assert!(served.status.success(), "{served:?}");
}

#[test]
fn a_suspended_tenant_is_refused_with_its_totals_kept_until_resumed() {
    let (_dir, server) = fresh_server();
    set_limits(&server, "acme", 500.0, 0.0);
    assert!(pod_asks(&server, "acme").status.success());
    let show = [
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ];
    let before = server.json(&show);
    assert_eq!(before["state"], Value::Null);

    let suspended = server.json(&[
        "tenant",
        "suspend",
        "--tenant",
        "acme",
        "--reason",
        "unpaid invoice",
        "--json",
    ]);
    assert_eq!(suspended["changed"], true);
    assert_eq!(suspended["state"]["kind"], "suspended");
    assert_eq!(suspended["state"]["reason"], "unpaid invoice");
    let refused = pod_asks(&server, "acme");
    assert_failed_with(
        &refused,
        "FailedPrecondition: tenant \"acme\" is suspended since ",
    );
    assert_failed_with(&refused, ": unpaid invoice");

    // Limits, tokens and totals exactly as they were; the state shows.
    let mut during = server.json(&show);
    assert_eq!(during["state"], suspended["state"]);
    during["state"] = Value::Null;
    // How long the pod has been silent is all that moved.
    let mut before = before;
    for view in [&mut before, &mut during] {
        view["instances"][0]["silent_for_seconds"] = Value::Null;
    }
    assert_eq!(during, before);
    let text = server.ok(&["tenant", "show", "--tenant", "acme"]);
    assert!(text.contains("state  suspended since"), "{text}");
    let table = server.ok(&["tenant", "list"]);
    assert!(
        table.contains("STATE") && table.contains("suspended"),
        "{table}"
    );

    let again = server.ok(&["tenant", "suspend", "--tenant", "acme"]);
    assert!(
        again.contains("was suspended already, nothing changed"),
        "{again}"
    );
    let resumed = server.ok(&["tenant", "resume", "--tenant", "acme"]);
    assert!(resumed.contains("resumed tenant acme"), "{resumed}");
    let served = pod_asks(&server, "acme");
    assert!(served.status.success(), "{served:?}");
    let again = server.ok(&["tenant", "resume", "--tenant", "acme"]);
    assert!(
        again.contains("was not suspended, nothing changed"),
        "{again}"
    );
    assert_failed_with(
        &server.tollgate(&["tenant", "suspend", "--tenant", "nobody"]),
        "NotFound",
    );
}
/// The text of a grant rounds its amounts, and an immediate grant leaves
/// out the trickle's duration and burst cap (zeros that do not apply);
/// `--json` keeps every field, exact.
#[test]
fn pod_request_text_rounds_amounts_and_shows_trickle_fields_only_for_a_trickle() {
    let (_dir, server) = fresh_server();
    set_limits(&server, "plenty", 1000.0, 0.0);
    let immediate = server.ok(&["pod", "request", "--tenant", "plenty", "--tokens", "50"]);
    assert!(
        immediate.contains("granted tokens    50\n")
            && immediate.contains("requested tokens  50\n"),
        "{immediate}"
    );
    assert!(
        !immediate.contains("max burst") && !immediate.contains("trickle"),
        "{immediate}"
    );

    // 100 tokens and 10 per second: a new pod's first trickle, a quarter
    // of the target period (2.5 s), of a little over 125 tokens (and the
    // refill while the request travels), with a burst cap.
    set_limits(&server, "slow", 100.0, 10.0);
    let trickled = server.ok(&["pod", "request", "--tenant", "slow", "--tokens", "500"]);
    let value = |name: &str| -> String {
        trickled
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {trickled}"))
            .trim()
            .to_owned()
    };
    assert_eq!(value("trickle duration"), "2.5 s", "{trickled}");
    let granted = value("granted tokens");
    let decimals = granted.split_once('.').map_or(0, |(_, d)| d.len());
    assert!(decimals <= 2, "{granted} in {trickled}");
    assert!(
        granted.parse::<f64>().expect("a number") > 0.0,
        "{trickled}"
    );
    assert!(value("max burst tokens").parse::<f64>().expect("a number") > 0.0);
    let json = pod_request(&server, "plenty", "50");
    assert_eq!(json["max_burst_tokens"], 0.0, "{json:#}");
    assert_eq!(json["trickle_duration_seconds"], 0.0, "{json:#}");
}

/// A reader that closes stdout early (`tollgate completions zsh | head`)
/// ends the command quietly with 141, as a process ended by SIGPIPE:
/// no panic, no backtrace, no error message.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    for args in [&["completions", "zsh"][..], &["man"]] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        // Closed before the command writes anything: every write fails.
        drop(reader);
        let out = support::command()
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run tollgate");
        assert_eq!(out.status.code(), Some(141), "{args:?}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A command that talks to a server ends the same way.
    let (_dir, server) = fresh_server();
    set_limits(&server, "acme", 10.0, 1.0);
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(BIN)
        .args(["tenant", "list", "--json"])
        .env("TOLLGATE_SERVER", &server.url)
        .stdout(writer)
        .output()
        .expect("run tollgate");
    assert_eq!(out.status.code(), Some(141), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `tenant watch` outlives a server restart: while the server is down
/// each poll says since when it is unreachable, and frames resume when it
/// is back on the same port.
#[test]
fn tenant_watch_keeps_polling_through_a_server_restart() {
    use std::io::BufRead;
    use std::sync::mpsc;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tollgate.redb");
    let port = support::free_port();
    let server = Server::start_on(&store, port, &[]);
    set_limits(&server, "acme", 1000.0, 100.0);
    let mut watching = support::Served(
        Command::new(BIN)
            .args(["tenant", "watch", "--interval", "1s"])
            .env("TOLLGATE_SERVER", &server.url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run tollgate tenant watch"),
    );
    let stdout = watching.0.stdout.take().expect("stdout");
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if lines.send(line.expect("a line")).is_err() {
                return;
            }
        }
    });
    // Lines until one contains `text`, within a generous deadline.
    let until = |text: &str| -> String {
        loop {
            let line = seen
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no line with {text:?} in time"));
            if line.contains(text) {
                return line;
            }
        }
    };
    until("1 tenants, 1 buckets");
    server.stop();
    let down = until("server unreachable since ");
    assert!(down.contains("retrying"), "{down}");
    // Still polling, still saying so.
    until("server unreachable since ");
    assert!(
        watching.0.try_wait().expect("wait").is_none(),
        "watch ended while the server was down"
    );

    let server = Server::start_on(&store, port, &[]);
    let back = until("1 tenants, 1 buckets");
    assert!(!back.contains("unreachable"), "{back}");
    assert!(watching.0.try_wait().expect("wait").is_none());
    drop(server);
}
