//! Envoy's rate limit service API (`ShouldRateLimit`) end to end: a real
//! server on `127.0.0.1:0` over an in-memory embedded store whose clock the
//! test moves, Envoy's generated client, and the native `KeyLimits/Check`
//! as the reference the answers are compared with.

mod support;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{self, UInt64Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::ManualClock;
use support::server::TestServer;
use tollgate_proto::v1::{self, key_limits_client::KeyLimitsClient};
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
use tonic::Code as GrpcCode;
use tonic::transport::Channel;

const TIER: &str = "gateway";
const ENVOY_TENANT: &str = "envoy-tenant";
const NATIVE_TENANT: &str = "native-tenant";

/// The tier's per-key buckets: name, refill rate, burst limit, and the
/// `current_limit` Envoy is told (the rate in whole requests per unit).
const PER_KEY: [(&str, f64, f64, u32, Unit); 3] = [
    ("api-calls-per-user", 2.0, 10.0, 2, Unit::Second),
    ("remote_address", 0.5, 6.0, 30, Unit::Minute),
    // Never refills: a key that is out stays out.
    ("uploads", 0.0, 4.0, 0, Unit::Day),
];
/// A shared bucket of the same tier: not for per-key checks.
const SHARED: &str = "schedule-email";
/// A per-key bucket with a quota of 3 a day (UTC) per key.
const DAILY: &str = "calls-per-day";

/// A server whose store reads the time from `clock`, with tenants `envoy-tenant` and `native-tenant` on a tier
/// of [`PER_KEY`] buckets and [`SHARED`].
struct Gateway {
    server: TestServer,
    clock: ManualClock,
    envoy: RateLimitServiceClient<Channel>,
    native: KeyLimitsClient<Channel>,
}

impl Gateway {
    async fn start() -> Gateway {
        let clock = ManualClock::default();
        clock.set_secs(1_800_000_000.0);
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::in_memory_with_clock(BucketSettings::default(), clock.as_clock())
                .expect("in-memory store"),
        );
        let server = TestServer::start(store).await;
        let mut admin = server.admin().await;
        let mut buckets: Vec<v1::BucketDefinition> = PER_KEY
            .iter()
            .map(
                |&(bucket, refill_rate, burst_limit, _, _)| v1::BucketDefinition {
                    quota: None,
                    bucket: bucket.into(),
                    refill_rate,
                    burst_limit,
                    initial_tokens: None,
                    kind: v1::BucketKind::PerKey.into(),
                    enforce: None,
                },
            )
            .collect();
        buckets.push(v1::BucketDefinition {
            quota: Some(v1::Quota {
                amount: 3.0,
                cycle: Some(v1::BudgetCycle {
                    period: v1::BudgetPeriod::Daily.into(),
                    ..Default::default()
                }),
            }),
            bucket: DAILY.into(),
            refill_rate: 100.0,
            burst_limit: 100.0,
            initial_tokens: None,
            kind: v1::BucketKind::PerKey.into(),
            enforce: None,
        });
        buckets.push(v1::BucketDefinition {
            quota: None,
            bucket: SHARED.into(),
            refill_rate: 10.0,
            burst_limit: 100.0,
            initial_tokens: None,
            kind: v1::BucketKind::Shared.into(),
            enforce: None,
        });
        admin
            .put_tier(v1::PutTierRequest {
                tier: Some(v1::Tier {
                    name: TIER.into(),
                    buckets,
                    ..Default::default()
                }),
                dry_run: false,
            })
            .await
            .expect("put the tier");
        for tenant in [ENVOY_TENANT, NATIVE_TENANT] {
            admin
                .create_tenant(v1::CreateTenantRequest {
                    tenant_id: tenant.into(),
                    tier: TIER.into(),
                })
                .await
                .expect("onboard the tenant");
        }
        let channel = server.channel().await;
        Gateway {
            envoy: RateLimitServiceClient::new(channel.clone()),
            native: KeyLimitsClient::new(channel),
            server,
            clock,
        }
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn ask(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        Ok(self.envoy.should_rate_limit(request).await?.into_inner())
    }

