//! `tollgate bench` end to end: real `tollgate serve` processes on store
//! files, real gRPC over sockets. The bench's own sums must match what the
//! servers stored, to the last unit. Nothing here asserts on latency: the
//! tests share a small machine.

mod support;

use std::net::TcpListener;
use std::process::Command;

use serde_json::Value;
use support::{BIN, Server};

/// The nine consumption fields, as the bench and `tenant show --json` name
/// them.
const CONSUMPTION_FIELDS: [&str; 9] = [
    "request_units",
    "read_batches",
    "read_requests",
    "read_bytes",
    "write_batches",
    "write_requests",
    "write_bytes",
    "cpu_seconds",
    "egress_bytes",
];

fn tenant_show(server: &Server, tenant: &str) -> Value {
    server.json(&[
        "tenant", "show", "--tenant", tenant, "--bucket", "", "--json",
    ])
}

fn count(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

fn assert_no_failures(report: &Value) {
    let total = &report["total"];
    assert_eq!(total["errors"], serde_json::json!({}), "{report:#}");
    assert_eq!(total["retried"], serde_json::json!({}), "{report:#}");
    assert_eq!(count(&total["duplicate_mismatches"]), 0, "{report:#}");
    assert_eq!(count(&total["abandoned"]), 0, "{report:#}");
}

#[test]
fn closed_loop_with_duplicates_reports_exactly_the_consumption_the_server_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));

    let report = server.json(&[
        "bench",
        "--duration",
        "2s",
        "--warmup",
        "500ms",
        "--tenants",
        "3",
        "--instances-per-tenant",
        "4",
        "--duplicates",
        "0.2",
        "--json",
    ]);

    assert_eq!(report["mode"], "closed_loop");
    assert_eq!(count(&report["pods"]), 12);
    assert!(number(&report["requests_per_second"]) > 0.0, "{report:#}");
    assert!(count(&report["measured"]["requests"]) > 0, "{report:#}");
    assert!(count(&report["latency_us"]["count"]) > 0, "{report:#}");
    assert_no_failures(&report);
    // One answer in five is sent again: over hundreds of answers some must be.
    assert!(count(&report["total"]["duplicates"]) > 0, "{report:#}");

    let tenants = report["tenants"].as_object().expect("tenant map");
    let ids: Vec<&str> = tenants.keys().map(String::as_str).collect();
    assert_eq!(ids, ["bench-0", "bench-1", "bench-2"]);
    for (id, sent) in tenants {
        assert!(count(&sent["requests"]) > 0, "{id}: {sent:#}");
        let stored = tenant_show(&server, id);
        for field in CONSUMPTION_FIELDS {
            assert_eq!(
                sent["consumption"][field], stored["consumption"][field],
                "{id}: {field} the bench confirmed vs the server's total"
            );
        }
        assert!(number(&stored["consumption"]["request_units"]) > 0.0);
        assert_eq!(number(&sent["unconfirmed"]["request_units"]), 0.0);
        // Granted tokens are fractional and summed in another order: close,
        // not exact.
        let granted = number(&sent["granted_tokens"]);
        let stored_granted = number(&stored["granted_tokens"]);
        assert!(
            (granted - stored_granted).abs() <= 1e-6 * stored_granted.max(1.0),
            "{id}: granted {granted} vs {stored_granted}"
        );
        assert_eq!(count(&stored["live_instances"]), 4, "{id}");
    }
    server.stop();
}

#[test]
fn replicas_each_serve_their_share_of_the_pods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Server::start(&dir.path().join("a.redb"));
    let b = Server::start(&dir.path().join("b.redb"));

    let report = a.json(&[
        "bench",
        "--server",
        &a.url,
        "--server",
        &b.url,
        "--connections",
        "2",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--tenants",
        "1",
        "--instances-per-tenant",
        "4",
        "--tenant-prefix",
        "replicated",
        "--json",
    ]);
    assert_no_failures(&report);
    assert_eq!(count(&report["connections_per_server"]), 2);

    // Pod i talks to server i mod 2: instances 1 and 3 to the first, 2 and 4
    // to the second; their consumption adds up to what the bench confirmed.
    let sent = &report["tenants"]["replicated-0"]["consumption"];
    let stored = [
        tenant_show(&a, "replicated-0"),
        tenant_show(&b, "replicated-0"),
    ];
    for (server, instances) in stored.iter().zip([[1, 3], [2, 4]]) {
        let ids: Vec<u64> = server["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .map(|i| count(&i["instance_id"]))
            .collect();
        assert_eq!(ids, instances);
    }
    for field in ["read_batches", "write_bytes", "egress_bytes"] {
        let sum: u64 = stored.iter().map(|s| count(&s["consumption"][field])).sum();
        assert_eq!(sum, count(&sent[field]), "{field}");
    }
    let sum: f64 = stored
        .iter()
        .map(|s| number(&s["consumption"]["request_units"]))
        .sum();
    assert_eq!(sum, number(&sent["request_units"]));
    a.stop();
    b.stop();
}

