//! A PostgreSQL failover under load: pg_auto_failover's monitor, a primary
//! and a synchronous standby (`tollgate-testdb`'s `HaCluster`), two
//! `tollgate serve` on the multi-host URL
//! (`postgres://h1,h2/db?target_session_attrs=read-write`), and 64 pods of
//! 4 tenants (`tollgate bench`) asking all along. The primary is killed as
//! a lost machine would be (its keeper and its postmaster, SIGKILL); the
//! monitor promotes the standby, and the same two servers serve again on
//! it without a restart. Every request answered OK before, during or after
//! is in the stored totals, and none is counted twice: the store holds
//! exactly what the pods saw confirmed. The test prints how long service
//! stopped (the slowest request, retries included).

mod support;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::Server;
use support::pods::watch;
use support::usage::{check_consumption, read_tenant};
use tollgate_client::{Controller, LocalBucketConfig, Options};
use tollgate_testdb::HaCluster;

/// A pod beside the load, asking about every half second, whose longest
/// wait for an answer is the time without service a pod sees.
fn probe(endpoints: &str) -> Controller {
    let period = Duration::from_millis(500);
    let options = Options {
        bucket: LocalBucketConfig {
            target_request_period: period,
            report_interval: period,
            ..LocalBucketConfig::default()
        },
        request_timeout: Duration::from_secs(1),
        ..Options::default()
    };
    Controller::connect(endpoints, "probe", 1, options).expect("valid options")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_resumes_on_the_promoted_standby_with_nothing_lost_or_counted_twice() {
    let cluster = tokio::task::block_in_place(HaCluster::start).expect("pg_auto_failover cluster");
    let url = cluster.url();
    let limits = [
        "--default-refill-rate",
        "1000",
        "--default-burst-limit",
        "1000",
        "--pg-pool-size",
        "4",
    ];
    let servers: Vec<Server> = tokio::task::block_in_place(|| {
        (0..2)
            .map(|_| Server::start_with(Path::new(&url), &limits))
            .collect()
    });
    let mut args = vec![
        "bench",
        "--tenants",
        "4",
        "--instances-per-tenant",
        "16",
        "--duration",
        "20s",
        "--warmup",
        "0s",
        "--json",
    ];
    for server in &servers {
        args.extend(["--server", server.url.as_str()]);
    }
    let endpoints: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let probe = probe(&endpoints.join(","));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch(vec![probe.clone()], Arc::clone(&stop)));
    let asking = tokio::spawn({
        let probe = probe.clone();
        async move { while probe.acquire(1.0).await.is_ok() {} }
    });
    let bench = support::command()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench");

    tokio::time::sleep(Duration::from_secs(4)).await;
    let old = tokio::task::block_in_place(|| cluster.primary())
        .expect("monitor state")
        .expect("a primary");
    let killed = Instant::now();
    tokio::task::block_in_place(|| cluster.kill_node(&old)).expect("kill the primary");
    let new =
        tokio::task::block_in_place(|| cluster.wait_for_new_primary(&old, Duration::from_secs(30)))
            .expect("the standby promoted");
    let promoted = killed.elapsed();

    let out = tokio::task::block_in_place(|| bench.wait_with_output()).expect("bench ran");
    stop.store(true, Ordering::Relaxed);
    let without_service = watcher.await.expect("watcher ran")[0].1;
    let report_probe = probe.shutdown().await;
    asking.abort();
    assert!(
        report_probe.consumption_reported,
        "the probe's report stored"
    );
    let report = support::bench_report(&out);
    let total = &report["total"];
    assert_eq!(total["errors"], serde_json::json!({}), "{report}");
    assert_eq!(total["abandoned"], 0, "every request answered: {report}");
    assert_eq!(total["duplicate_mismatches"], 0, "{report}");
    eprintln!(
        "failover from {old} to {new}: promoted {promoted:?} after the kill; a pod waited \
         {without_service:?} at most for an answer; bench: {} requests, retried {}",
        total["requests"], total["retried"]
    );
    assert!(
        without_service < Duration::from_secs(20),
        "service resumed ({without_service:?} without)"
    );

    let client = tollgate_testdb::connect(&url).await.expect("connect");
    for t in 0..4 {
        let tenant = format!("bench-{t}");
        let stored = read_tenant(&client, &tenant).await;
        let unconfirmed = &report["tenants"][&tenant]["unconfirmed"];
        assert!(
            unconfirmed
                .as_object()
                .is_some_and(|fields| fields.values().all(|v| v.as_f64() == Some(0.0))),
            "{tenant}: nothing unconfirmed: {unconfirmed}"
        );
        check_consumption(&tenant, &stored, &[&report]);
    }
    // The pod's own reports, retried through the failover, stored once.
    let stored = read_tenant(&client, "probe").await;
    let micros = stored
        .counters
        .iter()
        .find(|(name, _)| name == "request_unit_micros")
        .map_or(0, |(_, v)| *v);
    let charged = report_probe.status.charged_tokens;
    assert!(
        (micros as f64 / 1e6 - charged).abs() <= 1e-6 * charged.max(1.0),
        "probe: stored {micros} µRU, charged {charged}"
    );
    tokio::task::block_in_place(|| {
        for server in servers {
            server.stop();
        }
    });
}