    /// The tokens `entries` names hold now on [`ENVOY_TENANT`], read with a
    /// descriptor that takes nothing.
    async fn remaining(&mut self, entries: &[(&str, &str)]) -> u32 {
        let read = RateLimitDescriptor {
            hits_addend: Some(UInt64Value { value: 0 }),
            ..descriptor(entries)
        };
        let answer = self
            .ask(request(ENVOY_TENANT, 0, vec![read]))
            .await
            .expect("read the key");
        assert_eq!(answer.overall_code, Code::Ok as i32, "a read is allowed");
        answer.statuses[0].limit_remaining
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry {
                key: key.into(),
                value: value.into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(entries)
    }
}

fn request(
    domain: &str,
    hits_addend: u32,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend,
    }
}

fn seconds(s: f64) -> Option<protobuf::Duration> {
    let d = Duration::from_secs_f64(s);
    Some(protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).expect("seconds"),
        nanos: i32::try_from(d.subsec_nanos()).expect("nanos"),
    })
}

fn retry_after(seconds: &str) -> Vec<HeaderValue> {
    vec![HeaderValue {
        key: "retry-after".into(),
        value: seconds.into(),
        raw_value: Vec::new(),
    }]
}

/// The documented rule, restated: the bucket and key a descriptor's
/// entries name.
fn bucket_and_key(entries: &[(&str, &str)]) -> (String, String) {
    let (bucket, rest) = match entries {
        [("generic_key", bucket), rest @ ..] => (*bucket, rest),
        [(bucket, _), ..] => (*bucket, entries),
        [] => panic!("no entries"),
    };
    let values: Vec<&str> = rest.iter().map(|(_, v)| *v).collect();
    (bucket.to_owned(), values.join("/"))
}

/// The documented rule, restated: a descriptor's tokens.
fn tokens(descriptor: Option<u64>, request: u32) -> f64 {
    match descriptor {
        Some(hits) => hits as f64,
        None => f64::from(request.max(1)),
    }
}

