//! Calendar quotas on per-key buckets, through the wire contract: a tier's
//! per-key bucket with a monthly quota per key (AWS usage plans' "each API
//! key 10 000 calls a month"), checked by concurrent callers on two
//! replicas of one PostgreSQL database (and on the embedded store). The
//! store's clock is moved by the test.
//!
//! - Exact: each key is allowed exactly its quota in a cycle, however the
//!   checks interleave across replicas; the rest are refused, with a
//!   retry-after reaching the cycle's end.
//! - Each answer's remaining quota is the quota less what the key was
//!   allowed so far in the cycle (every value from amount − tokens down to
//!   0 is answered once), and its reset time is the cycle's end (the first
//!   of the next month, Paris time).
//! - The next cycle makes the whole quota available again; a retry with
//!   the same request id takes nothing more.
//! - A bad quota is refused naming the field; a shared bucket's quota is
//!   its budget, stopping grants at the amount.

mod support;

use std::time::Duration;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock};
use tollgate_core::Timestamp;
use tollgate_proto::v1;
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tollgate_server::store::BucketSettings;
use tonic::Code;
use tonic::transport::Channel;

const QUOTA: f64 = 300.0;
const KEYS: usize = 3;
const CALLERS: usize = 12;
const CALLS_PER_CALLER: usize = 60;

fn utc(text: &str) -> Timestamp {
    let t: jiff::Timestamp = text.parse().expect("a test date");
    Timestamp::from_unix_micros(t.as_microsecond())
}

fn micros(t: Option<prost_types::Timestamp>) -> i64 {
    let t = t.expect("a timestamp");
    t.seconds * 1_000_000 + i64::from(t.nanos) / 1_000
}

fn monthly(amount: f64) -> Option<v1::Quota> {
    Some(v1::Quota {
        amount,
        cycle: Some(v1::BudgetCycle {
            period: v1::BudgetPeriod::Monthly.into(),
            anchor_day: 1,
            anchor_weekday: String::new(),
            time_zone: "Europe/Paris".into(),
        }),
    })
}

/// Tier `plan` with a per-key bucket `api-calls` (fast enough that only
/// the quota binds) with `quota`, and tenant acme on it.
async fn set_up(server: &TestServer, quota: Option<v1::Quota>) -> Result<(), tonic::Status> {
    let mut admin = server.admin().await;
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "plan".into(),
                buckets: vec![v1::BucketDefinition {
                    bucket: "api-calls".into(),
                    refill_rate: 1_000_000.0,
                    burst_limit: 1_000_000.0,
                    initial_tokens: None,
                    kind: v1::BucketKind::PerKey.into(),
                    quota,
                    enforce: None,
                }],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await?;
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "plan".into(),
        })
        .await?;
    Ok(())
}

fn check(key: usize, tokens: f64, request_id: String) -> v1::CheckRequest {
    v1::CheckRequest {
        items: vec![v1::CheckItem {
            tenant_id: "acme".into(),
            bucket: "api-calls".into(),
            key: format!("api-key-{key}"),
            tokens,
            request_id,
        }],
    }
}

/// Every caller checks every key in turn, on the replicas in turn: `tokens`
/// a call. Answers (key, allowed, quota remaining, resets at, retry after).
async fn hammer(
    replicas: &[KeyLimitsClient<Channel>],
    tokens: f64,
    round: &str,
) -> Vec<(usize, bool, f64, i64, Option<Duration>)> {
    let callers = (0..CALLERS).map(|c| {
        let replicas = replicas.to_vec();
        let round = round.to_owned();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..CALLS_PER_CALLER {
                let key = (c + i) % KEYS;
                let mut client = replicas[(c + i) % replicas.len()].clone();
                let answer = client
                    .check(check(key, tokens, format!("{round}-{c}-{i}")))
                    .await
                    .expect("a check is answered")
                    .into_inner();
                let a = &answer.answers[0];
                seen.push((
                    key,
                    answer.allowed,
                    a.quota_remaining.expect("a quota answer"),
                    micros(a.quota_resets_at),
                    a.retry_after.map(|d| {
                        Duration::new(
                            u64::try_from(d.seconds).expect("not negative"),
                            u32::try_from(d.nanos).expect("not negative"),
                        )
                    }),
                ));
            }
            seen
        })
    });
    let mut all = Vec::new();
    for caller in callers {
        all.extend(caller.await.expect("caller"));
    }
    all
}

/// Checks one cycle's answers: each key allowed exactly its quota, every
/// remaining value answered once, the reset at `cycle_end`.
fn exactly_the_quota(
    seen: &[(usize, bool, f64, i64, Option<Duration>)],
    tokens: f64,
    cycle_end: Timestamp,
    now: Timestamp,
) {
    for key in 0..KEYS {
        let mine: Vec<_> = seen.iter().filter(|s| s.0 == key).collect();
        let allowed = mine.iter().filter(|s| s.1).count() as f64 * tokens;
        assert_eq!(allowed, QUOTA, "key {key} is allowed exactly its quota");
        let mut remaining: Vec<f64> = mine.iter().filter(|s| s.1).map(|s| s.2).collect();
        remaining.sort_by(f64::total_cmp);
        let expected: Vec<f64> = (0..(QUOTA / tokens) as usize)
            .map(|k| k as f64 * tokens)
            .collect();
        assert_eq!(remaining, expected, "key {key}: each remaining value once");
        for s in &mine {
            assert_eq!(s.3, cycle_end.unix_micros(), "resets at the cycle's end");
            if !s.1 {
                assert_eq!(s.2, 0.0, "a refused key has no quota left");
                assert_eq!(
                    s.4,
                    Some(cycle_end.duration_since(now)),
                    "retry when the cycle ends"
                );
            }
        }
    }
}

