//! Identical pods bursting at once beyond what their tenant's bucket holds,
//! over real sockets: a `tollgate serve` on the embedded store and pods
//! embedding `tollgate-client`, each on a connection of its own. The pods
//! first work at the same small rate (so their shares are equal), then all
//! ask for far more than the bucket holds in the same instant. Whichever
//! request reaches the server first, each pod gets an equal part of what
//! the bucket and the pods hold (the parts rule of `global_bucket.rs`):
//! Jain's index of what they admitted during the burst is at least 0.99,
//! and together they admit no more than the stated bound. With first-come
//! grants the first pod would take the whole bucket and the rest a trickle.
//!
//! Pods share evenly only while their round trips are alike: until a
//! pod's usage rate catches up with the burst, it asks for a buffer per
//! round trip, first come (docs/operations.md, "Bursts are shared"). A
//! busy machine slows some pods' round trips more than others' (a round
//! of 5 pods took 1 628 to 2 043 tokens, Jain 0.9897, with two CPU-bound
//! processes beside it, about one run in five). So a round that misses
//! the goal is run once more with the same draw, loudly, and the goal
//! holds for the second: a first-come split misses both.
//!
//! Each round draws its own pod count and bucket, from a seed printed with
//! the figures (`TOLLGATE_BURST_SEED` draws others). Held to the goal:
//! buckets of 10 to 40 times what the pods' buffers hold. Where their
//! buffers fill the bucket, or a third of it or more, the goal is not met:
//! those rounds are measured and printed.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use support::Server;
use tokio::time::Instant;
use tollgate_client::{Controller, LocalBucketConfig, Options};

/// Tokens per acquisition during the burst.
const STEP: f64 = 5.0;

fn jain(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * squares)
}

