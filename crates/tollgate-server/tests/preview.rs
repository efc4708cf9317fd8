//! Impact preview over the wire (`Admin/PreviewLimits`), on both stores
//! with the store's clock moved by the test: an hour of recorded usage at
//! 150 tokens/s, previewed at 100/s, throttles 50/s (the known answer,
//! within 1 %) and nothing under the limits it ran on; a tier's preview
//! covers its tenants' buckets that follow it and not an override; a
//! budget's preview says when its cycle's spend would have reached it and
//! what stopping then throttles; the preview changes nothing; bad requests are INVALID_ARGUMENT naming the
//! field, an unknown bucket NOT_FOUND.

mod support;

use std::sync::Arc;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock, proto_time, sample_all, secs};
use tollgate_proto::v1;
use tollgate_server::store::BucketSettings;
use tonic::Code;

const DAY: f64 = 86_400.0;
const HOUR: f64 = 3_600.0;
/// The recorded use, tokens a second.
const USE: f64 = 150.0;

/// A pod of `tenant` asking every 10 s for what it uses (`USE` a second)
/// from `bucket`, and reporting it.
fn ask(tenant: &str, bucket: &str, seq: u64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        bucket: bucket.into(),
        instance_id: 1,
        instance_lease: b"lease".to_vec(),
        seq,
        requested_tokens: USE * 10.0,
        shares: 1.0,
        target_request_period: Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        }),
        consumption_since_last_request: Some(v1::Consumption {
            request_units: USE * 10.0,
            ..v1::Consumption::default()
        }),
        ..v1::TokenBucketRequest::default()
    }
}

fn bucket_change(tenant: &str, bucket: &str, refill: f64, burst: f64) -> v1::PreviewLimitsRequest {
    v1::PreviewLimitsRequest {
        change: Some(v1::preview_limits_request::Change::Bucket(
            v1::ProposedLimits {
                tenant_id: tenant.into(),
                bucket: bucket.into(),
                refill_rate: refill,
                burst_limit: burst,
            },
        )),
        ..v1::PreviewLimitsRequest::default()
    }
}

fn definition(bucket: &str, refill: f64, burst: f64) -> v1::BucketDefinition {
    v1::BucketDefinition {
        bucket: bucket.into(),
        refill_rate: refill,
        burst_limit: burst,
        ..v1::BucketDefinition::default()
    }
}

