//! End-to-end tests: a real server on `127.0.0.1:0`, real gRPC clients, and
//! every test run twice: on the embedded store and on PostgreSQL. Among
//! them a restart on the same state, a tenant's named buckets served
//! apart, and the tier RPCs refusing bad input with the field named and
//! changing nothing.

mod support;

use support::server::{TestServer, get_tenant};
use support::{Backend, Backing};
use tollgate_proto::v1::{self, admin_client::AdminClient};
use tollgate_server::store::{BucketSettings, UnconfiguredTenants};
use tonic::Code;
use tonic::transport::Channel;

fn limits(
    tenant: &str,
    available: f64,
    refill_rate: f64,
    burst_limit: f64,
) -> v1::UpdateTenantResourceLimitsRequest {
    v1::UpdateTenantResourceLimitsRequest {
        tenant_id: tenant.into(),
        bucket: String::new(),
        available_tokens: available,
        refill_rate,
        burst_limit,
        as_of: None,
        as_of_consumed_tokens: 0.0,
        update_mask: None,
    }
}

fn pod_request(
    tenant: &str,
    instance: u32,
    seq: u64,
    tokens: f64,
    ru: f64,
) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        bucket: String::new(),
        instance_id: instance,
        instance_lease: format!("lease-{instance}").into_bytes(),
        seq,
        requested_tokens: tokens,
        shares: 1.0,
        target_request_period: Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        }),
        consumption_since_last_request: Some(v1::Consumption {
            request_units: ru,
            read_requests: 1,
            read_bytes: 100,
            write_requests: 2,
            write_bytes: 200,
            cpu_seconds: 0.01,
            ..v1::Consumption::default()
        }),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: None,
    }
}

/// The stored part of a tenant view: drops what depends on when it was read.
fn stored(mut t: v1::Tenant) -> v1::Tenant {
    t.current_tokens = 0.0;
    for i in &mut t.instances {
        i.silent_for = None;
    }
    t
}

async fn tenant_ids(admin: &mut AdminClient<Channel>) -> Vec<String> {
    let page = admin
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect("list")
        .into_inner();
    page.tenants.into_iter().map(|t| t.tenant_id).collect()
}

async fn several_instances_share_a_configured_tenant(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let configured = admin
        .update_tenant_resource_limits(limits("acme", 1000.0, 10.0, 2000.0))
        .await
        .expect("configure")
        .into_inner()
        .tenant
        .expect("tenant");
    assert!(configured.configured);
    assert_eq!(configured.current_tokens, 1000.0);

    // Eight pods, each with its own connection, ask concurrently.
    let mut tasks = Vec::new();
    for instance in 1..=8u32 {
        let mut pods = server.pods().await;
        tasks.push(tokio::spawn(async move {
            let mut granted = 0.0;
            for seq in 1..=10 {
                let grant = pods
                    .token_bucket(pod_request("acme", instance, seq, 10.0, 2.5))
                    .await
                    .expect("grant")
                    .into_inner();
                granted += grant.granted_tokens;
                assert!(grant.fallback_rate > 0.0);
            }
            granted
        }));
    }
    let mut granted = 0.0;
    for task in tasks {
        granted += task.await.expect("pod task");
    }
    // 80 requests of 10 tokens against 1000 available: all granted at once.
    assert_eq!(granted, 800.0);

    let tenant = get_tenant(&mut admin, "acme").await.expect("get");
    assert_eq!(tenant.live_instances, 8);
    assert_eq!(tenant.granted_tokens, 800.0);
    assert!((tenant.share_sum - 8.0).abs() < 1e-9);
    let c = tenant.consumption.expect("consumption");
    assert_eq!(c.request_units, 80.0 * 2.5);
    assert_eq!(c.read_requests, 80);
    assert_eq!(c.read_bytes, 8000);
    assert_eq!(c.write_requests, 160);
    // Exact: 80 reports of 0.01 s are 800 000 µs, not 0.8000000000000005 s.
    assert_eq!(c.cpu_micros, 800_000);
    assert_eq!(c.cpu_seconds, 0.8);
    assert_eq!(c.request_unit_micros, 200_000_000);
    // The list is 1 → 2 → … → 8 → 0.
    let ids: Vec<u32> = tenant.instances.iter().map(|i| i.instance_id).collect();
    assert_eq!(ids, (1..=8).collect::<Vec<_>>());
    for pair in tenant.instances.windows(2) {
        assert_eq!(pair[0].next_instance_id, pair[1].instance_id);
    }
    assert_eq!(tenant.instances[7].next_instance_id, 0);
    assert!(tenant.instances.iter().all(|i| i.seq == 10));
    // Refill since the configuration tops up what was taken.
    assert!(tenant.current_tokens >= 200.0 && tenant.current_tokens <= 2000.0);
    server.stop().await;
}

async fn level_of(admin: &mut AdminClient<Channel>, tenant: &str) -> f64 {
    get_tenant(admin, tenant).await.expect("get").current_tokens
}

/// What pods say they hold counts as part of what the bucket holds: a pod
/// sitting on the whole burst keeps the bucket from refilling (admitting
/// the burst twice over), until it says it holds none (it used them), and
/// tokens it gives back never lift bucket and pods above the burst.
async fn tokens_pods_hold_count_towards_the_burst_limit(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    admin
        .update_tenant_resource_limits(limits("acme", 100.0, 1000.0, 100.0))
        .await
        .expect("configure");
    let grant = pods
        .token_bucket(pod_request("acme", 1, 1, 100.0, 0.0))
        .await
        .expect("grant")
        .into_inner();
    assert_eq!(grant.granted_tokens, 100.0);
    // The pod holds all 100; a tenth of a second of refill would have put
    // 100 back in the bucket.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let holding = v1::TokenBucketRequest {
        requested_tokens: 0.0,
        held_tokens: 100.0,
        ..pod_request("acme", 1, 2, 0.0, 0.0)
    };
    pods.token_bucket(holding).await.expect("report");
    let level = level_of(&mut admin, "acme").await;
    assert!(level < 5.0, "the pod holds the burst: {level}");
    // It gives 60 back and holds 40: the bucket takes them, up to what
    // the pod does not hold.
    let giving_back = v1::TokenBucketRequest {
        requested_tokens: 0.0,
        returned_tokens: 60.0,
        held_tokens: 40.0,
        ..pod_request("acme", 1, 3, 0.0, 0.0)
    };
    pods.token_bucket(giving_back).await.expect("give back");
    let level = level_of(&mut admin, "acme").await;
    assert!(
        (55.0..=61.0).contains(&level),
        "bucket and pod hold the burst: {level}"
    );
    // Used up: the bucket refills to its burst.
    let used = v1::TokenBucketRequest {
        requested_tokens: 0.0,
        held_tokens: 0.0,
        ..pod_request("acme", 1, 4, 0.0, 40.0)
    };
    pods.token_bucket(used).await.expect("report");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let level = level_of(&mut admin, "acme").await;
    assert_eq!(level, 100.0);
    server.stop().await;
}