/// What `ShouldRateLimit` must answer, given the native answer to the same
/// check: the documented response mapping, restated.
fn expected_response(buckets: &[String], native: &v1::CheckResponse) -> RateLimitResponse {
    let code = |ok: bool| if ok { Code::Ok } else { Code::OverLimit } as i32;
    let statuses = buckets
        .iter()
        .zip(&native.answers)
        .map(|(bucket, answer)| {
            let &(_, refill_rate, _, requests_per_unit, unit) = PER_KEY
                .iter()
                .find(|(name, ..)| name == bucket)
                .expect("a per-key bucket");
            assert_eq!(answer.refill_rate, refill_rate, "{bucket}");
            let own_tokens_there = answer.allowed
                || answer
                    .retry_after
                    .is_some_and(|d| d.seconds == 0 && d.nanos == 0);
            DescriptorStatus {
                code: code(own_tokens_there),
                current_limit: Some(RateLimit {
                    name: bucket.clone(),
                    requests_per_unit,
                    unit: unit.into(),
                }),
                limit_remaining: answer.remaining_tokens.floor() as u32,
                duration_until_reset: answer.reset_after.map(|d| protobuf::Duration {
                    seconds: d.seconds,
                    nanos: d.nanos,
                }),
                quota: None,
            }
        })
        .collect();
    let longest_wait = native
        .answers
        .iter()
        .filter_map(|a| a.retry_after)
        .filter_map(|d| Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .max();
    let response_headers_to_add = match longest_wait {
        Some(wait) if !native.allowed => {
            retry_after(&(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).to_string())
        }
        _ => Vec::new(),
    };
    RateLimitResponse {
        overall_code: code(native.allowed),
        statuses,
        response_headers_to_add,
        ..Default::default()
    }
}

/// Envoy's descriptors, with and without their own hits_addend and with
/// and without the request's, get the decisions and remaining tokens of
/// the same checks made natively: one randomized sequence (fixed seed)
/// drives both tenants at the same store times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_answers_match_native_checks_on_the_same_sequence() {
    let mut gateway = Gateway::start().await;
    let mut rng = StdRng::seed_from_u64(0x7011_6a7e);
    let users = ["alice", "bob"];
    let addresses = ["10.0.0.1", "10.0.0.2"];
    let (mut allowed, mut refused, mut partly_there, mut reads) = (0, 0, 0, 0);
    for step in 0..400 {
        gateway.advance(Duration::from_millis(rng.random_range(0..1_500)));
        let request_hits: u32 = rng.random_range(0..=3);
        let mut descriptors = Vec::new();
        let mut items = Vec::new();
        let mut buckets = Vec::new();
        for _ in 0..rng.random_range(1..=3) {
            let user = users[rng.random_range(0..users.len())];
            let address = addresses[rng.random_range(0..addresses.len())];
            let entries: Vec<(&str, &str)> = match rng.random_range(0..5) {
                0 => vec![("generic_key", "api-calls-per-user"), ("user", user)],
                1 => vec![
                    ("generic_key", "api-calls-per-user"),
                    ("user", user),
                    ("method", "GET"),
                ],
                2 => vec![("remote_address", address)],
                3 => vec![("remote_address", address), ("path", "/upload")],
                _ => vec![("uploads", user)],
            };
            let own_hits = rng.random_bool(0.4).then(|| rng.random_range(0..=4u64));
            let (bucket, key) = bucket_and_key(&entries);
            let tokens = tokens(own_hits, request_hits);
            if tokens == 0.0 {
                reads += 1;
            }
            items.push(v1::CheckItem {
                tenant_id: NATIVE_TENANT.into(),
                bucket: bucket.clone(),
                key,
                tokens,
                request_id: String::new(),
            });
            buckets.push(bucket);
            descriptors.push(RateLimitDescriptor {
                hits_addend: own_hits.map(|value| UInt64Value { value }),
                ..descriptor(&entries)
            });
        }
        let what = format!("step {step}: {descriptors:?}, request hits_addend {request_hits}");
        let envoy = gateway
            .ask(request(ENVOY_TENANT, request_hits, descriptors))
            .await
            .expect(&what);
        let native = gateway
            .native
            .check(v1::CheckRequest { items })
            .await
            .expect(&what)
            .into_inner();
        assert_eq!(envoy, expected_response(&buckets, &native), "{what}");
        if native.allowed {
            allowed += 1;
        } else {
            refused += 1;
            if envoy.statuses.iter().any(|s| s.code == Code::Ok as i32) {
                partly_there += 1;
            }
        }
    }
    // The sequence exercised what it is meant to compare.
    assert!(
        allowed > 50 && refused > 50,
        "{allowed} allowed, {refused} refused"
    );
    assert!(
        partly_there > 0,
        "no refusal with a descriptor whose tokens were there"
    );
    assert!(reads > 0, "no descriptor read with hits_addend 0");
    gateway.server.stop().await;
}

/// A refused check is OVER_LIMIT with a `retry-after` header (the longest
/// finite wait, in whole seconds rounded up) and takes nothing, not even
/// from the descriptors whose tokens were there; a wait that never ends
/// gives no header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_is_answered_in_headers_and_refuses_until_the_day_ends() {
    let mut gateway = Gateway::start().await;
    let key = [("generic_key", DAILY), ("api_key", "k1")];
    // The store's clock is 2027-01-15T08:00:00Z: the day ends in 16 hours.
    let day_left = 16 * 3_600;
    let quota_headers = |remaining: u32| {
        vec![
            HeaderValue {
                key: "x-ratelimit-quota-remaining".into(),
                value: remaining.to_string(),
                raw_value: Vec::new(),
            },
            HeaderValue {
                key: "x-ratelimit-quota-reset".into(),
                value: day_left.to_string(),
                raw_value: Vec::new(),
            },
        ]
    };
    for remaining in [2, 1, 0] {
        let answer = gateway
            .ask(request(ENVOY_TENANT, 1, vec![descriptor(&key)]))
            .await
            .expect("answered");
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.response_headers_to_add, quota_headers(remaining));
    }
    let refused = gateway
        .ask(request(ENVOY_TENANT, 1, vec![descriptor(&key)]))
        .await
        .expect("answered");
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(refused.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(
        refused.response_headers_to_add,
        [retry_after(&day_left.to_string()), quota_headers(0)].concat()
    );
    // The next day: the quota is whole again.
    gateway.advance(Duration::from_secs(day_left));
    let next = gateway
        .ask(request(ENVOY_TENANT, 1, vec![descriptor(&key)]))
        .await
        .expect("answered");
    assert_eq!(next.overall_code, Code::Ok as i32);
    assert_eq!(
        next.response_headers_to_add[0].value, "2",
        "{:?}",
        next.response_headers_to_add
    );
    gateway.server.stop().await;
}

