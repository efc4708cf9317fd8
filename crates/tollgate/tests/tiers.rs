//! Tiers from the command line, end to end: `tollgate tier create | update
//! | list | show | delete | apply` and the tenant commands that put tenants
//! on tiers (`tenant create`, `set-tier`, `override set | clear`,
//! `describe`, `table-limits set | clear`), and a tier's table limits in a
//! tiers file, against a served store, each result read back with
//! `--json`. What the server must do is the `Admin` contract in
//! `proto/tollgate/v1/admin.proto`.
//!
//! Round trips, `apply` twice changing nothing the second time, bad files
//! refused before anything is sent, onboarding, a switch, an override, a
//! tier in use kept, a tenant's table limits, and a tier's table limits
//! applied, shown, changed and removed by the file.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use support::{Server, command, free_port};

/// A server on a fresh store file; the directory lives as long as the pair.
fn fresh_server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    (dir, server)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write the tiers file");
    path
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The entry of a JSON list whose `key` is `name`.
fn named<'a>(list: &'a Value, key: &str, name: &str) -> &'a Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .find(|entry| entry[key] == name)
        .unwrap_or_else(|| panic!("no {key} {name:?} in {list:#}"))
}

/// The names of a JSON list's entries, under `key`, in list order.
fn names(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|entry| entry[key].as_str().expect("a name").to_owned())
        .collect()
}

/// A failed command: non-zero exit, nothing on stdout, the reason on stderr.
fn assert_failed_with(out: &Output, reason: &str) {
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(reason), "{stderr}");
}

/// A tenant's named buckets as `tenant show --json` lists them (tiers do
/// not manage the request-unit bucket, which the tenant may also have).
fn tier_buckets(server: &Server, tenant: &str) -> Value {
    let all = server.json(&["tenant", "show", "--tenant", tenant, "--json"]);
    Value::Array(
        all.as_array()
            .expect("a list of buckets")
            .iter()
            .filter(|b| b["bucket"] != "")
            .cloned()
            .collect(),
    )
}

fn limits(bucket: &Value) -> (f64, f64) {
    (
        number(&bucket["refill_rate"]),
        number(&bucket["burst_limit"]),
    )
}

fn create_tier(server: &Server, tier: &str, buckets: &[&str]) -> Value {
    let mut args = vec!["tier", "create", "--tier", tier, "--json"];
    for bucket in buckets {
        args.extend(["--bucket", bucket]);
    }
    server.json(&args)
}

const TIERS: &str = r#"
[tiers.pro.buckets.schedule-email]
refill_rate = 10        # tokens per second
burst_limit = 100

[tiers.pro.buckets.invoke-doc-summary-ai]
refill_rate = 1
burst_limit = 20
initial_tokens = 5

[tiers.free.buckets.schedule-email]
refill_rate = 1
burst_limit = 10
"#;