async fn an_hour_at_150_previewed_at_100_throttles_50_a_second(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(6_000.0 * DAY);
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let options = tollgate_server::GrpcOptions {
        // The test samples, at the times it sets.
        history_interval: None,
        ..tollgate_server::GrpcOptions::default()
    };
    let telemetry = tollgate_server::telemetry::Telemetry::new().expect("telemetry");
    let server = TestServer::start_with(Arc::clone(&store), telemetry, options).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    // A tier whose "api" bucket covers the use (200/s); "steady" follows
    // it, "own" overrides it (300/s).
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "gold".into(),
                buckets: vec![definition("api", 200.0, 2_000.0)],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await
        .expect("put tier");
    for tenant in ["steady", "own"] {
        admin
            .create_tenant(v1::CreateTenantRequest {
                tenant_id: tenant.into(),
                tier: "gold".into(),
            })
            .await
            .expect("create tenant");
    }
    admin
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: "own".into(),
            bucket: Some(definition("api", 300.0, 3_000.0)),
        })
        .await
        .expect("override");
    sample_all(store.as_ref(), 100).await;
    for tick in 1..=360u32 {
        clock.set_secs(6_000.0 * DAY + f64::from(tick) * 10.0);
        for tenant in ["steady", "own"] {
            let answer = pods
                .token_bucket(ask(tenant, "api", u64::from(tick)))
                .await
                .expect("ask")
                .into_inner();
            assert_eq!(answer.granted_tokens, USE * 10.0, "unthrottled");
        }
        sample_all(store.as_ref(), 100).await;
    }
    let until = proto_time(clock.now());
    let hour = prost_types::Duration {
        seconds: 3_600,
        nanos: 0,
    };

    // One bucket, at 100/s with a burst of 100.
    let mut request = bucket_change("steady", "api", 100.0, 100.0);
    request.lookback = Some(hour);
    request.until = Some(until);
    let answer = admin
        .preview_limits(request.clone())
        .await
        .expect("preview")
        .into_inner();
    assert_eq!(secs(answer.max_wait), 5.0);
    assert_eq!(answer.impacts.len(), 1);
    let impact = &answer.impacts[0];
    let current = impact.current.expect("current");
    let proposed = impact.proposed.expect("proposed");
    assert_eq!(
        impact.current_limits.map(|l| l.refill_rate),
        Some(200.0),
        "{impact:?}"
    );
    assert!(
        (current.demand_tokens - USE * HOUR).abs() < 1e-6,
        "{current:?}"
    );
    assert_eq!(current.throttled_tokens, 0.0, "{current:?}");
    let known = (USE - 100.0) * HOUR;
    eprintln!(
        "previewed at 100/s: {} throttled, {known} known ({:+.3} %)",
        proposed.throttled_tokens,
        (proposed.throttled_tokens - known) / known * 100.0
    );
    assert!(
        (proposed.throttled_tokens - known).abs() / known < 0.01,
        "{} throttled, {known} known",
        proposed.throttled_tokens
    );
    // Demand waits up to max_wait before it gives up.
    assert!(
        (secs(proposed.longest_wait) - 5.0).abs() <= 1.0,
        "{proposed:?}"
    );
    assert!(proposed.busiest_hour.is_some());
    assert_eq!(proposed.recorded_throttled_pod_seconds, 0.0);

    // Nothing changed.
    let tenant = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "steady".into(),
            bucket: "api".into(),
        })
        .await
        .expect("get tenant")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(tenant.limits.map(|l| l.refill_rate), Some(200.0));

    // The tier at 100/s: "steady" follows it, "own" overrides it.
    let tier = v1::PreviewLimitsRequest {
        change: Some(v1::preview_limits_request::Change::Tier(v1::Tier {
            name: "gold".into(),
            buckets: vec![definition("api", 100.0, 100.0)],
            ..v1::Tier::default()
        })),
        lookback: Some(hour),
        until: Some(until),
        ..v1::PreviewLimitsRequest::default()
    };
    let answer = admin
        .preview_limits(tier.clone())
        .await
        .expect("preview tier")
        .into_inner();
    let touched: Vec<_> = answer
        .impacts
        .iter()
        .map(|i| (i.tenant_id.as_str(), i.bucket.as_str()))
        .collect();
    assert_eq!(touched, [("steady", "api")]);
    assert_eq!(
        answer.impacts[0]
            .proposed
            .expect("proposed")
            .throttled_tokens,
        proposed.throttled_tokens,
        "the tier's preview of a bucket is the bucket's"
    );
    // The tier as it is changes no bucket.
    let mut same = tier;
    if let Some(v1::preview_limits_request::Change::Tier(t)) = &mut same.change {
        t.buckets = vec![definition("api", 200.0, 2_000.0)];
    }
    let answer = admin
        .preview_limits(same.clone())
        .await
        .expect("preview")
        .into_inner();
    assert!(answer.impacts.is_empty(), "{:?}", answer.impacts);
    // The tier as it is, but in shadow mode: the same limits, previewed,
    // and marked as throttling nothing.
    if let Some(v1::preview_limits_request::Change::Tier(t)) = &mut same.change {
        t.enforce = tollgate_proto::enforce_to_wire(false);
    }
    let answer = admin
        .preview_limits(same)
        .await
        .expect("preview")
        .into_inner();
    let shadow = &answer.impacts[..];
    assert_eq!(shadow.len(), 1, "{shadow:?}");
    assert!(
        !shadow[0].current_shadow && shadow[0].proposed_shadow,
        "{shadow:?}"
    );
    assert_eq!(shadow[0].current, shadow[0].proposed, "the same limits");
    assert!(!answer.impacts.iter().any(|i| i.tenant_id == "own"));

    // A budget stopping at half the hour's use: the day's cycle began
    // with the hour, so the spend reaches it half-way, and the rest is
    // throttled; under no budget now, nothing is.
    let budget = v1::PreviewLimitsRequest {
        change: Some(v1::preview_limits_request::Change::Budget(
            v1::SetBudgetRequest {
                tenant_id: "steady".into(),
                budget: Some(v1::Budget {
                    bucket: "api".into(),
                    amount: USE * HOUR / 2.0,
                    cycle: Some(v1::BudgetCycle {
                        period: v1::BudgetPeriod::Daily.into(),
                        ..v1::BudgetCycle::default()
                    }),
                    at_limit: v1::BudgetAtLimit::Stop.into(),
                    ..v1::Budget::default()
                }),
            },
        )),
        until: Some(until),
        ..v1::PreviewLimitsRequest::default()
    };
    let answer = admin
        .preview_limits(budget.clone())
        .await
        .expect("preview budget")
        .into_inner();
    assert_eq!(
        answer.since.map(|t| t.seconds),
        Some((6_000.0 * DAY) as i64)
    );
    let impact = &answer.impacts[0];
    let current = impact.current.expect("current");
    let proposed = impact.proposed.expect("proposed");
    assert_eq!(current.throttled_tokens, 0.0);
    assert_eq!(current.budget_reached, None);
    let reached = proposed.budget_reached.expect("reached").seconds as f64;
    assert!(
        (reached - (6_000.0 * DAY + HOUR / 2.0)).abs() <= 1.0,
        "reached {reached}"
    );
    assert!(
        (proposed.throttled_tokens - USE * HOUR / 2.0).abs() < 200.0,
        "{proposed:?}"
    );

    // A bucket a budget throttles runs at the baseline; what it is
    // previewed against is its own limits (own's override, 300/s).
    admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "own".into(),
            budget: Some(v1::Budget {
                bucket: "api".into(),
                amount: 1_000.0,
                cycle: Some(v1::BudgetCycle {
                    period: v1::BudgetPeriod::Daily.into(),
                    ..v1::BudgetCycle::default()
                }),
                at_limit: v1::BudgetAtLimit::Throttle.into(),
                baseline: Some(v1::ResourceLimits {
                    refill_rate: 1.0,
                    burst_limit: 10.0,
                }),
                ..v1::Budget::default()
            }),
        })
        .await
        .expect("a throttling budget");
    pods.token_bucket(ask("own", "api", 1_000))
        .await
        .expect("ask past the budget");
    let running = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "own".into(),
            bucket: "api".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .tenant
        .and_then(|t| t.limits)
        .expect("limits");
    assert_eq!(running.refill_rate, 1.0, "throttled to the baseline");
    let mut own = bucket_change("own", "api", 100.0, 100.0);
    own.lookback = Some(hour);
    own.until = Some(until);
    let answer = admin
        .preview_limits(own)
        .await
        .expect("preview")
        .into_inner();
    assert_eq!(
        answer.impacts[0].current_limits.map(|l| l.refill_rate),
        Some(300.0)
    );

    // Refusals name the field; an unknown bucket is NOT_FOUND.
    let cases: Vec<(&str, v1::PreviewLimitsRequest)> = vec![
        ("change", v1::PreviewLimitsRequest::default()),
        ("refill_rate", bucket_change("steady", "api", -1.0, 1.0)),
        ("burst_limit", bucket_change("steady", "api", 1.0, f64::NAN)),
        ("tenant", bucket_change("", "api", 1.0, 1.0)),
        (
            "budget.cycle",
            v1::PreviewLimitsRequest {
                change: Some(v1::preview_limits_request::Change::Budget(
                    v1::SetBudgetRequest {
                        tenant_id: "steady".into(),
                        budget: Some(v1::Budget {
                            amount: -1.0,
                            ..v1::Budget::default()
                        }),
                    },
                )),
                ..v1::PreviewLimitsRequest::default()
            },
        ),
        ("lookback", {
            let mut r = request.clone();
            r.lookback = Some(prost_types::Duration {
                seconds: 15 * 86_400,
                nanos: 0,
            });
            r
        }),
        ("max_wait", {
            let mut r = request.clone();
            r.max_wait = Some(prost_types::Duration {
                seconds: 3_600,
                nanos: 0,
            });
            r
        }),
    ];
    let mut budget_with_lookback = budget.clone();
    budget_with_lookback.lookback = Some(hour);
    let mut cases = cases;
    cases.push(("lookback", budget_with_lookback));
    for (field, case) in cases {
        let status = admin.preview_limits(case).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
    }
    let status = admin
        .preview_limits(bucket_change("nobody", "api", 1.0, 1.0))
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    server.stop().await;
    drop(backing);
}

for_each_store!(an_hour_at_150_previewed_at_100_throttles_50_a_second);