/// Each pod acquires `rate` tokens a second, in steps of a tenth, until
/// `until`.
async fn work_evenly(pods: &[Controller], rate: f64, until: Instant) {
    let tasks: Vec<_> = pods
        .iter()
        .map(|pod| {
            let pod = pod.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                while Instant::now() < until {
                    tick.tick().await;
                    pod.acquire(rate / 10.0).await.expect("admitted");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker ran");
    }
}

/// Every pod acquires as fast as it is admitted from `start`, until the
/// pods together have admitted `bucket` or `longest` has passed; returns
/// what each admitted and how long the burst lasted. Ending on what was
/// admitted rather than after a fixed time keeps the burst the same on a
/// slow machine, where each round trip takes longer.
async fn burst(
    pods: &[Controller],
    start: Instant,
    longest: Duration,
    bucket: f64,
) -> (Vec<f64>, Duration) {
    let until = start + longest;
    let steps = Arc::new(AtomicU64::new(0));
    let (ended, done) = tokio::sync::watch::channel(false);
    let ended = Arc::new(ended);
    let tasks: Vec<_> = pods
        .iter()
        .map(|pod| {
            let pod = pod.clone();
            let steps = Arc::clone(&steps);
            let ended = Arc::clone(&ended);
            let mut done = done.clone();
            tokio::spawn(async move {
                let mut admitted = 0.0;
                tokio::time::sleep_until(start).await;
                loop {
                    tokio::select! {
                        outcome = tokio::time::timeout_at(until, pod.acquire(STEP)) => {
                            if !matches!(outcome, Ok(Ok(()))) {
                                break;
                            }
                        }
                        _ = done.wait_for(|ended| *ended) => break,
                    }
                    admitted += STEP;
                    let all = steps.fetch_add(1, Ordering::SeqCst) + 1;
                    if all as f64 * STEP >= bucket {
                        ended.send_replace(true);
                        break;
                    }
                }
                (admitted, Instant::now())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut last = start;
    for task in tasks {
        let (tokens, at) = task.await.expect("burst ran");
        admitted.push(tokens);
        last = last.max(at);
    }
    (admitted, last - start)
}

/// One round: `count` pods of `tenant`, equal steady work for 2 s, then a
/// burst from all at once until they have admitted the bucket (at most
/// 10 s). Returns Jain's index of what each admitted in the burst; panics
/// if the burst did not reach the pods or went beyond the stated bound.
async fn round(server: &Server, tenant: &str, count: u32, bucket: f64, refill: f64) -> f64 {
    tokio::task::block_in_place(|| server.set_limits(tenant, bucket, refill, bucket));
    let pods: Vec<Controller> = (1..=count)
        .map(|instance| {
            let options = Options {
                bucket: LocalBucketConfig {
                    initial_tokens: 0.0,
                    ..LocalBucketConfig::default()
                },
                ..Options::default()
            };
            Controller::connect(&server.url, tenant, instance, options).expect("valid options")
        })
        .collect();
    // Equal steady work, a fifth of the refill rate in all.
    let steady = refill / 5.0 / f64::from(count);
    work_evenly(&pods, steady, Instant::now() + Duration::from_secs(2)).await;
    let held = pods.iter().map(|p| p.status().tokens).sum::<f64>() / f64::from(count);

    let start = Instant::now() + Duration::from_millis(50);
    let (admitted, length) = burst(&pods, start, Duration::from_secs(10), bucket).await;
    let index = jain(&admitted);
    let total: f64 = admitted.iter().sum();
    eprintln!(
        "{tenant}: {count} pods, bucket {bucket}, refill {refill}/s, each holding {held:.0} \
         before: admitted {total:.0} in {:.2} s ({:.1} % of the bucket), Jain {index:.4}, \
         per pod {:.0} to {:.0}",
        length.as_secs_f64(),
        100.0 * total / bucket,
        admitted.iter().copied().fold(f64::INFINITY, f64::min),
        admitted.iter().copied().fold(0.0, f64::max),
    );
    assert!(
        total >= 0.5 * bucket,
        "the burst reached the pods: {admitted:?}"
    );
    // The stated bound without faults: the burst, the refill, and 12 % of
    // a minute's refill.
    let most = bucket + refill * (length.as_secs_f64() + 0.12 * 60.0);
    assert!(total <= most, "{total} admitted, at most {most}");
    for pod in pods {
        let report = pod.shutdown().await;
        assert!(report.consumption_reported, "final report delivered");
    }
    index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_pods_bursting_at_once_get_equal_parts_over_real_sockets() {
    let seed: u64 = std::env::var("TOLLGATE_BURST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = tokio::task::block_in_place(|| Server::start(&dir.path().join("t.redb")));
    let buffer = LocalBucketConfig::default().buffer_tokens;
    for r in 0..3 {
        let count: u32 = rng.random_range(2..=24);
        let refill: f64 = rng.random_range(20.0..200.0_f64).round();
        // Each pod's part of the bucket 10 to 40 times the buffer it holds.
        let bucket = (f64::from(count) * buffer * rng.random_range(10.0..40.0_f64)).round();
        let mut index = round(&server, &format!("burst-{r}"), count, bucket, refill).await;
        if index < 0.99 {
            // Round trips slowed unevenly by the machine (the limitation
            // the module doc names): the same draw again, on a new tenant.
            // A first-come split misses both; noise rarely does twice.
            eprintln!(
                "seed {seed} round {r}: Jain {index:.4} < 0.99; the same round again once, \
                 in case the machine slowed some pods' round trips"
            );
            index = round(&server, &format!("burst-{r}-again"), count, bucket, refill).await;
        }
        assert!(
            index >= 0.99,
            "seed {seed} round {r}: Jain {index:.4} < 0.99, twice"
        );
    }
    // Buckets the pods' buffers fill, or fill a third of or more: the goal
    // is not met there (docs/operations.md, "Bursts are shared"). What the
    // others hold is known only as of their last report, so the first to
    // ask still get more than the last. Measured and printed, not held.
    for (name, times) in [
        ("burst-buffers", 1.0),
        ("burst-between", rng.random_range(1.5..3.0)),
    ] {
        let count: u32 = rng.random_range(4..=24);
        let bucket = (f64::from(count) * buffer * times).round();
        let index = round(&server, name, count, bucket, 50.0).await;
        let met = if index >= 0.99 { "met" } else { "not met" };
        eprintln!(
            "{name}: buckets {times:.1} times the buffers: Jain {index:.4} (goal 0.99, {met})"
        );
    }
    tokio::task::block_in_place(|| server.stop());
}