#[test]
fn tier_create_show_list_update_and_delete_round_trip() {
    let (_dir, server) = fresh_server();
    let created = create_tier(
        &server,
        "pro",
        &["schedule-email=10/100", "invoke-doc-summary-ai=1/20/5"],
    );
    assert_eq!(created["created"], true);
    assert_eq!(created["tier"]["name"], "pro");
    assert_eq!(
        names(&created["added"], "bucket"),
        ["invoke-doc-summary-ai", "schedule-email"]
    );
    // A second create is refused, and leaves the tier as it was.
    assert_failed_with(
        &server.tollgate(&["tier", "create", "--tier", "pro", "--bucket", "x=1/1"]),
        "tier pro already exists",
    );

    let shown = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(shown["name"], "pro");
    let mut defined = names(&shown["buckets"], "bucket");
    defined.sort();
    assert_eq!(defined, ["invoke-doc-summary-ai", "schedule-email"]);
    let email = named(&shown["buckets"], "bucket", "schedule-email");
    assert_eq!(limits(email), (10.0, 100.0));
    assert_eq!(email["initial_tokens"], Value::Null);
    let ai = named(&shown["buckets"], "bucket", "invoke-doc-summary-ai");
    assert_eq!(limits(ai), (1.0, 20.0));
    assert_eq!(ai["initial_tokens"], 5.0);
    assert!(shown["created_at"].is_string(), "{shown:#}");
    let text = server.ok(&["tier", "show", "--tier", "pro"]);
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("schedule-email "))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(
        row,
        ["schedule-email", "10", "100", "(burst", "limit)"],
        "{text}"
    );

    create_tier(&server, "free", &["schedule-email=1/10"]);
    let listed = server.json(&["tier", "list", "--json"]);
    assert_eq!(names(&listed, "name"), ["free", "pro"]);

    let updated = server.json(&[
        "tier",
        "update",
        "--tier",
        "pro",
        "--bucket",
        "schedule-email=20/100",
        "--json",
    ]);
    assert_eq!(updated["created"], false);
    assert_eq!(
        updated["removed"],
        serde_json::json!(["invoke-doc-summary-ai"])
    );
    let changed = named(&updated["changed"], "bucket", "schedule-email");
    assert_eq!(changed["before"]["refill_rate"], 10.0);
    assert_eq!(changed["after"]["refill_rate"], 20.0);
    let shown = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(names(&shown["buckets"], "bucket"), ["schedule-email"]);
    assert_eq!(
        limits(named(&shown["buckets"], "bucket", "schedule-email")),
        (20.0, 100.0)
    );
    assert_failed_with(
        &server.tollgate(&["tier", "update", "--tier", "team", "--bucket", "x=1/1"]),
        "tier team does not exist",
    );

    let deleted = server.json(&["tier", "delete", "--tier", "pro", "--yes", "--json"]);
    assert_eq!(deleted, serde_json::json!({"name": "pro", "deleted": true}));
    assert_failed_with(
        &server.tollgate(&["tier", "show", "--tier", "pro"]),
        "NotFound",
    );
    assert_failed_with(
        &server.tollgate(&["tier", "delete", "--tier", "pro", "--yes"]),
        "NotFound",
    );
    let listed = server.json(&["tier", "list", "--json"]);
    assert_eq!(names(&listed, "name"), ["free"]);
}

#[test]
fn tier_apply_twice_changes_nothing_the_second_time_and_a_dry_run_changes_nothing() {
    let (dir, server) = fresh_server();
    let file = write(dir.path(), "tiers.toml", TIERS);
    let apply = |extra: &[&str]| {
        let mut args = vec!["tier", "apply", "-f", path_arg(&file), "--json"];
        args.extend(extra);
        server.json(&args)
    };

    let planned = apply(&["--dry-run"]);
    assert_eq!(planned["dry_run"], true);
    assert_eq!(planned["changes"], 2);
    assert_eq!(named(&planned["tiers"], "name", "pro")["action"], "created");
    assert_eq!(
        server.json(&["tier", "list", "--json"]),
        serde_json::json!([]),
        "a dry run changed the server"
    );

    let applied = apply(&[]);
    assert_eq!(applied["dry_run"], false);
    assert_eq!(applied["changes"], 2);
    for tier in ["free", "pro"] {
        assert_eq!(named(&applied["tiers"], "name", tier)["action"], "created");
    }
    let listed = server.json(&["tier", "list", "--json"]);
    assert_eq!(names(&listed, "name"), ["free", "pro"]);
    let pro = named(&listed, "name", "pro");
    assert_eq!(
        limits(named(&pro["buckets"], "bucket", "schedule-email")),
        (10.0, 100.0)
    );
    assert_eq!(
        named(&pro["buckets"], "bucket", "invoke-doc-summary-ai")["initial_tokens"],
        5.0
    );

    let again = apply(&[]);
    assert_eq!(again["changes"], 0, "{again:#}");
    for tier in ["free", "pro"] {
        assert_eq!(named(&again["tiers"], "name", tier)["action"], "unchanged");
    }
    let text = server.ok(&["tier", "apply", "-f", path_arg(&file)]);
    assert!(
        text.contains("0 created, 0 changed, 2 unchanged, 0 deleted"),
        "{text}"
    );

    // pro's email rate changes and free leaves the file: a dry run shows
    // it and changes nothing; without --prune free stays, with it, it goes.
    let edited = TIERS
        .replace("refill_rate = 10 ", "refill_rate = 15 ")
        .replace(
            "[tiers.free.buckets.schedule-email]",
            "[tiers.team.buckets.schedule-email]",
        );
    std::fs::write(&file, edited).expect("rewrite the tiers file");
    let planned = apply(&["--dry-run", "--prune"]);
    assert_eq!(planned["changes"], 3);
    assert_eq!(
        named(&planned["tiers"], "name", "free")["action"],
        "deleted"
    );
    let pro = named(&planned["tiers"], "name", "pro");
    assert_eq!(pro["action"], "changed");
    let email = named(&pro["changed"], "bucket", "schedule-email");
    assert_eq!(email["before"]["refill_rate"], 10.0);
    assert_eq!(email["after"]["refill_rate"], 15.0);
    assert_eq!(server.json(&["tier", "list", "--json"]), listed);

    let kept = apply(&[]);
    assert_eq!(
        named(&kept["tiers"], "name", "free")["action"],
        "not_in_file"
    );
    assert_eq!(
        names(&server.json(&["tier", "list", "--json"]), "name"),
        ["free", "pro", "team"]
    );
    let pruned = apply(&["--prune"]);
    assert_eq!(named(&pruned["tiers"], "name", "free")["action"], "deleted");
    assert_eq!(pruned["changes"], 1);
    let listed = server.json(&["tier", "list", "--json"]);
    assert_eq!(names(&listed, "name"), ["pro", "team"]);
    assert_eq!(
        limits(named(
            &named(&listed, "name", "pro")["buckets"],
            "bucket",
            "schedule-email"
        )),
        (15.0, 100.0)
    );
}

