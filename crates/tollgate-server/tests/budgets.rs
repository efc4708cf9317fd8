//! Budgets per billing cycle through the wire contract alone, on the
//! embedded store and PostgreSQL, with the store's clock moved by the
//! test: pods drive a bucket through a cycle under a budget (`SetBudget`,
//! `GetBudget`, `GetUsage`, `ClearBudget`), the grants never pass the
//! budget plus the baseline's refill since the limit, the cycle boundary
//! (a 31st anchor in a leap February, a daylight-saving change) resets it,
//! and the closed cycle's record equals what the pods reported, exactly.
//! Bad input is refused naming its field, changing nothing.

mod support;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock};
use tollgate_core::Timestamp;
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_server::store::BucketSettings;
use tollgate_server::store::image::{Record, RecordSink};
use tonic::Code;
use tonic::transport::Channel;

const AMOUNT: f64 = 1_000_000.0;
const BASELINE_RATE: f64 = 100.0;
const PODS: u32 = 4;

fn utc(text: &str) -> Timestamp {
    let t: jiff::Timestamp = text.parse().expect("a test date");
    Timestamp::from_unix_micros(t.as_microsecond())
}

fn proto_micros(t: Option<prost_types::Timestamp>) -> i64 {
    let t = t.expect("a timestamp");
    t.seconds * 1_000_000 + i64::from(t.nanos) / 1_000
}

fn budget(bucket: &str) -> v1::Budget {
    v1::Budget {
        bucket: bucket.into(),
        amount: AMOUNT,
        cycle: Some(v1::BudgetCycle {
            period: v1::BudgetPeriod::Monthly.into(),
            anchor_day: 31,
            anchor_weekday: String::new(),
            time_zone: "America/New_York".into(),
        }),
        at_limit: v1::BudgetAtLimit::Throttle.into(),
        baseline: Some(v1::ResourceLimits {
            refill_rate: BASELINE_RATE,
            burst_limit: 1_000.0,
        }),
        thresholds: Vec::new(),
        price_per_million_tokens: 0.2,
        currency: "USD".into(),
        enforce: None,
    }
}

fn pod_request(instance: u32, seq: u64, tokens: f64, micros: u64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: "acme".into(),
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
            request_unit_micros: micros,
            read_requests: 1,
            write_bytes: 7,
            ..v1::Consumption::default()
        }),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: None,
    }
}

async fn status(admin: &mut AdminClient<Channel>) -> v1::BudgetStatus {
    admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect("get budget")
        .into_inner()
        .status
        .expect("a budget")
}

/// A server over a fresh store of `backend` that reads the time from
/// `clock`, with tenant acme's request-unit bucket at 20 000/s, burst
/// 50 000; the backing keeps the store until dropped.
async fn acme_server(backend: Backend, clock: &ManualClock) -> (Backing, TestServer) {
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let server = TestServer::start(store).await;
    server
        .admin()
        .await
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "acme".into(),
            available_tokens: 50_000.0,
            refill_rate: 20_000.0,
            burst_limit: 50_000.0,
            ..Default::default()
        })
        .await
        .expect("limits");
    (backing, server)
}

