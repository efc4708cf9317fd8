//! Usage history on both stores, with the store's clock moved by the
//! test: two replicas sampling the same buckets through a day of
//! generated requests leave one row per slot, and the usage the rows give
//! sums to the change of the exact totals; rows are pruned by age per
//! resolution; a deleted tenant's history stays. Over the wire
//! (`Admin/GetHistory`): the points a client reads sum to what its pods
//! reported, the server's own sampler writes them, and bad spans are
//! `INVALID_ARGUMENT` naming the field.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock, proto_time, sample_all, tenant_id};
use tollgate_core::history::{HistoryConfig, Resolution, total_usage, usage};
use tollgate_core::{
    BucketKey, Consumption, Limits, LimitsMask, LimitsUpdate, Timestamp, TokenBucketRequest,
};
use tollgate_proto::v1;
use tollgate_server::store::{BucketSettings, HistoryRows, Store};

const DAY: f64 = 86_400.0;

/// Two handles on one fresh store of `backend` (two replicas on
/// PostgreSQL; one store shared by two callers when embedded), their
/// time read from `clock`.
async fn replicas(backend: Backend, clock: &ManualClock) -> (Backing, [Arc<dyn Store>; 2]) {
    let backing = Backing::new(backend).await;
    let settings = BucketSettings {
        history: HistoryConfig {
            sample_interval: Duration::from_secs(10),
            resolutions: vec![
                Resolution {
                    step: Duration::from_secs(60),
                    retention: Duration::from_secs(14 * 86_400),
                },
                Resolution {
                    step: Duration::from_secs(3_600),
                    retention: Duration::from_secs(396 * 86_400),
                },
            ],
        },
        ..BucketSettings::default()
    };
    let first = backing
        .open_with_clock(settings.clone(), clock.as_clock())
        .await;
    let second = match backend {
        Backend::Embedded => Arc::clone(&first),
        Backend::Postgres => backing.open_with_clock(settings, clock.as_clock()).await,
    };
    (backing, [first, second])
}

fn key(tenant: &str) -> BucketKey {
    BucketKey::request_units(tenant_id(tenant))
}