async fn a_duplicate_request_is_answered_from_the_first_response(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    admin
        .update_tenant_resource_limits(limits("dup", 0.0, 100.0, 0.0))
        .await
        .expect("configure");
    let mut pods = server.pods().await;
    let first = pods
        .token_bucket(pod_request("dup", 1, 1, 5000.0, 7.0))
        .await
        .expect("first")
        .into_inner();
    assert!(
        first.trickle_duration.expect("trickle").seconds > 0,
        "a trickle grant"
    );
    let after_first = stored(get_tenant(&mut admin, "dup").await.expect("get"));
    let retry = pods
        .token_bucket(pod_request("dup", 1, 1, 5000.0, 7.0))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(retry, first);
    assert_eq!(
        stored(get_tenant(&mut admin, "dup").await.expect("get")),
        after_first
    );
    assert_eq!(after_first.consumption.expect("c").request_units, 7.0);
    server.stop().await;
}

/// Two busy pods whose demand falls at once, over the wire: the first to
/// report its lower shares is not held to a sliver of the refill against
/// the other's old shares for a whole period. Each gets an even split of
/// it for a quarter of the period, and asks again once the shares are known.
async fn pods_whose_shares_fall_at_once_get_short_even_trickles(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    admin
        .update_tenant_resource_limits(limits("falling", 0.0, 100.0, 0.0))
        .await
        .expect("configure");
    let mut pods = server.pods().await;
    let request = |instance, seq, tokens, shares| v1::TokenBucketRequest {
        shares,
        ..pod_request("falling", instance, seq, tokens, 0.0)
    };
    for instance in [1, 2] {
        pods.token_bucket(request(instance, 1, 0.0, 40.0))
            .await
            .expect("busy");
    }
    let started = std::time::Instant::now();
    let mut grants = Vec::new();
    for instance in [1, 2] {
        let grant = pods
            .token_bucket(request(instance, 2, 1e6, 1.0))
            .await
            .expect("fallen")
            .into_inner();
        grants.push(grant);
    }
    // The bucket refills while the test runs: at most that much more.
    let refilled = 100.0 * started.elapsed().as_secs_f64();
    for grant in &grants {
        let trickle = grant.trickle_duration.expect("a trickle");
        assert_eq!(
            (trickle.seconds, trickle.nanos),
            (2, 500_000_000),
            "{grant:?}"
        );
        // An even split, 50/s for 2.5 s; against the other's old shares
        // it would have been 100/41 per second for 10 s, 24 tokens.
        assert!(
            grant.granted_tokens >= 125.0 - 1e-6 && grant.granted_tokens <= 125.0 + refilled,
            "{grant:?}"
        );
    }
    server.stop().await;
}

/// Fallback tokens a pod reports are charged to the tenant's bucket once,
/// whatever the retries (which may carry more), and are not granted.
async fn fallback_tokens_are_charged_once(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    admin
        .update_tenant_resource_limits(limits("fb", 1000.0, 0.0, 1000.0))
        .await
        .expect("configure");
    let mut pods = server.pods().await;
    let charging = v1::TokenBucketRequest {
        requested_tokens: 0.0,
        fallback_tokens: 300.0,
        fallback_duration: Some(prost_types::Duration {
            seconds: 20,
            nanos: 0,
        }),
        ..pod_request("fb", 1, 1, 0.0, 0.0)
    };
    let first = pods
        .token_bucket(charging.clone())
        .await
        .expect("charged")
        .into_inner();
    assert_eq!(first.granted_tokens, 0.0, "fallback tokens are not granted");
    assert_eq!(
        first.fallback_charged_tokens,
        Some(300.0),
        "the response says what was charged"
    );
    let level = |t: &v1::Tenant| t.current_tokens;
    let after = get_tenant(&mut admin, "fb").await.expect("get");
    // No refill, so no refill lost to the burst either: charged in full.
    assert_eq!(level(&after), 700.0);
    // A retry carries the fallback used since (450 in all): answered with
    // the first attempt's response, it charges nothing, and that response
    // tells the pod that 300 were charged (the other 150 are its to charge
    // with its next request).
    let retry = pods
        .token_bucket(v1::TokenBucketRequest {
            fallback_tokens: 450.0,
            ..charging.clone()
        })
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(retry, first);
    assert_eq!(
        level(&get_tenant(&mut admin, "fb").await.expect("get")),
        700.0,
        "a retry charges nothing more"
    );
    // A retry whose first attempt never arrived is charged what it carries.
    let late = pods
        .token_bucket(v1::TokenBucketRequest {
            fallback_tokens: 450.0,
            ..pod_request("fb", 2, 1, 0.0, 0.0)
        })
        .await
        .expect("charged")
        .into_inner();
    assert_eq!(late.fallback_charged_tokens, Some(450.0));
    assert_eq!(
        level(&get_tenant(&mut admin, "fb").await.expect("get")),
        250.0
    );
    server.stop().await;
}

