//! Usage history on both stores, with the store's clock moved by the
//! test: two replicas sampling the same buckets through a day of
//! generated requests leave one row per slot, and the usage the rows give
//! sums to the change of the exact totals; rows are pruned by age per
//! resolution; a deleted tenant's history stays.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Backend, Backing, ManualClock, tenant_id};
use tollgate_core::history::{HistoryConfig, Resolution, total_usage, usage};
use tollgate_core::{
    BucketKey, Consumption, Limits, LimitsMask, LimitsUpdate, Timestamp, TokenBucketRequest,
};
use tollgate_server::store::{BucketSettings, HistoryRows, Store};

const DAY: f64 = 86_400.0;

/// Two handles on one fresh store of `backend` (two replicas on
/// PostgreSQL; one store shared by two callers when embedded), their
/// time read from `clock`.
async fn replicas(backend: Backend, clock: &ManualClock) -> (Backing, [Arc<dyn Store>; 2]) {
    let backing = Backing::new(backend).await;
    let settings = BucketSettings {
        history: HistoryConfig {
            sample_interval: Duration::from_secs(10),
            resolutions: vec![
                Resolution {
                    step: Duration::from_secs(60),
                    retention: Duration::from_secs(14 * 86_400),
                },
                Resolution {
                    step: Duration::from_secs(3_600),
                    retention: Duration::from_secs(396 * 86_400),
                },
            ],
        },
        ..BucketSettings::default()
    };
    let first = backing
        .open_with_clock(settings.clone(), clock.as_clock())
        .await;
    let second = match backend {
        Backend::Embedded => Arc::clone(&first),
        Backend::Postgres => backing.open_with_clock(settings, clock.as_clock()).await,
    };
    (backing, [first, second])
}

fn key(tenant: &str) -> BucketKey {
    BucketKey::request_units(tenant_id(tenant))
}