/// A pod's request reporting `request_units` used.
fn report(instance_id: u32, seq: u64, request_units: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id,
        lease: b"lease".to_vec(),
        seq,
        requested_tokens: request_units,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::from_request_units(request_units),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

async fn configure(store: &dyn Store, key: &BucketKey) {
    store
        .update_limits(
            key,
            &LimitsUpdate {
                available_tokens: 1e9,
                limits: Limits {
                    refill_rate: 1e6,
                    burst_limit: 1e9,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: LimitsMask::ALL,
            },
        )
        .await
        .expect("configure");
}

/// Slots strictly increase: no slot twice.
fn assert_one_row_per_slot(rows: &HistoryRows) {
    let slots: Vec<_> = rows
        .samples
        .iter()
        .map(|s| rows.resolution.slot(s.at))
        .collect();
    assert!(
        slots.windows(2).all(|w| w[0] < w[1]),
        "slots not strictly increasing: {slots:?}"
    );
}

/// A small deterministic generator (the test's own, so every run draws
/// the same day).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn two_replicas_sampling_a_day_agree_with_the_totals(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(1_000.0 * DAY);
    let start = clock.now();
    let (_backing, [a, b]) = replicas(backend, &clock).await;
    let tenants = ["alpha", "beta", "gamma", "delta"];
    for t in tenants {
        configure(a.as_ref(), &key(t)).await;
    }
    let mut draw = Draw(7);
    let mut seq = 0;
    let mut t = 0.0;
    // Each tenant's consumption after each of its reports, and when.
    let mut timelines: Vec<Vec<(Timestamp, Consumption)>> = vec![Vec::new(); tenants.len()];
    let mut sampled_at = Vec::new();
    while t < DAY {
        // Samples 20 to 100 s apart (the server's are 10 s: fewer here
        // for time), with activity in bursts and idle hours between.
        t += 20.0 + draw.below(81) as f64;
        clock.set_secs(1_000.0 * DAY + t);
        let active = (t / 3_600.0).floor() as u64 % 3 != 1;
        if active && draw.below(3) == 0 {
            seq += 1;
            let i = draw.below(tenants.len() as u64) as usize;
            let units = draw.below(1_000_000) as f64 / 1_000.0;
            a.token_bucket(&key(tenants[i]), &report(1, seq, units))
                .await
                .expect("request");
            let totals = a
                .get_bucket(&key(tenants[i]))
                .await
                .expect("get")
                .head
                .totals;
            timelines[i].push((clock.now(), totals.consumption));
        }
        sampled_at.push(clock.now());
        // Both replicas sample at once, in pages of 3 buckets.
        futures_util::future::join(sample_all(a.as_ref(), 3), sample_all(b.as_ref(), 3)).await;
    }
    let end = clock.now();
    for (i, tenant) in tenants.into_iter().enumerate() {
        let totals = a.get_bucket(&key(tenant)).await.expect("get").head.totals;
        // The consumption as of `at`.
        let as_of = |at: Timestamp| {
            timelines[i]
                .iter()
                .take_while(|(when, _)| *when <= at)
                .last()
                .map_or(Consumption::default(), |(_, c)| *c)
        };
        for step in [60, 3_600] {
            for store in [&a, &b] {
                let rows = store
                    .history(&key(tenant), start, end, Duration::from_secs(step))
                    .await
                    .expect("history");
                assert_eq!(rows.resolution.step, Duration::from_secs(step));
                // The bucket was created at the start: its baseline is the
                // zero totals it had before.
                assert!(rows.baseline);
                assert_eq!(rows.samples[0].totals, Default::default());
                assert_one_row_per_slot(&rows);
                let r = rows.resolution;
                // Every row holds the totals as of when it says it was
                // sampled, and every sample that saw a change left a row
                // in its slot.
                for row in &rows.samples {
                    assert_eq!(
                        row.totals.consumption,
                        as_of(row.at),
                        "{tenant}: row at {:?}",
                        row.at
                    );
                }
                for &at in &sampled_at {
                    let row = rows
                        .samples
                        .iter()
                        .take_while(|row| r.slot(row.at) <= r.slot(at))
                        .last();
                    if let Some(row) = row.filter(|row| r.slot(row.at) < r.slot(at)) {
                        assert_eq!(
                            row.totals.consumption,
                            as_of(at),
                            "{tenant}, step {step}: a change sampled at {at:?} has no row"
                        );
                    }
                }
                let last = rows.samples.last().expect("rows");
                assert_eq!(last.totals, totals, "{tenant}: the last row is the totals");
                // What was used falls within two steps of when it was
                // sampled, however long the bucket was idle before.
                for span in usage(&rows.samples) {
                    if span.consumption != Consumption::default() {
                        assert!(
                            span.seconds() <= 2.0 * step as f64,
                            "{tenant}, step {step}: use spread over {} s",
                            span.seconds()
                        );
                    }
                }
                let first = &rows.samples[0].totals;
                let sum = total_usage(&usage(&rows.samples));
                assert_eq!(
                    sum.consumption,
                    totals.consumption.saturating_sub(&first.consumption),
                    "{tenant}, step {step}: usage sums to the change of the totals"
                );
                assert!(sum.consumption.request_unit_micros > 0);
            }
        }
    }
}

async fn rows_are_pruned_by_age_per_resolution(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(2_000.0 * DAY);
    let (_backing, [store, _]) = replicas(backend, &clock).await;
    let k = key("pruned");
    configure(store.as_ref(), &k).await;
    // Two hours of use, one report and one sample a minute.
    let start = clock.now();
    for minute in 0..120u64 {
        clock.set_secs(2_000.0 * DAY + minute as f64 * 60.0);
        store
            .token_bucket(&k, &report(1, minute + 1, 1.0))
            .await
            .expect("request");
        sample_all(store.as_ref(), 100).await;
    }
    let minutes = store
        .history(&k, start, clock.now(), Duration::from_secs(60))
        .await
        .expect("history");
    // A row a minute, after the zero totals before the bucket existed.
    assert_eq!(minutes.samples.len(), 121);
    assert!(minutes.baseline);
    assert!(
        (total_usage(&usage(&minutes.samples))
            .consumption
            .request_units()
            - 120.0)
            .abs()
            < 1e-9
    );
    // 15 days on: the minutes are past their 14 days, the hours are not.
    clock.set_secs(2_015.0 * DAY);
    assert_eq!(store.prune_history(1_000).await.expect("prune"), 121);
    let hours = store
        .history(&k, start, clock.now(), Duration::from_secs(60))
        .await
        .expect("history");
    assert_eq!(
        hours.resolution.step,
        Duration::from_secs(3_600),
        "minutes asked of a span only hours keep"
    );
    // Zero before the bucket, then each hour's last sample: 60 and 120
    // units.
    assert_eq!(hours.samples.len(), 3);
    let sum = total_usage(&usage(&hours.samples));
    assert!((sum.consumption.request_units() - 120.0).abs() < 1e-9);
    // A batch limit is kept to: 400 days on, one row at a time.
    clock.set_secs(2_400.0 * DAY);
    assert_eq!(store.prune_history(1).await.expect("prune"), 1);
    assert_eq!(store.prune_history(10).await.expect("prune"), 2);
    assert_eq!(store.prune_history(10).await.expect("prune"), 0);
}

async fn a_deleted_tenant_keeps_its_history(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(3_000.0 * DAY);
    let (_backing, [store, _]) = replicas(backend, &clock).await;
    let k = key("gone");
    let start = clock.now();
    configure(store.as_ref(), &k).await;
    store
        .token_bucket(&k, &report(1, 1, 5.0))
        .await
        .expect("request");
    sample_all(store.as_ref(), 100).await;
    clock.set_secs(3_000.0 * DAY + 90.0);
    store
        .delete_tenant(&tenant_id("gone"))
        .await
        .expect("delete");
    sample_all(store.as_ref(), 100).await;
    let rows = store
        .history(&k, start, clock.now(), Duration::from_secs(60))
        .await
        .expect("history");
    let sum = total_usage(&usage(&rows.samples));
    assert!((sum.consumption.request_units() - 5.0).abs() < 1e-9);
}

/// A pod's report over the wire: `request_units` used.
fn pod_report(tenant: &str, seq: u64, request_units: f64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        instance_id: 1,
        instance_lease: b"lease".to_vec(),
        seq,
        requested_tokens: 1.0,
        shares: 1.0,
        target_request_period: Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        }),
        consumption_since_last_request: Some(v1::Consumption {
            request_units,
            write_requests: 1,
            ..v1::Consumption::default()
        }),
        ..v1::TokenBucketRequest::default()
    }
}

