//! Per-key buckets in the usage history over the wire, on both stores,
//! with the store's clock moved by the test.
//!
//! Two server replicas answer a generated stream of checks of one per-key
//! bucket, some of them sent again to the other replica as a retry
//! (answered from the first check's record); halfway, one replica stops
//! and a new one takes its place, as after a restart. Read back with
//! `GetHistory` from a server that answered none:
//! - every minute's checks, refusals and replicas are exactly what the
//!   callers were answered, retries not counted again;
//! - the hours add up to the same totals;
//! - the busiest key is the hot one, with its exact count, and no key is
//!   shown with more checks than it had.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::server::TestServer;
use support::{Backend, Backing, ManualClock, proto_time};
use tollgate_core::Timestamp;
use tollgate_core::history::HistoryConfig;
use tollgate_proto::v1::{self, key_limits_client::KeyLimitsClient};
use tollgate_server::store::{BucketSettings, Store};

const DAY: f64 = 86_400.0;
const CALLS: usize = 400;
const SEEDS: [u64; 2] = [11, 12];

/// A store handle for one more server: the same one on the embedded store
/// (one file, one process), a new connection pool on PostgreSQL (as
/// another process would have).
async fn handle(backing: &Backing, clock: &ManualClock, first: &Arc<dyn Store>) -> Arc<dyn Store> {
    match backing.backend() {
        Backend::Embedded => Arc::clone(first),
        Backend::Postgres => {
            backing
                .open_with_clock(BucketSettings::default(), clock.as_clock())
                .await
        }
    }
}

fn call(key: &str, request_id: &str) -> v1::CheckRequest {
    v1::CheckRequest {
        items: vec![v1::CheckItem {
            tenant_id: "acme".into(),
            bucket: "per-user".into(),
            key: key.into(),
            tokens: 1.0,
            request_id: request_id.into(),
        }],
    }
}

/// What the callers were answered in one minute.
#[derive(Debug, Default, PartialEq)]
struct Minute {
    checks: u64,
    refusals: u64,
    replicas: BTreeSet<usize>,
}

