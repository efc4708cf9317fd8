//! One controller gating several of the tenant's buckets, in paused tokio
//! time against an in-process server that keeps one core global bucket per
//! bucket name: buckets are isolated from each other (an exhausted or a
//! hanging bucket holds up no other), `acquire(n)` claims n at once, a
//! name always means the same bucket, bad names are refused, each request
//! names its bucket with its own lease and sequence, shutdown reports
//! every bucket, and each bucket has its own metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tollgate_client::{
    BucketName, ClientError, Controller, Grant, LocalBucketConfig, Options, Registry, TenantId,
    TokenBucketRequest, Transport, TransportError,
};
use tollgate_core::Timestamp;
use tollgate_core::global_bucket::{self, BucketRow, BucketRows, GlobalBucketConfig, Limits};

/// How the in-process server treats one bucket's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Serve,
    /// Fails at once, as an unreachable server would.
    Refuse,
    /// Never answers, as a server stuck on a lock would.
    Hang,
}

/// The tenant's global buckets in-process, one per name, on tokio's
/// (paused) clock; it records every request it receives.
struct Server {
    buckets: Mutex<BTreeMap<BucketName, (BucketRows, Answer)>>,
    received: Mutex<Vec<(BucketName, TokenBucketRequest)>>,
    origin: Instant,
}

impl Server {
    fn new() -> Arc<Self> {
        Arc::new(Server {
            buckets: Mutex::new(BTreeMap::new()),
            received: Mutex::new(Vec::new()),
            origin: Instant::now(),
        })
    }

    /// Adds bucket `name` with these limits and `tokens` in it.
    fn with(
        self: Arc<Self>,
        name: &str,
        refill_rate: f64,
        burst_limit: f64,
        tokens: f64,
    ) -> Arc<Self> {
        let limits = Limits {
            refill_rate,
            burst_limit,
        };
        let rows = BucketRows {
            head: BucketRow::new(limits, tokens, true, Timestamp::EPOCH),
            instances: BTreeMap::new(),
        };
        self.buckets
            .lock()
            .expect("lock")
            .insert(bucket(name), (rows, Answer::Serve));
        self
    }

    fn answer(&self, name: &str, answer: Answer) {
        if let Some(entry) = self.buckets.lock().expect("lock").get_mut(&bucket(name)) {
            entry.1 = answer;
        }
    }

    /// The request units bucket `name` has been told were consumed.
    fn consumed(&self, name: &str) -> f64 {
        self.buckets.lock().expect("lock")[&bucket(name)]
            .0
            .head
            .totals
            .consumption
            .request_units()
    }

    /// The requests received for bucket `name`, in order.
    fn received(&self, name: &str) -> Vec<TokenBucketRequest> {
        let name = bucket(name);
        self.received
            .lock()
            .expect("lock")
            .iter()
            .filter(|(b, _)| *b == name)
            .map(|(_, request)| request.clone())
            .collect()
    }

    fn received_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .received
            .lock()
            .expect("lock")
            .iter()
            .map(|(b, _)| b.to_string())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

struct Link(Arc<Server>);

#[async_trait]
impl Transport for Link {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        let server = &self.0;
        server
            .received
            .lock()
            .expect("lock")
            .push((bucket.clone(), request.clone()));
        let answer = {
            let now = Timestamp::from_unix_micros(server.origin.elapsed().as_micros() as i64);
            let mut buckets = server.buckets.lock().expect("lock");
            let Some((rows, answer)) = buckets.get_mut(bucket) else {
                return Err(TransportError::new(format!("unknown bucket {bucket:?}")));
            };
            match answer {
                Answer::Serve => Some(
                    global_bucket::request(rows, &request, now, &GlobalBucketConfig::default())
                        .map(|outcome| outcome.grant)
                        .map_err(|e| TransportError::new(e.to_string())),
                ),
                Answer::Refuse => Some(Err(TransportError::new("connection refused"))),
                Answer::Hang => None,
            }
        };
        match answer {
            Some(result) => result,
            None => std::future::pending().await,
        }
    }
}

fn bucket(name: &str) -> BucketName {
    BucketName::parse("bucket", name).expect("valid bucket name")
}