fn history_request(tenant: &str, since: Timestamp, until: Timestamp) -> v1::GetHistoryRequest {
    v1::GetHistoryRequest {
        tenant_id: tenant.into(),
        bucket: String::new(),
        since: Some(proto_time(since)),
        until: Some(proto_time(until)),
        step: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
    }
}

async fn a_client_reads_what_its_pods_reported_minute_by_minute(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(4_000.0 * DAY);
    let start = clock.now();
    let (backing, [store, _]) = replicas(backend, &clock).await;
    let options = tollgate_server::GrpcOptions {
        // The test samples, at the times it sets.
        history_interval: None,
        ..tollgate_server::GrpcOptions::default()
    };
    let telemetry = tollgate_server::telemetry::Telemetry::new().expect("telemetry");
    let server = TestServer::start_with(Arc::clone(&store), telemetry, options).await;
    let mut pods = server.pods().await;
    let mut admin = server.admin().await;
    // Ten minutes: 2.5 request units every 10 s in the even minutes only.
    let mut seq = 0;
    for tick in 0..60u32 {
        clock.set_secs(4_000.0 * DAY + f64::from(tick) * 10.0);
        if (tick / 6) % 2 == 0 {
            seq += 1;
            pods.token_bucket(pod_report("wire", seq, 2.5))
                .await
                .expect("report");
        }
        sample_all(store.as_ref(), 100).await;
    }
    let answer = admin
        .get_history(history_request("wire", start, clock.now()))
        .await
        .expect("history")
        .into_inner();
    assert_eq!(answer.step.map(|d| d.seconds), Some(60));
    // A point per minute with use: minutes 0, 2, 4, 6 and 8, each 6
    // reports of 2.5 units.
    assert_eq!(answer.points.len(), 5, "{:?}", answer.points);
    for p in &answer.points {
        let used = p.consumption.expect("consumption");
        assert_eq!(used.request_unit_micros, 15_000_000);
        assert_eq!(used.write_requests, 6);
        assert!(p.request_units_per_second > 0.0);
    }
    let total: u64 = answer
        .points
        .iter()
        .map(|p| p.consumption.expect("consumption").request_unit_micros)
        .sum();
    let bucket = store.get_bucket(&key("wire")).await.expect("get");
    let billed = bucket.head.totals.consumption.request_unit_micros;
    assert_eq!(total, billed);
    // Each point says the level its row sampled: just after a pod took a
    // token, so under the level now, which refilled since the last use.
    let burst = bucket.head.state.limits.burst_limit;
    for p in &answer.points {
        let level = p.level.expect("a level");
        assert!(level >= 0.0 && level < burst, "{level} of {burst}");
    }
    let last = answer.points.last().and_then(|p| p.level).expect("a level");
    assert!(
        last < bucket.current_tokens(),
        "{last} sampled, {} now",
        bucket.current_tokens()
    );
    // An unknown bucket has no points, and is no error.
    let none = admin
        .get_history(history_request("nobody", start, clock.now()))
        .await
        .expect("history")
        .into_inner();
    assert!(none.points.is_empty());
    server.stop().await;
    drop(backing);
}