async fn pods_drive_a_cycle_within_the_budget_and_the_next_resets_it(backend: Backend) {
    let clock = ManualClock::default();
    // 2024 is a leap year; New York leaves winter time on 2024-03-10.
    let start = utc("2024-02-27T12:00:00Z");
    clock.set_secs(start.unix_micros() as f64 / 1e6);
    let (_backing, server) = acme_server(backend, &clock).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;

    let set = admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(budget("")),
        })
        .await
        .expect("set budget")
        .into_inner()
        .status
        .expect("status");
    // Anchor 31 in a leap February: the cycle runs from January 31 to
    // February 29, midnight in New York (UTC-5).
    let current = set.current.expect("current cycle");
    assert_eq!(
        proto_micros(current.start),
        utc("2024-01-31T05:00:00Z").unix_micros()
    );
    assert_eq!(
        proto_micros(current.end),
        utc("2024-02-29T05:00:00Z").unix_micros()
    );
    assert_eq!(set.state, "under");
    assert_eq!(
        set.budget.expect("budget").thresholds,
        ["50", "75", "90", "100"]
    );

    // Pods ask for more than the budget allows, a second apart, each
    // reporting what it consumed; the server's cycle never grants past
    // the amount plus the baseline since the limit.
    let mut seq = 0;
    let mut granted = 0.0;
    let mut reported: u64 = 0;
    let mut reached_at = None;
    for round in 0..200u64 {
        seq += 1;
        for pod in 1..=PODS {
            let micros = 1_234_567 + round * 1_000 + u64::from(pod);
            reported += micros;
            let grant = pods
                .token_bucket(pod_request(pod, seq, 60_000.0, micros))
                .await
                .expect("a grant")
                .into_inner();
            granted += grant.granted_tokens;
        }
        let s = status(&mut admin).await;
        let current = s.current.expect("current");
        if let (None, Some(at)) = (reached_at, current.limit_reached_at) {
            reached_at = Some(proto_micros(Some(at)));
        }
        let past = reached_at.map_or(0.0, |at| {
            (clock.now().unix_micros() - at).max(0) as f64 / 1e6
        });
        // Past the limit: the baseline since, and one target request
        // period (10 s) ahead.
        let bound = AMOUNT + BASELINE_RATE * reached_at.map_or(0.0, |_| past + 10.0);
        assert!(
            current.granted_tokens <= bound * (1.0 + 1e-12),
            "round {round}: granted {} beyond {bound}",
            current.granted_tokens
        );
        assert!(
            (current.granted_tokens - granted).abs() <= 1e-6 * granted.max(1.0),
            "the cycle counts what the pods were granted: {} against {granted}",
            current.granted_tokens
        );
        clock.advance(std::time::Duration::from_secs(1));
    }
    let s = status(&mut admin).await;
    assert!(reached_at.is_some(), "the pods reached the limit");
    assert_eq!(s.state, "throttled");
    assert_eq!(s.fired, ["50", "75", "90", "100"]);
    let own = s.own_limits.expect("own limits");
    assert_eq!(
        own.refill_rate, 20_000.0,
        "the bucket's own limits are kept"
    );
    let tenant = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect("tenant")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(
        tenant.limits.expect("limits").refill_rate,
        BASELINE_RATE,
        "throttled, the bucket runs at the baseline"
    );

    // The next cycle starts at midnight of February 29 in New York and
    // ends at midnight of March 31, summer time (UTC-4).
    clock.set_secs(utc("2024-02-29T05:00:01Z").unix_micros() as f64 / 1e6);
    seq += 1;
    let grant = pods
        .token_bucket(pod_request(1, seq, 30_000.0, 5))
        .await
        .expect("a grant")
        .into_inner();
    assert_eq!(grant.granted_tokens, 30_000.0, "a new cycle grants again");
    let usage = admin
        .get_usage(v1::GetUsageRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
            cycles: 0,
        })
        .await
        .expect("usage")
        .into_inner()
        .cycles;
    assert_eq!(usage.len(), 2, "{usage:?}");
    let (now, closed) = (&usage[0], &usage[1]);
    assert!(!now.closed && closed.closed);
    assert_eq!(
        proto_micros(now.start),
        utc("2024-02-29T05:00:00Z").unix_micros()
    );
    assert_eq!(
        proto_micros(now.end),
        utc("2024-03-31T04:00:00Z").unix_micros()
    );
    assert_eq!(now.granted_tokens, 30_000.0);
    assert_eq!(
        closed.consumption.expect("consumption").request_unit_micros,
        reported,
        "the closed cycle's record is what the pods reported, to the micro-unit"
    );
    assert_eq!(
        closed.consumption.expect("consumption").read_requests,
        200 * u64::from(PODS)
    );
    assert!((closed.granted_tokens - granted).abs() <= 1e-6 * granted);
    assert_eq!(
        proto_micros(closed.end),
        utc("2024-02-29T05:00:00Z").unix_micros()
    );
    let s = status(&mut admin).await;
    assert_eq!(s.state, "under");
    assert!(s.fired.is_empty());
    let tenant = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect("tenant")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(tenant.limits.expect("limits").refill_rate, 20_000.0);

    // Clearing closes the cycle now; the record stays.
    let closed_now = admin
        .clear_budget(v1::ClearBudgetRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect("clear")
        .into_inner()
        .closed
        .expect("the closed cycle");
    assert_eq!(closed_now.granted_tokens, 30_000.0);
    assert_eq!(proto_micros(closed_now.end), clock.now().unix_micros());
    let after = admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect("get")
        .into_inner();
    assert!(after.status.is_none());
    let missing = admin
        .clear_budget(v1::ClearBudgetRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect_err("nothing to clear");
    assert_eq!(missing.code(), Code::NotFound);
    let usage = admin
        .get_usage(v1::GetUsageRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
            cycles: 10,
        })
        .await
        .expect("usage")
        .into_inner()
        .cycles;
    assert_eq!(usage.len(), 2, "both closed cycles, no current one");

    // The store kept one event per threshold crossed, for delivery.
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let store = std::sync::Arc::clone(&server.store);
    let exporting = tokio::spawn(async move { store.export(RecordSink::new(tx)).await });
    let mut thresholds = Vec::new();
    while let Some(record) = rx.recv().await {
        if let Record::BudgetEvent { event, .. } = record {
            assert!(event.delivery.delivered_at.is_none());
            thresholds.push(event.event.threshold.label());
        }
    }
    let counts = exporting.await.expect("export task").expect("export");
    thresholds.sort();
    assert_eq!(thresholds, ["100", "50", "75", "90"]);
    assert_eq!(counts.budget_cycles, 2);
    server.stop().await;
}

