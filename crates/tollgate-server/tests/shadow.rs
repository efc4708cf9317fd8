//! Shared buckets in shadow mode over the wire, on both stores, with the
//! store's clock moved by the test: two tenants on two tiers alike but for
//! `enforce`, their pods sending the same requests at the same times. The
//! shadow tenant's pods get all they ask at once and are never throttled;
//! what it counts as held back (`Tenant.shadow_throttled_tokens` and
//! `shadow_throttled_micros`, and `/metrics`) is exactly what the enforcing
//! tenant's answers held back; its billed grants are what its pods got.
//! Switched to enforcing, it answers as the other tenant does: the state
//! was kept. A whole tier in shadow mode enforces none of its shared,
//! per-key and budget limits, and all three once enforced again.

mod support;

use std::sync::Arc;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock, secs};
use tollgate_proto::v1;
use tollgate_server::store::BucketSettings;

const DAY: f64 = 86_400.0;

fn tier(name: &str, enforce: bool) -> v1::PutTierRequest {
    v1::PutTierRequest {
        tier: Some(v1::Tier {
            name: name.into(),
            buckets: vec![v1::BucketDefinition {
                bucket: "api".into(),
                refill_rate: 10.0,
                burst_limit: 50.0,
                enforce: tollgate_proto::enforce_to_wire(enforce),
                ..v1::BucketDefinition::default()
            }],
            ..v1::Tier::default()
        }),
        dry_run: false,
    }
}

fn ask(tenant: &str, seq: u64, tokens: f64) -> v1::TokenBucketRequest {
    ask_bucket(tenant, "api", seq, tokens)
}

fn ask_bucket(tenant: &str, bucket: &str, seq: u64, tokens: f64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        bucket: bucket.into(),
        instance_id: 1,
        instance_lease: b"lease".to_vec(),
        seq,
        requested_tokens: tokens,
        shares: 1.0,
        target_request_period: Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        }),
        consumption_since_last_request: Some(v1::Consumption {
            request_units: tokens,
            ..v1::Consumption::default()
        }),
        ..v1::TokenBucketRequest::default()
    }
}

async fn shadow_buckets_grant_what_is_asked_and_count_what_enforcing_held_back(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(7_000.0 * DAY);
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let telemetry = tollgate_server::telemetry::Telemetry::new().expect("telemetry");
    let metrics = telemetry.metrics.clone();
    let server = TestServer::start_with(
        Arc::clone(&store),
        telemetry,
        tollgate_server::GrpcOptions::default(),
    )
    .await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    for (name, enforce) in [("strict", true), ("shadowed", false)] {
        admin.put_tier(tier(name, enforce)).await.expect("put tier");
        admin
            .create_tenant(v1::CreateTenantRequest {
                tenant_id: name.into(),
                tier: name.into(),
            })
            .await
            .expect("create");
    }

    // The same requests, at the same times, to both: bursts of 30 to 120
    // tokens against 10/s and a burst of 50.
    let (mut held_back, mut trickled, mut asked) = (0.0, 0.0, 0.0);
    for seq in 1..=24u64 {
        clock.set_secs(7_000.0 * DAY + seq as f64 * 1.5);
        let tokens = 30.0 + (seq * 37 % 91) as f64;
        let strict = pods
            .token_bucket(ask("strict", seq, tokens))
            .await
            .expect("strict")
            .into_inner();
        let shadowed = pods
            .token_bucket(ask("shadowed", seq, tokens))
            .await
            .expect("shadowed")
            .into_inner();
        assert_eq!(shadowed.granted_tokens, tokens, "all asked, at once");
        assert_eq!(secs(shadowed.trickle_duration), 0.0);
        let trickle = secs(strict.trickle_duration);
        let at_once = if trickle == 0.0 {
            strict.granted_tokens
        } else {
            0.0
        };
        held_back += (tokens - at_once).max(0.0);
        trickled += trickle;
        asked += tokens;
    }
    assert!(trickled > 0.0 && held_back > 0.0, "enforcing throttled");

    let get = |tenant: &str| v1::GetTenantRequest {
        tenant_id: tenant.into(),
        bucket: "api".into(),
    };
    let shadowed = admin
        .get_tenant(get("shadowed"))
        .await
        .expect("get")
        .into_inner()
        .tenant
        .expect("tenant");
    let strict = admin
        .get_tenant(get("strict"))
        .await
        .expect("get")
        .into_inner()
        .tenant
        .expect("tenant");
    assert!(shadowed.shadow && !strict.shadow);
    assert!(
        (shadowed.shadow_throttled_tokens - held_back).abs() < 1e-6,
        "{} counted, {held_back} held back",
        shadowed.shadow_throttled_tokens
    );
    assert!(
        (shadowed.shadow_throttled_micros as f64 / 1e6 - trickled).abs() < 1e-3,
        "{} µs counted, {trickled} s trickled",
        shadowed.shadow_throttled_micros
    );
    assert_eq!(shadowed.throttled_micros, 0, "never throttled");
    assert!(
        (shadowed.granted_tokens - asked).abs() < 1e-6,
        "billed what it got"
    );
    assert_eq!(strict.shadow_throttled_tokens, 0.0);
    // The level is the enforced one.
    assert!(
        (shadowed.current_tokens - strict.current_tokens).abs() < 1e-6,
        "{} and {}",
        shadowed.current_tokens,
        strict.current_tokens
    );
    let text = metrics.render(store.as_ref()).await.expect("metrics");
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("tollgate_tenant_shadow_throttled_tokens_total{")
                && l.contains("tenant_id=\"shadowed\"")
        })
        .unwrap_or_else(|| panic!("the shadow bucket's counter in {text}"));
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a value");
    assert!((value - held_back).abs() < 1e-6, "{line}");
    assert!(
        !text.contains(
            "tollgate_tenant_shadow_throttled_tokens_total{bucket=\"api\",tenant_id=\"strict\"}"
        ),
        "no series for an enforcing bucket"
    );

    // Enforcing again: the same answers as the tenant that always was.
    admin
        .put_tier(tier("shadowed", true))
        .await
        .expect("enforce");
    for seq in 25..=30u64 {
        clock.set_secs(7_000.0 * DAY + seq as f64 * 1.5);
        let strict = pods
            .token_bucket(ask("strict", seq, 80.0))
            .await
            .expect("strict")
            .into_inner();
        let shadowed = pods
            .token_bucket(ask("shadowed", seq, 80.0))
            .await
            .expect("shadowed")
            .into_inner();
        assert_eq!(shadowed.granted_tokens, strict.granted_tokens, "seq {seq}");
        assert_eq!(shadowed.trickle_duration, strict.trickle_duration);
    }
    server.stop().await;
    drop(backing);
}

