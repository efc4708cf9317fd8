use super::*;

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn key(partition: u64) -> CounterKey {
    CounterKey {
        table: 0,
        op: Op::Write,
        partition,
    }
}

/// Offers `rate` operations per second to one partition with limit `limit`
/// for `seconds`, arrivals Poisson (`poisson`) or evenly spaced; returns
/// (offered, accepted) over the whole run after a 10 s warmup.
fn offer(limit: f64, rate: f64, seconds: f64, poisson: bool, seed: u64) -> (u64, u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut table = CounterTable::new(64);
    let warmup = 10.0;
    let mut t = 1.0;
    let (mut offered, mut accepted) = (0, 0);
    while t < warmup + seconds {
        let gap = if poisson {
            -(1.0 - rng.random::<f64>()).ln() / rate
        } else {
            1.0 / rate
        };
        t += gap;
        let verdict = table.admit(&key(7), limit, at(t), rng.random());
        if t >= warmup {
            offered += 1;
            accepted += u64::from(verdict == Verdict::Accepted);
        }
    }
    (offered, accepted)
}

#[test]
fn the_counter_halves_every_second_and_reads_as_a_rate() {
    let mut table = CounterTable::new(64);
    for _ in 0..100 {
        table.admit(&key(1), 1e9, at(5.0), 0.5);
    }
    let ln2 = std::f64::consts::LN_2;
    assert!((table.rate(&key(1), 1e9, at(5.0)) - 100.0 * ln2).abs() < 1e-9);
    assert!((table.rate(&key(1), 1e9, at(6.0)) - 50.0 * ln2).abs() < 1e-9);
    assert!((table.rate(&key(1), 1e9, at(8.0)) - 12.5 * ln2).abs() < 1e-9);
    // A clock that goes back neither grows nor shrinks the count.
    assert!((table.rate(&key(1), 1e9, at(4.0)) - 100.0 * ln2).abs() < 1e-9);
    assert_eq!(table.rate(&key(2), 1e9, at(5.0)), 0.0);
}

#[test]
fn the_rule_is_limit_over_rate() {
    // 1 000 operations at one instant: the count is 1 000, the rate
    // 693/s; with a limit of 100/s the next is accepted with probability
    // 100 / 693.8.
    let mut table = CounterTable::new(64);
    for _ in 0..1000 {
        table.admit(&key(1), 1e9, at(1.0), 0.0);
    }
    let p = 100.0 / (1001.0 * std::f64::consts::LN_2);
    assert_eq!(
        table.admit(&key(1), 100.0, at(1.0), p - 1e-6),
        Verdict::Accepted
    );
    assert_eq!(
        table.admit(&key(1), 100.0, at(1.0), p + 1e-3),
        Verdict::Rejected
    );
    // Below the limit, every draw is accepted.
    let mut table = CounterTable::new(64);
    for _ in 0..100 {
        assert_eq!(
            table.admit(&key(2), 1000.0, at(1.0), 0.999_999),
            Verdict::Accepted
        );
    }
}

#[test]
fn accepted_rate_is_the_limit_from_1_1_to_100_times_it() {
    // Limits across five decades, offered 1.1 to 100 times each, Poisson
    // arrivals: the accepted rate stays within ±10 % of the limit. Each run
    // is long enough for 5 000 accepted operations, so the test measures
    // the rule, not the sampling noise of a short run.
    let mut worst: f64 = 0.0;
    for (i, limit) in [1.0, 10.0, 100.0, 1_000.0, 10_000.0]
        .into_iter()
        .enumerate()
    {
        for (j, factor) in [1.1, 1.5, 2.0, 5.0, 10.0, 100.0].into_iter().enumerate() {
            let seconds = 5_000.0 / limit;
            let seed = (i * 10 + j) as u64;
            let (_, accepted) = offer(limit, limit * factor, seconds, true, seed);
            let ratio = accepted as f64 / seconds / limit;
            worst = worst.max((ratio - 1.0).abs());
            eprintln!("limit {limit}, offered {factor} x: accepted {ratio:.4} x the limit");
            assert!(
                (0.9..=1.1).contains(&ratio),
                "limit {limit}, offered {factor} x: accepted {ratio:.3} x the limit"
            );
        }
    }
    // And limits and loads drawn at random, log-uniform: 0.5 to 50 000
    // operations per second, 1.1 to 100 times over.
    let mut rng = SmallRng::seed_from_u64(99);
    for case in 0..12 {
        let limit = 10f64.powf(rng.random_range(-0.3..4.7));
        let factor = 10f64.powf(rng.random_range(0.0414..2.0));
        let seconds = 5_000.0 / limit;
        let (_, accepted) = offer(limit, limit * factor, seconds, true, 1000 + case);
        let ratio = accepted as f64 / seconds / limit;
        worst = worst.max((ratio - 1.0).abs());
        assert!(
            (0.9..=1.1).contains(&ratio),
            "limit {limit:.2}, offered {factor:.2} x: accepted {ratio:.3} x the limit"
        );
    }
    eprintln!("worst |accepted / limit - 1| = {worst:.4}");
}