#[test]
fn open_loop_sends_about_the_requested_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));

    let report = server.json(&[
        "bench",
        "--rate",
        "20",
        "--duration",
        "2s",
        "--warmup",
        "0s",
        "--tenants",
        "2",
        "--instances-per-tenant",
        "2",
        "--json",
    ]);
    assert_eq!(report["mode"], "open_loop");
    assert_eq!(number(&report["target_rate"]), 20.0);
    assert_no_failures(&report);
    // 20/s for 2 s is 40 requests; loose bounds, the machine may be busy.
    let sent = count(&report["measured"]["requests"]);
    assert!((12..=80).contains(&sent), "{sent} requests: {report:#}");
    let stored: u64 = ["bench-0", "bench-1"]
        .iter()
        .map(|id| tenant_show(&server, id)["consumption"]["read_batches"].clone())
        .map(|v| count(&v))
        .sum();
    let sent_batches: u64 = ["bench-0", "bench-1"]
        .iter()
        .map(|id| count(&report["tenants"][id]["consumption"]["read_batches"]))
        .sum();
    assert_eq!(stored, sent_batches);
    server.stop();
}

#[test]
fn the_table_shows_throughput_latency_and_every_tenant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let table = server.ok(&[
        "bench",
        "--duration",
        "500ms",
        "--warmup",
        "0s",
        "--tenants",
        "2",
        "--instances-per-tenant",
        "2",
        "--tenant-prefix",
        "table",
    ]);
    for expected in [
        "requests/s",
        "latency               p50",
        "duplicate mismatches  0",
        "errors                none",
        "TENANT",
        "table-0",
        "table-1",
    ] {
        assert!(table.contains(expected), "{expected:?} missing:\n{table}");
    }
    server.stop();
}

#[test]
fn bad_options_and_unreachable_servers_exit_1_with_a_clear_message() {
    let cases: [(&[&str], &str); 9] = [
        (&["--tenants", "0"], "--tenants: must be at least 1"),
        (
            &["--instances-per-tenant", "0"],
            "--instances-per-tenant: must be at least 1",
        ),
        (
            &["--connections", "0"],
            "--connections: must be between 1 and",
        ),
        (&["--rate", "0"], "--rate: must be a number above zero"),
        (&["--rate", "-3"], "--rate: must be a number above zero"),
        (
            &["--duplicates", "1.5"],
            "--duplicates: must be between 0 and 1",
        ),
        (
            &["--report-only", "-0.1"],
            "--report-only: must be between 0 and 1",
        ),
        (&["--duration", "0s"], "--duration: must be more than zero"),
        (&["--tenant-prefix", "a/b"], "--tenant-prefix"),
    ];
    for (args, message) in cases {
        let out = Command::new(BIN)
            .arg("bench")
            .args(args)
            .args(["--server", "http://127.0.0.1:1"])
            .output()
            .expect("run tollgate bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }

    // A port nobody listens on (bound, then released).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = Command::new(BIN)
        .args(["bench", "--duration", "1s", "--server", &url])
        .output()
        .expect("run tollgate bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach server {url}")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no report without a run");
}

/// With `--buckets N` the bench creates N named buckets per tenant and
/// spreads each tenant's pods over them; what it confirmed per tenant is
/// what the server stored over that tenant's buckets.
#[test]
fn several_buckets_per_tenant_are_created_and_counted_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let report = server.json(&[
        "bench",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--tenants",
        "2",
        "--instances-per-tenant",
        "6",
        "--buckets",
        "3",
        "--json",
    ]);
    assert_no_failures(&report);
    let tenants = report["tenants"].as_object().expect("tenant map");
    for (id, sent) in tenants {
        let buckets = server.json(&["tenant", "show", "--tenant", id, "--json"]);
        let buckets = buckets.as_array().expect("a list of buckets");
        let names: Vec<&str> = buckets
            .iter()
            .map(|b| b["bucket"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["b0", "b1", "b2"], "{id}");
        for bucket in buckets {
            assert_eq!(count(&bucket["live_instances"]), 2, "{id}: {bucket:#}");
        }
        for field in ["read_batches", "write_bytes", "egress_bytes"] {
            let stored: u64 = buckets
                .iter()
                .map(|b| count(&b["consumption"][field]))
                .sum();
            assert_eq!(count(&sent["consumption"][field]), stored, "{id}: {field}");
        }
    }
}
