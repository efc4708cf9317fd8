//! Overload, over real gRPC, on a real PostgreSQL store: a server whose
//! bound on pending requests is full refuses a pod's request at once with
//! UNAVAILABLE and a retry hint, applies nothing of it, and applies it
//! exactly once when the pod retries it; and the load generator, refused
//! thousands of times, keeps every confirmed sum equal to what the store
//! holds.
//!
//! The first test fills the bound deterministically: a transaction holds
//! the tenant's rows locked, so the one admitted request waits in the store
//! while the next arrives. The second runs `tollgate bench` with 128 pods
//! against two places.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::Server;
use support::usage::{check_consumption, read_tenant};
use tollgate_proto::v1::{self, token_bucket_service_client::TokenBucketServiceClient};
use tollgate_testdb::TestDatabase;
use tonic::Code;

/// A request of pod `instance` for 10 tokens, reporting `units` request
/// units consumed since its previous one.
fn request(instance: u32, lease: &[u8], seq: u64, units: f64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: "acme".into(),
        bucket: String::new(),
        instance_id: instance,
        instance_lease: lease.to_vec(),
        seq,
        requested_tokens: 10.0,
        shares: 1.0,
        target_request_period: Some(tollgate_proto::duration(Duration::from_secs(10))),
        consumption_since_last_request: Some(v1::Consumption {
            request_units: units,
            ..v1::Consumption::default()
        }),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: None,
    }
}

fn stored_units(stored: &support::usage::Stored) -> i64 {
    stored
        .counters
        .iter()
        .find(|(name, _)| name == "request_unit_micros")
        .map(|(_, v)| *v / 1_000_000)
        .expect("request units stored")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_refuses_at_once_with_a_hint_and_applies_the_retry_once() {
    let db = TestDatabase::create().await.expect("test database");
    let server = tokio::task::block_in_place(|| {
        Server::start_with(Path::new(db.url()), &["--max-pending-requests", "1"])
    });
    let mut pods = TokenBucketServiceClient::connect(server.url.clone())
        .await
        .expect("connect");
    let (first, second) = (
        tollgate_client::lease::new_lease(None),
        tollgate_client::lease::new_lease(None),
    );
    pods.token_bucket(request(1, &first, 1, 0.0))
        .await
        .expect("the tenant's rows are created");

    // Hold the tenant's rows: the next request admitted waits in the store.
    let mut locker = tollgate_testdb::connect(db.url()).await.expect("connect");
    let lock = locker.transaction().await.expect("begin");
    lock.execute(
        "SELECT 1 FROM tenant_usage WHERE tenant_id = 'acme' FOR UPDATE",
        &[],
    )
    .await
    .expect("lock the tenant");
    let waiting = tokio::spawn({
        let mut pods = pods.clone();
        let lease = first.clone();
        async move { pods.token_bucket(request(1, &lease, 2, 7.0)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the admitted request waits on the lock"
    );

    let asked = Instant::now();
    let refused = pods
        .token_bucket(request(2, &second, 1, 5.0))
        .await
        .expect_err("the bound is full");
    let answered_in = asked.elapsed();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("overloaded"), "{refused:?}");
    let hint = tollgate_proto::pushback::pushback(&refused).expect("a retry hint");
    assert!(hint >= Duration::from_millis(250), "{hint:?}");
    assert!(
        answered_in < Duration::from_millis(400),
        "refused at once, not queued: {answered_in:?}"
    );

    lock.rollback().await.expect("release the tenant");
    waiting
        .await
        .expect("task")
        .expect("the admitted request is answered");
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    assert_eq!(
        stored_units(&read_tenant(&client, "acme").await),
        7,
        "the refused request applied nothing"
    );
    // The pod retries the same request, as told: applied once.
    pods.token_bucket(request(2, &second, 1, 5.0))
        .await
        .expect("the retry is served");
    pods.token_bucket(request(2, &second, 1, 5.0))
        .await
        .expect("a duplicate is answered again");
    assert_eq!(stored_units(&read_tenant(&client, "acme").await), 12);
    tokio::task::block_in_place(|| server.stop());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_generator_refused_by_a_full_server_keeps_exact_sums() {
    let db = TestDatabase::create().await.expect("test database");
    let server = tokio::task::block_in_place(|| {
        Server::start_with(
            Path::new(db.url()),
            &["--max-pending-requests", "2", "--pg-pool-size", "2"],
        )
    });
    let out = tokio::task::block_in_place(|| {
        support::command()
            .args([
                "bench",
                "--server",
                server.url.as_str(),
                "--tenants",
                "4",
                "--instances-per-tenant",
                "32",
                "--duration",
                "3s",
                "--warmup",
                "0s",
                "--duplicates",
                "0.05",
                "--json",
            ])
            .output()
    })
    .expect("bench ran");
    let report = support::bench_report(&out);
    let total = &report["total"];
    assert_eq!(total["errors"], serde_json::json!({}), "{report}");
    assert_eq!(total["duplicate_mismatches"], 0, "{report}");
    let refused = total["retried"]["Unavailable"].as_u64().unwrap_or(0);
    assert!(refused > 0, "128 pods against 2 places: some refused");
    let message = total["error_messages"]["Unavailable"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("overloaded"), "{message}");
    eprintln!(
        "bench, 128 pods, 2 pending at most: {} requests answered, {refused} refusals retried, {} abandoned",
        total["requests"], total["abandoned"]
    );
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    for t in 0..4 {
        let tenant = format!("bench-{t}");
        let stored = read_tenant(&client, &tenant).await;
        check_consumption(&tenant, &stored, &[&report]);
    }
    tokio::task::block_in_place(|| server.stop());
}