async fn per_key_quotas_are_exact_and_answer_what_is_left(backend: Backend, replicas: usize) {
    let clock = ManualClock::default();
    let now = utc("2026-02-14T09:30:00Z");
    clock.set_secs(now.unix_micros() as f64 / 1e6);
    let backing = Backing::new(backend).await;
    let mut servers = Vec::new();
    for _ in 0..replicas {
        let store = backing
            .open_with_clock(BucketSettings::default(), clock.as_clock())
            .await;
        servers.push(TestServer::start(store).await);
    }
    set_up(&servers[0], monthly(QUOTA))
        .await
        .expect("tier and tenant");
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(KeyLimitsClient::new(server.channel().await));
    }

    // February in Paris ends at March 1st, 00:00 (UTC+1).
    let february_end = utc("2026-02-28T23:00:00Z");
    let seen = hammer(&clients, 5.0, "feb").await;
    assert!(
        seen.len() as f64 * 5.0 > QUOTA * KEYS as f64 * 2.0,
        "demand past the quota"
    );
    exactly_the_quota(&seen, 5.0, february_end, now);

    // A retry (the same request id) is answered from its record, however
    // long after; the key's quota stays spent.
    let mut client = clients[0].clone();
    let replay = client
        .check(check(0, 5.0, "feb-0-0".into()))
        .await
        .expect("replayed")
        .into_inner();
    assert!(replay.answers[0].replayed);
    let after = client
        .check(check(0, 5.0, "feb-after".into()))
        .await
        .expect("checked")
        .into_inner();
    assert!(!after.allowed);
    assert_eq!(after.answers[0].quota_remaining, Some(0.0));

    // March: the whole quota again, up to March 31st's end (UTC+2 by
    // then: summer time starts on the 29th).
    let march = utc("2026-03-01T00:00:00Z");
    clock.set_secs(march.unix_micros() as f64 / 1e6);
    let seen = hammer(&clients, 20.0, "mar").await;
    exactly_the_quota(&seen, 20.0, utc("2026-03-31T22:00:00Z"), march);

    for server in servers {
        server.stop().await;
    }
    drop(backing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_postgres_replicas_allow_each_key_exactly_its_quota() {
    per_key_quotas_are_exact_and_answer_what_is_left(Backend::Postgres, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_store_allows_each_key_exactly_its_quota() {
    per_key_quotas_are_exact_and_answer_what_is_left(Backend::Embedded, 1).await;
}

async fn a_bad_quota_is_refused_naming_its_field(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut bad_zone = monthly(10.0);
    if let Some(q) = bad_zone.as_mut().and_then(|q| q.cycle.as_mut()) {
        q.time_zone = "Europe/Pariss".into();
    }
    for (quota, field) in [
        (monthly(0.0), "tier.buckets[0].quota.amount"),
        (monthly(f64::NAN), "tier.buckets[0].quota.amount"),
        (bad_zone, "tier.buckets[0].quota.cycle.time_zone"),
        (
            Some(v1::Quota {
                amount: 5.0,
                cycle: None,
            }),
            "tier.buckets[0].quota.cycle",
        ),
    ] {
        let e = set_up(&server, quota).await.expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    let tiers = server
        .admin()
        .await
        .list_tiers(v1::ListTiersRequest {})
        .await
        .expect("list")
        .into_inner()
        .tiers;
    assert!(tiers.is_empty(), "nothing was stored");
    server.stop().await;
}

/// A quota on a shared bucket ("10 emails a second, and 1 000 a day") is
/// its budget: grants stop at the amount in the cycle.
async fn a_shared_buckets_quota_stops_its_grants_at_the_amount(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "mail".into(),
                buckets: vec![v1::BucketDefinition {
                    bucket: "schedule-email".into(),
                    refill_rate: 1_000.0,
                    burst_limit: 1_000.0,
                    initial_tokens: None,
                    kind: v1::BucketKind::Shared.into(),
                    quota: Some(v1::Quota {
                        amount: 1_000.0,
                        cycle: Some(v1::BudgetCycle {
                            period: v1::BudgetPeriod::Daily.into(),
                            ..Default::default()
                        }),
                    }),
                    enforce: None,
                }],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await
        .expect("put tier");
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "mail".into(),
        })
        .await
        .expect("create tenant");
    let budget = admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: "schedule-email".into(),
        })
        .await
        .expect("the quota is the bucket's budget")
        .into_inner()
        .status
        .expect("status");
    let b = budget.budget.expect("budget");
    assert_eq!(b.amount, 1_000.0);
    assert_eq!(b.at_limit(), v1::BudgetAtLimit::Stop);
    let mut pods = server.pods().await;
    let mut granted = 0.0;
    for seq in 1..=5u64 {
        granted += pods
            .token_bucket(v1::TokenBucketRequest {
                tenant_id: "acme".into(),
                bucket: "schedule-email".into(),
                instance_id: 1,
                instance_lease: b"lease".to_vec(),
                seq,
                requested_tokens: 400.0,
                shares: 1.0,
                target_request_period: Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                }),
                ..v1::TokenBucketRequest::default()
            })
            .await
            .expect("a grant")
            .into_inner()
            .granted_tokens;
    }
    assert!(
        granted <= 1_000.0 + 1e-9,
        "granted {granted} past the day's quota"
    );
    assert!(granted >= 999.0, "granted {granted}: the quota is usable");
    server.stop().await;
}

for_each_store!(
    a_bad_quota_is_refused_naming_its_field,
    a_shared_buckets_quota_stops_its_grants_at_the_amount
);