#[test]
fn partitions_below_their_limit_are_not_rejected() {
    // Evenly spaced arrivals below the limit: the count holds at rate/ln 2,
    // so nothing is ever rejected.
    for limit in [1.0, 10.0, 1_000.0] {
        for factor in [0.1, 0.5, 0.9, 0.99] {
            let (offered, accepted) = offer(limit, limit * factor, 2_000.0 / limit, false, 1);
            assert_eq!(offered, accepted, "limit {limit}, offered {factor} x");
        }
    }
    // Poisson arrivals at half the limit or less: rejections only from the
    // noise of the arrivals, at most 0.1 %.
    for limit in [1.0, 10.0, 100.0, 10_000.0] {
        for factor in [0.1, 0.5] {
            let (offered, accepted) = offer(limit, limit * factor, 200_000.0 / limit, true, 2);
            let rejected = (offered - accepted) as f64 / offered as f64;
            eprintln!(
                "Poisson at {factor} x a limit of {limit}: {:.4} % rejected",
                rejected * 100.0
            );
            assert!(
                rejected <= 0.001,
                "limit {limit}, offered {factor} x: {:.4} % rejected",
                rejected * 100.0
            );
        }
    }
}

#[test]
fn a_hot_partition_is_not_pushed_out_by_a_million_cold_ones() {
    let mut table = CounterTable::new(4096);
    let memory = table.memory_bytes();
    let mut rng = SmallRng::seed_from_u64(3);
    let hot = key(0xdead_beef_0000_0001);
    let (mut offered, mut accepted) = (0u64, 0u64);
    // 100 s: the hot partition at 10 x its limit of 100/s; one million
    // distinct cold partitions at one operation each, spread over the run.
    let mut t = 1.0;
    for i in 0..1_000_000u64 {
        t += 1e-4;
        let cold = key(rng.random::<u64>() | 1);
        assert_eq!(
            table.admit(&cold, 100.0, at(t), rng.random()),
            Verdict::Accepted,
            "cold partition {i}"
        );
        if i % 10 == 0 {
            let verdict = table.admit(&hot, 100.0, at(t), rng.random());
            if t > 10.0 {
                offered += 1;
                accepted += u64::from(verdict == Verdict::Accepted);
            }
        }
    }
    assert_eq!(table.memory_bytes(), memory);
    let seconds = t - 10.0;
    let rate = accepted as f64 / seconds;
    assert!(
        (90.0..=110.0).contains(&rate),
        "hot partition accepted {rate:.1}/s of {:.0}/s offered",
        offered as f64 / seconds
    );
}

#[test]
fn operations_and_tables_count_apart() {
    let mut table = CounterTable::new(64);
    let write = key(5);
    let read = CounterKey {
        op: Op::Read,
        ..write
    };
    let other_table = CounterKey { table: 1, ..write };
    for _ in 0..10 {
        table.admit(&write, 1e9, at(1.0), 0.0);
    }
    assert!(table.rate(&write, 1e9, at(1.0)) > 6.0);
    assert_eq!(table.rate(&read, 1e9, at(1.0)), 0.0);
    assert_eq!(table.rate(&other_table, 1e9, at(1.0)), 0.0);
}

