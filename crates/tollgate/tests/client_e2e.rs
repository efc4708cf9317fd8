//! Pods embedding `tollgate-client` against a real `tollgate serve` process
//! (embedded store, gRPC over sockets, real time): accuracy over a minute,
//! an outage and recovery, and consumption that adds up to the last token.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::Server;
use tokio::time::Instant;
use tollgate_client::{Controller, LocalBucketConfig, Options};

/// Tokens per acquisition.
const STEP: f64 = 10.0;

fn set_limits(server: &Server, tenant: &str, available: f64, refill: f64, burst: f64) {
    server.ok(&[
        "tenant",
        "set-limits",
        "--tenant",
        tenant,
        "--available",
        &available.to_string(),
        "--refill-rate",
        &refill.to_string(),
        "--burst-limit",
        &burst.to_string(),
    ]);
}

fn stored_request_units(server: &Server, tenant: &str) -> f64 {
    server.json(&[
        "tenant", "show", "--tenant", tenant, "--bucket", "", "--json",
    ])["consumption"]["request_units"]
        .as_f64()
        .unwrap_or(0.0)
}

fn pods(url: &str, tenant: &str, n: u32) -> Vec<Controller> {
    (1..=n)
        .map(|instance| {
            let options = Options {
                bucket: LocalBucketConfig {
                    initial_tokens: 100.0,
                    ..LocalBucketConfig::default()
                },
                ..Options::default()
            };
            Controller::connect(url, tenant, instance, options).expect("valid options")
        })
        .collect()
}

/// Runs `workers` tasks per pod, each acquiring `STEP` tokens in a loop,
/// until `until`; returns the tokens admitted before `until`.
async fn saturate(pods: &[Controller], workers: usize, until: Instant) -> f64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for pod in pods {
        for _ in 0..workers {
            let pod = pod.clone();
            let admitted = Arc::clone(&admitted);
            tasks.push(tokio::spawn(async move {
                while let Ok(Ok(())) = tokio::time::timeout_at(until, pod.acquire(STEP)).await {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("worker ran");
    }
    admitted.load(Ordering::Relaxed) as f64 * STEP
}

/// Shuts the pods down and returns the tokens they charged in total.
async fn shutdown(pods: Vec<Controller>) -> f64 {
    let mut charged = 0.0;
    for pod in pods {
        let report = pod.shutdown().await;
        assert!(report.consumption_reported, "final report delivered");
        charged += report.status.charged_tokens;
    }
    charged
}

fn assert_same_consumption(stored: f64, charged: f64) {
    assert!(
        (stored - charged).abs() <= 1e-6 * charged.max(1.0),
        "server stored {stored} request units, pods charged {charged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pods_admit_refill_times_a_minute_plus_burst() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = tokio::task::block_in_place(|| Server::start(&dir.path().join("t.redb")));
    let (refill, burst) = (1000.0, 5000.0);
    tokio::task::block_in_place(|| set_limits(&server, "acme", burst, refill, burst));

    let pods = pods(&server.url, "acme", 3);
    let secs = 60.0;
    let admitted = saturate(&pods, 4, Instant::now() + Duration::from_secs_f64(secs)).await;
    let ideal = refill * secs + burst;
    let error = (admitted - ideal) / ideal;
    eprintln!(
        "3 pods, refill {refill}/s, burst {burst}, {secs} s: admitted {admitted}, ideal {ideal}, error {:+.2}%",
        error * 100.0
    );
    assert!(error.abs() <= 0.05, "error {:+.2}%", error * 100.0);

    let charged = shutdown(pods).await;
    let stored = tokio::task::block_in_place(|| stored_request_units(&server, "acme"));
    assert_same_consumption(stored, charged);
    tokio::task::block_in_place(|| server.stop());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_keep_working_through_a_server_outage_and_resume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("t.redb");
    let server = tokio::task::block_in_place(|| Server::start(&store));
    let port = server.port;
    let refill = 300.0;
    tokio::task::block_in_place(|| set_limits(&server, "outage", 0.0, refill, 1000.0));
    let pods = pods(&server.url, "outage", 3);

    let before = saturate(&pods, 2, Instant::now() + Duration::from_secs(8)).await;
    assert!(before > 0.0);

    // The server dies without a goodbye.
    tokio::task::block_in_place(|| server.kill());
    let outage = Duration::from_secs(10);
    let during = saturate(&pods, 2, Instant::now() + outage).await;
    assert!(
        pods.iter().all(|pod| pod.status().fallback_active),
        "every pod runs on its fallback rate"
    );
    // Each pod may use at least an even split of the refill rate on its own,
    // starting a second after its request went unanswered.
    let floor = 0.5 * refill * (outage.as_secs_f64() - 2.0);
    let ceiling = 2.0 * refill * outage.as_secs_f64() + 1000.0;
    eprintln!("outage of {outage:?} at refill {refill}/s: pods admitted {during} on their own");
    assert!(
        during >= floor,
        "admitted {during} in the outage, at least {floor} expected"
    );
    assert!(
        during <= ceiling,
        "admitted {during} in the outage, at most {ceiling} expected"
    );

    // Back on the same port and store: the pods reconnect and leave fallback.
    let server = tokio::task::block_in_place(|| Server::start_on(&store, port, &[]));
    let after = saturate(&pods, 2, Instant::now() + Duration::from_secs(8)).await;
    assert!(after > 0.0, "pods admit work after the server is back");
    assert!(
        pods.iter().all(|pod| !pod.status().fallback_active),
        "every pod is back on grants from the server"
    );

    let charged = shutdown(pods).await;
    let stored = tokio::task::block_in_place(|| stored_request_units(&server, "outage"));
    assert_same_consumption(stored, charged);
    tokio::task::block_in_place(|| server.stop());
}
