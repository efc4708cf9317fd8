//! Hot-partition limits end to end: pods embedding `tollgate-client` run
//! against a real `tollgate serve` (embedded store, gRPC over sockets, real
//! time); a limit set with `tollgate tenant table-limits set` reaches the
//! running pods, which start rejecting the hot partition (about the limit
//! accepted between them), and raising it stops the rejections.

mod support;

use std::time::Duration;

use support::Server;
use tokio::time::Instant;
use tollgate_client::{
    ClientError, Controller, LocalBucketConfig, Op, Options, Partition, PartitionOptions, Request,
};

const PERIOD: Duration = Duration::from_millis(500);

fn set_write_limit(server: &Server, tenant: &str, writes: f64) {
    server.ok(&[
        "tenant",
        "table-limits",
        "set",
        "--tenant",
        tenant,
        "--table",
        "orders",
        "--max-writes-per-second",
        &writes.to_string(),
    ]);
}

fn pods(url: &str, tenant: &str, n: u32) -> Vec<Controller> {
    (1..=n)
        .map(|instance| {
            let options = Options {
                bucket: LocalBucketConfig {
                    initial_tokens: 1e6,
                    ..LocalBucketConfig::default()
                },
                partitions: PartitionOptions {
                    report_period: PERIOD,
                    ..PartitionOptions::default()
                },
                ..Options::default()
            };
            Controller::connect(url, tenant, instance, options).expect("valid options")
        })
        .collect()
}

fn hot() -> Partition {
    Partition::new("orders", b"customer-42").expect("partition")
}

/// Every pod writes to the hot partition at `rate` per second for `for_`;
/// returns (accepted, rejected) over all pods.
async fn write(pods: &[Controller], rate: f64, for_: Duration) -> (u64, u64) {
    let tasks: Vec<_> = pods
        .iter()
        .cloned()
        .map(|pod| {
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                let until = Instant::now() + for_;
                let (mut accepted, mut rejected) = (0, 0);
                while Instant::now() < until {
                    ticks.tick().await;
                    match pod
                        .on_request(&Request::write(1, 100).on_partition(hot()))
                        .await
                    {
                        Ok(()) => accepted += 1,
                        Err(ClientError::PartitionRateLimited { table, op }) => {
                            assert_eq!((table.as_str(), op), ("orders", Op::Write));
                            rejected += 1;
                        }
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                (accepted, rejected)
            })
        })
        .collect();
    let mut total = (0, 0);
    for task in tasks {
        let (a, r) = task.await.expect("pod task");
        total.0 += a;
        total.1 += r;
    }
    total
}

/// Waits until every pod applies a write limit of `writes` on `orders`;
/// returns how long that took.
async fn until_pods_apply(pods: &[Controller], writes: f64) -> Duration {
    let start = Instant::now();
    loop {
        let applied = pods.iter().all(|pod| {
            pod.partitions()
                .expect("limiter")
                .limits()
                .values()
                .any(|l| l.max_writes_per_second == Some(writes))
        });
        if applied {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the pods did not learn the limit of {writes}/s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_by_the_cli_reaches_running_pods_and_raising_it_stops_rejections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = tokio::task::block_in_place(|| Server::start(&dir.path().join("t.redb")));
    let pods = pods(&server.url, "acme", 3);

    // No limit yet: nothing is rejected.
    let (_, rejected) = write(&pods, 40.0, Duration::from_secs(1)).await;
    assert_eq!(rejected, 0);

    // 3 pods x 40 writes/s on one partition, against a limit of 20/s.
    tokio::task::block_in_place(|| set_write_limit(&server, "acme", 20.0));
    let took = until_pods_apply(&pods, 20.0).await;
    // Within one report period (and the exchange's round trip).
    assert!(took <= PERIOD + Duration::from_millis(500), "took {took:?}");
    // Two periods for the shares to settle, then measured.
    write(&pods, 40.0, PERIOD * 4).await;
    let window = Duration::from_secs(5);
    let (accepted, rejected) = write(&pods, 40.0, window).await;
    let rate = accepted as f64 / window.as_secs_f64();
    assert!(rejected > 0, "the hot partition is limited");
    // About the limit between the three pods, not three times it (a
    // real-time run on a shared machine: loose bounds).
    assert!(
        (10.0..=32.0).contains(&rate),
        "accepted {rate}/s of 120/s offered against 20/s ({rejected} rejected)"
    );

    // Raised: the rejections stop once the pods have the new limit.
    tokio::task::block_in_place(|| set_write_limit(&server, "acme", 100_000.0));
    until_pods_apply(&pods, 100_000.0).await;
    let (accepted, rejected) = write(&pods, 40.0, Duration::from_secs(2)).await;
    assert_eq!(rejected, 0, "{accepted} accepted");
    for pod in pods {
        pod.shutdown().await;
    }
    server.stop();
}
