//! A replica dies under load: three `tollgate serve` on one PostgreSQL
//! database, 24 pods of 4 tenants given all three endpoints (each pod
//! starts on the replica its instance id picks), every pod saturating its
//! bucket. One replica is SIGKILLed; its pods move to the next replica on
//! their first failed request and carry on, retrying that request with the
//! same sequence number. Every pod is served after the kill, and the
//! consumption stored is what the pods charged, to the last token: nothing
//! the dead replica applied is counted again, nothing a pod charged is
//! lost. The test prints how long the pods ran on their fallback rate and
//! waited for an answer.
//!
//! The load generator moves on the same way: a second test kills one of
//! three replicas under `tollgate bench` and checks that no request failed
//! or was left unanswered and that the store holds what the simulated pods
//! saw confirmed.

#[path = "../../tollgate-client/tests/common/load.rs"]
mod load;
mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use load::{assert_same_consumption, saturate, shutdown};
use support::Server;
use support::pods::watch;
use support::usage::{check_consumption, read_tenant};
use tokio::time::Instant;
use tollgate_client::{Controller, LocalBucketConfig, Options};
use tollgate_testdb::TestDatabase;

const TENANTS: u32 = 4;
const PODS_PER_TENANT: u32 = 6;
/// Short, so that every pod asks several times after the kill.
const PERIOD: Duration = Duration::from_secs(1);

fn pod_options() -> Options {
    Options {
        bucket: LocalBucketConfig {
            target_request_period: PERIOD,
            report_interval: PERIOD,
            initial_tokens: 50.0,
            ..LocalBucketConfig::default()
        },
        request_timeout: Duration::from_secs(1),
        ..Options::default()
    }
}

/// Both tests start servers on ports found free a moment before: they run
/// one at a time, so neither binds a port the other has just picked (a
/// replica of one would then serve the other's pods).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_move_to_another_replica_when_theirs_is_killed() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let db = TestDatabase::create().await.expect("test database");
    let limits = [
        "--default-refill-rate",
        "2000",
        "--default-burst-limit",
        "2000",
        "--default-initial-tokens",
        "0",
        "--pg-pool-size",
        "4",
    ];
    let mut servers: Vec<Server> = tokio::task::block_in_place(|| {
        (0..3)
            .map(|_| Server::start_with(Path::new(db.url()), &limits))
            .collect()
    });
    let endpoints = servers
        .iter()
        .map(|s| s.url.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let tenants: Vec<String> = (0..TENANTS).map(|t| format!("replica-loss-{t}")).collect();
    let mut pods = Vec::new();
    for tenant in &tenants {
        for instance in 1..=PODS_PER_TENANT {
            let pod = Controller::connect(&endpoints, tenant, instance, pod_options())
                .expect("valid options");
            pods.push((tenant.clone(), pod));
        }
    }
    let controllers: Vec<Controller> = pods.iter().map(|(_, pod)| pod.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch(controllers.clone(), Arc::clone(&stop)));

    let start = Instant::now();
    let kill_at = start + Duration::from_millis(2500);
    let end = kill_at + Duration::from_secs(4);
    let load = tokio::spawn({
        let controllers = controllers.clone();
        async move { saturate(&controllers, 1, end).await }
    });

    tokio::time::sleep_until(kill_at).await;
    let granted_at_kill: Vec<f64> = controllers
        .iter()
        .map(|pod| pod.status().granted_tokens)
        .collect();
    let victim = servers.remove(0);
    tokio::task::block_in_place(|| victim.kill());
    let admitted = load.await.expect("load ran");
    stop.store(true, Ordering::Relaxed);
    let longest = watcher.await.expect("watcher ran");

    // Every pod was served after the kill: a third of them started on the
    // dead replica, so they were served by another.
    for (i, (tenant, pod)) in pods.iter().enumerate() {
        let granted = pod.status().granted_tokens;
        assert!(
            granted > granted_at_kill[i],
            "{tenant} pod {}: no grant after the kill ({granted})",
            i as u32 % PODS_PER_TENANT + 1
        );
    }
    let fallback = longest.iter().map(|l| l.0).max().unwrap_or_default();
    let waiting = longest.iter().map(|l| l.1).max().unwrap_or_default();
    eprintln!(
        "{} pods, 3 replicas, one killed: admitted {admitted} tokens; longest on the \
         fallback rate {fallback:?}, longest wait for an answer {waiting:?}",
        pods.len()
    );

    // Every report delivered, and stored exactly once.
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    for tenant in &tenants {
        let mine: Vec<Controller> = pods
            .iter()
            .filter(|(t, _)| t == tenant)
            .map(|(_, pod)| pod.clone())
            .collect();
        let charged = shutdown(mine).await;
        let stored = read_tenant(&client, tenant).await;
        let micros = stored
            .counters
            .iter()
            .find(|(name, _)| name == "request_unit_micros")
            .map_or(0, |(_, v)| *v);
        assert_same_consumption(micros as f64 / 1e6, charged);
    }
    tokio::task::block_in_place(|| {
        for server in servers {
            server.stop();
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_generator_moves_on_from_a_killed_replica() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let db = TestDatabase::create().await.expect("test database");
    let limits = [
        "--default-refill-rate",
        "1000",
        "--default-burst-limit",
        "1000",
        "--pg-pool-size",
        "4",
    ];
    let mut servers: Vec<Server> = tokio::task::block_in_place(|| {
        (0..3)
            .map(|_| Server::start_with(Path::new(db.url()), &limits))
            .collect()
    });
    let mut args = vec![
        "bench",
        "--tenants",
        "4",
        "--instances-per-tenant",
        "8",
        "--duration",
        "5s",
        "--warmup",
        "0s",
        "--json",
    ];
    for server in &servers {
        args.extend(["--server", server.url.as_str()]);
    }
    let bench = support::command()
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the bench");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = servers.remove(0);
    tokio::task::block_in_place(|| victim.kill());
    let out = tokio::task::block_in_place(|| bench.wait_with_output()).expect("bench ran");
    let report = support::bench_report(&out);
    let total = &report["total"];
    assert_eq!(total["errors"], serde_json::json!({}), "{report}");
    assert_eq!(total["abandoned"], 0, "{report}");
    assert_eq!(total["duplicate_mismatches"], 0, "{report}");
    let retried: u64 = total["retried"]
        .as_object()
        .map_or(0, |codes| codes.values().filter_map(|v| v.as_u64()).sum());
    assert!(retried > 0, "the kill failed some requests: {report}");
    eprintln!(
        "bench, 3 replicas, one killed at 2 s of 5 s: {} requests, retried {}",
        total["requests"], total["retried"]
    );

    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    for t in 0..4 {
        let tenant = format!("bench-{t}");
        let stored = read_tenant(&client, &tenant).await;
        check_consumption(&tenant, &stored, &[&report]);
    }
    tokio::task::block_in_place(|| {
        for server in servers {
            server.stop();
        }
    });
}