/// A change that makes a good budget bad.
type Spoil = Box<dyn Fn(&mut v1::Budget)>;

async fn bad_budgets_are_refused_naming_the_field_and_change_nothing(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let cases: Vec<(&str, Spoil)> = vec![
        ("budget.amount", Box::new(|b| b.amount = 0.0)),
        ("budget.amount", Box::new(|b| b.amount = f64::NAN)),
        (
            "budget.cycle.time_zone",
            Box::new(|b| b.cycle.as_mut().expect("cycle").time_zone = "Mars/Base".into()),
        ),
        (
            "budget.cycle.anchor_day",
            Box::new(|b| b.cycle.as_mut().expect("cycle").anchor_day = 32),
        ),
        (
            "budget.cycle.anchor_weekday",
            Box::new(|b| b.cycle.as_mut().expect("cycle").anchor_weekday = "monday".into()),
        ),
        (
            "budget.cycle.period",
            Box::new(|b| b.cycle.as_mut().expect("cycle").period = 0),
        ),
        ("budget.at_limit", Box::new(|b| b.at_limit = 0)),
        ("budget.baseline", Box::new(|b| b.baseline = None)),
        (
            "budget.baseline.refill_rate",
            Box::new(|b| b.baseline.as_mut().expect("baseline").refill_rate = -1.0),
        ),
        (
            "budget.thresholds[1]",
            Box::new(|b| b.thresholds = vec!["50".into(), "half".into()]),
        ),
        (
            "budget.currency",
            Box::new(|b| b.currency = "dollars".into()),
        ),
        ("budget.bucket", Box::new(|b| b.bucket = "no spaces".into())),
    ];
    for (field, spoil) in cases {
        let mut b = budget("");
        spoil(&mut b);
        let err = admin
            .set_budget(v1::SetBudgetRequest {
                tenant_id: "acme".into(),
                budget: Some(b),
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().contains(field),
            "{field} not named in {:?}",
            err.message()
        );
    }
    // Nothing was created.
    let err = admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect_err("no tenant");
    assert_eq!(err.code(), Code::NotFound);
    // A bucket the tenant does not have is a precondition, named.
    let err = admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(budget("schedule-email")),
        })
        .await
        .expect_err("no such bucket");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("schedule-email"),
        "{}",
        err.message()
    );
    server.stop().await;
}

