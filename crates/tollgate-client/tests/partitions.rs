//! Hot-partition limits at the pod, in paused tokio time against the
//! core's exchange in process (the rules every store runs): the limit is
//! learned from the server and held, cold partitions pass, a rejection is
//! never retried nor charged, pods share a hot partition through the
//! server, and fall back to the whole limit each without it.
//!
//! In numbers: the limit held from 1.5 to 20 times over; ten pods sharing
//! a partition admit about ten times the limit alone and about the limit
//! coordinated; a changed limit reaches the pods within one period; a
//! rejection is returned at once and counted once; and the metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tollgate_client::{
    BucketName, ClientError, Controller, Grant, Op, Options, Partition, PartitionClock,
    PartitionOptions, Request, TenantId, TokenBucketRequest, Transport, TransportError,
};
use tollgate_core::Timestamp;
use tollgate_core::partition::{
    self, ExchangeAnswer, PartitionReports, RETRY_AFTER_FAILURE, TableLimitSet, TableLimits,
};
use tollgate_core::{LocalBucketConfig, TableName};
use tollgate_proto::partition::PartitionLoadCall;

const PERIOD: Duration = Duration::from_secs(10);

/// The tenant's side in process: table limits an operator sets, the
/// pods' reports, and plenty of tokens.
struct Server {
    limits: Mutex<TableLimitSet>,
    reports: Mutex<PartitionReports>,
    origin: Instant,
    down: AtomicBool,
    exchanges: AtomicU64,
    /// False: answer limits but never shares (each pod on its own).
    coordinate: bool,
}

impl Server {
    fn new(writes_per_second: f64, coordinate: bool) -> Arc<Self> {
        let server = Arc::new(Server {
            limits: Mutex::new(TableLimitSet::new()),
            reports: Mutex::new(PartitionReports::default()),
            origin: Instant::now(),
            down: AtomicBool::new(false),
            exchanges: AtomicU64::new(0),
            coordinate,
        });
        server.set_limit(writes_per_second);
        server
    }

    fn set_limit(&self, writes_per_second: f64) {
        let table = TableName::parse("table", "orders").expect("name");
        let limits = TableLimits {
            max_reads_per_second: None,
            max_writes_per_second: Some(writes_per_second),
        };
        *self.limits.lock().expect("lock") = [(table, limits)].into();
    }
}

struct Link(Arc<Server>);

#[async_trait]
impl Transport for Link {
    async fn token_bucket(
        &self,
        _bucket: &BucketName,
        _request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        Ok(Grant {
            granted_tokens: 1e9,
            trickle_duration: Duration::ZERO,
            max_burst_tokens: 0.0,
            fallback_rate: 1e9,
            fallback_charged: Some(0.0),
            initial_allowance: None,
        })
    }

    async fn partition_load(
        &self,
        call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        let server = &self.0;
        if server.down.load(Ordering::SeqCst) {
            return Err(TransportError::new("connection refused"));
        }
        server.exchanges.fetch_add(1, Ordering::SeqCst);
        let now = Timestamp::from_unix_micros(server.origin.elapsed().as_micros() as i64);
        let limits = server.limits.lock().expect("lock").clone();
        let mut answer = partition::exchange(
            &mut server.reports.lock().expect("lock"),
            &limits,
            &call.exchange,
            now,
        );
        if !server.coordinate {
            answer.shares.clear();
        }
        Ok(answer)
    }
}

fn pod(server: &Arc<Server>, instance: u32) -> Controller {
    let options = Options {
        bucket: LocalBucketConfig {
            initial_tokens: 1e9,
            ..LocalBucketConfig::default()
        },
        partitions: PartitionOptions {
            report_period: PERIOD,
            // Paused time drives the counters.
            clock: PartitionClock::Tokio,
            ..PartitionOptions::default()
        },
        ..Options::default()
    };
    let tenant = TenantId::parse("tenant", "acme").expect("valid");
    Controller::with_transport(Link(Arc::clone(server)), &tenant, instance, options)
        .expect("controller")
}

fn hot() -> Partition {
    Partition::new("orders", b"customer-42").expect("partition")
}

/// Starts the pod's limiter and lets its first exchange be answered.
async fn learn_limits(controller: &Controller) {
    controller.partitions().expect("limiter");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        !controller
            .partitions()
            .expect("limiter")
            .limits()
            .is_empty()
    );
}