async fn state_survives_a_restart_on_the_same_store(backend: Backend) {
    let backing = Backing::new(backend).await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    admin
        .update_tenant_resource_limits(limits("durable", 500.0, 0.0, 1000.0))
        .await
        .expect("configure");
    let mut last = None;
    for instance in 1..=3 {
        for seq in 1..=4 {
            let grant = pods
                .token_bucket(pod_request("durable", instance, seq, 20.0, 3.0))
                .await
                .expect("grant")
                .into_inner();
            last = Some(grant);
        }
    }
    // A tenant nobody configured, served on the defaults.
    pods.token_bucket(pod_request("walk-in", 1, 1, 1.0, 1.0))
        .await
        .expect("default limits");
    let before = stored(get_tenant(&mut admin, "durable").await.expect("get"));
    let before_ids = tenant_ids(&mut admin).await;
    server.stop().await;

    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    let after = stored(
        get_tenant(&mut admin, "durable")
            .await
            .expect("get after restart"),
    );
    assert_eq!(after, before);
    assert_eq!(after.granted_tokens, 240.0);
    assert_eq!(after.consumption.expect("c").request_units, 36.0);
    assert_eq!(
        get_tenant(&mut admin, "durable")
            .await
            .expect("get")
            .current_tokens,
        260.0,
        "refill 0: the level is exactly what is left"
    );
    assert_eq!(tenant_ids(&mut admin).await, before_ids);
    assert!(
        !get_tenant(&mut admin, "walk-in")
            .await
            .expect("walk-in")
            .configured
    );
    // The idempotency record survived too: a retry of the last request
    // gets the same answer and changes nothing.
    let retry = pods
        .token_bucket(pod_request("durable", 3, 4, 20.0, 3.0))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(Some(retry), last);
    assert_eq!(
        stored(get_tenant(&mut admin, "durable").await.expect("get")),
        before
    );
    server.stop().await;
}

async fn bad_pod_requests_get_clear_errors_and_change_nothing(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    // Refill 0 so the level read back is exact.
    admin
        .update_tenant_resource_limits(limits("acme", 100.0, 0.0, 100.0))
        .await
        .expect("configure");
    pods.token_bucket(pod_request("acme", 1, 5, 10.0, 1.0))
        .await
        .expect("a good request first");
    let before = get_tenant(&mut admin, "acme").await.expect("get");
    let before_ids = tenant_ids(&mut admin).await;

    let good = || pod_request("acme", 1, 6, 10.0, 1.0);
    let with_consumption = |f: fn(&mut v1::Consumption)| {
        let mut r = good();
        if let Some(c) = r.consumption_since_last_request.as_mut() {
            f(c);
        }
        r
    };
    let period = |seconds: i64, nanos: i32| v1::TokenBucketRequest {
        target_request_period: Some(prost_types::Duration { seconds, nanos }),
        ..good()
    };
    let fallback_for = |seconds: i64, nanos: i32| v1::TokenBucketRequest {
        fallback_duration: Some(prost_types::Duration { seconds, nanos }),
        ..good()
    };
    let cases: Vec<(v1::TokenBucketRequest, Code, &str)> = vec![
        (
            v1::TokenBucketRequest {
                tenant_id: String::new(),
                ..good()
            },
            Code::InvalidArgument,
            "tenant_id",
        ),
        (
            v1::TokenBucketRequest {
                tenant_id: "no spaces".into(),
                ..good()
            },
            Code::InvalidArgument,
            "tenant_id",
        ),
        (
            v1::TokenBucketRequest {
                tenant_id: "x".repeat(129),
                ..good()
            },
            Code::InvalidArgument,
            "tenant_id",
        ),
        // Must not create the tenant either.
        (
            v1::TokenBucketRequest {
                tenant_id: "newcomer".into(),
                requested_tokens: f64::NAN,
                ..good()
            },
            Code::InvalidArgument,
            "requested_tokens",
        ),
        // A bucket the tenant does not have: not found, naming both.
        (
            v1::TokenBucketRequest {
                bucket: "emails".into(),
                ..good()
            },
            Code::NotFound,
            "tenant \"acme\" has no bucket \"emails\"",
        ),
        (
            v1::TokenBucketRequest {
                bucket: "no spaces".into(),
                ..good()
            },
            Code::InvalidArgument,
            "bucket",
        ),
        (
            v1::TokenBucketRequest {
                bucket: "b".repeat(65),
                ..good()
            },
            Code::InvalidArgument,
            "bucket",
        ),
        (
            v1::TokenBucketRequest {
                instance_id: 0,
                ..good()
            },
            Code::InvalidArgument,
            "instance_id",
        ),
        (
            v1::TokenBucketRequest {
                instance_lease: Vec::new(),
                ..good()
            },
            Code::InvalidArgument,
            "instance_lease",
        ),
        (
            v1::TokenBucketRequest {
                instance_lease: vec![7; 300],
                ..good()
            },
            Code::InvalidArgument,
            "instance_lease",
        ),
        (
            v1::TokenBucketRequest {
                seq: u64::MAX,
                ..good()
            },
            Code::InvalidArgument,
            "seq",
        ),
        (
            v1::TokenBucketRequest {
                requested_tokens: f64::NAN,
                ..good()
            },
            Code::InvalidArgument,
            "requested_tokens",
        ),
        (
            v1::TokenBucketRequest {
                requested_tokens: f64::INFINITY,
                ..good()
            },
            Code::InvalidArgument,
            "requested_tokens",
        ),
        (
            v1::TokenBucketRequest {
                requested_tokens: -1.0,
                ..good()
            },
            Code::InvalidArgument,
            "requested_tokens",
        ),
        (
            v1::TokenBucketRequest {
                requested_tokens: 1e300,
                ..good()
            },
            Code::InvalidArgument,
            "requested_tokens",
        ),
        (
            v1::TokenBucketRequest {
                shares: f64::NEG_INFINITY,
                ..good()
            },
            Code::InvalidArgument,
            "shares",
        ),
        (
            v1::TokenBucketRequest {
                shares: -3.0,
                ..good()
            },
            Code::InvalidArgument,
            "shares",
        ),
        (
            period(-1, 0),
            Code::InvalidArgument,
            "target_request_period",
        ),
        (period(0, 0), Code::InvalidArgument, "target_request_period"),
        (
            period(3600, 0),
            Code::InvalidArgument,
            "target_request_period",
        ),
        (
            v1::TokenBucketRequest {
                fallback_tokens: f64::NAN,
                ..good()
            },
            Code::InvalidArgument,
            "fallback_tokens",
        ),
        (
            v1::TokenBucketRequest {
                held_tokens: -1.0,
                ..good()
            },
            Code::InvalidArgument,
            "held_tokens",
        ),
        (
            v1::TokenBucketRequest {
                held_tokens: f64::INFINITY,
                ..good()
            },
            Code::InvalidArgument,
            "held_tokens",
        ),
        (
            v1::TokenBucketRequest {
                fallback_tokens: -1.0,
                ..good()
            },
            Code::InvalidArgument,
            "fallback_tokens",
        ),
        (
            v1::TokenBucketRequest {
                fallback_tokens: 1e300,
                ..good()
            },
            Code::InvalidArgument,
            "fallback_tokens",
        ),
        (
            fallback_for(-1, 0),
            Code::InvalidArgument,
            "fallback_duration",
        ),
        (
            fallback_for(40 * 24 * 3600, 0),
            Code::InvalidArgument,
            "fallback_duration",
        ),
        (
            fallback_for(1, 1_000_000_000),
            Code::InvalidArgument,
            "fallback_duration",
        ),
        (
            with_consumption(|c| c.request_units = f64::NAN),
            Code::InvalidArgument,
            "consumption_since_last_request.request_units",
        ),
        (
            with_consumption(|c| c.cpu_seconds = f64::INFINITY),
            Code::InvalidArgument,
            "consumption_since_last_request.cpu_seconds",
        ),
        (
            with_consumption(|c| c.request_units = -5.0),
            Code::InvalidArgument,
            "consumption_since_last_request.request_units",
        ),
        (
            with_consumption(|c| c.read_bytes = u64::MAX),
            Code::InvalidArgument,
            "consumption_since_last_request.read_bytes",
        ),
        // An older sequence number than the last one seen.
        (
            pod_request("acme", 1, 4, 10.0, 1.0),
            Code::FailedPrecondition,
            "seq 4",
        ),
    ];
    for (request, code, names) in cases {
        let what = format!("{request:?}");
        let status = pods.token_bucket(request).await.expect_err(&what);
        assert_eq!(status.code(), code, "{what}: {}", status.message());
        assert!(
            status.message().contains(names),
            "{what}: message {:?} should name {names}",
            status.message()
        );
    }
    let after = get_tenant(&mut admin, "acme").await.expect("get");
    assert_eq!(
        after.current_tokens, before.current_tokens,
        "refill 0: exact"
    );
    assert_eq!(stored(after), stored(before));
    assert_eq!(tenant_ids(&mut admin).await, before_ids);
    server.stop().await;
}

