//! `tollgate check` end to end: a per-key bucket defined in a tiers file,
//! a tenant on it, and checks whose exit status is the verdict (0
//! allowed, 3 refused, 1 an error), read back with `--json`.

mod support;

use serde_json::Value;
use support::Server;

/// The documented exit status of a refused check.
const REFUSED: i32 = 3;

fn check(server: &Server, key: &str, tokens: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![
        "check",
        "--tenant",
        "acme",
        "--bucket",
        "logins-per-ip",
        "--key",
        key,
        "--tokens",
        tokens,
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = server.tollgate(&args);
    let code = out.status.code().expect("exited");
    let json = if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).expect("one JSON document")
    };
    (code, json)
}

#[test]
fn the_exit_status_is_the_verdict_and_a_retry_takes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.pro.buckets.logins-per-ip]\nkind = \"per-key\"\nrefill_rate = 0.001\nburst_limit = 3\n",
    )
    .expect("write tiers");
    server.ok(&["tier", "apply", "-f", tiers.to_str().expect("utf-8 path")]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "pro"]);

    let (code, first) = check(&server, "203.0.113.7", "2", &["--request-id", "login-1"]);
    assert_eq!(code, 0, "{first}");
    // Named as every other command names the tenant.
    assert_eq!(first["tenant_id"], "acme", "{first:#}");
    assert!(first.get("tenant").is_none(), "{first:#}");
    assert_eq!(first["allowed"], true);
    assert_eq!(first["remaining_tokens"], 1.0);
    assert_eq!(first["burst_limit"], 3.0);
    // The same request id again: the first answer, nothing taken.
    let (code, again) = check(&server, "203.0.113.7", "2", &["--request-id", "login-1"]);
    assert_eq!(code, 0);
    assert_eq!(again["replayed"], true);
    assert_eq!(again["remaining_tokens"], 1.0);
    // Two more tokens are not there: refused, nothing taken.
    let (code, refused) = check(&server, "203.0.113.7", "2", &[]);
    assert_eq!(code, REFUSED, "{refused}");
    assert_eq!(refused["allowed"], false);
    assert!(refused["retry_after_seconds"].as_f64().expect("a number") > 900.0);
    let (code, read) = check(&server, "203.0.113.7", "0", &[]);
    assert_eq!(code, 0);
    assert!((read["remaining_tokens"].as_f64().expect("a number") - 1.0).abs() < 0.01);
    // Another key is full; more than the burst never will be.
    let (code, other) = check(&server, "198.51.100.1", "5", &[]);
    assert_eq!(code, REFUSED);
    assert_eq!(other["retry_after_seconds"], Value::Null, "never");

    // Errors: exit 1, nothing on stdout, the field named on stderr.
    let out = server.tollgate(&[
        "check",
        "--tenant",
        "acme",
        "--bucket",
        "logins-per-ip",
        "--key",
        "",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("items[0].key"), "{stderr}");
    let out = server.tollgate(&[
        "check", "--tenant", "acme", "--bucket", "nope", "--key", "k",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
    server.stop();
}
