//! Three server replicas on one PostgreSQL database, under load from 64
//! pods of 4 tenants for 20 s, one request in ten sent twice, and one in
//! fifty the last before its pod crashes: the pod gives up on the request a
//! moment after sending it and comes back as a new incarnation on the next
//! replica while the old attempt may still be in flight. Nothing is counted
//! twice or lost, grants stay within the bucket's bounds, and every instance
//! list stays whole. The crashes are `tollgate bench --restarts`; the
//! stored rows are read directly (`support/usage.rs`).

mod support;

use std::path::Path;
use std::process::Command;

use support::usage::{check_consumption, read_tenant};
use support::{BIN, Server};
use tollgate_testdb::TestDatabase;

const REFILL: f64 = 500.0;
const INITIAL: f64 = 2000.0;
/// The pods' target request period.
const PERIOD_SECS: f64 = 10.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_database_without_counting_twice() {
    let db = TestDatabase::create().await.expect("test database");
    let limits = [
        "--default-refill-rate",
        "500",
        "--default-burst-limit",
        "2000",
        "--default-initial-tokens",
        "2000",
        "--pg-pool-size",
        "4",
    ];
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start_with(Path::new(db.url()), &limits))
        .collect();
    let mut args = vec![
        "bench",
        "--tenants",
        "4",
        "--instances-per-tenant",
        "16",
        "--duplicates",
        "0.1",
        "--restarts",
        "0.02",
        "--duration",
        "20s",
        "--warmup",
        "0s",
        "--json",
    ];
    for server in &servers {
        args.extend(["--server", server.url.as_str()]);
    }
    let out = Command::new(BIN)
        .args(&args)
        .output()
        .expect("run the bench");
    let report = support::bench_report(&out);
    let total = &report["total"];
    assert_eq!(
        total["errors"],
        serde_json::json!({}),
        "no errors: {report}"
    );
    assert_eq!(
        total["retried"],
        serde_json::json!({}),
        "nothing retried: {report}"
    );
    assert_eq!(total["duplicate_mismatches"], 0, "{report}");
    assert_eq!(total["abandoned"], 0, "{report}");
    assert!(total["restarts"].as_u64().unwrap_or(0) > 20, "{report}");
    assert!(total["duplicates"].as_u64().unwrap_or(0) > 0, "{report}");
    assert!(total["requests"].as_u64().unwrap_or(0) > 1000, "{report}");

    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    for t in 0..4 {
        let tenant = format!("bench-{t}");
        let stored = read_tenant(&client, &tenant).await;
        assert_eq!(stored.live_instances, 16, "{tenant}");
        // Each request counted exactly once: the fate of every attempt is
        // known, and the store holds exactly what the pods saw confirmed.
        let unconfirmed = &report["tenants"][&tenant]["unconfirmed"];
        assert!(
            unconfirmed
                .as_object()
                .is_some_and(|fields| fields.values().all(|v| v.as_f64() == Some(0.0))),
            "{tenant}: nothing unconfirmed: {unconfirmed}"
        );
        check_consumption(&tenant, &stored, &[&report]);
        let seen = report["tenants"][&tenant]["granted_tokens"]
            .as_f64()
            .expect("granted");
        assert!(
            (stored.granted_tokens - seen).abs() <= 1e-9 * seen.max(1.0),
            "{tenant}: stored granted {} vs the pods' {seen}",
            stored.granted_tokens
        );
        // Never more than the bucket could give: what it started with, its
        // refill, and at most the debt bound (two periods of refill).
        let bound = INITIAL + REFILL * stored.lifetime_secs + 2.0 * REFILL * PERIOD_SECS;
        assert!(
            stored.granted_tokens <= bound,
            "{tenant}: granted {} above the bound {bound}",
            stored.granted_tokens
        );
        assert!(
            stored.tokens >= -2.0 * REFILL * PERIOD_SECS - 1e-6,
            "{tenant}"
        );
        assert!(
            stored.granted_tokens >= 0.5 * REFILL * stored.lifetime_secs,
            "{tenant}: the pods were served ({} granted)",
            stored.granted_tokens
        );
    }
    for server in servers {
        server.stop();
    }
}