fn options(initial_tokens: f64) -> Options {
    Options {
        bucket: LocalBucketConfig {
            initial_tokens,
            buffer_tokens: 0.0,
            ..LocalBucketConfig::default()
        },
        ..Options::default()
    }
}

fn pod_with(server: &Arc<Server>, options: Options) -> Controller {
    let tenant = TenantId::parse("tenant", "acme").expect("valid");
    Controller::with_transport(Link(Arc::clone(server)), &tenant, 1, options)
        .expect("valid options")
}

fn pod(server: &Arc<Server>, initial_tokens: f64) -> Controller {
    pod_with(server, options(initial_tokens))
}

#[tokio::test(start_paused = true)]
async fn exhausting_one_bucket_leaves_the_others_usable() {
    // Refill 0: "a" holds 10 tokens for good, "b" 100, the request units 50.
    let server = Server::new()
        .with("", 0.0, 0.0, 50.0)
        .with("a", 0.0, 0.0, 10.0)
        .with("b", 0.0, 0.0, 100.0);
    let controller = pod(&server, 0.0);
    let a = controller.bucket("a").expect("valid name");
    let b = controller.bucket("b").expect("valid name");
    a.acquire(10.0).await.expect("a holds 10");
    // "a" is spent: one more waits for good…
    let stuck = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(1.0).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(a.status().waiters, 1);
    // …while "b" and the request-unit bucket admit what they hold.
    let started = Instant::now();
    b.acquire(100.0).await.expect("b holds 100");
    controller
        .acquire(50.0)
        .await
        .expect("request units hold 50");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "not held up by a"
    );
    assert_eq!(b.status().charged_tokens, 100.0);
    assert_eq!(controller.status().charged_tokens, 50.0);
    assert_eq!(a.status().charged_tokens, 10.0);
    assert!(!a.try_acquire(1.0).expect("valid"));
    assert!(!stuck.is_finished(), "a never gets another token");
    stuck.abort();
}