/// `request` with an update mask of `paths`.
fn masked(
    request: v1::UpdateTenantResourceLimitsRequest,
    paths: &[&str],
) -> v1::UpdateTenantResourceLimitsRequest {
    v1::UpdateTenantResourceLimitsRequest {
        update_mask: Some(prost_types::FieldMask {
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        }),
        ..request
    }
}

async fn bad_admin_requests_get_clear_errors_and_change_nothing(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    admin
        .update_tenant_resource_limits(limits("acme", 100.0, 0.0, 100.0))
        .await
        .expect("configure");
    let before = get_tenant(&mut admin, "acme").await.expect("get");

    let good = || limits("acme", 50.0, 5.0, 500.0);
    let as_of = |seconds: i64, nanos: i32, consumed: f64| v1::UpdateTenantResourceLimitsRequest {
        as_of: Some(prost_types::Timestamp { seconds, nanos }),
        as_of_consumed_tokens: consumed,
        ..good()
    };
    let cases: Vec<(v1::UpdateTenantResourceLimitsRequest, &str)> = vec![
        (
            v1::UpdateTenantResourceLimitsRequest {
                tenant_id: "a/b".into(),
                ..good()
            },
            "tenant_id",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                bucket: "a/i".into(),
                ..good()
            },
            "bucket",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                available_tokens: f64::NAN,
                ..good()
            },
            "available_tokens",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                available_tokens: -1.0,
                ..good()
            },
            "available_tokens",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                refill_rate: f64::INFINITY,
                ..good()
            },
            "refill_rate",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                refill_rate: -0.5,
                ..good()
            },
            "refill_rate",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                burst_limit: 1e200,
                ..good()
            },
            "burst_limit",
        ),
        (
            v1::UpdateTenantResourceLimitsRequest {
                burst_limit: f64::NAN,
                ..good()
            },
            "burst_limit",
        ),
        (as_of(1_700_000_000, -1, 0.0), "as_of"),
        (as_of(-10, 0, 0.0), "as_of"),
        (as_of(1_700_000_000, 0, f64::NAN), "as_of_consumed_tokens"),
        // More consumed at as_of than the tenant has consumed in total.
        (as_of(1_700_000_000, 0, 10.0), "as_of_consumed_tokens"),
        (
            v1::UpdateTenantResourceLimitsRequest {
                as_of_consumed_tokens: 3.0,
                ..good()
            },
            "as_of_consumed_tokens",
        ),
        // Must not create a tenant.
        (
            v1::UpdateTenantResourceLimitsRequest {
                tenant_id: "newcomer".into(),
                refill_rate: f64::NAN,
                ..good()
            },
            "refill_rate",
        ),
        // An as_of in the future (a day after now).
        (
            as_of(
                i64::try_from(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .expect("clock")
                        .as_secs(),
                )
                .expect("seconds")
                    + 86_400,
                0,
                0.0,
            ),
            "as_of",
        ),
        // Update masks: an unknown path, an empty part, as_of without
        // available_tokens, and part of a bucket that does not exist.
        (
            masked(good(), &["refill_rate", "tokens"]),
            "update_mask.paths[1]",
        ),
        (masked(good(), &[""]), "update_mask.paths[0]"),
        (
            masked(as_of(1_700_000_000, 0, 0.0), &["refill_rate"]),
            "as_of",
        ),
        (
            masked(
                v1::UpdateTenantResourceLimitsRequest {
                    tenant_id: "newcomer".into(),
                    ..good()
                },
                &["refill_rate"],
            ),
            "update_mask",
        ),
    ];
    for (request, field) in cases {
        let what = format!("{request:?}");
        let status = admin
            .update_tenant_resource_limits(request)
            .await
            .expect_err(&what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
        assert!(
            status.message().contains(field),
            "{what}: {:?} should name {field}",
            status.message()
        );
    }

    let not_found = get_tenant(&mut admin, "nobody")
        .await
        .expect_err("unknown tenant");
    assert_eq!(not_found.code(), Code::NotFound);
    assert!(not_found.message().contains("nobody"));
    let status = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: String::new(),
            bucket: String::new(),
        })
        .await
        .expect_err("empty id");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "nobody".into(),
            dry_run: false,
        })
        .await
        .expect_err("unknown tenant");
    assert_eq!(status.code(), Code::NotFound);
    let status = admin
        .list_tenants(v1::ListTenantsRequest {
            page_size: 5000,
            ..Default::default()
        })
        .await
        .expect_err("page too large");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("page_size"));
    let status = admin
        .list_tenants(v1::ListTenantsRequest {
            page_size: 10,
            page_token: "not a token".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad token");
    assert!(status.message().contains("page_token"));
    let status = admin
        .list_tenants(v1::ListTenantsRequest {
            tenant_id: "no spaces".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad tenant filter");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("tenant_id"));

    let after = get_tenant(&mut admin, "acme").await.expect("get");
    assert_eq!(
        after.current_tokens, before.current_tokens,
        "refill 0: exact"
    );
    let tokens_before = before.current_tokens;
    assert_eq!(stored(after), stored(before));
    assert_eq!(tenant_ids(&mut admin).await, vec!["acme".to_owned()]);

    // A masked update changes what it names and nothing else.
    let updated = admin
        .update_tenant_resource_limits(masked(good(), &["burst_limit"]))
        .await
        .expect("masked update")
        .into_inner()
        .tenant
        .expect("tenant");
    let limits = updated.limits.expect("limits");
    assert_eq!(limits.burst_limit, 500.0);
    assert_eq!(limits.refill_rate, 0.0, "the rate is kept");
    assert_eq!(updated.current_tokens, tokens_before, "tokens kept");
    server.stop().await;
}

async fn limits_updates_apply_the_as_of_correction(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    admin
        .update_tenant_resource_limits(limits("acme", 1000.0, 0.0, 1000.0))
        .await
        .expect("configure");
    for seq in 1..=4 {
        pods.token_bucket(pod_request("acme", 1, seq, 0.0, 25.0))
            .await
            .expect("report");
    }
    // The controller read 40 RU consumed; 60 more were consumed since. With
    // no refill, the new level is 500 - 60.
    let as_of = prost_types::Timestamp::from(std::time::SystemTime::now());
    let updated = admin
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            as_of: Some(as_of),
            as_of_consumed_tokens: 40.0,
            ..limits("acme", 500.0, 0.0, 1000.0)
        })
        .await
        .expect("update")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(updated.current_tokens, 440.0);
    server.stop().await;
}

async fn unconfigured_tenants_get_defaults_or_not_found(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut pods = server.pods().await;
    let grant = pods
        .token_bucket(pod_request("walk-in", 1, 1, 100.0, 0.0))
        .await
        .expect("served on defaults")
        .into_inner();
    assert_eq!(grant.granted_tokens, 100.0);
    let mut admin = server.admin().await;
    let tenant = get_tenant(&mut admin, "walk-in").await.expect("created");
    assert!(!tenant.configured);
    assert_eq!(tenant.limits.expect("limits").refill_rate, 1000.0);
    server.stop().await;

    let strict = TestServer::new(
        backend,
        BucketSettings {
            unconfigured_tenants: UnconfiguredTenants::Reject,
            ..BucketSettings::default()
        },
    )
    .await;
    let mut pods = strict.pods().await;
    let status = pods
        .token_bucket(pod_request("walk-in", 1, 1, 100.0, 0.0))
        .await
        .expect_err("not configured");
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("walk-in"));
    let mut admin = strict.admin().await;
    assert!(tenant_ids(&mut admin).await.is_empty());
    admin
        .update_tenant_resource_limits(limits("walk-in", 100.0, 1.0, 100.0))
        .await
        .expect("configure");
    pods.token_bucket(pod_request("walk-in", 1, 1, 100.0, 0.0))
        .await
        .expect("served once configured");
    strict.stop().await;
}