#[test]
fn hottest_lists_the_top_by_load_above_the_floor() {
    let mut table = CounterTable::new(1024);
    // Partition p gets p * 10 operations at once; the limit is 1 000/s.
    for p in 1..=20u64 {
        for _ in 0..p * 10 {
            table.admit(&key(p), 1e9, at(1.0), 0.0);
        }
    }
    let hot = table.hottest(3, at(1.0), |_| Some(1000.0));
    let order: Vec<u64> = hot.iter().map(|h| h.key.partition).collect();
    assert_eq!(order, vec![20, 19, 18]);
    assert!((hot[0].rate - 200.0 * std::f64::consts::LN_2).abs() < 1e-9);
    // Unlimited counters are not reported, nor those under 1 % of the limit.
    assert!(table.hottest(3, at(1.0), |_| None).is_empty());
    assert!(table.hottest(30, at(1.0), |_| Some(1e6)).is_empty());
}

#[test]
fn shares_divide_the_limit_in_proportion_to_rates() {
    let table = TableName::parse("t", "orders").expect("name");
    let report = |rate: f64| {
        vec![ReportedPartition {
            table: table.clone(),
            op: Op::Write,
            partition: 9,
            rate,
        }]
    };
    let (a, b, c) = (report(300.0), report(100.0), report(0.0));
    let all = [a.as_slice(), b.as_slice(), c.as_slice()];
    let limit = |_: &ReportedPartition| Some(100.0);
    let share_a = shares(&a, all, limit);
    assert_eq!(share_a.len(), 1);
    assert!((share_a[0].1 - 0.75).abs() < 1e-12);
    assert!((shares(&b, all, limit)[0].1 - 0.25).abs() < 1e-12);
    // Alone on a partition: whole, so not listed.
    assert!(shares(&a, [a.as_slice()], limit).is_empty());
    // Together under the limit (400/s of 1 000/s): whole.
    assert!(shares(&a, all, |_| Some(1_000.0)).is_empty());
}

/// Ten pods, each offered a tenth of one partition running at 10 x its
/// limit (1 000/s against 100/s), reporting every 10 s; returns the
/// accepted rate from the first report on, with or without the shares the
/// server computes from the reports.
fn ten_pods(coordinated: bool) -> f64 {
    let pods = 10;
    let limit = 100.0;
    let period = 10.0;
    let end = 200.0;
    let mut tables: Vec<CounterTable> = (0..pods).map(|_| CounterTable::new(64)).collect();
    let mut rng = SmallRng::seed_from_u64(4);
    let name = TableName::parse("t", "orders").expect("name");
    let mut accepted = 0u64;
    let mut t = 0.0;
    let mut next_report = period;
    while t < end {
        t += -(1.0 - rng.random::<f64>()).ln() / (limit * 10.0);
        if coordinated && t >= next_report {
            let reports: Vec<Vec<ReportedPartition>> = tables
                .iter()
                .map(|table| {
                    table
                        .hottest(8, at(t), |_| Some(limit))
                        .into_iter()
                        .map(|h| ReportedPartition {
                            table: name.clone(),
                            op: h.key.op,
                            partition: h.key.partition,
                            rate: h.rate,
                        })
                        .collect()
                })
                .collect();
            for (table, mine) in tables.iter_mut().zip(&reports) {
                let given: Vec<(CounterKey, f64)> =
                    shares(mine, reports.iter().map(Vec::as_slice), |_| Some(limit))
                        .into_iter()
                        .map(|(p, share)| (key(p.partition), share))
                        .collect();
                table.set_shares(&given, at(t));
            }
            next_report += period;
        }
        let pod = rng.random_range(0..pods);
        let verdict = tables[pod].admit(&key(1), limit, at(t), rng.random());
        if t >= period {
            accepted += u64::from(verdict == Verdict::Accepted);
        }
    }
    accepted as f64 / (end - period)
}

#[test]
fn coordinated_pods_accept_about_the_limit_between_them() {
    // Alone, each pod sees 100/s, its whole limit, and rejects nothing:
    // the tenant accepts 10 x the limit, as ScyllaDB's replicas would with
    // RF = 10. Coordinated, about the limit.
    let alone = ten_pods(false);
    assert!(alone > 900.0, "alone: {alone:.1}/s");
    let shared = ten_pods(true);
    assert!(
        (80.0..=120.0).contains(&shared),
        "ten coordinated pods accepted {shared:.1}/s against a limit of 100/s"
    );
}