/// A tier as a whole in shadow mode (`Tier.enforce` false): its shared
/// bucket grants what pods ask, its per-key bucket refuses no check and
/// marks the short ones, its budget stops nothing; enforced again, all
/// three enforce.
async fn a_whole_tier_in_shadow_mode_enforces_none_of_its_limits(backend: Backend) {
    use tollgate_proto::v1::key_limits_client::KeyLimitsClient;

    let backing = Backing::new(backend).await;
    let store = backing.open(BucketSettings::default()).await;
    let server = TestServer::start(Arc::clone(&store)).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    let mut checks = KeyLimitsClient::new(server.channel().await);
    let trial = |enforce: bool| v1::PutTierRequest {
        tier: Some(v1::Tier {
            name: "trial".into(),
            buckets: vec![
                v1::BucketDefinition {
                    bucket: "api".into(),
                    refill_rate: 0.001,
                    burst_limit: 10.0,
                    ..v1::BucketDefinition::default()
                },
                v1::BucketDefinition {
                    bucket: "per-user".into(),
                    refill_rate: 0.001,
                    burst_limit: 2.0,
                    kind: v1::BucketKind::PerKey.into(),
                    ..v1::BucketDefinition::default()
                },
            ],
            budgets: vec![v1::Budget {
                bucket: "api".into(),
                amount: 1_000.0,
                cycle: Some(v1::BudgetCycle {
                    period: v1::BudgetPeriod::Daily.into(),
                    ..v1::BudgetCycle::default()
                }),
                at_limit: v1::BudgetAtLimit::Stop.into(),
                ..v1::Budget::default()
            }],
            enforce: tollgate_proto::enforce_to_wire(enforce),
            ..v1::Tier::default()
        }),
        dry_run: false,
    };
    admin.put_tier(trial(false)).await.expect("a shadow tier");
    let shown = admin
        .get_tier(v1::GetTierRequest {
            name: "trial".into(),
        })
        .await
        .expect("get tier")
        .into_inner()
        .tier
        .expect("tier");
    assert_eq!(shown.enforce, Some(false));
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "trial".into(),
        })
        .await
        .expect("create");

    // The shared bucket: 1 500 asked against a burst of 10 and a budget
    // stopping at 1 000: all of it, at once.
    let answer = pods
        .token_bucket(ask_bucket("acme", "api", 1, 1_500.0))
        .await
        .expect("ask")
        .into_inner();
    assert_eq!(answer.granted_tokens, 1_500.0);
    assert_eq!(secs(answer.trickle_duration), 0.0);
    let budget = admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: "api".into(),
        })
        .await
        .expect("budget")
        .into_inner()
        .status
        .expect("status");
    assert_eq!(budget.budget.as_ref().and_then(|b| b.enforce), Some(false));
    assert!(
        budget
            .shadow_excess
            .is_some_and(|e| (e - 500.0).abs() < 1e-6),
        "{budget:?}"
    );
    // The per-key bucket: 4 checks of a 2-token key, none refused.
    let check = |key: &str| v1::CheckRequest {
        items: vec![v1::CheckItem {
            tenant_id: "acme".into(),
            bucket: "per-user".into(),
            key: key.into(),
            tokens: 1.0,
            ..Default::default()
        }],
    };
    let mut shadow_refused = 0;
    for _ in 0..4 {
        let answer = checks
            .check(check("ada"))
            .await
            .expect("check")
            .into_inner();
        assert!(answer.allowed);
        shadow_refused += usize::from(answer.answers[0].shadow_refused);
    }
    assert_eq!(shadow_refused, 2);

    // Enforced again: each of the three enforces where shadow mode left it.
    admin.put_tier(trial(true)).await.expect("enforce");
    let tenant = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "acme".into(),
            bucket: "api".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .tenant
        .expect("tenant");
    assert!(!tenant.shadow);
    let answer = pods
        .token_bucket(ask_bucket("acme", "api", 2, 100.0))
        .await
        .expect("ask")
        .into_inner();
    assert_eq!(
        answer.granted_tokens, 0.0,
        "the budget stops it: {answer:?}"
    );
    let answer = checks
        .check(check("ada"))
        .await
        .expect("check")
        .into_inner();
    assert!(!answer.allowed, "the key is spent: {answer:?}");
    server.stop().await;
    drop(backing);
}

for_each_store!(
    shadow_buckets_grant_what_is_asked_and_count_what_enforcing_held_back,
    a_whole_tier_in_shadow_mode_enforces_none_of_its_limits,
);