/// Passes without tier support on the server: the file is refused before
/// the server is contacted, so there is none to contact.
#[test]
fn a_bad_tier_file_is_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        dir.path(),
        "tiers.toml",
        "[tiers.pro.buckets.schedule-email]\nrefill_rate = -1\nburst_limit = 100\n",
    );
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let out = command()
        .args(["tier", "apply", "-f", path_arg(&file), "--server", &nobody])
        .output()
        .expect("run tollgate");
    assert_failed_with(
        &out,
        "tiers.toml:2:15: tiers.pro.buckets.schedule-email.refill_rate: must be >= 0, got -1",
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("connect"));
}

#[test]
fn a_tier_file_with_any_error_changes_nothing() {
    let (dir, server) = fresh_server();
    let file = write(dir.path(), "tiers.toml", TIERS);
    server.ok(&["tier", "apply", "-f", path_arg(&file)]);
    let before = server.json(&["tier", "list", "--json"]);

    // A valid change and a new tier, beside one bad value: nothing goes.
    let bad = format!(
        "{}\n[tiers.team.buckets.schedule-email]\nrefill_rate = nan\nburst_limit = 500\n",
        TIERS.replace("refill_rate = 10 ", "refill_rate = 15 ")
    );
    std::fs::write(&file, &bad).expect("rewrite the tiers file");
    for extra in [&[][..], &["--prune"][..], &["--dry-run"][..]] {
        let mut args = vec!["tier", "apply", "-f", path_arg(&file)];
        args.extend(extra);
        assert_failed_with(
            &server.tollgate(&args),
            "tiers.toml:16:15: tiers.team.buckets.schedule-email.refill_rate: \
             must be a number, got NaN",
        );
    }
    std::fs::write(&file, format!("{bad}burst = 1\n")).expect("rewrite the tiers file");
    assert_failed_with(
        &server.tollgate(&["tier", "apply", "-f", path_arg(&file)]),
        "tiers.toml:18:1: tiers.team.buckets.schedule-email.burst: unknown field `burst`",
    );
    std::fs::write(
        &file,
        TIERS.replace("burst_limit = 10\n", "burst_limit = 10\nburst_limit = 11\n"),
    )
    .expect("rewrite the tiers file");
    assert_failed_with(
        &server.tollgate(&["tier", "apply", "-f", path_arg(&file)]),
        "tiers.toml:14:1: duplicate key",
    );
    std::fs::write(
        &file,
        TIERS.replace("refill_rate = 10 ", "refill_rate = inf "),
    )
    .expect("rewrite the tiers file");
    assert_failed_with(
        &server.tollgate(&["tier", "apply", "-f", path_arg(&file)]),
        "tiers.pro.buckets.schedule-email.refill_rate: must be finite, got inf",
    );
    assert_eq!(server.json(&["tier", "list", "--json"]), before);
}

