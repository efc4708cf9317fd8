//! The cost of admitting work when tokens are available, next to
//! `governor`'s direct rate limiter in the same run: one thread, and two
//! threads contending for the same limiter.
//!
//! Our controller runs against an in-process server (in-memory store) whose
//! tenant has far more tokens than the benchmark uses, so every admission
//! finds tokens — the pod's hot path.
//!
//! Hot-partition admission is measured in the same run: a batch's
//! `on_request` with and without a partition named, a partition of a table
//! without limits, and cold partitions (each admitted once in a million,
//! so every admission claims a counter slot, forgetting the coldest) of a
//! limited table. The counter table's memory after 10^6 distinct
//! partitions is printed once.
//!
//! Run: `cargo bench -p tollgate-client --bench admit`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate_client::{Controller, LocalBucketConfig, Op, Options, Partition, Request};
use tollgate_core::partition::{CounterKey, CounterTable, TableLimits};
use tollgate_core::tier::TenantChange;
use tollgate_server::store::{BucketSettings, DefaultLimits, EmbeddedStore, Store};

/// Starts a server whose unconfigured tenants get an effectively unlimited
/// bucket (and whose tenant "bench" limits writes to each partition of
/// table "orders" to 10^6 per second), and a controller on it that has its
/// first grant and knows the table limits.
fn controller(runtime: &tokio::runtime::Runtime) -> Controller {
    runtime.block_on(async {
        let settings = BucketSettings {
            unconfigured_tenants: tollgate_server::store::UnconfiguredTenants::UseDefaults(
                DefaultLimits {
                    limits: tollgate_core::Limits {
                        refill_rate: 1e12,
                        burst_limit: 1e14,
                    },
                    initial_tokens: 1e14,
                },
            ),
            ..BucketSettings::default()
        };
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::in_memory(settings).expect("in-memory store"));
        let tenant = tollgate_core::TenantId::parse("tenant", "bench").expect("name");
        store
            .change_tenant(
                &tenant,
                &TenantChange::SetTableLimits {
                    table: tollgate_core::TableName::parse("table", "orders").expect("name"),
                    limits: TableLimits {
                        max_reads_per_second: None,
                        max_writes_per_second: Some(1e6),
                    },
                },
            )
            .await
            .expect("table limits");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(tollgate_server::run(
            listener,
            store,
            std::future::pending(),
        ));
        let options = Options {
            bucket: LocalBucketConfig {
                // Ask for a lot at a time: this measures admission, not refill.
                buffer_tokens: 1e9,
                ..LocalBucketConfig::default()
            },
            ..Options::default()
        };
        let controller = Controller::connect(&url, "bench", 1, options).expect("controller");
        // Wait for the first grant, and the table limits.
        let limiter = controller.partitions().expect("partition limiter");
        while controller.status().tokens < 1e8 || limiter.limits().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        controller
    })
}

/// Runs `admit` `iters` times on each of `threads` threads at once; the
/// time per iteration is the wall time of all threads.
fn contended(threads: usize, iters: u64, admit: impl Fn() + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..iters {
                    admit();
                }
            });
        }
    });
    start.elapsed()
}

fn admit(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let ours = controller(&runtime);
    let quota = Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX);
    let governor = RateLimiter::direct(quota);

    let mut group = c.benchmark_group("admit/1-thread");
    group.bench_function("tollgate try_acquire", |b| {
        b.iter(|| black_box(ours.try_acquire(black_box(1.0)).expect("valid")))
    });
    group.bench_function("tollgate acquire (async, ready)", |b| {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        b.iter(|| {
            let mut fut = std::pin::pin!(ours.acquire(black_box(1.0)));
            black_box(fut.as_mut().poll(&mut cx))
        })
    });
    group.bench_function("governor check", |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    group.finish();

    let mut group = c.benchmark_group("admit/partitions");
    let write = Request::write(1, 100);
    group.bench_function("on_request write (async, ready), no partition", |b| {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        b.iter(|| {
            let mut fut = std::pin::pin!(ours.on_request(black_box(&write)));
            black_box(fut.as_mut().poll(&mut cx))
        })
    });
    let cold: Vec<Partition> = (0..1_000_000u64)
        .map(|i| Partition::new("orders", &i.to_le_bytes()).expect("partition"))
        .collect();
    let mut next = 0;
    group.bench_function("on_request write (async, ready), cold partition", |b| {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        b.iter(|| {
            next = (next + 1) % cold.len();
            let request = write.on_partition(cold[next]);
            let mut fut = std::pin::pin!(ours.on_request(black_box(&request)));
            black_box(fut.as_mut().poll(&mut cx))
        })
    });
    let unlimited = Partition::new("users", b"k").expect("partition");
    group.bench_function("admit_partition, table without limits", |b| {
        b.iter(|| black_box(ours.admit_partition(black_box(unlimited), Op::Write)))
    });
    group.bench_function("admit_partition, cold partition", |b| {
        b.iter(|| {
            next = (next + 1) % cold.len();
            black_box(ours.admit_partition(black_box(cold[next]), Op::Write))
        })
    });
    let hot = Partition::new("orders", b"hot").expect("partition");
    group.bench_function("admit_partition, one partition", |b| {
        b.iter(|| black_box(ours.admit_partition(black_box(hot), Op::Write)))
    });
    group.bench_function("Partition::new (16-byte key)", |b| {
        b.iter(|| black_box(Partition::new("orders", black_box(b"customer-0000042"))))
    });
    group.finish();
    let mut table = CounterTable::default();
    let before = table.memory_bytes();
    let now = tollgate_core::Timestamp::EPOCH;
    for p in &cold {
        let key = CounterKey {
            table: 0,
            op: Op::Write,
            partition: p.hash(),
        };
        table.admit(&key, 1e6, now, 0.5);
    }
    eprintln!(
        "counter table: {} bytes before, {} bytes after 10^6 distinct partitions ({} slots)",
        before,
        table.memory_bytes(),
        table.capacity()
    );

    let mut group = c.benchmark_group("admit/2-threads");
    group.bench_function("tollgate try_acquire", |b| {
        b.iter_custom(|iters| {
            contended(2, iters, || {
                black_box(ours.try_acquire(black_box(1.0)).expect("valid"));
            })
        })
    });
    group.bench_function("governor check", |b| {
        b.iter_custom(|iters| {
            contended(2, iters, || {
                black_box(governor.check().is_ok());
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = admit
}
criterion_main!(benches);
