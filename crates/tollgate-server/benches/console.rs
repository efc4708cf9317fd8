//! What a tenant's console page costs to read (`console::tenant_page`,
//! what `/console/api/tenant` answers and the page asks again every 30 s):
//! one tenant with BUCKETS shared buckets (20 by default), each used every
//! minute for DAYS days (30), its history sampled every minute, on the
//! embedded store in memory; the page read for each range, 1 h to 30 d.
//! Two of its buckets are throttled at the end, so the page also reads
//! their day of minutes for since when.
//!
//! Run: `cargo bench -p tollgate-server --bench console`

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate_core::tier::{BucketDefinition, BucketKind, TenantChange, Tier};
use tollgate_core::{BucketKey, BucketName, Limits, TenantId, TierName, Timestamp};
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
use tollgate_server::telemetry::console::{Range, tenant_page};
use tollgate_server::telemetry::metrics::Metrics;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A store whose tenant `acme` used each of its `buckets` buckets every
/// minute for `days` days, ending now by the store's clock.
async fn recorded(buckets: usize, days: usize) -> EmbeddedStore {
    let minutes = days * 1_440;
    let start = Timestamp::from_unix_micros(1_800_000_000_000_000);
    let clock = Arc::new(AtomicI64::new(start.unix_micros()));
    let reading = Arc::clone(&clock);
    let store = EmbeddedStore::in_memory_with_clock(
        BucketSettings::default(),
        Arc::new(move || Timestamp::from_unix_micros(reading.load(Ordering::SeqCst))),
    )
    .expect("store");
    let names: Vec<String> = (0..buckets).map(|i| format!("action-{i:02}")).collect();
    let definition = BucketDefinition {
        limits: Limits {
            refill_rate: 100.0,
            burst_limit: 1_000.0,
        },
        initial_tokens: None,
        kind: BucketKind::Shared,
        quota: None,
        enforce: true,
    };
    let gold = TierName::parse("tier", "gold").expect("name");
    let tier = Tier::from_definitions(
        "tier",
        names.iter().map(|n| (n.as_str(), definition.clone())),
        start,
    )
    .expect("tier");
    store.put_tier(&gold, &tier).await.expect("put tier");
    let acme = TenantId::parse("tenant", "acme").expect("id");
    store
        .change_tenant(&acme, &TenantChange::Create { tier: gold })
        .await
        .expect("create");
    let keys: Vec<BucketKey> = names
        .iter()
        .map(|n| BucketKey::new(acme.clone(), BucketName::parse("bucket", n).expect("name")))
        .collect();
    let began = Instant::now();
    for minute in 0..=minutes {
        let at = start.saturating_add(Duration::from_secs(60 * minute as u64));
        clock.store(at.unix_micros(), Ordering::SeqCst);
        if minute > 0 {
            for (i, key) in keys.iter().enumerate() {
                // Two buckets ask for more than a minute's refill at the
                // end: throttled.
                let used = if i < 2 && minute + 60 > minutes {
                    12_000.0
                } else {
                    3_000.0
                };
                let request = support::request(minute as u64, used);
                store.token_bucket(key, &request).await.expect("request");
            }
        }
        support::sample_all(&store).await;
        if minute % 1_440 == 0 {
            eprintln!(
                "recorded {} of {days} days of {buckets} buckets ({:.0} s)",
                minute / 1_440,
                began.elapsed().as_secs_f64()
            );
        }
    }
    store
}

fn bench(c: &mut Criterion) {
    let buckets = env("BUCKETS", 20);
    let days = env("DAYS", 30);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store = runtime.block_on(recorded(buckets, days));
    let metrics = Metrics::new().expect("metrics");
    let acme = TenantId::parse("tenant", "acme").expect("id");
    let mut group = c.benchmark_group(format!("tenant page, {buckets} buckets, {days} days"));
    group.sample_size(10);
    for range in ["1h", "24h", "7d", "30d"] {
        let range = Range::parse("range", range).expect("range");
        group.bench_function(range.name(), |b| {
            b.iter(|| {
                runtime
                    .block_on(tenant_page(&store, &metrics, &acme, range))
                    .expect("read")
                    .expect("a page")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
