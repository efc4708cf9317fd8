//! The gate's promises, in paused tokio time against the core global bucket
//! (a deterministic in-process transport): FIFO order, cancellation gives
//! claims back, no waiter starves, fallback when the server is gone,
//! shutdown, and bad input refused.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tollgate_client::{
    BucketName, ClientError, Controller, Grant, LocalBucketConfig, Options, TenantId,
    TokenBucketRequest, Transport, TransportError,
};
use tollgate_core::Timestamp;
use tollgate_core::global_bucket::{self, BucketRow, BucketRows, GlobalBucketConfig, Limits};

/// The global bucket in-process, on tokio's (paused) clock.
struct LocalServer {
    rows: Mutex<BucketRows>,
    origin: Instant,
    down: AtomicBool,
}

impl LocalServer {
    fn new(refill_rate: f64, burst_limit: f64, tokens: f64) -> Arc<Self> {
        let limits = Limits {
            refill_rate,
            burst_limit,
        };
        Arc::new(LocalServer {
            rows: Mutex::new(BucketRows {
                head: BucketRow::new(limits, tokens, true, Timestamp::EPOCH),
                instances: BTreeMap::new(),
            }),
            origin: Instant::now(),
            down: AtomicBool::new(false),
        })
    }

    fn consumed(&self) -> f64 {
        self.rows
            .lock()
            .expect("lock")
            .head
            .totals
            .consumption
            .request_units()
    }
}

struct Link(Arc<LocalServer>);

#[async_trait]
impl Transport for Link {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        // This server keeps one bucket: the request-unit bucket.
        assert!(bucket.is_request_units(), "sent to bucket {bucket:?}");
        let server = &self.0;
        if server.down.load(Ordering::SeqCst) {
            return Err(TransportError::new("connection refused"));
        }
        let now = Timestamp::from_unix_micros(server.origin.elapsed().as_micros() as i64);
        let mut rows = server.rows.lock().expect("lock");
        global_bucket::request(&mut rows, &request, now, &GlobalBucketConfig::default())
            .map(|outcome| outcome.grant)
            .map_err(|e| TransportError::new(e.to_string()))
    }
}