#[test]
fn tenant_create_on_a_tier_provisions_every_bucket_with_the_tiers_limits() {
    let (dir, server) = fresh_server();
    let file = write(dir.path(), "tiers.toml", TIERS);
    server.ok(&["tier", "apply", "-f", path_arg(&file)]);

    let created = server.json(&[
        "tenant", "create", "--tenant", "t1234", "--tier", "pro", "--json",
    ]);
    assert_eq!(created["tenant_id"], "t1234");
    assert_eq!(created["tier"], "pro");
    assert_eq!(created["overrides"], serde_json::json!([]));

    let buckets = tier_buckets(&server, "t1234");
    assert_eq!(
        names(&buckets, "bucket"),
        ["invoke-doc-summary-ai", "schedule-email"]
    );
    let email = named(&buckets, "bucket", "schedule-email");
    assert_eq!(limits(email), (10.0, 100.0));
    assert_eq!(email["configured"], true);
    // No initial_tokens: a new bucket starts full.
    assert_eq!(number(&email["current_tokens"]), 100.0);
    let ai = named(&buckets, "bucket", "invoke-doc-summary-ai");
    assert_eq!(limits(ai), (1.0, 20.0));
    let ai_tokens = number(&ai["current_tokens"]);
    assert!((5.0..20.0).contains(&ai_tokens), "{ai:#}");

    let described = server.json(&["tenant", "describe", "--tenant", "t1234", "--json"]);
    assert_eq!(described["tier"], "pro");
    assert_eq!(
        limits(named(&described["buckets"], "bucket", "schedule-email")),
        (10.0, 100.0)
    );
    let text = server.ok(&["tenant", "show", "--tenant", "t1234"]);
    assert!(text.starts_with("tier       pro\n"), "{text}");
    assert!(text.contains("overrides  (none)"), "{text}");

    // An existing tenant is refused, with the command that moves it.
    let again = server.tollgate(&["tenant", "create", "--tenant", "t1234", "--tier", "free"]);
    assert_failed_with(
        &again,
        "AlreadyExists: tenant \"t1234\" already exists; move it to tier free with `tollgate tenant set-tier --tenant t1234 --tier free`",
    );
    assert!(
        !String::from_utf8_lossy(&again.stderr).contains("SetTenantTier"),
        "{again:?}"
    );
    assert_failed_with(
        &server.tollgate(&["tenant", "create", "--tenant", "t5678", "--tier", "gold"]),
        "NotFound",
    );
    assert_failed_with(
        &server.tollgate(&["tenant", "describe", "--tenant", "t5678"]),
        "NotFound",
    );
}