/// A budget does not bring a deleted tenant back (with the server's
/// default limits): it is refused, and the tenant stays deleted.
async fn a_budget_for_a_deleted_tenant_is_refused_and_it_stays_deleted(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    pods.token_bucket(pod_request(1, 1, 10.0, 1))
        .await
        .expect("pods make the tenant");
    admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("deleted");
    let err = admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(budget("")),
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("deleted"), "{}", err.message());
    let err = pods
        .token_bucket(pod_request(1, 2, 10.0, 1))
        .await
        .expect_err("still deleted");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    server.stop().await;
}

/// Closed cycles older than the retention are pruned, the others kept.
async fn closed_cycles_past_the_retention_are_pruned(backend: Backend) {
    use tollgate_core::budget::{AtLimit, Budget, CycleRule, Period};
    use tollgate_core::tier::TenantChange;
    use tollgate_core::{BucketKey, BucketName, LimitsUpdate, TenantId};
    let clock = ManualClock::default();
    clock.set_secs(utc("2025-01-01T00:00:00Z").unix_micros() as f64 / 1e6);
    let backing = Backing::new(backend).await;
    let settings = BucketSettings {
        budget_record_retention: std::time::Duration::from_secs(10 * 86_400),
        ..BucketSettings::default()
    };
    let store = backing.open_with_clock(settings, clock.as_clock()).await;
    let tenant = TenantId::parse("tenant_id", "acme").expect("id");
    let key = BucketKey::request_units(tenant.clone());
    store
        .update_limits(
            &key,
            &LimitsUpdate {
                available_tokens: 100.0,
                limits: tollgate_core::Limits {
                    refill_rate: 10.0,
                    burst_limit: 100.0,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: tollgate_core::LimitsMask::ALL,
            },
        )
        .await
        .expect("limits");
    store
        .change_tenant(
            &tenant,
            &TenantChange::SetBudget {
                bucket: BucketName::REQUEST_UNITS,
                budget: Budget::new(1e6, CycleRule::utc(Period::Daily), AtLimit::Stop),
            },
        )
        .await
        .expect("budget");
    // A request a day for 20 days: 19 closed cycles.
    for day in 0..20u64 {
        let request = tollgate_core::TokenBucketRequest {
            instance_id: 1,
            lease: b"lease".to_vec(),
            seq: day + 1,
            requested_tokens: 1.0,
            shares: 1.0,
            target_request_period: std::time::Duration::from_secs(10),
            consumption: tollgate_core::Consumption::default(),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            held_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: std::time::Duration::ZERO,
        };
        store.token_bucket(&key, &request).await.expect("granted");
        clock.advance(std::time::Duration::from_secs(86_400));
    }
    assert_eq!(
        store.budget_cycles(&key, 100).await.expect("cycles").len(),
        19
    );
    // Now is 2025-01-21: cycles that ended before 2025-01-11 go, in
    // batches.
    assert_eq!(
        store.prune_budget_records(4).await.expect("prune").cycles,
        4
    );
    assert_eq!(
        store.prune_budget_records(100).await.expect("prune").cycles,
        5
    );
    assert_eq!(
        store.prune_budget_records(100).await.expect("prune").cycles,
        0
    );
    let kept = store.budget_cycles(&key, 100).await.expect("cycles");
    assert_eq!(kept.len(), 10);
    let cutoff = utc("2025-01-11T00:00:00Z");
    assert!(kept.iter().all(|r| r.cycle.end >= cutoff), "{kept:?}");
    store.close().await.expect("close");
}

fn tier_with_budgets(budgets: Vec<v1::Budget>) -> v1::Tier {
    v1::Tier {
        name: "free".into(),
        buckets: vec![
            v1::BucketDefinition {
                quota: None,
                bucket: "schedule-email".into(),
                refill_rate: 10.0,
                burst_limit: 100.0,
                initial_tokens: None,
                kind: v1::BucketKind::Shared.into(),
                enforce: None,
            },
            v1::BucketDefinition {
                quota: None,
                bucket: "per-user".into(),
                refill_rate: 1.0,
                burst_limit: 10.0,
                initial_tokens: None,
                kind: v1::BucketKind::PerKey.into(),
                enforce: None,
            },
        ],
        budgets,
        ..Default::default()
    }
}

async fn budget_of(admin: &mut AdminClient<Channel>, bucket: &str) -> Option<v1::BudgetStatus> {
    admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: bucket.into(),
        })
        .await
        .expect("get budget")
        .into_inner()
        .status
}

