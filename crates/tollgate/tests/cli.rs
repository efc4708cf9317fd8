//! The `tollgate` binary end to end: `serve` on a store file, the tenant
//! commands against it, a graceful stop on SIGTERM, and a restart.

mod support;

use std::process::Command;

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
    assert!(grant.contains("granted tokens    120.000"), "{grant}");

    let shown = server.json(&["tenant", "show", "--tenant", "acme", "--json"]);
    assert_eq!(shown["current_tokens"], 380.0);
    assert_eq!(shown["consumption"]["request_units"], 42.5);
    assert_eq!(shown["live_instances"], 1);
    assert_eq!(shown["instances"][0]["instance_id"], 3);

    let table = server.ok(&["tenant", "show", "--tenant", "acme"]);
    assert!(table.contains("request units   42.5"), "{table}");
    assert!(table.contains("INSTANCE"), "{table}");

    server.ok(&[
        "tenant",
        "set-limits",
        "--tenant",
        "beta",
        "--available",
        "1",
        "--refill-rate",
        "2",
        "--burst-limit",
        "3",
    ]);
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

    server.ok(&["tenant", "delete", "--tenant", "beta"]);
    server.stop();

    // Same file, new process: everything is still there.
    let server = Server::start(&store);
    let shown = server.json(&["tenant", "show", "--tenant", "acme", "--json"]);
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