#[tokio::test]
async fn over_limit_carries_retry_after_and_takes_nothing() {
    let mut gateway = Gateway::start().await;
    let alice = [("generic_key", "api-calls-per-user"), ("user", "alice")];
    let address = [("remote_address", "10.0.0.9")];

    let drained = gateway
        .ask(request(ENVOY_TENANT, 10, vec![descriptor(&alice)]))
        .await
        .expect("take the burst");
    assert_eq!(
        drained,
        RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![DescriptorStatus {
                code: Code::Ok.into(),
                current_limit: Some(RateLimit {
                    name: "api-calls-per-user".into(),
                    requests_per_unit: 2,
                    unit: Unit::Second.into(),
                }),
                limit_remaining: 0,
                duration_until_reset: seconds(5.0),
                quota: None,
            }],
            ..Default::default()
        }
    );

    // Three more tokens for alice are 1.5 s away; the address is full.
    let refused = gateway
        .ask(request(
            ENVOY_TENANT,
            0,
            vec![with_hits(&alice, 3), with_hits(&address, 2)],
        ))
        .await
        .expect("refused, not an error");
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(refused.response_headers_to_add, retry_after("2"));
    let codes: Vec<i32> = refused.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [Code::OverLimit as i32, Code::Ok as i32]);
    assert_eq!(refused.statuses[1].limit_remaining, 6, "nothing taken");
    assert_eq!(
        refused.statuses[1].current_limit,
        Some(RateLimit {
            name: "remote_address".into(),
            requests_per_unit: 30,
            unit: Unit::Minute.into(),
        })
    );
    assert_eq!(gateway.remaining(&address).await, 6, "nothing taken");

    gateway.advance(Duration::from_millis(1_500));
    let later = gateway
        .ask(request(
            ENVOY_TENANT,
            0,
            vec![with_hits(&alice, 3), with_hits(&address, 2)],
        ))
        .await
        .expect("allowed after the wait");
    assert_eq!(later.overall_code, Code::Ok as i32);
    assert!(later.response_headers_to_add.is_empty());
    assert_eq!(gateway.remaining(&address).await, 4);
    assert_eq!(gateway.remaining(&alice).await, 0);

    // A bucket that never refills: out is out, with no retry-after; the
    // key never fills again, so it has no reset either.
    let uploads = [("uploads", "alice")];
    let emptied = gateway
        .ask(request(ENVOY_TENANT, 0, vec![with_hits(&uploads, 4)]))
        .await
        .expect("take every upload");
    assert_eq!(emptied.overall_code, Code::Ok as i32);
    assert_eq!(emptied.statuses[0].duration_until_reset, None);
    let never = gateway
        .ask(request(ENVOY_TENANT, 0, vec![descriptor(&uploads)]))
        .await
        .expect("refused, not an error");
    assert_eq!(never.overall_code, Code::OverLimit as i32);
    assert!(never.response_headers_to_add.is_empty(), "{never:?}");
    // More than the burst is refused on a full key too, with no header.
    let too_many = gateway
        .ask(request(
            ENVOY_TENANT,
            0,
            vec![with_hits(&[("uploads", "bob")], 5)],
        ))
        .await
        .expect("refused, not an error");
    assert_eq!(too_many.overall_code, Code::OverLimit as i32);
    assert!(too_many.response_headers_to_add.is_empty());
    assert_eq!(too_many.statuses[0].limit_remaining, 4);
    assert_eq!(too_many.statuses[0].duration_until_reset, seconds(0.0));
    gateway.server.stop().await;
}