/// Sends `rate` writes per second on `partition` for `seconds`, evenly
/// spaced (in ticks of whole milliseconds, tokio's timer resolution);
/// returns how many were accepted.
async fn offer(controller: &Controller, partition: Partition, rate: f64, seconds: f64) -> u64 {
    let tick = Duration::from_millis(((1_000.0 / rate).floor() as u64).max(1));
    let per_tick = rate * tick.as_secs_f64();
    let ticks = (seconds / tick.as_secs_f64()).round() as u64;
    let mut accepted = 0;
    let mut owed = 0.0;
    for _ in 0..ticks {
        owed += per_tick;
        while owed >= 1.0 - 1e-9 {
            owed -= 1.0;
            match controller
                .on_request(&Request::write(1, 10).on_partition(partition))
                .await
            {
                Ok(()) => accepted += 1,
                Err(ClientError::PartitionRateLimited { table, op }) => {
                    assert_eq!((table.as_str(), op), ("orders", Op::Write));
                }
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        tokio::time::sleep(tick).await;
    }
    accepted
}

#[tokio::test(start_paused = true)]
async fn a_hot_partition_is_held_to_its_limit_and_cold_ones_pass() {
    let server = Server::new(100.0, true);
    let controller = pod(&server, 1);
    learn_limits(&controller).await;
    // Reads are not limited, nor are other tables.
    for _ in 0..10_000 {
        controller
            .on_request(&Request::read(1).on_partition(hot()))
            .await
            .expect("reads are not limited");
        controller
            .admit_partition(Partition::new("users", b"k").expect("p"), Op::Write)
            .expect("users is not limited");
    }
    for multiple in [1.5, 5.0, 20.0] {
        let partition =
            Partition::new("orders", format!("hot-{multiple}").as_bytes()).expect("partition");
        // From a fresh counter, as it fills, a few more pass: measured in
        // steady state, after 5 s.
        offer(&controller, partition, 100.0 * multiple, 5.0).await;
        let accepted = offer(&controller, partition, 100.0 * multiple, 30.0).await;
        let rate = accepted as f64 / 30.0;
        assert!(
            (rate - 100.0).abs() <= 10.0,
            "{multiple} x the limit: accepted {rate}/s against 100/s"
        );
    }
    // 2 000 cold partitions at 0.5/s each, 1 000/s in all: none rejected.
    let mut rejected = 0;
    for round in 0..10 {
        for key in 0..2_000u32 {
            let partition = Partition::new("orders", &key.to_be_bytes()).expect("p");
            if controller.admit_partition(partition, Op::Write).is_err() {
                rejected += 1;
            }
            tokio::time::sleep(Duration::from_micros(1_000)).await;
        }
        assert_eq!(rejected, 0, "round {round}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_rejection_is_returned_at_once_and_never_retried_nor_charged() {
    let server = Server::new(10.0, true);
    let controller = pod(&server, 1);
    learn_limits(&controller).await;
    let charged_before = controller.status().charged_tokens;
    let mut accepted = 0u32;
    let mut rejected = 0u32;
    let start = Instant::now();
    // 1 000 writes at once, no time passing: the first hundred or so pass
    // (the counter fills: about L x half-life / ln 2 of them, then fewer
    // and fewer), the rest are refused on the spot.
    for _ in 0..1_000 {
        let started = Instant::now();
        match controller
            .on_request(&Request::write(1, 10).on_partition(hot()))
            .await
        {
            Ok(()) => accepted += 1,
            Err(ClientError::PartitionRateLimited { .. }) => {
                assert_eq!(started.elapsed(), Duration::ZERO, "a rejection never waits");
                rejected += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(rejected > 800, "accepted {accepted}, rejected {rejected}");
    // Each call counted once: the partition's counter holds the 1 000
    // operations offered, not more (a retry would have added to it).
    let seen = controller.partitions().expect("limiter").hottest();
    assert_eq!(seen.len(), 1);
    let counted = seen[0].rate * partition::half_life(10.0) / std::f64::consts::LN_2;
    assert!((counted - 1_000.0).abs() < 1.0, "counted {counted}");
    // Only the accepted writes were charged.
    let charged = controller.status().charged_tokens - charged_before;
    let per_write = controller.status().charged_tokens / f64::from(accepted.max(1));
    assert!(charged > 0.0 && per_write > 0.0);
    let one = tollgate_core::CostModel::default()
        .before(tollgate_core::Batch::Write {
            requests: 1,
            bytes: 10,
        })
        .request_units();
    assert!(
        (charged - one * f64::from(accepted)).abs() < 1e-6,
        "charged {charged} for {accepted} accepted writes"
    );
}

/// Ten pods each offered the hot partition at its limit (ten times it in
/// all) for 80 s; returns the accepted rate over the last 40 s.
async fn ten_pods(coordinate: bool) -> f64 {
    let server = Server::new(100.0, coordinate);
    let pods: Vec<Controller> = (1..=10).map(|i| pod(&server, i)).collect();
    for controller in &pods {
        learn_limits(controller).await;
    }
    let run = |seconds: f64| {
        let pods = pods.clone();
        async move {
            let tasks: Vec<_> = pods
                .into_iter()
                .map(|controller| {
                    tokio::spawn(async move { offer(&controller, hot(), 100.0, seconds).await })
                })
                .collect();
            let mut total = 0;
            for task in tasks {
                total += task.await.expect("pod task");
            }
            total
        }
    };
    run(40.0).await;
    run(40.0).await as f64 / 40.0
}

#[tokio::test(start_paused = true)]
async fn pods_share_a_hot_partition_through_the_server() {
    let alone = ten_pods(false).await;
    let coordinated = ten_pods(true).await;
    // On their own, ten pods each accept about the limit, as ScyllaDB's
    // replicas do; coordinated, about the limit between them.
    assert!(alone > 900.0, "local only: {alone}/s");
    assert!(
        (80.0..=120.0).contains(&coordinated),
        "coordinated: {coordinated}/s against 100/s"
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_server_each_pod_applies_the_whole_limit() {
    let server = Server::new(100.0, true);
    let a = pod(&server, 1);
    let b = pod(&server, 2);
    learn_limits(&a).await;
    learn_limits(&b).await;
    let both = |seconds| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let a = tokio::spawn(async move { offer(&a, hot(), 100.0, seconds).await });
            let b = tokio::spawn(async move { offer(&b, hot(), 100.0, seconds).await });
            a.await.expect("a") + b.await.expect("b")
        }
    };
    both(30.0).await;
    let share = a.partitions().expect("limiter").share(hot(), Op::Write);
    assert!((0.3..0.7).contains(&share), "coordinated share {share}");
    server.down.store(true, Ordering::SeqCst);
    // The shares go with the first failed exchange two periods after the
    // last answer; failed exchanges are retried at most twice
    // RETRY_AFTER_FAILURE apart (the jitter draw is the pod's own).
    let longest_retry = 2.0 * RETRY_AFTER_FAILURE.as_secs_f64();
    both(2.0 * PERIOD.as_secs_f64() + longest_retry + 1.0).await;
    assert_eq!(
        a.partitions().expect("limiter").share(hot(), Op::Write),
        1.0,
        "two periods without an answer: the whole limit"
    );
    // The limits known are kept: the partition is still limited (measured
    // once the counter has caught up with the new rate).
    offer(&a, hot(), 500.0, 5.0).await;
    let accepted = offer(&a, hot(), 500.0, 10.0).await as f64 / 10.0;
    assert!((90.0..=110.0).contains(&accepted), "{accepted}/s");
}

#[tokio::test(start_paused = true)]
async fn a_changed_limit_reaches_the_pod_within_one_period() {
    let server = Server::new(10.0, true);
    let controller = pod(&server, 1);
    learn_limits(&controller).await;
    let before = offer(&controller, hot(), 100.0, 20.0).await;
    assert!(before < 400, "limited at 10/s: {before} of 2 000 accepted");
    server.set_limit(1_000.0);
    let limiter = controller.partitions().expect("limiter");
    let start = Instant::now();
    while limiter
        .limits()
        .values()
        .next()
        .and_then(|l| l.max_writes_per_second)
        != Some(1_000.0)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(start.elapsed() <= PERIOD, "took {:?}", start.elapsed());
    assert_eq!(
        offer(&controller, hot(), 100.0, 5.0).await,
        500,
        "none rejected"
    );
    assert!(server.exchanges.load(Ordering::SeqCst) >= 2);
}

#[tokio::test(start_paused = true)]
async fn rejections_and_the_hottest_partitions_are_in_the_metrics() {
    let server = Server::new(10.0, true);
    let registry = tollgate_client::Registry::new();
    let options = Options {
        registry: Some(registry.clone()),
        partitions: PartitionOptions {
            report_period: PERIOD,
            clock: PartitionClock::Tokio,
            top_k: 3,
            ..PartitionOptions::default()
        },
        ..Options::default()
    };
    let tenant = TenantId::parse("tenant", "acme").expect("valid");
    let controller =
        Controller::with_transport(Link(Arc::clone(&server)), &tenant, 1, options).expect("pod");
    learn_limits(&controller).await;
    // Twenty partitions over their limit: the gauge keeps the top 3 only.
    for key in 0..20u32 {
        let partition = Partition::new("orders", &key.to_be_bytes()).expect("p");
        for _ in 0..100 {
            let _ = controller.admit_partition(partition, Op::Write);
        }
    }
    tokio::time::sleep(PERIOD).await;
    let families = registry.gather();
    let family = |name: &str| {
        families
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("{name} is registered"))
    };
    let rejections = family("tollgate_client_partition_rejections_total");
    let metric = &rejections.get_metric()[0];
    let labels: Vec<(&str, &str)> = metric
        .get_label()
        .iter()
        .map(|l| (l.name(), l.value()))
        .collect();
    assert!(labels.contains(&("table", "orders")) && labels.contains(&("op", "write")));
    assert!(metric.get_counter().get_value() > 500.0);
    let hot = family("tollgate_client_partition_hot_rate");
    assert_eq!(hot.get_metric().len(), 3, "top-k, hashed keys");
    for metric in hot.get_metric() {
        let partition = metric
            .get_label()
            .iter()
            .find(|l| l.name() == "partition")
            .expect("partition label");
        assert_eq!(partition.value().len(), 16, "a 64-bit hash in hex");
    }
}

#[test]
fn a_partition_key_is_checked() {
    assert!(Partition::new("orders", b"").is_err());
    let long = vec![b'k'; 4097];
    let err = Partition::new("orders", &long).expect_err("too long");
    assert_eq!(err.field, "key");
    assert!(Partition::new("orders", &long[..4096]).is_ok());
}