#[test]
fn set_tier_changes_limits_carries_tokens_over_capped_at_the_burst_and_retires_dropped_buckets() {
    let (_dir, server) = fresh_server();
    create_tier(
        &server,
        "pro",
        &[
            "schedule-email=10/1000",
            "invoke-doc-summary-ai=1/20",
            "export=1/50",
        ],
    );
    create_tier(&server, "free", &["schedule-email=1/500", "export=1/10"]);
    server.ok(&["tenant", "create", "--tenant", "t1234", "--tier", "pro"]);
    // Spend 900 of the 1000 email tokens: about 100 are left to carry over.
    let grant = server.json(&[
        "pod",
        "request",
        "--tenant",
        "t1234",
        "--bucket",
        "schedule-email",
        "--tokens",
        "900",
        "--json",
    ]);
    assert_eq!(grant["granted_tokens"], 900.0);

    let moved = server.json(&[
        "tenant", "set-tier", "--tenant", "t1234", "--tier", "free", "--yes", "--json",
    ]);
    assert_eq!(moved["tenant"]["tier"], "free");
    assert_eq!(moved["created"], serde_json::json!([]));
    let mut changed = moved["changed"].clone();
    changed
        .as_array_mut()
        .expect("a list")
        .sort_by_key(|v| v.to_string());
    assert_eq!(changed, serde_json::json!(["export", "schedule-email"]));
    assert_eq!(
        moved["retired"],
        serde_json::json!(["invoke-doc-summary-ai"])
    );

    let buckets = tier_buckets(&server, "t1234");
    assert_eq!(names(&buckets, "bucket"), ["export", "schedule-email"]);
    let email = named(&buckets, "bucket", "schedule-email");
    assert_eq!(limits(email), (1.0, 500.0));
    // Carried over, not reset to the new tier's full burst.
    let tokens = number(&email["current_tokens"]);
    assert!((100.0..500.0).contains(&tokens), "{email:#}");
    // 50 tokens, capped at the new burst of 10 (refill stops there).
    let export = named(&buckets, "bucket", "export");
    assert_eq!(limits(export), (1.0, 10.0));
    assert_eq!(number(&export["current_tokens"]), 10.0);

    let text = server.ok(&["tenant", "set-tier", "--tenant", "t1234", "--tier", "pro"]);
    assert!(text.contains("created  invoke-doc-summary-ai"), "{text}");
}

#[test]
fn an_override_survives_a_set_tier_and_is_gone_after_override_clear() {
    let (_dir, server) = fresh_server();
    create_tier(&server, "pro", &["schedule-email=10/100"]);
    create_tier(&server, "free", &["schedule-email=1/10"]);
    server.ok(&["tenant", "create", "--tenant", "t1234", "--tier", "pro"]);

    let overridden = server.json(&[
        "tenant",
        "override",
        "set",
        "--tenant",
        "t1234",
        "--bucket",
        "schedule-email",
        "--refill-rate",
        "50",
        "--burst-limit",
        "500",
        "--json",
    ]);
    let email = named(&overridden["overrides"], "bucket", "schedule-email");
    assert_eq!(limits(email), (50.0, 500.0));
    assert_eq!(
        limits(named(
            &tier_buckets(&server, "t1234"),
            "bucket",
            "schedule-email"
        )),
        (50.0, 500.0)
    );

    // The override wins over the new tier.
    server.ok(&["tenant", "set-tier", "--tenant", "t1234", "--tier", "free"]);
    assert_eq!(
        limits(named(
            &tier_buckets(&server, "t1234"),
            "bucket",
            "schedule-email"
        )),
        (50.0, 500.0)
    );
    let described = server.json(&["tenant", "describe", "--tenant", "t1234", "--json"]);
    assert_eq!(described["tier"], "free");
    assert_eq!(names(&described["overrides"], "bucket"), ["schedule-email"]);
    let text = server.ok(&["tenant", "show", "--tenant", "t1234"]);
    assert!(
        text.contains("overrides  schedule-email: refill_rate 50, burst_limit 500"),
        "{text}"
    );

    let cleared = server.json(&[
        "tenant",
        "override",
        "clear",
        "--tenant",
        "t1234",
        "--bucket",
        "schedule-email",
        "--json",
    ]);
    assert_eq!(cleared["overrides"], serde_json::json!([]));
    assert_eq!(
        limits(named(
            &tier_buckets(&server, "t1234"),
            "bucket",
            "schedule-email"
        )),
        (1.0, 10.0)
    );
    assert_failed_with(
        &server.tollgate(&[
            "tenant",
            "override",
            "clear",
            "--tenant",
            "t1234",
            "--bucket",
            "schedule-email",
        ]),
        "NotFound",
    );

    // An override of a bucket the tier lacks creates it; clearing it
    // retires it.
    server.ok(&[
        "tenant",
        "override",
        "set",
        "--tenant",
        "t1234",
        "--bucket",
        "export",
        "--refill-rate",
        "2",
        "--burst-limit",
        "30",
        "--initial-tokens",
        "7",
    ]);
    let export = named(&tier_buckets(&server, "t1234"), "bucket", "export").clone();
    assert_eq!(limits(&export), (2.0, 30.0));
    assert!(number(&export["current_tokens"]) >= 7.0, "{export:#}");
    server.ok(&[
        "tenant", "override", "clear", "--tenant", "t1234", "--bucket", "export", "--yes",
    ]);
    assert_eq!(
        names(&tier_buckets(&server, "t1234"), "bucket"),
        ["schedule-email"]
    );
}