async fn throttled_pods_show_in_the_history(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(5_000.0 * DAY);
    let start = clock.now();
    let (backing, [store, _]) = replicas(backend, &clock).await;
    // 1 token a second, no burst: a pod asking for 100 every 10 s is on a
    // trickle all the time.
    store
        .update_limits(
            &key("slow"),
            &LimitsUpdate {
                available_tokens: 0.0,
                limits: Limits {
                    refill_rate: 1.0,
                    burst_limit: 0.0,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: LimitsMask::ALL,
            },
        )
        .await
        .expect("configure");
    let options = tollgate_server::GrpcOptions {
        history_interval: None,
        ..tollgate_server::GrpcOptions::default()
    };
    let telemetry = tollgate_server::telemetry::Telemetry::new().expect("telemetry");
    let server = TestServer::start_with(Arc::clone(&store), telemetry, options).await;
    let mut pods = server.pods().await;
    let mut admin = server.admin().await;
    for tick in 0..=30u32 {
        clock.set_secs(5_000.0 * DAY + f64::from(tick) * 10.0);
        let mut ask = pod_report("slow", u64::from(tick) + 1, 0.5);
        ask.requested_tokens = 100.0;
        pods.token_bucket(ask).await.expect("ask");
        sample_all(store.as_ref(), 100).await;
    }
    let answer = admin
        .get_history(history_request("slow", start, clock.now()))
        .await
        .expect("history")
        .into_inner();
    let throttled: f64 = answer.points.iter().map(|p| p.throttled_pod_seconds).sum();
    let billed = store
        .get_bucket(&key("slow"))
        .await
        .expect("get")
        .head
        .totals
        .throttled_micros;
    assert!(billed >= 280_000_000, "throttled {billed} µs of 300 s");
    let tenant = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "slow".into(),
            ..Default::default()
        })
        .await
        .expect("get tenant")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(tenant.throttled_micros, billed);
    assert!((throttled - billed as f64 / 1e6).abs() < 1e-6);
    // Each whole minute: one pod throttled all along.
    for p in &answer.points[1..answer.points.len() - 1] {
        assert!(
            (p.throttled_pods - 1.0).abs() < 0.01,
            "{} pods throttled in {:?}",
            p.throttled_pods,
            p.from
        );
    }
    server.stop().await;
    drop(backing);
}

