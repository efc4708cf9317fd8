//! The binary as operators run it: metrics and health over HTTP
//! (`--metrics-listen`, `/readyz`), and a SIGTERM in the middle of load
//! that drains, exits 0 and loses nothing; after a restart `/metrics`
//! equals the store's totals.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{BIN, Server, free_port};

/// GET `path` from `port`: the status code and body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(port, "/readyz").map(|(code, _)| code) != Some(200) {
        assert!(Instant::now() < deadline, "/readyz never said ready");
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_under_load_drains_and_metrics_match_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tollgate.redb");
    let (port, metrics) = (free_port(), free_port());
    let metrics_flag = format!("127.0.0.1:{metrics}");
    let flags = ["--metrics-listen", metrics_flag.as_str()];
    let server = Server::start_on(&store, port, &flags);
    wait_ready(metrics);
    assert_eq!(get(metrics, "/healthz").map(|r| r.0), Some(200));

    let bench = Command::new(BIN)
        .args([
            "bench",
            "--server",
            &server.url,
            "--tenants",
            "2",
            "--instances-per-tenant",
            "8",
            "--duration",
            "6s",
            "--warmup",
            "0s",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench");
    sleep(Duration::from_secs(2));
    // SIGTERM under load: the server drains and exits 0 (`stop` checks).
    server.stop();
    // The pods retry against nothing for a moment; then a new process
    // serves the same store on the same port.
    sleep(Duration::from_millis(500));
    let server = Server::start_on(&store, port, &flags);
    let out = bench.wait_with_output().expect("bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["total"]["errors"], serde_json::json!({}), "{report}");
    assert_eq!(report["total"]["duplicate_mismatches"], 0, "{report}");

    wait_ready(metrics);
    let (code, text) = get(metrics, "/metrics").expect("scrape");
    assert_eq!(code, 200);
    for t in 0..2 {
        let tenant = format!("bench-{t}");
        let shown = server.json(&[
            "tenant", "show", "--tenant", &tenant, "--bucket", "", "--json",
        ]);
        let stored = shown["consumption"]["request_units"]
            .as_f64()
            .unwrap_or(0.0);
        let confirmed = report["tenants"][&tenant]["consumption"]["request_units"]
            .as_f64()
            .expect("confirmed");
        let unconfirmed = report["tenants"][&tenant]["unconfirmed"]["request_units"]
            .as_f64()
            .unwrap_or(0.0);
        assert!(
            stored >= confirmed && stored <= confirmed + unconfirmed,
            "{tenant}: stored {stored} outside [{confirmed}, {}]: nothing answered is lost",
            confirmed + unconfirmed
        );
        let line =
            format!("tollgate_tenant_request_units_total{{bucket=\"\",tenant_id=\"{tenant}\"}} ");
        let exported: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} in\n{text}"));
        assert_eq!(
            exported, stored,
            "{tenant}: /metrics shows the store's total"
        );
    }
    server.stop();
    assert!(Path::new(&store).exists());
}