fn pod(server: &Arc<LocalServer>, instance: u32, initial_tokens: f64) -> Controller {
    let options = Options {
        bucket: LocalBucketConfig {
            initial_tokens,
            buffer_tokens: 0.0,
            ..LocalBucketConfig::default()
        },
        ..Options::default()
    };
    let tenant = TenantId::parse("tenant", "acme").expect("valid");
    Controller::with_transport(Link(Arc::clone(server)), &tenant, instance, options)
        .expect("valid options")
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_in_arrival_order() {
    let server = LocalServer::new(100.0, 100.0, 0.0);
    let controller = pod(&server, 1, 0.0);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..6 {
        let controller = controller.clone();
        let done = done_tx.clone();
        // Alternate sizes: a small one must not overtake a big one.
        let tokens = if i % 2 == 0 { 80.0 } else { 5.0 };
        tokio::spawn(async move {
            controller.acquire(tokens).await.expect("admitted");
            done.send(i).expect("receiver alive");
        });
        // Let it queue before the next one arrives.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(done_tx);
    let mut order = Vec::new();
    while let Some(i) = done_rx.recv().await {
        order.push(i);
    }
    assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquisition_gives_its_claim_back() {
    // Refill 0: the tenant has 50 tokens and never more.
    let server = LocalServer::new(0.0, 0.0, 50.0);
    let controller = pod(&server, 1, 0.0);
    // 100 can never come: give up after a second (the pod gets the 50).
    let gave_up = tokio::time::timeout(Duration::from_secs(1), controller.acquire(100.0)).await;
    assert!(gave_up.is_err(), "cannot be admitted");
    let status = controller.status();
    assert_eq!(status.waiters, 0, "the claim left the queue");
    assert_eq!(status.queued_tokens, 0.0);
    assert_eq!(status.charged_tokens, 0.0, "nothing charged");
    // The 50 are still there, and the next acquisition is not stuck
    // behind the cancelled one.
    assert_eq!(status.tokens, 50.0);
    assert!(controller.try_acquire(50.0).expect("valid"));
}

#[tokio::test(start_paused = true)]
async fn tokens_given_back_before_they_are_reported_are_not_counted() {
    // Refill 0: the tenant has 100 tokens and never more.
    let server = LocalServer::new(0.0, 0.0, 100.0);
    let controller = pod(&server, 1, 0.0);
    let bucket = controller.bucket("").expect("the request-unit bucket");
    bucket.acquire(100.0).await.expect("admitted");
    // 30 of them were not used: back at once, usable by the next caller.
    assert_eq!(bucket.give_back(30.0).expect("valid"), 30.0);
    assert_eq!(bucket.status().charged_tokens, 70.0);
    assert!(bucket.try_acquire(30.0).expect("valid"));
    assert_eq!(bucket.give_back(20.0).expect("valid"), 20.0);
    // Once the driver has reported them, nothing comes back.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(!bucket.status().request_in_flight);
    assert_eq!(bucket.give_back(50.0).expect("valid"), 0.0);
    assert!(matches!(
        bucket.give_back(f64::NAN),
        Err(ClientError::InvalidInput(e)) if e.field == "tokens"
    ));
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    assert_eq!(server.consumed(), 80.0, "100 + 30 taken, 50 given back");
}

#[tokio::test(start_paused = true)]
async fn no_waiter_starves_behind_a_stream_of_small_ones() {
    let server = LocalServer::new(100.0, 100.0, 0.0);
    let controller = pod(&server, 1, 0.0);
    let started = Instant::now();
    // Four tasks asking for 1 token as fast as they can…
    let mut small = Vec::new();
    for _ in 0..4 {
        let controller = controller.clone();
        small.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            while started.elapsed() < Duration::from_secs(30) {
                controller.acquire(1.0).await.expect("admitted");
                admitted += 1;
            }
            admitted
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // …and one asking for 300 in the middle of them.
    let big_started = Instant::now();
    controller.acquire(300.0).await.expect("admitted");
    let waited = big_started.elapsed();
    // FIFO: only the few small acquisitions queued before it go first. It
    // waits at most one target period (for the grant sized to the queue)
    // plus its own 3 s of refill — not for as long as small ones keep coming.
    assert!(
        waited < Duration::from_secs(13),
        "big waiter waited {waited:?}"
    );
    for task in small {
        assert!(
            task.await.expect("task ran") > 0,
            "small waiters progress too"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_server_the_pod_runs_on_the_fallback_rate_and_recovers() {
    let server = LocalServer::new(100.0, 1000.0, 1000.0);
    let controller = pod(&server, 1, 0.0);
    // A first answer sets the fallback rate (100/s: the only pod gets it all).
    controller.acquire(10.0).await.expect("admitted");
    server.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await; // whatever it holds is used below
    let outage = Instant::now();
    let mut admitted = 0.0;
    while outage.elapsed() < Duration::from_secs(10) {
        controller.acquire(10.0).await.expect("fallback admits");
        admitted += 10.0;
    }
    assert!(controller.status().fallback_active);
    // 10 s at 100/s plus what was on hand when the server went.
    assert!(admitted >= 900.0, "fallback admitted {admitted}");
    assert!(admitted <= 2100.0, "fallback admitted {admitted}");
    server.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!controller.status().fallback_active, "recovered");
    controller
        .acquire(10.0)
        .await
        .expect("admitted after recovery");
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    assert!((server.consumed() - report.status.charged_tokens).abs() < 1e-6);
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_waiters_and_reports_everything_charged() {
    // Refill 0: the waiter below can never be admitted.
    let server = LocalServer::new(0.0, 0.0, 0.0);
    let controller = pod(&server, 1, 100.0);
    controller.acquire(60.0).await.expect("admitted");
    controller.record_cpu(0.003).expect("valid");
    let waiter = {
        let controller = controller.clone();
        tokio::spawn(async move { controller.acquire(1e6).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    assert!(matches!(
        waiter.await.expect("task ran"),
        Err(ClientError::Closed)
    ));
    assert!(matches!(
        controller.acquire(1.0).await,
        Err(ClientError::Closed)
    ));
    let charged = 60.0 + 333.3 * 0.003;
    assert!((report.status.charged_tokens - charged).abs() < 1e-6);
    assert!((server.consumed() - charged).abs() < 1e-6);
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_and_charges_nothing() {
    let server = LocalServer::new(10.0, 0.0, 0.0);
    let controller = pod(&server, 1, 100.0);
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        assert!(matches!(
            controller.acquire(bad).await,
            Err(ClientError::InvalidInput(_))
        ));
        assert!(controller.try_acquire(bad).is_err());
        assert!(controller.record_cpu(bad).is_err());
    }
    assert_eq!(controller.status().charged_tokens, 0.0);
    let tenant = TenantId::parse("tenant", "acme").expect("valid");
    assert!(
        Controller::with_transport(Link(Arc::clone(&server)), &tenant, 0, Options::default())
            .is_err(),
        "instance 0 is the tenant's"
    );
    assert!(matches!(
        Controller::connect("not a url", "acme", 1, Options::default()),
        Err(ClientError::Endpoint { .. })
    ));
    assert!(matches!(
        Controller::connect("http://127.0.0.1:1", "bad tenant!", 1, Options::default()),
        Err(ClientError::InvalidInput(_))
    ));
}

/// The KV interceptor counts reads and writes off the lock; every one of
/// them reaches the server's totals, from threads at once, by shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_and_write_counted_by_on_request_reaches_the_server() {
    let server = LocalServer::new(1e9, 1e9, 1e9);
    let controller = pod(&server, 1, 1e6);
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let controller = controller.clone();
            tokio::spawn(async move {
                for _ in 0..1_000 {
                    controller
                        .on_request(&tollgate_client::Request::read(3))
                        .await
                        .expect("read");
                    controller
                        .on_request(&tollgate_client::Request::write(2, 100))
                        .await
                        .expect("write");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert!(controller.shutdown().await.consumption_reported);
    let rows = server.rows.lock().expect("lock");
    let total = &rows.head.totals.consumption;
    assert_eq!(
        (
            total.read_batches,
            total.read_requests,
            total.write_batches,
            total.write_requests,
            total.write_bytes
        ),
        (4_000, 12_000, 4_000, 8_000, 400_000)
    );
}