async fn bad_spans_are_invalid_arguments_naming_the_field(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let now = Timestamp::from_secs_f64(1_800_000_000.0);
    let day = Duration::from_secs(86_400);
    let ok = history_request("acme", now.saturating_sub(day), now);
    let cases: Vec<(&str, v1::GetHistoryRequest)> = vec![
        (
            "since",
            v1::GetHistoryRequest {
                since: None,
                ..ok.clone()
            },
        ),
        (
            "until",
            v1::GetHistoryRequest {
                until: Some(proto_time(now.saturating_sub(2 * day))),
                ..ok.clone()
            },
        ),
        (
            "since",
            v1::GetHistoryRequest {
                since: Some(proto_time(now.saturating_sub(401 * day))),
                ..ok.clone()
            },
        ),
        (
            "step",
            v1::GetHistoryRequest {
                step: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                }),
                ..ok.clone()
            },
        ),
        (
            "step",
            v1::GetHistoryRequest {
                step: Some(prost_types::Duration {
                    seconds: 2 * 86_400,
                    nanos: 0,
                }),
                ..ok.clone()
            },
        ),
        (
            "step",
            v1::GetHistoryRequest {
                step: Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                }),
                ..ok.clone()
            },
        ),
        (
            "since",
            v1::GetHistoryRequest {
                since: Some(prost_types::Timestamp {
                    seconds: -1,
                    nanos: 0,
                }),
                ..ok.clone()
            },
        ),
        (
            "tenant_id",
            v1::GetHistoryRequest {
                tenant_id: "no spaces".into(),
                ..ok.clone()
            },
        ),
        (
            "bucket",
            v1::GetHistoryRequest {
                bucket: "Bad Name!".into(),
                ..ok.clone()
            },
        ),
    ];
    for (field, request) in cases {
        let status = admin
            .get_history(request.clone())
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{request:?}");
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    }
    admin
        .get_history(ok)
        .await
        .expect("the span as given is fine");
    server.stop().await;
}

async fn the_server_samples_on_its_own(backend: Backend) {
    let backing = Backing::new(backend).await;
    let store = backing.open(BucketSettings::default()).await;
    let options = tollgate_server::GrpcOptions {
        history_interval: Some(Duration::from_millis(100)),
        ..tollgate_server::GrpcOptions::default()
    };
    let telemetry = tollgate_server::telemetry::Telemetry::new().expect("telemetry");
    let server = TestServer::start_with(store, telemetry, options).await;
    let mut pods = server.pods().await;
    let mut admin = server.admin().await;
    let since = Timestamp::from_system_time(std::time::SystemTime::now())
        .saturating_sub(Duration::from_secs(600));
    pods.token_bucket(pod_report("self", 1, 4.0))
        .await
        .expect("report");
    // Until a sample has been taken: at most 10 s.
    let mut seen = 0;
    for _ in 0..100 {
        let answer = admin
            .get_history(v1::GetHistoryRequest {
                until: None,
                ..history_request("self", since, since)
            })
            .await
            .expect("history")
            .into_inner();
        seen = answer
            .points
            .iter()
            .map(|p| p.consumption.expect("consumption").request_unit_micros)
            .sum::<u64>();
        if seen > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, 4_000_000, "the server's sampler wrote the report");
    server.stop().await;
    drop(backing);
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn embedded_store() {
                    super::$name(super::Backend::Embedded).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres_store() {
                    super::$name(super::Backend::Postgres).await;
                }
            }
        )*
    };
}

on_both_stores!(
    two_replicas_sampling_a_day_agree_with_the_totals,
    rows_are_pruned_by_age_per_resolution,
    a_deleted_tenant_keeps_its_history,
    a_client_reads_what_its_pods_reported_minute_by_minute,
    throttled_pods_show_in_the_history,
    bad_spans_are_invalid_arguments_naming_the_field,
    the_server_samples_on_its_own,
);