#[test]
fn limits_are_checked() {
    let ok = TableLimits {
        max_reads_per_second: Some(10.0),
        max_writes_per_second: None,
    };
    assert!(ok.validate("tables[0]").is_ok());
    let cases = [
        (None, None, "tables[0].max_reads_per_second"),
        (Some(f64::NAN), None, "tables[0].max_reads_per_second"),
        (Some(-1.0), None, "tables[0].max_reads_per_second"),
        (Some(0.0), None, "tables[0].max_reads_per_second"),
        (None, Some(f64::INFINITY), "tables[0].max_writes_per_second"),
        (None, Some(2e9), "tables[0].max_writes_per_second"),
    ];
    for (reads, writes, field) in cases {
        let limits = TableLimits {
            max_reads_per_second: reads,
            max_writes_per_second: writes,
        };
        let err = limits.validate("tables[0]").expect_err(field);
        assert_eq!(err.field, field, "{limits:?}");
    }
    assert!(validate_partition_key("key", b"").is_err());
    assert!(validate_partition_key("key", &[0; MAX_PARTITION_KEY_LEN]).is_ok());
    assert!(validate_partition_key("key", &[0; MAX_PARTITION_KEY_LEN + 1]).is_err());
}

#[test]
fn versions_follow_the_limits() {
    let a: TableLimitSet = [(name("orders"), limits(10.0))].into();
    let b: TableLimitSet = [(name("orders"), limits(11.0))].into();
    assert_eq!(limits_version(&a), limits_version(&a.clone()));
    assert_ne!(limits_version(&a), limits_version(&b));
    assert_ne!(limits_version(&TableLimitSet::new()), 0);
}

proptest! {
    /// Whatever the operations and times, the table's memory is fixed,
    /// rates are finite and non-negative, and a counter's rate is never
    /// above the count of its operations times ln 2.
    #[test]
    fn counters_stay_bounded(
        ops in prop::collection::vec((0u64..40, 0u16..3, any::<bool>(), 0.0f64..10.0, 0.0f64..1.0), 1..400),
    ) {
        let mut table = CounterTable::new(16);
        let memory = table.memory_bytes();
        let mut counts = std::collections::HashMap::new();
        for (partition, t, read, time, draw) in ops {
            let key = CounterKey { table: t, op: if read { Op::Read } else { Op::Write }, partition };
            table.admit(&key, 5.0, at(time), draw);
            *counts.entry(key).or_insert(0u64) += 1;
            let rate = table.rate(&key, 5.0, at(time));
            prop_assert!(rate.is_finite() && rate >= 0.0);
            prop_assert!(rate <= counts[&key] as f64 * std::f64::consts::LN_2 / half_life(5.0) + 1e-9);
        }
        prop_assert_eq!(table.memory_bytes(), memory);
    }
}

fn name(table: &str) -> TableName {
    TableName::parse("t", table).expect("name")
}

/// Reads limited to `r` per second, writes too.
fn limits(r: f64) -> TableLimits {
    TableLimits {
        max_reads_per_second: Some(r),
        max_writes_per_second: Some(r),
    }
}

fn reported(table: &str, op: Op, partition: u64, rate: f64) -> ReportedPartition {
    ReportedPartition {
        table: name(table),
        op,
        partition,
        rate,
    }
}

fn exchange_of(pod: u32, partitions: Vec<ReportedPartition>, known_version: u64) -> Exchange {
    Exchange {
        pod,
        partitions,
        period: std::time::Duration::from_secs(10),
        known_version,
    }
}

#[test]
fn an_exchange_sums_pods_and_answers_each_its_share() {
    let tenant_limits: TableLimitSet = [(name("orders"), limits(100.0))].into();
    let mut reports = PartitionReports::default();
    let first = exchange(
        &mut reports,
        &tenant_limits,
        &exchange_of(1, vec![reported("orders", Op::Write, 7, 300.0)], 0),
        at(0.0),
    );
    // Alone: a whole share, and the limits because it had none.
    assert!(first.shares.is_empty());
    assert_eq!(first.limits.as_ref(), Some(&tenant_limits));
    let second = exchange(
        &mut reports,
        &tenant_limits,
        &exchange_of(
            2,
            vec![reported("orders", Op::Write, 7, 100.0)],
            first.version,
        ),
        at(1.0),
    );
    assert_eq!(second.limits, None, "the pod has the current version");
    assert_eq!(second.shares.len(), 1);
    assert!((second.shares[0].1 - 0.25).abs() < 1e-12);
    // A retried exchange replaces the pod's report: the same answer.
    let again = exchange(
        &mut reports,
        &tenant_limits,
        &exchange_of(
            2,
            vec![reported("orders", Op::Write, 7, 100.0)],
            first.version,
        ),
        at(1.5),
    );
    assert_eq!(again.shares, second.shares);
    assert_eq!(reports.pods.len(), 2);
    // Pod 1's report goes stale after twice its period: pod 2 is alone.
    let later = exchange(
        &mut reports,
        &tenant_limits,
        &exchange_of(
            2,
            vec![reported("orders", Op::Write, 7, 100.0)],
            first.version,
        ),
        at(20.5),
    );
    assert!(later.shares.is_empty());
    assert_eq!(reports.pods.len(), 1);
    // An empty report removes the pod's.
    exchange(
        &mut reports,
        &tenant_limits,
        &exchange_of(2, vec![], first.version),
        at(21.0),
    );
    assert!(reports.is_empty());
}

