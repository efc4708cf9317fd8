//! Per-key checks are exact across replicas: three servers on one
//! PostgreSQL database, 32 callers hammering 10 keys over the wire, each
//! call sent to a random replica and sometimes sent twice (a retry after a
//! lost answer, to another replica).
//!
//! Checked afterwards, for every key:
//! - over every window, the checks admitted are at most burst + rate × the
//!   window. A check's store time lies between its caller's send and
//!   receive times (one machine, one clock; the store counts in whole
//!   microseconds, hence 1 µs of slack), so the checks sent at or after X
//!   and answered by Y took their tokens within [X, Y];
//! - the store's record of every check (read back by replaying its request
//!   id, which takes nothing) is the answer its caller got, and a
//!   duplicate got the same answer: nothing counted twice, nothing lost.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use support::server::TestServer;
use support::{Backend, Backing};
use tollgate_proto::v1::{self, key_limits_client::KeyLimitsClient};
use tollgate_server::store::BucketSettings;
use tonic::transport::Channel;

const REPLICAS: usize = 3;
const CALLERS: usize = 32;
const KEYS: usize = 10;
const RUN: Duration = Duration::from_secs(20);
/// Low enough that 32 callers outrun it on a slow machine too: at 5 per
/// second a key admits at most 110 checks in the run, and even a loaded
/// machine answers thousands.
const REFILL_RATE: f64 = 5.0;
const BURST_LIMIT: f64 = 10.0;

/// What one caller saw of one check.
#[derive(Clone, Debug)]
struct Seen {
    key: usize,
    request_id: String,
    sent: f64,
    received: f64,
    allowed: bool,
}

fn unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

fn item(key: usize, request_id: &str) -> v1::CheckItem {
    v1::CheckItem {
        tenant_id: "acme".into(),
        bucket: "per-user".into(),
        key: format!("user-{key}"),
        tokens: 1.0,
        request_id: request_id.into(),
    }
}

async fn caller(n: usize, replicas: Vec<KeyLimitsClient<Channel>>, until: f64) -> Vec<Seen> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
    let mut seen = Vec::new();
    let mut i = 0;
    while unix_secs() < until {
        let key = rng.random_range(0..KEYS);
        let request_id = format!("caller-{n}-{i}");
        i += 1;
        let mut client = replicas[rng.random_range(0..REPLICAS)].clone();
        let sent = unix_secs();
        let answer = client
            .check(v1::CheckRequest {
                items: vec![item(key, &request_id)],
            })
            .await
            .expect("check answered")
            .into_inner();
        let received = unix_secs();
        assert!(
            !answer.answers[0].replayed,
            "a first attempt is not a replay"
        );
        // One call in eight is sent again to another replica, as after a
        // lost answer: it must get the first answer and take nothing.
        if rng.random_range(0..8) == 0 {
            let mut other = replicas[rng.random_range(0..REPLICAS)].clone();
            let again = other
                .check(v1::CheckRequest {
                    items: vec![item(key, &request_id)],
                })
                .await
                .expect("retry answered")
                .into_inner();
            assert!(again.answers[0].replayed);
            assert_eq!(again.allowed, answer.allowed, "{request_id}");
        }
        seen.push(Seen {
            key,
            request_id,
            sent,
            received,
            allowed: answer.allowed,
        });
    }
    seen
}

/// The most checks of one token the key may have admitted between the
/// send times and receive times given, by every window.
fn assert_within_the_bucket(key: usize, admitted: &[Seen]) {
    const SLACK: f64 = 1e-6;
    let mut by_send: Vec<&Seen> = admitted.iter().collect();
    by_send.sort_by(|a, b| a.sent.total_cmp(&b.sent));
    for (i, first) in by_send.iter().enumerate() {
        let from = first.sent - SLACK;
        let mut received: Vec<f64> = by_send[i..].iter().map(|s| s.received).collect();
        received.sort_by(f64::total_cmp);
        for (m, &until) in received.iter().enumerate() {
            let count = (m + 1) as f64;
            let bound = BURST_LIMIT + REFILL_RATE * (until + SLACK - from);
            assert!(
                count <= bound * (1.0 + 1e-12),
                "key {key}: {count} admitted within {:.6} s from {from:.6}: more than burst + rate × T = {bound}",
                until - from
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_admit_exactly_what_one_bucket_per_key_admits() {
    let backing = Backing::new(Backend::Postgres).await;
    let mut servers = Vec::new();
    for _ in 0..REPLICAS {
        servers.push(TestServer::start(backing.open(BucketSettings::default()).await).await);
    }
    let mut admin = servers[0].admin().await;
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "pro".into(),
                buckets: vec![v1::BucketDefinition {
                    quota: None,
                    bucket: "per-user".into(),
                    refill_rate: REFILL_RATE,
                    burst_limit: BURST_LIMIT,
                    initial_tokens: None,
                    kind: v1::BucketKind::PerKey as i32,
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
            tier: "pro".into(),
        })
        .await
        .expect("create tenant");
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(KeyLimitsClient::new(server.channel().await));
    }
    let started = unix_secs();
    let until = started + RUN.as_secs_f64();
    let callers: Vec<_> = (0..CALLERS)
        .map(|n| tokio::spawn(caller(n, clients.clone(), until)))
        .collect();
    let mut seen = Vec::new();
    for c in callers {
        seen.extend(c.await.expect("caller ran"));
    }
    let ended = seen.iter().map(|s| s.received).fold(started, f64::max);

    let mut per_key: BTreeMap<usize, Vec<Seen>> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.allowed) {
        per_key.entry(s.key).or_default().push(s.clone());
    }
    let admitted: usize = per_key.values().map(Vec::len).sum();
    eprintln!(
        "{} checks in {:.1} s, {admitted} admitted, {} keys",
        seen.len(),
        ended - started,
        per_key.len()
    );
    assert!(
        seen.len() > admitted && admitted > 0,
        "the keys were hammered past their limits: {} checks, {admitted} admitted",
        seen.len()
    );
    for (key, checks) in &per_key {
        assert_within_the_bucket(*key, checks);
    }

    // The store's records are the callers' answers: replaying every
    // request id (which takes nothing) gets exactly what its caller saw.
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for chunk in seen.chunks(64) {
        let mut client = clients[rng.random_range(0..REPLICAS)].clone();
        let answer = client
            .check(v1::CheckRequest {
                items: chunk.iter().map(|s| item(s.key, &s.request_id)).collect(),
            })
            .await
            .expect("replay answered")
            .into_inner();
        for (s, a) in chunk.iter().zip(&answer.answers) {
            assert!(a.replayed, "{} was recorded", s.request_id);
            assert_eq!(a.allowed, s.allowed, "{}: the store's record", s.request_id);
        }
    }
    let stats: Vec<_> = servers.iter().map(|s| s.store.stats()).collect();
    assert!(stats.iter().all(|s| s.failures == 0), "{stats:?}");
    for server in servers {
        server.stop().await;
    }
}
