//! What an impact preview costs: a tier's change previewed over every
//! tenant on it (`preview::tier`: list the buckets, read the tenants'
//! records, read each bucket's history, replay it twice), on the embedded
//! store in memory, with TENANTS tenants (10 000 by default) each holding
//! MINUTES minutes (60) of recorded usage at 50 to 150 tokens/s against a
//! proposed 100/s, so two in five replay throttled. Beside it, in the same
//! run, the replay alone of one bucket's day of minute spans, covered by
//! the limits (a step a span) and throttled all day (a tick a second).
//!
//! Run: `cargo bench -p tollgate-server --bench preview`
//! (`TENANTS=1000 MINUTES=1440` for a day of 1 000 tenants).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate_core::history::Usage;
use tollgate_core::impact::{self, Plan};
use tollgate_core::tier::{BucketDefinition, BucketKind, TenantChange, Tier};
use tollgate_core::{BucketKey, BucketName, Limits, TenantId, TierName, Timestamp};
use tollgate_server::preview::{self, Span};
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn api(refill_rate: f64) -> BucketDefinition {
    BucketDefinition {
        limits: Limits {
            refill_rate,
            burst_limit: 10.0 * refill_rate,
        },
        initial_tokens: None,
        kind: BucketKind::Shared,
        quota: None,
        enforce: true,
    }
}

/// A store whose `tenants` tenants on tier gold used their `api` bucket
/// every minute for `minutes`; the span to preview.
async fn recorded(tenants: usize, minutes: usize) -> (EmbeddedStore, Span) {
    let start = Timestamp::from_unix_micros(1_800_000_000_000_000);
    let clock = Arc::new(AtomicI64::new(start.unix_micros()));
    let reading = Arc::clone(&clock);
    let store = EmbeddedStore::in_memory_with_clock(
        BucketSettings::default(),
        Arc::new(move || Timestamp::from_unix_micros(reading.load(Ordering::SeqCst))),
    )
    .expect("store");
    let gold = TierName::parse("tier", "gold").expect("name");
    let tier = Tier::from_definitions("tier", [("api", api(1_000.0))], start).expect("tier");
    store.put_tier(&gold, &tier).await.expect("put tier");
    let ids: Vec<TenantId> = (0..tenants)
        .map(|i| TenantId::parse("tenant", &format!("tenant-{i:05}")).expect("id"))
        .collect();
    for id in &ids {
        store
            .change_tenant(id, &TenantChange::Create { tier: gold.clone() })
            .await
            .expect("create");
    }
    let bucket = BucketName::parse("bucket", "api").expect("name");
    let began = Instant::now();
    for minute in 0..=minutes {
        let at = start.saturating_add(Duration::from_secs(60 * minute as u64));
        clock.store(at.unix_micros(), Ordering::SeqCst);
        if minute > 0 {
            for (i, id) in ids.iter().enumerate() {
                let used = (50.0 + 25.0 * (i % 5) as f64) * 60.0;
                let request = support::request(minute as u64, used);
                store
                    .token_bucket(&BucketKey::new(id.clone(), bucket.clone()), &request)
                    .await
                    .expect("request");
            }
        }
        support::sample_all(&store).await;
        if minute % 10 == 0 {
            eprintln!(
                "recorded {minute} of {minutes} minutes for {tenants} tenants ({:.0} s)",
                began.elapsed().as_secs_f64()
            );
        }
    }
    let until = start.saturating_add(Duration::from_secs(60 * minutes as u64));
    let span = Span {
        since: start,
        until,
        max_wait: preview::DEFAULT_MAX_WAIT,
    };
    (store, span)
}

/// A day of minute spans at `rate` tokens a second.
fn day(rate: f64) -> Vec<Usage> {
    (0..1_440)
        .map(|m| Usage {
            from: Timestamp::from_unix_micros(m * 60_000_000),
            to: Timestamp::from_unix_micros((m + 1) * 60_000_000),
            granted_tokens: rate * 60.0,
            ..Usage::default()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let limits = Limits {
        refill_rate: 100.0,
        burst_limit: 1_000.0,
    };
    let wait = preview::DEFAULT_MAX_WAIT;
    let covered = day(50.0);
    let throttled = day(150.0);
    c.bench_function("replay a day of minute spans, covered", |b| {
        b.iter(|| impact::replay(black_box(&covered), &Plan::limits(limits), wait))
    });
    c.bench_function("replay a day of minute spans, throttled all day", |b| {
        b.iter(|| impact::replay(black_box(&throttled), &Plan::limits(limits), wait))
    });

    let tenants = env("TENANTS", 10_000);
    let minutes = env("MINUTES", 60);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (store, span) = runtime.block_on(recorded(tenants, minutes));
    let gold = TierName::parse("tier", "gold").expect("name");
    let proposed = Tier::from_definitions("tier", [("api", api(100.0))], span.since).expect("tier");
    let mut group = c.benchmark_group("preview a tier");
    group.sample_size(10);
    group.bench_function(
        format!("{tenants} tenants, {minutes} minutes of history each"),
        |b| {
            b.iter(|| {
                let previews = runtime
                    .block_on(preview::tier(&store, &gold, &proposed, span))
                    .expect("preview");
                assert_eq!(previews.len(), tenants);
                previews
            })
        },
    );
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