async fn tenants_are_listed_in_pages_and_deleted(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    let mut ids: Vec<String> = (0..25).map(|i| format!("tenant-{i:02}")).collect();
    for id in &ids {
        admin
            .update_tenant_resource_limits(limits(id, 10.0, 1.0, 10.0))
            .await
            .expect("configure");
    }
    pods.token_bucket(pod_request("tenant-03", 1, 1, 1.0, 1.0))
        .await
        .expect("grant");
    let mut listed = Vec::new();
    let mut page_token = String::new();
    let mut pages = 0;
    loop {
        let page = admin
            .list_tenants(v1::ListTenantsRequest {
                page_size: 10,
                page_token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        pages += 1;
        assert!(page.tenants.len() <= 10);
        listed.extend(page.tenants.into_iter().map(|t| t.tenant_id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(listed, ids);

    admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "tenant-03".into(),
            dry_run: false,
        })
        .await
        .expect("delete");
    ids.retain(|id| id != "tenant-03");
    let status = get_tenant(&mut admin, "tenant-03")
        .await
        .expect_err("deleted");
    assert_eq!(status.code(), Code::NotFound);
    // A returning pod is refused: the tenant stays deleted.
    let refused = pods
        .token_bucket(pod_request("tenant-03", 1, 1, 1.0, 1.0))
        .await
        .expect_err("deleted");
    assert_eq!(refused.code(), Code::NotFound);
    assert!(
        refused.message().contains("was deleted at"),
        "{}",
        refused.message()
    );
    // Created again by an operator, its instances went with it: the pod
    // starts a fresh tenant.
    admin
        .update_tenant_resource_limits(limits("tenant-03", 10.0, 1.0, 10.0))
        .await
        .expect("create again");
    pods.token_bucket(pod_request("tenant-03", 1, 1, 1.0, 1.0))
        .await
        .expect("grant");
    let fresh = get_tenant(&mut admin, "tenant-03")
        .await
        .expect("created again");
    assert!(fresh.configured);
    assert_eq!(fresh.live_instances, 1);
    assert_eq!(fresh.consumption.expect("c").request_units, 1.0);
    server.stop().await;
}

/// A tenant's buckets over the wire: each named bucket is created by an
/// operator and served apart; a bucket the tenant lacks is NOT_FOUND
/// naming both; listing shows every bucket, or one tenant's; deleting the
/// tenant deletes them all.
async fn a_tenants_buckets_are_served_apart(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    for (bucket, burst) in [("schedule-email", 100.0), ("invoke-doc-summary-ai", 20.0)] {
        let created = admin
            .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
                bucket: bucket.into(),
                ..limits("t1234", burst, 1.0, burst)
            })
            .await
            .expect("create bucket")
            .into_inner()
            .tenant
            .expect("bucket");
        assert_eq!(created.bucket, bucket);
        assert_eq!(created.current_tokens, burst);
    }
    let on = |bucket: &str, seq: u64, tokens: f64| v1::TokenBucketRequest {
        bucket: bucket.into(),
        ..pod_request("t1234", 1, seq, tokens, 2.0)
    };
    // A bulk send claims the whole email bucket; the AI bucket is untouched.
    let grant = pods
        .token_bucket(on("schedule-email", 1, 100.0))
        .await
        .expect("grant")
        .into_inner();
    assert_eq!(grant.granted_tokens, 100.0);
    let throttled = pods
        .token_bucket(on("schedule-email", 2, 50.0))
        .await
        .expect("grant")
        .into_inner();
    assert!(
        throttled
            .trickle_duration
            .is_some_and(|d| d.seconds > 0 || d.nanos > 0),
        "the emptied bucket trickles: {throttled:?}"
    );
    let grant = pods
        .token_bucket(on("invoke-doc-summary-ai", 1, 20.0))
        .await
        .expect("grant")
        .into_inner();
    assert_eq!(grant.granted_tokens, 20.0);
    assert_eq!(
        grant.trickle_duration.unwrap_or_default(),
        prost_types::Duration::default()
    );

    let missing = pods
        .token_bucket(on("no-such-action", 1, 1.0))
        .await
        .expect_err("unknown bucket");
    assert_eq!(missing.code(), Code::NotFound);
    assert!(
        missing.message().contains("t1234") && missing.message().contains("no-such-action"),
        "{}",
        missing.message()
    );
    let missing = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "t1234".into(),
            bucket: "no-such-action".into(),
        })
        .await
        .expect_err("unknown bucket");
    assert_eq!(missing.code(), Code::NotFound);

    // Consumption is counted per bucket.
    let email = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "t1234".into(),
            bucket: "schedule-email".into(),
        })
        .await
        .expect("bucket")
        .into_inner()
        .tenant
        .expect("bucket");
    assert_eq!(email.consumption.expect("c").request_units, 4.0);
    assert_eq!(email.live_instances, 1);

    // A pod built before buckets had names uses the request-unit bucket.
    pods.token_bucket(pod_request("t1234", 1, 1, 1.0, 1.0))
        .await
        .expect("request-unit bucket");
    pods.token_bucket(pod_request("other", 1, 1, 1.0, 1.0))
        .await
        .expect("another tenant");
    let everything = tenant_ids(&mut admin).await;
    assert_eq!(everything, vec!["other", "t1234", "t1234", "t1234"]);
    let mine = admin
        .list_tenants(v1::ListTenantsRequest {
            tenant_id: "t1234".into(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    let buckets: Vec<_> = mine.tenants.iter().map(|t| t.bucket.as_str()).collect();
    assert_eq!(buckets, vec!["", "invoke-doc-summary-ai"]);
    let rest = admin
        .list_tenants(v1::ListTenantsRequest {
            tenant_id: "t1234".into(),
            page_size: 2,
            page_token: mine.next_page_token,
        })
        .await
        .expect("list")
        .into_inner();
    let buckets: Vec<_> = rest.tenants.iter().map(|t| t.bucket.as_str()).collect();
    assert_eq!(buckets, vec!["schedule-email"]);
    assert!(rest.next_page_token.is_empty());

    admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "t1234".into(),
            dry_run: false,
        })
        .await
        .expect("delete");
    assert_eq!(tenant_ids(&mut admin).await, vec!["other"]);
    let gone = pods
        .token_bucket(on("schedule-email", 3, 1.0))
        .await
        .expect_err("deleted with its tenant");
    assert_eq!(gone.code(), Code::NotFound);
    server.stop().await;
}