#[test]
fn a_tier_in_use_cannot_be_deleted() {
    let (_dir, server) = fresh_server();
    create_tier(&server, "pro", &["schedule-email=10/100"]);
    create_tier(&server, "free", &["schedule-email=1/10"]);
    server.ok(&["tenant", "create", "--tenant", "t1234", "--tier", "pro"]);

    let refused = server.tollgate(&["tier", "delete", "--tier", "pro", "--yes"]);
    assert_failed_with(&refused, "FailedPrecondition");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("t1234"),
        "{refused:?}"
    );
    server.ok(&["tier", "show", "--tier", "pro"]);

    server.ok(&["tenant", "set-tier", "--tenant", "t1234", "--tier", "free"]);
    server.ok(&["tier", "delete", "--tier", "pro", "--yes"]);
    assert_eq!(
        names(&server.json(&["tier", "list", "--json"]), "name"),
        ["free"]
    );
}

#[test]
fn table_limits_are_set_shown_refused_when_bad_and_cleared() {
    let (_dir, server) = fresh_server();
    let set = server.json(&[
        "tenant",
        "table-limits",
        "set",
        "--tenant",
        "t1234",
        "--table",
        "orders",
        "--max-reads-per-second",
        "500",
        "--json",
    ]);
    assert_eq!(set["table_limits"][0]["table"], "orders");
    assert_eq!(
        number(&set["table_limits"][0]["max_reads_per_second"]),
        500.0
    );
    assert_eq!(set["table_limits"][0]["max_writes_per_second"], Value::Null);
    let text = server.ok(&["tenant", "describe", "--tenant", "t1234"]);
    assert!(
        text.contains("table limits  orders: reads 500/s, writes unlimited per partition"),
        "{text}"
    );

    // Refused by the server, naming the field; nothing changed.
    for (flags, field) in [
        (vec![], "limits.max_reads_per_second"),
        (
            vec!["--max-writes-per-second", "-3"],
            "limits.max_writes_per_second",
        ),
        (
            vec!["--max-reads-per-second", "NaN"],
            "limits.max_reads_per_second",
        ),
    ] {
        let mut args = vec![
            "tenant",
            "table-limits",
            "set",
            "--tenant",
            "t1234",
            "--table",
            "orders",
        ];
        args.extend(flags);
        assert_failed_with(&server.tollgate(&args), field);
    }
    let described = server.json(&["tenant", "describe", "--tenant", "t1234", "--json"]);
    assert_eq!(described["table_limits"], set["table_limits"]);

    let cleared = server.json(&[
        "tenant",
        "table-limits",
        "clear",
        "--tenant",
        "t1234",
        "--table",
        "orders",
        "--json",
    ]);
    assert_eq!(cleared["table_limits"], serde_json::json!([]));
    assert_failed_with(
        &server.tollgate(&[
            "tenant",
            "table-limits",
            "clear",
            "--tenant",
            "t1234",
            "--table",
            "orders",
        ]),
        "NotFound",
    );
}

const TIERS_WITH_TABLES: &str = r#"
[tiers.pro.buckets.schedule-email]
refill_rate = 10
burst_limit = 100

[tiers.pro.tables.orders]
max_reads_per_second = 500
max_writes_per_second = 100

[tiers.pro.tables.users]
max_reads_per_second = 50
"#;