#[test]
fn partitions_without_a_limit_are_not_recorded() {
    let tenant_limits: TableLimitSet = [(
        name("orders"),
        TableLimits {
            max_reads_per_second: None,
            max_writes_per_second: Some(10.0),
        },
    )]
    .into();
    let mut reports = PartitionReports::default();
    exchange(
        &mut reports,
        &tenant_limits,
        &exchange_of(
            1,
            vec![
                reported("orders", Op::Read, 1, 50.0),
                reported("users", Op::Write, 1, 50.0),
                reported("orders", Op::Write, 1, 50.0),
            ],
            0,
        ),
        at(0.0),
    );
    assert_eq!(
        reports.pods[&1].partitions,
        vec![reported("orders", Op::Write, 1, 50.0)]
    );
}

#[test]
fn reports_are_checked_and_bounded() {
    let ok = vec![reported("orders", Op::Write, 1, 5.0)];
    assert!(Exchange::validate_partitions("p", &ok).is_ok());
    let twice = vec![
        reported("orders", Op::Write, 1, 5.0),
        reported("orders", Op::Write, 1, 6.0),
    ];
    assert_eq!(
        Exchange::validate_partitions("p", &twice).map_err(|e| e.field),
        Err("p[1]".to_string())
    );
    for rate in [f64::NAN, -1.0, f64::INFINITY, 2e12] {
        let bad = vec![reported("orders", Op::Write, 1, rate)];
        assert_eq!(
            Exchange::validate_partitions("p", &bad).map_err(|e| e.field),
            Err("p[0].rate".to_string()),
            "{rate}"
        );
    }
    let many: Vec<_> = (0..=MAX_REPORTED_PARTITIONS as u64)
        .map(|p| reported("orders", Op::Write, p, 1.0))
        .collect();
    assert!(Exchange::validate_partitions("p", &many).is_err());
    // However many pods report, a tenant keeps at most
    // MAX_TENANT_REPORTED partitions, the oldest reports dropped first.
    let tenant_limits: TableLimitSet = [(name("orders"), limits(100.0))].into();
    let mut reports = PartitionReports::default();
    let four: Vec<_> = (0..4)
        .map(|p| reported("orders", Op::Write, p, 5.0))
        .collect();
    let pods = (MAX_TENANT_REPORTED / 4) as u32 + 10;
    for pod in 0..pods {
        exchange(
            &mut reports,
            &tenant_limits,
            &exchange_of(pod, four.clone(), 0),
            at(f64::from(pod) * 1e-3),
        );
    }
    let kept: usize = reports.pods.values().map(|r| r.partitions.len()).sum();
    assert_eq!(kept, MAX_TENANT_REPORTED);
    assert!(reports.pods.contains_key(&(pods - 1)));
    assert!(!reports.pods.contains_key(&0));
}

#[test]
fn the_log_that_picks_the_coldest_is_within_a_tenth() {
    let mut x = 1e-6;
    while x < 1e9 {
        assert!((approx_log2(x) - x.log2()).abs() < 0.09, "{x}");
        x *= 1.37;
    }
    assert!(approx_log2(0.0) < -1000.0);
}