fn definition(bucket: &str, refill_rate: f64, burst_limit: f64) -> v1::BucketDefinition {
    v1::BucketDefinition {
        quota: None,
        bucket: bucket.into(),
        refill_rate,
        burst_limit,
        initial_tokens: None,
        kind: v1::BucketKind::Shared.into(),
        enforce: None,
    }
}

fn put_tier(name: &str, buckets: Vec<v1::BucketDefinition>) -> v1::PutTierRequest {
    v1::PutTierRequest {
        tier: Some(v1::Tier {
            name: name.into(),
            buckets,
            ..Default::default()
        }),
        dry_run: false,
    }
}

/// Tiers over the wire: onboarding and switching through the Admin
/// service; every bad input refused with INVALID_ARGUMENT naming the field
/// (NOT_FOUND for an unknown tier), and nothing changed, read back.
async fn tiers_refuse_bad_input_and_change_nothing(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    admin
        .put_tier(put_tier(
            "pro",
            vec![
                definition("schedule-email", 10.0, 100.0),
                definition("invoke-doc-summary-ai", 1.0, 20.0),
            ],
        ))
        .await
        .expect("put pro");
    let created = admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "t1234".into(),
            tier: "pro".into(),
        })
        .await
        .expect("onboard")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(created.tier, "pro");
    let buckets: Vec<_> = created.buckets.iter().map(|b| b.bucket.as_str()).collect();
    assert_eq!(buckets, ["invoke-doc-summary-ai", "schedule-email"]);

    let tiers_before = admin
        .list_tiers(v1::ListTiersRequest {})
        .await
        .expect("list")
        .into_inner();
    let bad_tiers = [
        (put_tier("", vec![]), "tier.name"),
        (put_tier("a b", vec![]), "tier.name"),
        (
            put_tier("pro", vec![definition("", 1.0, 1.0)]),
            "tier.buckets[0].bucket",
        ),
        (
            put_tier("pro", vec![definition("x/y", 1.0, 1.0)]),
            "tier.buckets[0].bucket",
        ),
        (
            put_tier(
                "pro",
                vec![definition("a", 1.0, 1.0), definition("a", 2.0, 2.0)],
            ),
            "tier.buckets[1].bucket",
        ),
        (
            put_tier("pro", vec![definition("a", -1.0, 1.0)]),
            "tier.buckets[0].refill_rate",
        ),
        (
            put_tier("pro", vec![definition("a", f64::NAN, 1.0)]),
            "tier.buckets[0].refill_rate",
        ),
        (
            put_tier("pro", vec![definition("a", 1.0, f64::INFINITY)]),
            "tier.buckets[0].burst_limit",
        ),
        (
            put_tier(
                "pro",
                vec![v1::BucketDefinition {
                    initial_tokens: Some(-5.0),
                    ..definition("a", 1.0, 1.0)
                }],
            ),
            "tier.buckets[0].initial_tokens",
        ),
        (
            v1::PutTierRequest {
                tier: None,
                dry_run: false,
            },
            "tier",
        ),
        (
            put_tier(
                "pro",
                vec![v1::BucketDefinition {
                    kind: 7,
                    ..definition("a", 1.0, 1.0)
                }],
            ),
            "tier.buckets[0].kind",
        ),
        (
            put_tier(
                "pro",
                vec![v1::BucketDefinition {
                    kind: v1::BucketKind::PerKey.into(),
                    initial_tokens: Some(1.0),
                    ..definition("a", 1.0, 1.0)
                }],
            ),
            "tier.buckets[0].initial_tokens",
        ),
    ];
    for (request, field) in bad_tiers {
        let what = format!("{request:?}");
        let status = admin.put_tier(request).await.expect_err(&what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{what}: {} should name {field}",
            status.message()
        );
    }
    let tiers_after = admin
        .list_tiers(v1::ListTiersRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(tiers_after, tiers_before, "no bad tier changed anything");

    // A per-key definition is kept as such and provisions no bucket.
    let per_key = v1::BucketDefinition {
        kind: v1::BucketKind::PerKey.into(),
        ..definition("api-calls-per-user", 5.0, 50.0)
    };
    admin
        .put_tier(put_tier("keyed", vec![per_key.clone()]))
        .await
        .expect("per-key tier");
    let keyed = admin
        .get_tier(v1::GetTierRequest {
            name: "keyed".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .tier
        .expect("tier");
    assert_eq!(keyed.buckets, vec![per_key]);
    let onboarded = admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "keyed-tenant".into(),
            tier: "keyed".into(),
        })
        .await
        .expect("onboard")
        .into_inner()
        .tenant
        .expect("tenant");
    assert!(onboarded.buckets.is_empty(), "{onboarded:?}");

    let describe = |admin: &mut AdminClient<Channel>| {
        let mut admin = admin.clone();
        async move {
            admin
                .describe_tenant(v1::DescribeTenantRequest {
                    tenant_id: "t1234".into(),
                })
                .await
                .expect("describe")
                .into_inner()
                .tenant
                .expect("tenant")
        }
    };
    let mut before = describe(&mut admin).await;
    let unknown = admin
        .set_tenant_tier(v1::SetTenantTierRequest {
            tenant_id: "t1234".into(),
            tier: "gold".into(),
            dry_run: false,
        })
        .await
        .expect_err("unknown tier");
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("gold"), "{}", unknown.message());
    let bad_overrides = [
        (
            v1::SetBucketOverrideRequest {
                tenant_id: "t1234".into(),
                bucket: Some(definition("schedule-email", f64::NAN, 1.0)),
            },
            "bucket.refill_rate",
        ),
        (
            v1::SetBucketOverrideRequest {
                tenant_id: "t1234".into(),
                bucket: Some(definition("", 1.0, 1.0)),
            },
            "bucket.bucket",
        ),
        (
            v1::SetBucketOverrideRequest {
                tenant_id: "t1234".into(),
                bucket: None,
            },
            "bucket",
        ),
    ];
    for (request, field) in bad_overrides {
        let what = format!("{request:?}");
        let status = admin.set_bucket_override(request).await.expect_err(&what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{what}: {}",
            status.message()
        );
    }
    let in_use = admin
        .delete_tier(v1::DeleteTierRequest { name: "pro".into() })
        .await
        .expect_err("in use");
    assert_eq!(in_use.code(), Code::FailedPrecondition);
    assert!(in_use.message().contains("t1234"), "{}", in_use.message());
    let exists = admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "t1234".into(),
            tier: "pro".into(),
        })
        .await
        .expect_err("exists");
    assert_eq!(exists.code(), Code::AlreadyExists);
    let mut after = describe(&mut admin).await;
    for view in [&mut before, &mut after] {
        for bucket in &mut view.buckets {
            bucket.current_tokens = 0.0;
        }
    }
    assert_eq!(after, before, "no bad change touched the tenant");
    server.stop().await;
}