/// The free tier: 50 M request units a month, then 100 RU/s, and 10 000
/// emails a month; its tenants get both, a tenant's own budget replaces
/// the tier's, and a tier without them takes them off.
async fn tiers_carry_budgets_to_their_tenants(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    let mut ru = budget("");
    ru.amount = 50e6;
    let mut emails = budget("schedule-email");
    emails.amount = 10_000.0;
    emails.at_limit = v1::BudgetAtLimit::Stop.into();
    emails.baseline = None;
    let stored = admin
        .put_tier(v1::PutTierRequest {
            tier: Some(tier_with_budgets(vec![ru.clone(), emails.clone()])),
            ..Default::default()
        })
        .await
        .expect("put tier")
        .into_inner()
        .tier
        .expect("tier");
    assert_eq!(stored.budgets.len(), 2);
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "free".into(),
        })
        .await
        .expect("onboard");
    let ru_status = budget_of(&mut admin, "")
        .await
        .expect("the request-unit budget");
    assert_eq!(ru_status.budget.expect("budget").amount, 50e6);
    let email_status = budget_of(&mut admin, "schedule-email")
        .await
        .expect("emails");
    assert_eq!(email_status.budget.expect("budget").amount, 10_000.0);

    // The tenant's own replaces the tier's; cleared, the tier's is back.
    let mut own = emails.clone();
    own.amount = 500.0;
    admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(own),
        })
        .await
        .expect("own budget");
    let amount = |s: Option<v1::BudgetStatus>| s.and_then(|s| s.budget).map(|b| b.amount);
    assert_eq!(
        amount(budget_of(&mut admin, "schedule-email").await),
        Some(500.0)
    );
    admin
        .clear_budget(v1::ClearBudgetRequest {
            tenant_id: "acme".into(),
            bucket: "schedule-email".into(),
        })
        .await
        .expect("clear");
    assert_eq!(
        amount(budget_of(&mut admin, "schedule-email").await),
        Some(10_000.0)
    );

    // A tier without budgets takes them off its tenants.
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(tier_with_budgets(Vec::new())),
            ..Default::default()
        })
        .await
        .expect("put tier");
    assert_eq!(amount(budget_of(&mut admin, "").await), None);
    assert_eq!(amount(budget_of(&mut admin, "schedule-email").await), None);

    // Bad tier budgets name their field; nothing changes.
    let mut per_key = budget("per-user");
    per_key.at_limit = v1::BudgetAtLimit::Stop.into();
    per_key.baseline = None;
    let mut bad_amount = emails.clone();
    bad_amount.amount = -1.0;
    for (budgets, field) in [
        (vec![budget("nope")], "tier.budgets[0].bucket"),
        (vec![per_key], "tier.budgets[0].bucket"),
        (vec![emails.clone(), bad_amount], "tier.budgets[1].amount"),
        (
            vec![emails.clone(), emails.clone()],
            "tier.budgets[1].bucket",
        ),
    ] {
        let err = admin
            .put_tier(v1::PutTierRequest {
                tier: Some(tier_with_budgets(budgets)),
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert_eq!(amount(budget_of(&mut admin, "schedule-email").await), None);
    server.stop().await;

    // A server that does not create request-unit buckets refuses a tier's
    // request-unit budget rather than leave it unapplied.
    let strict = TestServer::new(
        backend,
        BucketSettings {
            unconfigured_tenants: tollgate_server::store::UnconfiguredTenants::Reject,
            ..BucketSettings::default()
        },
    )
    .await;
    let mut admin = strict.admin().await;
    let err = admin
        .put_tier(v1::PutTierRequest {
            tier: Some(tier_with_budgets(vec![ru])),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("request-unit budget"),
        "{}",
        err.message()
    );
    strict.stop().await;
}

/// A budget in shadow mode over the wire: a STOP budget whose pods keep
/// getting what they ask for past the amount, a status that says "over"
/// and exactly what enforcing would have held back; set back to
/// enforcing, the bucket stops where the cycle stands.
async fn a_shadow_budget_stops_nothing_and_says_what_it_would_have(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(utc("2024-05-10T12:00:00Z").unix_micros() as f64 / 1e6);
    let (_backing, server) = acme_server(backend, &clock).await;
    let mut admin = server.admin().await;
    let mut pods = server.pods().await;
    let stop = |enforce: Option<bool>| v1::Budget {
        amount: 1_000.0,
        at_limit: v1::BudgetAtLimit::Stop.into(),
        baseline: None,
        price_per_million_tokens: 0.0,
        currency: String::new(),
        enforce,
        ..budget("")
    };
    let set = admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(stop(Some(false))),
        })
        .await
        .expect("a shadow budget")
        .into_inner()
        .status
        .expect("status");
    assert_eq!(set.budget.and_then(|b| b.enforce), Some(false));
    // 6 requests of 300: 1 800 granted, 800 past the amount.
    for seq in 1..=6 {
        clock.advance(std::time::Duration::from_secs(1));
        let grant = pods
            .token_bucket(pod_request(1, seq, 300.0, 0))
            .await
            .expect("a grant")
            .into_inner();
        assert_eq!(grant.granted_tokens, 300.0, "request {seq}: {grant:?}");
    }
    let now = status(&mut admin).await;
    assert_eq!(now.state, "over", "{now:?}");
    assert_eq!(now.remaining, None, "{now:?}");
    let excess = now.shadow_excess.expect("what stop would have held back");
    assert!((excess - 800.0).abs() < 1e-6, "{now:?}");

    // Enforcing again: stopped, the cycle's spend kept.
    admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(stop(None)),
        })
        .await
        .expect("enforced");
    clock.advance(std::time::Duration::from_secs(1));
    let grant = pods
        .token_bucket(pod_request(1, 7, 300.0, 0))
        .await
        .expect("an answer")
        .into_inner();
    assert_eq!(grant.granted_tokens, 0.0, "{grant:?}");
    let now = status(&mut admin).await;
    assert_eq!(now.state, "stopped", "{now:?}");
    assert_eq!(now.shadow_excess, None);
    let spend = now.current.map(|c| c.spend).expect("the cycle");
    assert!((spend - 1_800.0).abs() < 1e-6, "{spend}");
    server.stop().await;
}

for_each_store!(
    a_shadow_budget_stops_nothing_and_says_what_it_would_have,
    tiers_carry_budgets_to_their_tenants,
    closed_cycles_past_the_retention_are_pruned,
    pods_drive_a_cycle_within_the_budget_and_the_next_resets_it,
    bad_budgets_are_refused_naming_the_field_and_change_nothing,
    a_budget_for_a_deleted_tenant_is_refused_and_it_stays_deleted,
);