#[test]
fn a_tiers_table_limits_are_applied_shown_changed_and_removed_by_the_file() {
    let (dir, server) = fresh_server();
    let file = write(dir.path(), "tiers.toml", TIERS_WITH_TABLES);
    let apply = |extra: &[&str]| {
        let mut args = vec!["tier", "apply", "-f", path_arg(&file), "--json"];
        args.extend(extra);
        server.json(&args)
    };

    let applied = apply(&[]);
    let pro = named(&applied["tiers"], "name", "pro");
    assert_eq!(pro["action"], "created");
    assert_eq!(names(&pro["tables"]["added"], "table"), ["orders", "users"]);
    let shown = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(names(&shown["tables"], "table"), ["orders", "users"]);
    let orders = named(&shown["tables"], "table", "orders");
    assert_eq!(number(&orders["max_reads_per_second"]), 500.0);
    assert_eq!(number(&orders["max_writes_per_second"]), 100.0);
    let users = named(&shown["tables"], "table", "users");
    assert_eq!(users["max_writes_per_second"], Value::Null);
    let text = server.ok(&["tier", "show", "--tier", "pro"]);
    assert!(
        text.contains(
            "TABLE   READS/S  WRITES/S\norders  500      100\nusers   50       unlimited"
        ),
        "{text}"
    );
    let listed = server.json(&["tier", "list", "--json"]);
    assert_eq!(named(&listed, "name", "pro")["tables"], shown["tables"]);
    assert!(
        server
            .ok(&["tier", "list"])
            .contains("pro   users   50       unlimited"),
        "list"
    );
    assert_eq!(apply(&[])["changes"], 0, "applied twice");

    // A tenant on the tier has the tier's buckets; the tables are not its own.
    server.ok(&["tenant", "create", "--tenant", "t1234", "--tier", "pro"]);
    let described = server.json(&["tenant", "describe", "--tenant", "t1234", "--json"]);
    assert_eq!(names(&described["buckets"], "bucket"), ["schedule-email"]);
    assert_eq!(described["table_limits"], serde_json::json!([]));

    // `tier update` replaces the buckets and keeps the tables.
    server.ok(&[
        "tier",
        "update",
        "--tier",
        "pro",
        "--bucket",
        "schedule-email=20/100",
    ]);
    let updated = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(updated["tables"], shown["tables"]);

    // Changed in the file: the plan shows each table's difference.
    let edited = TIERS_WITH_TABLES
        .replace("refill_rate = 10", "refill_rate = 20")
        .replace("max_reads_per_second = 500", "max_reads_per_second = 1000")
        .replace(
            "[tiers.pro.tables.users]\nmax_reads_per_second = 50\n",
            "[tiers.pro.tables.events]\nmax_writes_per_second = 5\n",
        );
    std::fs::write(&file, edited).expect("rewrite the tiers file");
    let text = server.ok(&["tier", "apply", "-f", path_arg(&file), "--dry-run"]);
    assert!(
        text.contains(
            "would change tier pro\n  \
             + table events  max_writes_per_second 5\n  \
             - table users\n  \
             ~ table orders  max_reads_per_second 500 -> 1000\n"
        ),
        "{text}"
    );
    assert_eq!(
        server.json(&["tier", "show", "--tier", "pro", "--json"])["tables"],
        shown["tables"],
        "a dry run changed the server"
    );
    let changed = apply(&[]);
    let pro = named(&changed["tiers"], "name", "pro");
    assert_eq!(pro["action"], "changed");
    assert_eq!(pro["changed"], serde_json::json!([]), "no bucket changed");
    let orders = named(&pro["tables"]["changed"], "table", "orders");
    assert_eq!(number(&orders["before"]["max_reads_per_second"]), 500.0);
    assert_eq!(number(&orders["after"]["max_reads_per_second"]), 1000.0);
    assert_eq!(pro["tables"]["removed"], serde_json::json!(["users"]));
    let shown = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(names(&shown["tables"], "table"), ["events", "orders"]);
    assert_eq!(
        limits(named(
            &tier_buckets(&server, "t1234"),
            "bucket",
            "schedule-email"
        )),
        (20.0, 100.0)
    );

    // The file is the truth: a tier without tables in it loses them.
    let bare = TIERS_WITH_TABLES
        .split("[tiers.pro.tables.orders]")
        .next()
        .expect("the buckets part");
    std::fs::write(&file, bare).expect("rewrite the tiers file");
    let planned = apply(&["--dry-run"]);
    let pro = named(&planned["tiers"], "name", "pro");
    assert_eq!(pro["action"], "changed");
    assert_eq!(
        pro["tables"]["removed"],
        serde_json::json!(["events", "orders"])
    );
    apply(&[]);
    let shown = server.json(&["tier", "show", "--tier", "pro", "--json"]);
    assert_eq!(shown["tables"], serde_json::json!([]));
    assert!(
        !server
            .ok(&["tier", "show", "--tier", "pro"])
            .contains("TABLE")
    );
    assert_eq!(apply(&[])["changes"], 0);
}