/// `live_instances` counts the pods heard from within the inactivity
/// timeout, in `GetTenant` and `ListTenants`: pods that fell silent leave
/// the count, and an idle bucket has none, while their rows stay listed
/// so that a late retry is answered, not counted again.
async fn live_instances_are_the_pods_heard_within_the_timeout(backend: Backend) {
    let clock = support::ManualClock::default();
    clock.set_secs(1_000.0);
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let server = TestServer::start(store).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    admin
        .update_tenant_resource_limits(limits("acme", 1000.0, 10.0, 1000.0))
        .await
        .expect("configure");
    for instance in 1..=3 {
        pods.token_bucket(pod_request("acme", instance, 1, 1.0, 1.0))
            .await
            .expect("grant");
    }
    let live = async |admin: &mut AdminClient<Channel>| {
        let shown = get_tenant(admin, "acme").await.expect("get");
        let listed = admin
            .list_tenants(v1::ListTenantsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .tenants;
        (
            shown.live_instances,
            listed[0].live_instances,
            shown.instances.len(),
        )
    };
    assert_eq!(live(&mut admin).await, (3, 3, 3));
    // Instance 3 asks again 40 s later; 1 and 2 stay silent.
    clock.advance(std::time::Duration::from_secs(40));
    pods.token_bucket(pod_request("acme", 3, 2, 1.0, 1.0))
        .await
        .expect("grant");
    clock.advance(std::time::Duration::from_secs(21));
    // 1 and 2 are silent for 61 s: not live; the listing counts the list
    // until the bucket is idle.
    assert_eq!(live(&mut admin).await, (1, 3, 3));
    clock.advance(std::time::Duration::from_secs(40));
    assert_eq!(live(&mut admin).await, (0, 0, 3), "idle for 61 s");
    // Instance 3's last request, retried late: answered, not counted.
    let before = get_tenant(&mut admin, "acme").await.expect("get");
    pods.token_bucket(pod_request("acme", 3, 2, 1.0, 1.0))
        .await
        .expect("the retry is answered");
    let after = get_tenant(&mut admin, "acme").await.expect("get");
    assert_eq!(after.consumption, before.consumption);
    server.stop().await;
}

/// Closed buckets over the wire: a dry run of PutTier, SetTenantTier,
/// ClearBucketOverride or DeleteTenant answers the buckets it would
/// retire with their exact totals and changes nothing; the real change
/// answers the same and ListClosedBuckets reads them back, paged, with the
/// caller's actor; a bad page token or size is INVALID_ARGUMENT.
async fn retired_buckets_leave_closed_records(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    admin
        .put_tier(put_tier(
            "pro",
            vec![
                definition("schedule-email", 10.0, 100.0),
                definition("export", 1.0, 20.0),
            ],
        ))
        .await
        .expect("put pro");
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "pro".into(),
        })
        .await
        .expect("onboard");
    let mut request = pod_request("acme", 1, 1, 5.0, 1.234567);
    request.bucket = "export".into();
    pods.token_bucket(request).await.expect("grant");
    let export = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "acme".into(),
            bucket: "export".into(),
        })
        .await
        .expect("export")
        .into_inner()
        .tenant
        .expect("a bucket");
    let list = |page_size, page_token: &str| v1::ListClosedBucketsRequest {
        tenant_id: "acme".into(),
        page_size,
        page_token: page_token.into(),
    };

    let typo = put_tier("pro", vec![definition("schedule-emial", 10.0, 100.0)]);
    let dry = admin
        .put_tier(v1::PutTierRequest {
            dry_run: true,
            ..typo.clone()
        })
        .await
        .expect("dry run")
        .into_inner();
    let names: Vec<_> = dry.closed.iter().map(|c| c.bucket.as_str()).collect();
    assert_eq!(names, ["export", "schedule-email"]);
    assert_eq!(dry.closed[0].consumption, export.consumption);
    assert_eq!(dry.closed[0].granted_tokens, export.granted_tokens);
    assert_eq!(
        dry.closed[0]
            .consumption
            .as_ref()
            .map(|c| c.request_unit_micros),
        Some(1_234_567)
    );
    assert!(
        admin
            .list_closed_buckets(list(0, ""))
            .await
            .expect("list")
            .into_inner()
            .closed
            .is_empty()
    );
    let still = admin
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(still.buckets.len(), 2, "a dry run changed nothing");

    let mut put = tonic::Request::new(typo);
    put.metadata_mut()
        .insert("x-tollgate-actor", "ops-alice".parse().expect("ascii"));
    let done = admin.put_tier(put).await.expect("put").into_inner();
    assert_eq!(done.closed.len(), 2);
    let first = admin
        .list_closed_buckets(list(1, ""))
        .await
        .expect("page 1")
        .into_inner();
    assert_eq!(first.closed.len(), 1);
    assert_eq!(first.closed[0], done.closed[0]);
    assert_eq!(first.closed[0].actor, "ops-alice");
    assert!(!first.closed[0].peer.is_empty());
    assert_eq!(first.closed[0].reason(), v1::CloseReason::TierRedefined);
    let second = admin
        .list_closed_buckets(list(1, &first.next_page_token))
        .await
        .expect("page 2")
        .into_inner();
    assert_eq!(second.closed, done.closed[1..]);
    assert!(second.next_page_token.is_empty(), "the last page");

    // An override then cleared, dry run first; then the tenant deleted.
    admin
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: "acme".into(),
            bucket: Some(definition("export", 2.0, 40.0)),
        })
        .await
        .expect("override");
    let clear = |dry_run| v1::ClearBucketOverrideRequest {
        tenant_id: "acme".into(),
        bucket: "export".into(),
        dry_run,
    };
    let dry = admin.clear_bucket_override(clear(true)).await.expect("dry");
    assert_eq!(dry.into_inner().closed.len(), 1);
    let cleared = admin
        .clear_bucket_override(clear(true))
        .await
        .expect("again");
    assert_eq!(
        cleared.into_inner().closed.len(),
        1,
        "the dry run kept nothing"
    );
    let cleared = admin
        .clear_bucket_override(clear(false))
        .await
        .expect("clear");
    assert_eq!(
        cleared.into_inner().closed[0].reason(),
        v1::CloseReason::OverrideCleared
    );
    let deleted = admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            dry_run: false,
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(deleted.closed.len(), 1);
    assert_eq!(deleted.closed[0].reason(), v1::CloseReason::TenantDeleted);
    let all = admin
        .list_closed_buckets(list(0, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(all.closed.len(), 4);
    assert!(all.next_page_token.is_empty());

    for (bad, field) in [
        (list(0, "x"), "page_token"),
        (list(1001, ""), "page_size"),
        (
            v1::ListClosedBucketsRequest {
                tenant_id: "bad tenant".into(),
                ..list(0, "")
            },
            "tenant_id",
        ),
    ] {
        let status = admin.list_closed_buckets(bad).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }
    server.stop().await;
}

for_each_store!(
    several_instances_share_a_configured_tenant,
    tokens_pods_hold_count_towards_the_burst_limit,
    live_instances_are_the_pods_heard_within_the_timeout,
    a_duplicate_request_is_answered_from_the_first_response,
    pods_whose_shares_fall_at_once_get_short_even_trickles,
    fallback_tokens_are_charged_once,
    state_survives_a_restart_on_the_same_store,
    bad_pod_requests_get_clear_errors_and_change_nothing,
    bad_admin_requests_get_clear_errors_and_change_nothing,
    limits_updates_apply_the_as_of_correction,
    unconfigured_tenants_get_defaults_or_not_found,
    tenants_are_listed_in_pages_and_deleted,
    a_tenants_buckets_are_served_apart,
    tiers_refuse_bad_input_and_change_nothing,
    retired_buckets_leave_closed_records,
);