#[tokio::test(start_paused = true)]
async fn a_bucket_whose_server_hangs_does_not_stall_another() {
    let server = Server::new()
        .with("", 100.0, 1000.0, 1000.0)
        .with("stalled", 100.0, 1000.0, 1000.0)
        .with("moving", 100.0, 1000.0, 1000.0);
    server.answer("stalled", Answer::Hang);
    let controller = pod(&server, 0.0);
    let stalled = controller.bucket("stalled").expect("valid name");
    let moving = controller.bucket("moving").expect("valid name");
    let waiting = {
        let stalled = stalled.clone();
        tokio::spawn(async move { stalled.acquire(10.0).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // "stalled" waits on an answer that never comes; "moving" gets its
    // grants all the same, 100 rounds of them.
    let started = Instant::now();
    for _ in 0..100 {
        moving.acquire(10.0).await.expect("moving is served");
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "moving waited {:?}",
        started.elapsed()
    );
    assert!(!waiting.is_finished(), "nothing granted to stalled");
    assert!(stalled.status().request_in_flight);
    waiting.abort();
}

#[tokio::test(start_paused = true)]
async fn acquire_n_claims_all_n_tokens_at_once_in_arrival_order() {
    // 30 tokens now, 10 more a second.
    let server = Server::new()
        .with("", 0.0, 0.0, 0.0)
        .with("schedule-email", 10.0, 1000.0, 30.0);
    let controller = pod(&server, 0.0);
    let emails = controller.bucket("schedule-email").expect("valid name");
    // Never partly: 40 are not there, so nothing is taken.
    assert!(!emails.try_acquire(40.0).expect("valid"));
    assert_eq!(emails.status().charged_tokens, 0.0);

    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for tokens in [50.0, 1.0] {
        let emails = emails.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            emails.acquire(tokens).await.expect("admitted");
            done.send((tokens, emails.status().charged_tokens))
                .expect("receiver alive");
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(done_tx);
    // The server holds 30 of the 50: they arrive as a trickle of at least
    // a second, and the claim waits for all of them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        done_rx.try_recv().is_err(),
        "50 admitted with 30 in the bucket"
    );
    let mut done = Vec::new();
    while let Some(admission) = done_rx.recv().await {
        done.push(admission);
    }
    // The small claim came second and waited behind the big one.
    assert_eq!(done[0].0, 50.0);
    assert!(done[0].1 >= 50.0);
    assert_eq!(done[1].0, 1.0);
    assert_eq!(emails.status().charged_tokens, 51.0);
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    assert!((server.consumed("schedule-email") - 51.0).abs() < 1e-6);
    assert_eq!(server.consumed(""), 0.0, "nothing charged to request units");
}

#[tokio::test(start_paused = true)]
async fn the_same_name_always_gives_the_same_bucket() {
    let server = Server::new()
        .with("", 0.0, 0.0, 0.0)
        .with("schedule-email", 0.0, 0.0, 0.0);
    let controller = pod(&server, 100.0);
    let first = controller.bucket("schedule-email").expect("valid name");
    let second = controller.bucket("schedule-email").expect("valid name");
    let through_a_clone = controller.clone().bucket("schedule-email").expect("valid");
    first.acquire(30.0).await.expect("initial allowance");
    assert!(second.try_acquire(30.0).expect("valid"));
    through_a_clone
        .acquire(30.0)
        .await
        .expect("initial allowance");
    for handle in [&first, &second, &through_a_clone] {
        assert_eq!(handle.name().as_str(), "schedule-email");
        assert_eq!(handle.status().charged_tokens, 90.0);
        assert_eq!(handle.status().tokens, 10.0);
    }
    // The request-unit bucket is the controller's own, under the name "".
    let request_units = controller.bucket("").expect("the request-unit bucket");
    assert!(request_units.name().is_request_units());
    request_units
        .acquire(20.0)
        .await
        .expect("initial allowance");
    assert_eq!(controller.status().charged_tokens, 20.0);
    // One bucket on the server's side too: one lease, one sequence.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = server.received("schedule-email");
    assert!(!sent.is_empty());
    assert!(sent.iter().all(|r| r.lease == sent[0].lease));
}

#[tokio::test(start_paused = true)]
async fn invalid_bucket_names_are_refused_naming_the_field() {
    let server = Server::new().with("", 0.0, 0.0, 0.0);
    let controller = pod(&server, 0.0);
    let long = "a".repeat(65);
    for bad in ["a b", "x/y", "é", "email\n", long.as_str()] {
        match controller.bucket(bad) {
            Err(ClientError::InvalidInput(e)) => assert_eq!(e.field, "bucket", "{bad:?}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(
        controller.bucket(&"a".repeat(64)).is_ok(),
        "64 is the limit"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let names = server.received_names();
    assert_eq!(names, vec!["".to_string(), "a".repeat(64)]);
}

#[tokio::test(start_paused = true)]
async fn each_request_names_its_bucket_and_keeps_its_own_lease_and_sequence() {
    let server = Server::new()
        .with("", 100.0, 1000.0, 1000.0)
        .with("schedule-email", 100.0, 1000.0, 1000.0)
        .with("invoke-doc-summary-ai", 100.0, 1000.0, 1000.0);
    let controller = pod(&server, 0.0);
    let emails = controller.bucket("schedule-email").expect("valid name");
    let summaries = controller
        .bucket("invoke-doc-summary-ai")
        .expect("valid name");
    for _ in 0..20 {
        controller.acquire(5.0).await.expect("request units");
        emails.acquire(7.0).await.expect("emails");
        summaries.acquire(3.0).await.expect("summaries");
    }
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    assert_eq!(
        server.received_names(),
        ["", "invoke-doc-summary-ai", "schedule-email"]
    );
    let mut leases = Vec::new();
    for (name, charged) in [
        ("", 100.0),
        ("schedule-email", 140.0),
        ("invoke-doc-summary-ai", 60.0),
    ] {
        let sent = server.received(name);
        assert!(sent.len() >= 2, "{name:?}: a first and a final request");
        // Each bucket's own sequence, from 1, on one lease of its own.
        assert_eq!(sent[0].seq, 1, "{name:?}");
        assert!(sent.windows(2).all(|w| w[0].seq < w[1].seq), "{name:?}");
        assert!(sent.iter().all(|r| r.lease == sent[0].lease), "{name:?}");
        leases.push(sent[0].lease.clone());
        // What each bucket charged reached that bucket, and only that one.
        let reported: f64 = sent.iter().map(|r| r.consumption.request_units()).sum();
        assert!((reported - charged).abs() < 1e-6, "{name:?}: {reported}");
        assert!((server.consumed(name) - charged).abs() < 1e-6, "{name:?}");
    }
    leases.sort();
    leases.dedup();
    assert_eq!(leases.len(), 3, "a lease per bucket");
}

#[tokio::test(start_paused = true)]
async fn shutdown_reports_every_bucket_and_gives_back_what_each_holds() {
    // Refill 0 so that what the server holds is exactly what it got back.
    let server = Server::new()
        .with("", 0.0, 1000.0, 100.0)
        .with("schedule-email", 0.0, 1000.0, 200.0)
        .with("invoke-doc-summary-ai", 0.0, 1000.0, 300.0);
    let controller = pod(&server, 0.0);
    let emails = controller.bucket("schedule-email").expect("valid name");
    let summaries = controller
        .bucket("invoke-doc-summary-ai")
        .expect("valid name");
    controller.acquire(10.0).await.expect("request units");
    emails.acquire(20.0).await.expect("emails");
    summaries.acquire(30.0).await.expect("summaries");
    let waiter = {
        let emails = emails.clone();
        tokio::spawn(async move { emails.acquire(1e6).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;

    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    let names: Vec<&str> = report.buckets.iter().map(|b| b.bucket.as_str()).collect();
    assert_eq!(names, ["", "invoke-doc-summary-ai", "schedule-email"]);
    assert_eq!(report.status, report.buckets[0].status);
    for (name, charged) in [
        ("", 10.0),
        ("invoke-doc-summary-ai", 30.0),
        ("schedule-email", 20.0),
    ] {
        let bucket = report
            .buckets
            .iter()
            .find(|b| b.bucket.as_str() == name)
            .expect("reported");
        assert!(bucket.consumption_reported, "{name:?}");
        assert_eq!(bucket.status.charged_tokens, charged, "{name:?}");
        assert!((server.consumed(name) - charged).abs() < 1e-6, "{name:?}");
        let last = server.received(name).pop().expect("a final request");
        assert_eq!(last.shares, 0.0, "{name:?}: final request");
    }
    // Everything not used went back: each global bucket holds its tokens
    // less what was charged.
    let held = |name: &str| {
        server.buckets.lock().expect("lock")[&bucket(name)]
            .0
            .head
            .state
            .tokens
    };
    assert!((held("") - 90.0).abs() < 1e-6, "{}", held(""));
    assert!((held("schedule-email") - 180.0).abs() < 1e-6);
    assert!((held("invoke-doc-summary-ai") - 270.0).abs() < 1e-6);

    // Every bucket is closed, and no new one starts.
    assert!(matches!(
        waiter.await.expect("task ran"),
        Err(ClientError::Closed)
    ));
    assert!(matches!(
        summaries.acquire(1.0).await,
        Err(ClientError::Closed)
    ));
    assert!(matches!(
        controller.bucket("late-comer"),
        Err(ClientError::Closed)
    ));
}

#[tokio::test(start_paused = true)]
async fn shutdown_says_which_bucket_could_not_report() {
    // Each bucket holds 100: the first grant covers what the pod uses
    // after its allowance is settled.
    let server =
        Server::new()
            .with("", 0.0, 100.0, 100.0)
            .with("schedule-email", 0.0, 100.0, 100.0);
    let controller = pod_with(
        &server,
        Options {
            shutdown_timeout: Duration::from_secs(3),
            ..options(100.0)
        },
    );
    let emails = controller.bucket("schedule-email").expect("valid name");
    controller.acquire(10.0).await.expect("initial allowance");
    emails.acquire(10.0).await.expect("initial allowance");
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The server stops answering for one bucket, which has charged since
    // its last request: that consumption has nowhere to go.
    server.answer("schedule-email", Answer::Refuse);
    controller.acquire(5.0).await.expect("granted");
    emails.acquire(5.0).await.expect("granted");
    let started = Instant::now();
    let report = controller.shutdown().await;
    assert!(started.elapsed() <= Duration::from_secs(3), "one deadline");
    assert!(!report.consumption_reported, "one bucket's report is lost");
    let delivered: Vec<(&str, bool)> = report
        .buckets
        .iter()
        .map(|b| (b.bucket.as_str(), b.consumption_reported))
        .collect();
    assert_eq!(delivered, [("", true), ("schedule-email", false)]);
    assert!((server.consumed("") - 15.0).abs() < 1e-6);
    assert!((server.consumed("schedule-email") - 10.0).abs() < 1e-6);
}

#[tokio::test(start_paused = true)]
async fn each_bucket_has_its_own_metrics() {
    let server = Server::new()
        .with("", 0.0, 0.0, 0.0)
        .with("schedule-email", 0.0, 0.0, 0.0);
    let registry = Registry::new();
    let controller = pod_with(
        &server,
        Options {
            registry: Some(registry.clone()),
            ..options(100.0)
        },
    );
    controller.acquire(10.0).await.expect("initial allowance");
    let emails = controller.bucket("schedule-email").expect("valid name");
    emails.acquire(25.0).await.expect("initial allowance");
    // The lock-free fast path leaves the metrics to the next locked
    // operation, as a status read is.
    controller.status();
    emails.status();
    let charged: BTreeMap<String, f64> = registry
        .gather()
        .iter()
        .filter(|family| family.name() == "tollgate_client_charged_tokens_total")
        .flat_map(|family| family.get_metric().iter())
        .map(|metric| {
            let bucket = metric
                .get_label()
                .iter()
                .find(|label| label.name() == "bucket")
                .map(|label| label.value().to_string())
                .expect("a bucket label");
            (bucket, metric.get_counter().get_value())
        })
        .collect();
    assert_eq!(
        charged,
        BTreeMap::from([("".to_string(), 10.0), ("schedule-email".to_string(), 25.0)])
    );
}

#[tokio::test(start_paused = true)]
async fn a_bucket_can_start_from_a_thread_outside_the_runtime() {
    let server = Server::new()
        .with("", 0.0, 0.0, 0.0)
        .with("schedule-email", 0.0, 0.0, 0.0);
    let controller = pod(&server, 100.0);
    let on_a_thread = controller.clone();
    let emails = std::thread::spawn(move || on_a_thread.bucket("schedule-email"))
        .join()
        .expect("thread ran")
        .expect("valid name");
    assert!(emails.try_acquire(5.0).expect("valid"));
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);
    assert!((server.consumed("schedule-email") - 5.0).abs() < 1e-6);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_claim_on_a_bucket_gives_it_back() {
    // Refill 0: "schedule-email" holds 40 and never more.
    let server = Server::new()
        .with("", 0.0, 0.0, 0.0)
        .with("schedule-email", 0.0, 0.0, 40.0);
    let controller = pod(&server, 0.0);
    let emails = controller.bucket("schedule-email").expect("valid name");
    let gave_up = tokio::time::timeout(Duration::from_secs(1), emails.acquire(50.0)).await;
    assert!(gave_up.is_err(), "50 never come");
    let status = emails.status();
    assert_eq!(status.waiters, 0, "the claim left the queue");
    assert_eq!(status.charged_tokens, 0.0, "nothing charged");
    // The 40 are there for the next claim, not stuck behind the cancelled one.
    emails.acquire(40.0).await.expect("admitted");
}

#[tokio::test(start_paused = true)]
async fn status_counts_what_a_trickle_delivered_since_the_bucket_last_moved() {
    // An empty bucket refilling at 10 a second: what the pod asks for
    // comes as a trickle.
    let server = Server::new()
        .with("", 0.0, 0.0, 0.0)
        .with("schedule-email", 10.0, 1000.0, 0.0);
    let controller = pod(&server, 0.0);
    let emails = controller.bucket("schedule-email").expect("valid name");
    emails.acquire(5.0).await.expect("the trickle brings 5");
    let trickle = emails.status();
    assert!(trickle.trickle_rate > 0.0, "no trickle: {trickle:?}");
    // Nothing touches the bucket for a second: what reads its status sees
    // the second's tokens, as the next acquisition would.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = emails.status();
    assert!(
        later.tokens >= trickle.tokens + 0.9 * trickle.trickle_rate,
        "status stayed at {} after a second of a {}/s trickle",
        later.tokens,
        trickle.trickle_rate
    );
    assert!(emails.try_acquire(later.tokens).expect("valid"));
    controller.shutdown().await;
}