/// A pod's request reporting `request_units` used.
fn report(instance_id: u32, seq: u64, request_units: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id,
        lease: b"lease".to_vec(),
        seq,
        requested_tokens: request_units,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::from_request_units(request_units),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

async fn configure(store: &dyn Store, key: &BucketKey) {
    store
        .update_limits(
            key,
            &LimitsUpdate {
                available_tokens: 1e9,
                limits: Limits {
                    refill_rate: 1e6,
                    burst_limit: 1e9,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: LimitsMask::ALL,
            },
        )
        .await
        .expect("configure");
}

/// Samples every bucket, page by page of `page` buckets.
async fn sample_all(store: &dyn Store, page: usize) -> u64 {
    let mut after = None;
    let mut written = 0;
    loop {
        let p = store
            .sample_history(after.as_ref(), page)
            .await
            .expect("sample");
        written += p.rows_written;
        match p.last {
            Some(last) => after = Some(last),
            None => return written,
        }
    }
}

/// Slots strictly increase: no slot twice.
fn assert_one_row_per_slot(rows: &HistoryRows) {
    let slots: Vec<_> = rows
        .samples
        .iter()
        .map(|s| rows.resolution.slot(s.at))
        .collect();
    assert!(
        slots.windows(2).all(|w| w[0] < w[1]),
        "slots not strictly increasing: {slots:?}"
    );
}

/// A small deterministic generator (the test's own, so every run draws
/// the same day).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn two_replicas_sampling_a_day_agree_with_the_totals(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(1_000.0 * DAY);
    let start = clock.now();
    let (_backing, [a, b]) = replicas(backend, &clock).await;
    let tenants = ["alpha", "beta", "gamma", "delta"];
    for t in tenants {
        configure(a.as_ref(), &key(t)).await;
    }
    let mut draw = Draw(7);
    let mut seq = 0;
    let mut t = 0.0;
    // Each tenant's consumption after each of its reports, and when.
    let mut timelines: Vec<Vec<(Timestamp, Consumption)>> = vec![Vec::new(); tenants.len()];
    let mut sampled_at = Vec::new();
    while t < DAY {
        // Samples 20 to 100 s apart (the server's are 10 s: fewer here
        // for time), with activity in bursts and idle hours between.
        t += 20.0 + draw.below(81) as f64;
        clock.set_secs(1_000.0 * DAY + t);
        let active = (t / 3_600.0).floor() as u64 % 3 != 1;
        if active && draw.below(3) == 0 {
            seq += 1;
            let i = draw.below(tenants.len() as u64) as usize;
            let units = draw.below(1_000_000) as f64 / 1_000.0;
            a.token_bucket(&key(tenants[i]), &report(1, seq, units))
                .await
                .expect("request");
            let totals = a
                .get_bucket(&key(tenants[i]))
                .await
                .expect("get")
                .head
                .totals;
            timelines[i].push((clock.now(), totals.consumption));
        }
        sampled_at.push(clock.now());
        // Both replicas sample at once, in pages of 3 buckets.
        futures_util::future::join(sample_all(a.as_ref(), 3), sample_all(b.as_ref(), 3)).await;
    }
    let end = clock.now();
    for (i, tenant) in tenants.into_iter().enumerate() {
        let totals = a.get_bucket(&key(tenant)).await.expect("get").head.totals;
        // The consumption as of `at`.
        let as_of = |at: Timestamp| {
            timelines[i]
                .iter()
                .take_while(|(when, _)| *when <= at)
                .last()
                .map_or(Consumption::default(), |(_, c)| *c)
        };
        for step in [60, 3_600] {
            for store in [&a, &b] {
                let rows = store
                    .history(&key(tenant), start, end, Duration::from_secs(step))
                    .await
                    .expect("history");
                assert_eq!(rows.resolution.step, Duration::from_secs(step));
                // The bucket was created at the start: its baseline is the
                // zero totals it had before.
                assert!(rows.baseline);
                assert_eq!(rows.samples[0].totals, Default::default());
                assert_one_row_per_slot(&rows);
                let r = rows.resolution;
                // Every row holds the totals as of when it says it was
                // sampled, and every sample that saw a change left a row
                // in its slot.
                for row in &rows.samples {
                    assert_eq!(
                        row.totals.consumption,
                        as_of(row.at),
                        "{tenant}: row at {:?}",
                        row.at
                    );
                }
                for &at in &sampled_at {
                    let row = rows
                        .samples
                        .iter()
                        .take_while(|row| r.slot(row.at) <= r.slot(at))
                        .last();
                    if let Some(row) = row.filter(|row| r.slot(row.at) < r.slot(at)) {
                        assert_eq!(
                            row.totals.consumption,
                            as_of(at),
                            "{tenant}, step {step}: a change sampled at {at:?} has no row"
                        );
                    }
                }
                let last = rows.samples.last().expect("rows");
                assert_eq!(last.totals, totals, "{tenant}: the last row is the totals");
                // What was used falls within two steps of when it was
                // sampled, however long the bucket was idle before.
                for span in usage(&rows.samples) {
                    if span.consumption != Consumption::default() {
                        assert!(
                            span.seconds() <= 2.0 * step as f64,
                            "{tenant}, step {step}: use spread over {} s",
                            span.seconds()
                        );
                    }
                }
                let first = &rows.samples[0].totals;
                let sum = total_usage(&usage(&rows.samples));
                assert_eq!(
                    sum.consumption,
                    totals.consumption.saturating_sub(&first.consumption),
                    "{tenant}, step {step}: usage sums to the change of the totals"
                );
                assert!(sum.consumption.request_unit_micros > 0);
            }
        }
    }
}

async fn rows_are_pruned_by_age_per_resolution(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(2_000.0 * DAY);
    let (_backing, [store, _]) = replicas(backend, &clock).await;
    let k = key("pruned");
    configure(store.as_ref(), &k).await;
    // Two hours of use, one report and one sample a minute.
    let start = clock.now();
    for minute in 0..120u64 {
        clock.set_secs(2_000.0 * DAY + minute as f64 * 60.0);
        store
            .token_bucket(&k, &report(1, minute + 1, 1.0))
            .await
            .expect("request");
        sample_all(store.as_ref(), 100).await;
    }
    let minutes = store
        .history(&k, start, clock.now(), Duration::from_secs(60))
        .await
        .expect("history");
    // A row a minute, after the zero totals before the bucket existed.
    assert_eq!(minutes.samples.len(), 121);
    assert!(minutes.baseline);
    assert!(
        (total_usage(&usage(&minutes.samples))
            .consumption
            .request_units()
            - 120.0)
            .abs()
            < 1e-9
    );
    // 15 days on: the minutes are past their 14 days, the hours are not.
    clock.set_secs(2_015.0 * DAY);
    assert_eq!(store.prune_history(1_000).await.expect("prune"), 121);
    let hours = store
        .history(&k, start, clock.now(), Duration::from_secs(60))
        .await
        .expect("history");
    assert_eq!(
        hours.resolution.step,
        Duration::from_secs(3_600),
        "minutes asked of a span only hours keep"
    );
    // Zero before the bucket, then each hour's last sample: 60 and 120
    // units.
    assert_eq!(hours.samples.len(), 3);
    let sum = total_usage(&usage(&hours.samples));
    assert!((sum.consumption.request_units() - 120.0).abs() < 1e-9);
    // A batch limit is kept to: 400 days on, one row at a time.
    clock.set_secs(2_400.0 * DAY);
    assert_eq!(store.prune_history(1).await.expect("prune"), 1);
    assert_eq!(store.prune_history(10).await.expect("prune"), 2);
    assert_eq!(store.prune_history(10).await.expect("prune"), 0);
}

async fn a_deleted_tenant_keeps_its_history(backend: Backend) {
    let clock = ManualClock::default();
    clock.set_secs(3_000.0 * DAY);
    let (_backing, [store, _]) = replicas(backend, &clock).await;
    let k = key("gone");
    let start = clock.now();
    configure(store.as_ref(), &k).await;
    store
        .token_bucket(&k, &report(1, 1, 5.0))
        .await
        .expect("request");
    sample_all(store.as_ref(), 100).await;
    clock.set_secs(3_000.0 * DAY + 90.0);
    store
        .delete_tenant(&tenant_id("gone"))
        .await
        .expect("delete");
    sample_all(store.as_ref(), 100).await;
    let rows = store
        .history(&k, start, clock.now(), Duration::from_secs(60))
        .await
        .expect("history");
    let sum = total_usage(&usage(&rows.samples));
    assert!((sum.consumption.request_units() - 5.0).abs() < 1e-9);
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn embedded_store() {
                    super::$name(super::Backend::Embedded).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres_store() {
                    super::$name(super::Backend::Postgres).await;
                }
            }
        )*
    };
}

on_both_stores!(
    two_replicas_sampling_a_day_agree_with_the_totals,
    rows_are_pruned_by_age_per_resolution,
    a_deleted_tenant_keeps_its_history,
);
