//! Budget events posted to a real HTTP receiver started by the test: pods
//! take a budget across its thresholds through the wire contract, and the
//! servers' deliverers post each event, signed, until the receiver
//! acknowledges it. The receiver fails for a while, hangs while a replica
//! is killed mid-delivery, and comes back; each event is acknowledged
//! exactly once per cycle, every post of it carries the same idempotency
//! key, and a new cycle's events have new keys.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use support::server::TestServer;
use support::{Backend, Backing, ManualClock};
use tollgate_core::Timestamp;
use tollgate_core::budget::delivery::Backoff;
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_server::store::{BucketSettings, Store};
use tollgate_server::webhooks::{self, WebhookOptions};
use tonic::transport::Channel;

const SECRET: &[u8] = b"a shared secret of the test";
const AMOUNT: f64 = 1_000_000.0;

/// What the receiver does with a post.
const ANSWER_OK: u8 = 0;
const ANSWER_FAIL: u8 = 1;
const ANSWER_HANG: u8 = 2;

/// One post as the receiver saw it.
#[derive(Clone, Debug)]
struct Post {
    key: String,
    attempt: u32,
    signature: String,
    body: Vec<u8>,
    answered: StatusCode,
}

#[derive(Default)]
struct Receiver {
    mode: AtomicU8,
    posts: Mutex<Vec<Post>>,
    /// Posts being answered now, by key: never two of one event at once.
    in_flight: Mutex<BTreeMap<String, u32>>,
    most_in_flight_of_one_key: Mutex<u32>,
    /// Lets hanging posts go (unanswered to their sender, who is gone).
    release: tokio::sync::Notify,
}

impl Receiver {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn posts(&self) -> Vec<Post> {
        self.posts.lock().expect("posts").clone()
    }

    /// The keys acknowledged, each with how many times.
    fn acknowledged(&self) -> BTreeMap<String, usize> {
        let mut acks = BTreeMap::new();
        for post in self.posts() {
            if post.answered.is_success() {
                *acks.entry(post.key).or_insert(0) += 1;
            }
        }
        acks
    }

    fn keys_posted(&self) -> BTreeSet<String> {
        self.posts().into_iter().map(|p| p.key).collect()
    }