#[test]
fn a_bad_table_in_a_tiers_file_is_refused_naming_the_field_and_changes_nothing() {
    let (dir, server) = fresh_server();
    let file = write(
        dir.path(),
        "tiers.toml",
        "[tiers.pro.tables.orders]\nmax_reads_per_second = -5\n",
    );
    assert_failed_with(
        &server.tollgate(&["tier", "apply", "-f", path_arg(&file)]),
        "tiers.toml:2:24: tiers.pro.tables.orders.max_reads_per_second: must be a number above 0",
    );
    std::fs::write(
        &file,
        "[tiers.pro.tables.orders]\nmax_read_per_second = 5\n",
    )
    .expect("rewrite the tiers file");
    assert_failed_with(
        &server.tollgate(&["tier", "apply", "-f", path_arg(&file)]),
        "tiers.pro.tables.orders.max_read_per_second: unknown field `max_read_per_second`",
    );
    assert_eq!(
        server.json(&["tier", "list", "--json"]),
        serde_json::json!([])
    );
}

/// `set-limits` on a bucket the tenant's tier or an override defines goes
/// through, and warns on stderr that the next change sets it back, naming
/// `tenant override set`; on any other bucket it warns of nothing.
#[test]
fn set_limits_on_a_bucket_a_tier_or_override_defines_warns_it_will_be_set_back() {
    let (dir, server) = fresh_server();
    let file = write(dir.path(), "tiers.toml", TIERS);
    server.ok(&["tier", "apply", "-f", path_arg(&file)]);
    server.ok(&["tenant", "create", "--tenant", "t1234", "--tier", "pro"]);
    let set_limits = |tenant: &str, bucket: &str| {
        let out = server.tollgate(&[
            "tenant",
            "set-limits",
            "--tenant",
            tenant,
            "--bucket",
            bucket,
            "--available",
            "5",
            "--refill-rate",
            "3",
            "--burst-limit",
            "30",
            "--json",
        ]);
        assert!(out.status.success(), "{out:?}");
        let set: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(limits(&set), (3.0, 30.0), "the change went through");
        String::from_utf8(out.stderr).expect("utf-8")
    };

    let warned = set_limits("t1234", "schedule-email");
    assert!(
        warned.starts_with("warning: bucket schedule-email of tenant t1234 is defined by tier pro (refill_rate 10, burst_limit 100)")
            && warned.contains("the next change of the tier")
            && warned.contains("sets these limits back")
            && warned.contains("tollgate tenant override set --tenant t1234 --bucket schedule-email"),
        "{warned}"
    );

    server.ok(&[
        "tenant",
        "override",
        "set",
        "--tenant",
        "t1234",
        "--bucket",
        "schedule-email",
        "--refill-rate",
        "50",
        "--burst-limit",
        "500",
    ]);
    let warned = set_limits("t1234", "schedule-email");
    assert!(
        warned.starts_with("warning: bucket schedule-email of tenant t1234 is defined by its override (refill_rate 50, burst_limit 500)"),
        "{warned}"
    );

    // A bucket made by hand, and the request-unit bucket: nobody's to set back.
    assert_eq!(set_limits("t1234", "send-sms"), "");
    assert_eq!(set_limits("t1234", ""), "");
    assert_eq!(set_limits("acme", "schedule-email"), "");
}