#[test]
fn a_pod_exchanges_within_a_period_retries_soon_and_falls_back_after_two() {
    let period = std::time::Duration::from_secs(10);
    let mut pod = PodLimiter::new(64, period, 8);
    let orders = table_seed("orders");
    // Before any answer: no limit known, everything admitted.
    assert_eq!(
        pod.admit(orders, 1, Op::Write, at(0.0), 0.5),
        PodVerdict::Unlimited
    );
    let (retry, whole) = pod.on_failure(at(0.0), 1.0, None);
    assert!(whole && retry <= RETRY_AFTER_FAILURE * 2 && retry >= RETRY_AFTER_FAILURE / 2);
    let answer = ExchangeAnswer {
        version: 7,
        limits: Some([(name("orders"), limits(10.0))].into()),
        shares: vec![(reported("orders", Op::Write, 1, 0.0), 0.25)],
    };
    for draw in [0.0, 0.5, 0.999] {
        let next = pod.on_answer(&answer, at(1.0), draw);
        assert!(next <= period && next >= period.mul_f64(0.8), "{next:?}");
    }
    assert_eq!(pod.version(), 7);
    assert_eq!(pod.limits(), [(name("orders"), limits(10.0))].into());
    assert_eq!(pod.share(orders, 1, Op::Write), 0.25);
    // One failure soon after: shares kept; two periods on: whole again.
    assert!(!pod.on_failure(at(5.0), 0.5, None).1);
    assert_eq!(pod.share(orders, 1, Op::Write), 0.25);
    assert!(pod.on_failure(at(21.0), 0.5, None).1);
    assert_eq!(pod.share(orders, 1, Op::Write), 1.0);
    // Over the limit: rejected, naming the table.
    let mut rejected = None;
    for i in 0..1_000 {
        if let PodVerdict::Rejected(index) = pod.admit(orders, 1, Op::Write, at(22.0), 0.99) {
            rejected = Some((i, index));
            break;
        }
    }
    let (_, index) = rejected.expect("over the limit, some are rejected");
    assert_eq!(pod.table_name(index), Some(&name("orders")));
    // The report names the table and the partition.
    let exchange = pod.exchange(3, at(22.0));
    assert_eq!((exchange.pod, exchange.known_version), (3, 7));
    assert_eq!(exchange.partitions[0].table, name("orders"));
    assert_eq!(exchange.partitions[0].partition, 1);
    // It reported a partition over its limit: the next exchange comes
    // twice as soon.
    let next = pod.on_answer(&answer, at(22.5), 0.999);
    assert!(next <= period / 2, "{next:?}");
}

#[test]
fn a_moved_hot_spot_keeps_the_quick_cadence_until_it_has_its_share() {
    let period = std::time::Duration::from_secs(10);
    let mut pod = PodLimiter::new(64, period, 8);
    let orders = table_seed("orders");
    let limit = 100.0;
    let shared = |partition: u64, share: f64| ExchangeAnswer {
        version: 1,
        limits: Some([(name("orders"), limits(limit))].into()),
        shares: vec![(reported("orders", Op::Write, partition, 0.0), share)],
    };
    pod.on_answer(&shared(1, 0.25), at(0.0), 0.5);
    // The hot spot moves to partition 2: the pod sees it at 40/s, under
    // the whole limit but over its old part of it (25/s).
    let mut t = 0.0;
    while t < 5.0 {
        pod.admit(orders, 2, Op::Write, at(t), 0.5);
        t += 1.0 / 40.0;
    }
    let exchange = pod.exchange(1, at(5.0));
    assert_eq!(exchange.partitions[0].partition, 2);
    // The server has not divided it yet: the next exchange comes soon all
    // the same.
    let next = pod.on_answer(&shared(1, 0.25), at(5.0), 0.999);
    assert!(next <= period / 2, "{next:?}");
    // Once nothing the pod sees runs over its part, the usual cadence.
    let mut quiet = PodLimiter::new(64, period, 8);
    quiet.on_answer(&shared(1, 0.25), at(0.0), 0.5);
    let mut t = 0.0;
    while t < 5.0 {
        quiet.admit(orders, 2, Op::Write, at(t), 0.5);
        t += 1.0 / 10.0;
    }
    quiet.exchange(1, at(5.0));
    let next = quiet.on_answer(&shared(1, 0.25), at(5.0), 0.999);
    assert!(next > period / 2, "{next:?}");
}

#[test]
fn a_partition_exchange_refused_by_an_overloaded_server_waits_its_pushback() {
    let mut pod = PodLimiter::new(64, std::time::Duration::from_secs(10), 8);
    let hint = std::time::Duration::from_secs(2);
    for draw in [0.0, 0.5, 0.999] {
        let (retry, _) = pod.on_failure(at(0.0), draw, Some(hint));
        assert!(retry >= hint && retry <= hint * 2, "{retry:?}");
    }
}
