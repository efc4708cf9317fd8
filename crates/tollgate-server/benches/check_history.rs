//! What counting a check for the usage history costs the replica that
//! answers it: `Metrics::observe_check` (the Prometheus counter and the
//! rate window every check already pays) with and without the history's
//! tally (`CheckTally::record`: two slots' counts and busiest keys), in
//! the same run. Keys drawn from 10 (the busiest keys' counters hit), and
//! all different (every check evicts the least counted of 64: the worst
//! case). And what taking a round's rows costs (`take_rows`), for 1 000
//! buckets checked in the round.
//!
//! Run: `cargo bench -p tollgate-server --bench check_history`

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tollgate_core::history::HistoryConfig;
use tollgate_core::key_bucket::{
    CallAnswer, CheckCall, ItemAnswer, ItemResult, KeyId, RequestItem,
};
use tollgate_core::{BucketName, Limits, TenantId, Timestamp};
use tollgate_server::telemetry::Metrics;

fn call(bucket: usize, key: &str) -> CheckCall {
    CheckCall::new(vec![RequestItem {
        key: KeyId::new(
            TenantId::parse("tenant", &format!("tenant-{bucket}")).expect("valid id"),
            BucketName::parse("bucket", "per-user").expect("valid name"),
            key,
        ),
        tokens: 1.0,
        request_id: None,
    }])
    .expect("a valid call")
}

fn answer(at: Timestamp) -> CallAnswer {
    CallAnswer {
        allowed: true,
        items: vec![ItemResult {
            answer: ItemAnswer {
                allowed: true,
                shadow_refused: false,
                remaining: 5.0,
                retry_after: Some(std::time::Duration::ZERO),
                reset_after: Some(std::time::Duration::ZERO),
                quota: None,
            },
            limits: Limits {
                refill_rate: 1.0,
                burst_limit: 10.0,
            },
            replayed: false,
        }],
        at,
    }
}

fn observe(c: &mut Criterion) {
    let at = Timestamp::from_secs_f64(1_800_000_000.0);
    let answer = answer(at);
    let few: Vec<CheckCall> = (0..10).map(|k| call(0, &format!("user-{k}"))).collect();
    let many: Vec<CheckCall> = (0..100_000).map(|k| call(0, &format!("ip-{k}"))).collect();
    for counted in [false, true] {
        let metrics = Metrics::new().expect("metrics");
        if counted {
            metrics.count_checks_for_history(HistoryConfig::default().resolutions);
        }
        let label = if counted {
            "with the history's tally"
        } else {
            "without (baseline)"
        };
        for (keys, calls) in [("10 keys", &few), ("all keys different", &many)] {
            let mut i = 0;
            c.bench_function(&format!("observe a check, {keys}: {label}"), |b| {
                b.iter(|| {
                    i = (i + 1) % calls.len();
                    metrics.observe_check(black_box(&calls[i]), black_box(&answer));
                })
            });
        }
    }
    // A round's rows: 1 000 buckets each checked since the last round.
    let metrics = Metrics::new().expect("metrics");
    metrics.count_checks_for_history(HistoryConfig::default().resolutions);
    let buckets: Vec<CheckCall> = (0..1_000).map(|b| call(b, "user-1")).collect();
    c.bench_function("take a round's rows, 1 000 buckets checked", |b| {
        b.iter_batched(
            || {
                for call in &buckets {
                    metrics.observe_check(call, &answer);
                }
            },
            |()| black_box(metrics.take_check_rows()),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, observe);
criterion_main!(benches);