/// Malformed descriptors and domains are refused with INVALID_ARGUMENT (or
/// NOT_FOUND for a bucket or tenant that does not exist), naming the
/// field in this request's terms, and nothing is taken: not even the valid
/// descriptor before the bad one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_descriptors_are_refused_and_take_nothing() {
    let mut gateway = Gateway::start().await;
    let alice = [("generic_key", "api-calls-per-user"), ("user", "alice")];
    let long_key = "k".repeat(600);
    let bad_descriptors: Vec<(RateLimitDescriptor, GrpcCode, &str)> = vec![
        (descriptor(&[]), GrpcCode::InvalidArgument, "descriptors[1]"),
        (
            descriptor(&[("generic_key", "api-calls-per-user")]),
            GrpcCode::InvalidArgument,
            "descriptors[1]",
        ),
        (
            descriptor(&[("generic_key", "api-calls-per-user"), ("user", "")]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries[1].value",
        ),
        (
            descriptor(&[("generic_key", ""), ("user", "alice")]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries[0].value",
        ),
        (
            descriptor(&[("generic_key", "api calls"), ("user", "alice")]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries[0]",
        ),
        (
            descriptor(&[("x-user-id/v2", "alice")]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries[0]",
        ),
        (
            descriptor(&[("", "alice")]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries[0]",
        ),
        (
            descriptor(&[("generic_key", "no-such-bucket"), ("user", "alice")]),
            GrpcCode::NotFound,
            "descriptors[1].entries[0]",
        ),
        (
            descriptor(&[("generic_key", SHARED), ("user", "alice")]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries[0]",
        ),
        (
            descriptor(&[("generic_key", "api-calls-per-user"), ("user", &long_key)]),
            GrpcCode::InvalidArgument,
            "descriptors[1].entries",
        ),
        (
            with_hits(&alice, 2_000_000_000_000_000),
            GrpcCode::InvalidArgument,
            "descriptors[1].hits_addend",
        ),
        (
            RateLimitDescriptor {
                limit: Some(RateLimitOverride {
                    requests_per_unit: 100,
                    unit: Unit::Minute.into(),
                }),
                ..descriptor(&alice)
            },
            GrpcCode::InvalidArgument,
            "descriptors[1].limit",
        ),
        (
            RateLimitDescriptor {
                is_negative_hits: true,
                ..descriptor(&alice)
            },
            GrpcCode::InvalidArgument,
            "descriptors[1].is_negative_hits",
        ),
    ];
    let mut cases: Vec<(RateLimitRequest, GrpcCode, &str)> = bad_descriptors
        .into_iter()
        .map(|(bad, code, field)| {
            (
                request(ENVOY_TENANT, 1, vec![descriptor(&alice), bad]),
                code,
                field,
            )
        })
        .collect();
    cases.extend([
        (
            request("not a tenant", 1, vec![descriptor(&alice)]),
            GrpcCode::InvalidArgument,
            "domain",
        ),
        (
            request("", 1, vec![descriptor(&alice)]),
            GrpcCode::InvalidArgument,
            "domain",
        ),
        (
            request("no-such-tenant", 1, vec![descriptor(&alice)]),
            GrpcCode::NotFound,
            "descriptors[0].entries[0]",
        ),
        (
            request(ENVOY_TENANT, 1, Vec::new()),
            GrpcCode::InvalidArgument,
            "descriptors",
        ),
        (
            request(ENVOY_TENANT, 1, vec![descriptor(&alice); 65]),
            GrpcCode::InvalidArgument,
            "descriptors",
        ),
    ]);
    for (request, code, field) in cases {
        let what = format!("{request:?}");
        let status = gateway.ask(request).await.expect_err(&what);
        assert_eq!(status.code(), code, "{what}: {}", status.message());
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{what}: {} should name {field}",
            status.message()
        );
        assert_eq!(gateway.remaining(&alice).await, 10, "{what}: nothing taken");
    }
    gateway.server.stop().await;
}