    fn hanging(&self) -> BTreeSet<String> {
        self.in_flight
            .lock()
            .expect("in flight")
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Leaves the in-flight count when the post is answered or abandoned.
struct Flight(Arc<Receiver>, String);

impl Drop for Flight {
    fn drop(&mut self) {
        if let Ok(mut flights) = self.0.in_flight.lock()
            && let Some(n) = flights.get_mut(&self.1)
        {
            *n -= 1;
        }
    }
}

async fn receive(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let key = header("idempotency-key");
    let _flight = {
        let mut flights = receiver.in_flight.lock().expect("in flight");
        let n = flights.entry(key.clone()).or_insert(0);
        *n += 1;
        let mut most = receiver.most_in_flight_of_one_key.lock().expect("most");
        *most = (*most).max(*n);
        Flight(Arc::clone(&receiver), key.clone())
    };
    let mode = receiver.mode.load(Ordering::SeqCst);
    if mode == ANSWER_HANG {
        // Until the test lets it go (or the server notices the sender is
        // gone and drops this): never acknowledged.
        receiver.release.notified().await;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let answered = if mode == ANSWER_OK {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    receiver.posts.lock().expect("posts").push(Post {
        key,
        attempt: header("tollgate-delivery-attempt").parse().unwrap_or(0),
        signature: header("tollgate-signature"),
        body: body.to_vec(),
        answered,
    });
    answered
}

async fn start_receiver() -> (Arc<Receiver>, String) {
    let receiver = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/hooks/budget", axum::routing::post(receive))
        .with_state(Arc::clone(&receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr: SocketAddr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (receiver, format!("http://{addr}/hooks/budget"))
}

fn options(url: &str) -> WebhookOptions {
    WebhookOptions {
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(30),
        timeout: Duration::from_secs(30),
        backoff: Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(4),
        },
        ..WebhookOptions::new(vec![url.to_owned()], SECRET.to_vec()).expect("options")
    }
}

fn utc(text: &str) -> Timestamp {
    let t: jiff::Timestamp = text.parse().expect("a test date");
    Timestamp::from_unix_micros(t.as_microsecond())
}

/// Checks a post's signature as a receiver would, from the header alone.
fn verify(post: &Post) {
    let (t, _) = post
        .signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .expect("a signature header t=...,v1=...");
    let t: u64 = t.parse().expect("unix seconds");
    assert_eq!(
        webhooks::signature(SECRET, t, &post.body),
        post.signature,
        "the signature matches the body"
    );
    let wrong = webhooks::signature(b"another secret, not the test's", t, &post.body);
    assert_ne!(wrong, post.signature);
}

async fn set_up(admin: &mut AdminClient<Channel>) {
    admin
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "acme".into(),
            available_tokens: 400_000.0,
            refill_rate: 1_000_000.0,
            burst_limit: 400_000.0,
            ..Default::default()
        })
        .await
        .expect("limits");
    admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(v1::Budget {
                bucket: String::new(),
                amount: AMOUNT,
                cycle: Some(v1::BudgetCycle {
                    period: v1::BudgetPeriod::Monthly.into(),
                    anchor_day: 1,
                    anchor_weekday: String::new(),
                    time_zone: "Europe/Paris".into(),
                }),
                at_limit: v1::BudgetAtLimit::Stop.into(),
                baseline: None,
                thresholds: Vec::new(),
                price_per_million_tokens: 0.0,
                currency: String::new(),
                enforce: None,
            }),
        })
        .await
        .expect("set budget");
}

/// Pods on `replicas` (in turns) ask for tokens until the budget stops
/// them, the clock moving a few seconds a round.
async fn spend_the_budget(
    replicas: &mut [TokenBucketServiceClient<Channel>],
    clock: Option<&ManualClock>,
    seq: &mut u64,
) {
    for _ in 0..400 {
        *seq += 1;
        let mut granted = 0.0;
        for (i, pods) in replicas.iter_mut().enumerate() {
            let instance = u32::try_from(i).expect("few replicas") + 1;
            granted += pods
                .token_bucket(v1::TokenBucketRequest {
                    tenant_id: "acme".into(),
                    instance_id: instance,
                    instance_lease: format!("lease-{instance}").into_bytes(),
                    seq: *seq,
                    requested_tokens: 150_000.0,
                    shares: 1.0,
                    target_request_period: Some(prost_types::Duration {
                        seconds: 10,
                        nanos: 0,
                    }),
                    consumption_since_last_request: Some(v1::Consumption {
                        request_unit_micros: 1_000,
                        ..v1::Consumption::default()
                    }),
                    ..v1::TokenBucketRequest::default()
                })
                .await
                .expect("a grant")
                .into_inner()
                .granted_tokens;
        }
        match clock {
            Some(clock) => clock.advance(Duration::from_secs(2)),
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
        if granted == 0.0 {
            return;
        }
    }
    panic!("the pods never reached the budget's stop");
}

/// Waits (real time) until `done`, moving the store's clock by `step`
/// each time round, if it has one.
async fn wait_until(
    what: &str,
    clock: Option<&ManualClock>,
    step: Duration,
    done: impl Fn() -> bool,
) {
    for _ in 0..1_000 {
        if done() {
            return;
        }
        if let Some(clock) = clock {
            clock.advance(step);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

fn thresholds_of(keys: &BTreeSet<String>) -> Vec<String> {
    let mut labels: Vec<String> = keys
        .iter()
        .map(|k| k.rsplit('/').next().expect("a label").to_owned())
        .collect();
    labels.sort_by_key(|l| l.parse::<u32>().unwrap_or(u32::MAX));
    labels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_deliver_each_event_once_through_failures_and_a_killed_replica() {
    let clock = ManualClock::default();
    clock.set_secs(utc("2026-03-03T10:00:00Z").unix_micros() as f64 / 1e6);
    let backing = Backing::new(Backend::Postgres).await;
    let store_a = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let store_b = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let server_a = TestServer::start(Arc::clone(&store_a)).await;
    let server_b = TestServer::start(Arc::clone(&store_b)).await;
    let (receiver, url) = start_receiver().await;
    receiver.set(ANSWER_FAIL);
    let deliver = |store: &Arc<dyn Store>| {
        tokio::spawn(webhooks::deliver_budget_events(
            Arc::clone(store),
            options(&url),
            None,
        ))
    };
    let deliverer_a = deliver(&store_a);
    let deliverer_b = deliver(&store_b);

    // Pods on both replicas take the budget across 50, 75, 90 and 100 %.
    set_up(&mut server_a.admin().await).await;
    let mut replicas = [server_a.pods().await, server_b.pods().await];
    let mut seq = 0;
    spend_the_budget(&mut replicas, Some(&clock), &mut seq).await;

    // The receiver fails: both replicas keep trying, with backoff, never
    // two posts of one event at once.
    wait_until(
        "every event was tried three times",
        Some(&clock),
        Duration::from_secs(1),
        || {
            let posts = receiver.posts();
            let keys = receiver.keys_posted();
            keys.len() == 4
                && keys
                    .iter()
                    .all(|k| posts.iter().filter(|p| &p.key == k).count() >= 3)
        },
    )
    .await;
    assert_eq!(
        thresholds_of(&receiver.keys_posted()),
        ["50", "75", "90", "100"]
    );
    assert!(receiver.acknowledged().is_empty());
    let attempts: BTreeSet<u32> = receiver.posts().iter().map(|p| p.attempt).collect();
    assert!(
        attempts.contains(&1) && attempts.contains(&3),
        "attempts {attempts:?}"
    );

    // Replica B stops delivering; the receiver hangs; replica A takes the
    // events and is killed while the receiver holds its posts.
    deliverer_b.abort();
    let _ = deliverer_b.await;
    receiver.set(ANSWER_HANG);
    wait_until(
        "replica A's posts hang",
        Some(&clock),
        Duration::from_secs(1),
        || !receiver.hanging().is_empty(),
    )
    .await;
    deliverer_a.abort();
    let _ = deliverer_a.await;
    let held = receiver.hanging();
    server_a.stop().await;
    receiver.release.notify_waiters();
    wait_until(
        "the killed replica's posts are let go",
        None,
        Duration::ZERO,
        || receiver.hanging().is_empty(),
    )
    .await;

    // The receiver recovers. Replica B delivers again, but not an event
    // the killed replica held until its claim lapses.
    receiver.set(ANSWER_OK);
    let deliverer_b = deliver(&store_b);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acked = receiver.acknowledged();
    assert!(
        held.iter().all(|k| !acked.contains_key(k)),
        "the killed replica's claim holds {held:?} until its lease ends: {acked:?}"
    );
    wait_until(
        "every event is acknowledged",
        Some(&clock),
        Duration::from_secs(5),
        || receiver.acknowledged().len() == 4,
    )
    .await;
    // Hours later, nothing more is posted for this cycle.
    let posts_before = receiver.posts().len();
    for _ in 0..20 {
        clock.advance(Duration::from_secs(600));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        receiver.posts().len(),
        posts_before,
        "delivered events stay delivered"
    );
    let acked = receiver.acknowledged();
    assert!(
        acked.values().all(|n| *n == 1),
        "each event acknowledged once: {acked:?}"
    );

    // The next cycle (April 1st, Paris time): new events, new keys; the
    // old ones are not posted again.
    clock.set_secs(utc("2026-04-01T00:00:30Z").unix_micros() as f64 / 1e6);
    let mut replicas = [server_b.pods().await];
    spend_the_budget(&mut replicas, Some(&clock), &mut seq).await;
    wait_until(
        "the new cycle's events are acknowledged",
        Some(&clock),
        Duration::from_secs(1),
        || receiver.acknowledged().len() == 8,
    )
    .await;
    let acked = receiver.acknowledged();
    assert!(
        acked.values().all(|n| *n == 1),
        "each event acknowledged once: {acked:?}"
    );
    let cycles: BTreeSet<&str> = acked
        .keys()
        .map(|k| k.split('/').nth(2).expect("a cycle start"))
        .collect();
    assert_eq!(cycles.len(), 2, "two cycles' events: {acked:?}");
    assert_eq!(
        *receiver.most_in_flight_of_one_key.lock().expect("most"),
        1,
        "no two posts of one event at once"
    );

    // Every post is signed with the shared secret and names its event.
    for post in receiver.posts() {
        verify(&post);
        let body: serde_json::Value = serde_json::from_slice(&post.body).expect("JSON");
        assert_eq!(body["id"], post.key);
        assert_eq!(body["type"], "budget.threshold");
        assert_eq!(body["tenant"], "acme");
        assert_eq!(body["bucket"], "");
        assert_eq!(body["amount"], AMOUNT);
        let percent = body["percent"].as_f64().expect("percent");
        assert!(
            body["spend"].as_f64().expect("spend") >= AMOUNT * percent / 100.0,
            "the spend had crossed the threshold: {body}"
        );
    }
    let april = body_of(&receiver, "100", "2026-03-31T22:00:00Z");
    assert_eq!(april["cycle_end"], "2026-04-30T22:00:00Z");

    deliverer_b.abort();
    let _ = deliverer_b.await;
    server_b.stop().await;
    drop(backing);
}

/// The body of the acknowledged post of threshold `label` in the cycle
/// starting at `start`.
fn body_of(receiver: &Receiver, label: &str, start: &str) -> serde_json::Value {
    receiver
        .posts()
        .iter()
        .filter(|p| p.answered.is_success())
        .map(|p| serde_json::from_slice::<serde_json::Value>(&p.body).expect("JSON"))
        .find(|b| b["threshold"] == label && b["cycle_start"] == start)
        .unwrap_or_else(|| panic!("no post of {label} for the cycle of {start}"))
}

/// Events made while no server delivers wait in the store, across a
/// restart, for the first server with webhooks.
async fn events_wait_in_the_store_across_a_restart(backend: Backend) {
    let backing = Backing::new(backend).await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    set_up(&mut server.admin().await).await;
    let mut replicas = [server.pods().await];
    let mut seq = 0;
    spend_the_budget(&mut replicas, None, &mut seq).await;
    server.stop().await;

    let store = backing.open(BucketSettings::default()).await;
    let (receiver, url) = start_receiver().await;
    receiver.set(ANSWER_FAIL);
    let deliverer = tokio::spawn(webhooks::deliver_budget_events(
        Arc::clone(&store),
        WebhookOptions {
            backoff: Backoff {
                first: Duration::from_millis(50),
                max: Duration::from_millis(100),
            },
            ..options(&url)
        },
        None,
    ));
    wait_until("the receiver failed twice", None, Duration::ZERO, || {
        receiver.posts().len() >= 8
    })
    .await;
    receiver.set(ANSWER_OK);
    wait_until("every event is acknowledged", None, Duration::ZERO, || {
        receiver.acknowledged().len() == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let acked = receiver.acknowledged();
    assert!(acked.values().all(|n| *n == 1), "{acked:?}");
    assert_eq!(
        thresholds_of(&acked.keys().cloned().collect()),
        ["50", "75", "90", "100"]
    );
    for post in receiver.posts() {
        verify(&post);
    }
    deliverer.abort();
    let _ = deliverer.await;
    // Nothing is left to claim.
    assert!(
        store
            .claim_budget_events(100, Duration::from_secs(1))
            .await
            .expect("claim")
            .is_empty()
    );
    store.close().await.expect("close");
    drop(store);

    // Past their retention, delivered events are pruned like closed
    // cycles.
    let store = backing
        .open(BucketSettings {
            budget_record_retention: Duration::from_millis(1),
            ..BucketSettings::default()
        })
        .await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let pruned = store.prune_budget_records(100).await.expect("prune");
    assert_eq!((pruned.events, pruned.undelivered_events), (4, 0));
    assert_eq!(
        store.prune_budget_records(100).await.expect("prune").events,
        0
    );
    store.close().await.expect("close");
}

for_each_store!(events_wait_in_the_store_across_a_restart);