async fn run(backend: Backend, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = ManualClock::default();
    clock.set_secs(20_000.0 * DAY + rng.random_range(0.0..DAY));
    let backing = Backing::new(backend).await;
    let first = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let mut servers: Vec<Option<TestServer>> = vec![
        Some(TestServer::start(Arc::clone(&first)).await),
        Some(TestServer::start(handle(&backing, &clock, &first).await).await),
    ];
    let mut admin = servers[0].as_ref().expect("a server").admin().await;
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "pro".into(),
                buckets: vec![v1::BucketDefinition {
                    bucket: "per-user".into(),
                    // Under what the hot key is asked (a third of a
                    // check a second): some of its checks are refused.
                    refill_rate: 0.2,
                    burst_limit: 3.0,
                    kind: v1::BucketKind::PerKey as i32,
                    ..v1::BucketDefinition::default()
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
            tier: "pro".into(),
        })
        .await
        .expect("create tenant");
    let mut clients = Vec::new();
    for server in servers.iter().flatten() {
        clients.push(KeyLimitsClient::new(server.channel().await));
    }
    // Replicas 0 and 1 serve; halfway, 2 takes 0's place.
    let mut live = vec![0, 1];
    let minute = HistoryConfig::default().resolutions[0];
    let mut minutes: BTreeMap<Timestamp, Minute> = BTreeMap::new();
    let mut truth: HashMap<String, u64> = HashMap::new();
    let since = clock.now();
    for i in 0..CALLS {
        if i == CALLS / 2 {
            let stopped = servers[0].take().expect("replica 0");
            let _ = stopped.stop_serving().await;
            let replacement = TestServer::start(handle(&backing, &clock, &first).await).await;
            clients.push(KeyLimitsClient::new(replacement.channel().await));
            servers.push(Some(replacement));
            live = vec![2, 1];
        }
        clock.advance(std::time::Duration::from_millis(rng.random_range(0..3_000)));
        let key = if rng.random_bool(0.5) {
            "hot".to_owned()
        } else {
            format!("user-{:02}", rng.random_range(0..20))
        };
        let request_id = format!("seed-{seed}-call-{i}");
        let replica = live[rng.random_range(0..live.len())];
        let answer = clients[replica]
            .check(call(&key, &request_id))
            .await
            .expect("check answered")
            .into_inner();
        let counted = minutes.entry(minute.slot(clock.now())).or_default();
        counted.checks += 1;
        counted.refusals += u64::from(!answer.allowed);
        counted.replicas.insert(replica);
        *truth.entry(key.clone()).or_default() += 1;
        // A retry to the other replica: answered from the record, and not
        // counted again.
        if rng.random_range(0..6) == 0 {
            let other = live[(live.iter().position(|&r| r == replica).unwrap_or(0) + 1) % 2];
            let again = clients[other]
                .check(call(&key, &request_id))
                .await
                .expect("retry answered")
                .into_inner();
            assert!(
                again.answers[0].replayed,
                "seed {seed}: a retry is a replay"
            );
        }
    }
    // Stopping writes each replica's last counts.
    for server in servers.into_iter().flatten() {
        let _ = server.stop_serving().await;
    }

    let reader = TestServer::start(handle(&backing, &clock, &first).await).await;
    let mut admin = reader.admin().await;
    let read = |step_secs: i64| v1::GetHistoryRequest {
        tenant_id: "acme".into(),
        bucket: "per-user".into(),
        since: Some(proto_time(since)),
        until: Some(proto_time(clock.now())),
        step: Some(prost_types::Duration {
            seconds: step_secs,
            nanos: 0,
        }),
    };
    let history = admin
        .get_history(read(60))
        .await
        .expect("history")
        .into_inner();
    assert!(
        history.points.is_empty(),
        "a per-key bucket has no usage points"
    );
    let seen: BTreeMap<Timestamp, Minute> = history
        .check_points
        .iter()
        .map(|p| {
            let from = p.from.expect("from");
            let from = Timestamp::from_unix_micros(
                from.seconds * 1_000_000 + i64::from(from.nanos) / 1_000,
            );
            (from, p)
        })
        .map(|(from, p)| {
            assert_eq!(
                p.checks_per_second,
                p.checks as f64 / 60.0,
                "seed {seed}: a whole minute's rate"
            );
            (
                from,
                Minute {
                    checks: p.checks,
                    refusals: p.refusals,
                    // Only how many: the replicas' names are the servers'.
                    replicas: (0..p.replicas as usize).collect(),
                },
            )
        })
        .collect();
    let expected: BTreeMap<Timestamp, Minute> = minutes
        .into_iter()
        .map(|(slot, m)| {
            (
                slot,
                Minute {
                    replicas: (0..m.replicas.len()).collect(),
                    ..m
                },
            )
        })
        .collect();
    assert_eq!(seen, expected, "seed {seed}: every minute, exactly");
    let total: u64 = expected.values().map(|m| m.checks).sum();
    assert_eq!(total, CALLS as u64);
    assert!(
        expected.values().any(|m| m.refusals > 0),
        "seed {seed}: some checks were refused"
    );

    let hours = admin
        .get_history(read(3_600))
        .await
        .expect("hourly history")
        .into_inner();
    assert_eq!(support::secs(hours.step), 3_600.0);
    let sum = |points: &[v1::CheckPoint]| -> (u64, u64) {
        points
            .iter()
            .fold((0, 0), |(c, r), p| (c + p.checks, r + p.refusals))
    };
    assert_eq!(
        sum(&hours.check_points),
        sum(&history.check_points),
        "seed {seed}: the hours add up to the minutes"
    );

    let busiest = &history.busiest_keys;
    assert_eq!(busiest[0].key, "hot", "seed {seed}: {busiest:?}");
    assert_eq!(busiest[0].checks_at_least, truth["hot"], "seed {seed}");
    for key in busiest {
        assert!(
            key.checks_at_least <= truth[&key.key],
            "seed {seed}: {key:?} had {}",
            truth[&key.key]
        );
    }
    println!(
        "seed {seed}: {total} checks in {} minutes, {} refused; hot key {} of {}",
        expected.len(),
        expected.values().map(|m| m.refusals).sum::<u64>(),
        busiest[0].checks_at_least,
        truth["hot"]
    );
    reader.stop().await;
}

async fn checks_are_counted_once_a_slot_over_replicas_and_restarts(backend: Backend) {
    for seed in SEEDS {
        run(backend, seed).await;
    }
}

for_each_store!(checks_are_counted_once_a_slot_over_replicas_and_restarts);
