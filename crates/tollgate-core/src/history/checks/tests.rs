use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::history::HistoryConfig;
use crate::validate::{BucketName, TenantId};

fn bucket(name: &str) -> BucketKey {
    BucketKey::new(
        TenantId::parse("tenant", "acme").expect("a valid id"),
        BucketName::parse("bucket", name).expect("a valid name"),
    )
}

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn tally() -> CheckTally {
    CheckTally::new(HistoryConfig::default().resolutions)
}

/// What a store keeps: one row per (bucket, step, slot) of one replica,
/// replaced only by counts that grew.
#[derive(Default)]
struct Rows(BTreeMap<(BucketKey, u64, Timestamp), CheckCounts>);

impl Rows {
    fn write(&mut self, rows: &[CheckRow]) {
        for row in rows {
            let key = (row.bucket.clone(), row.step_secs, row.slot);
            match self.0.get(&key) {
                Some(kept) if !row.counts.replaces(kept) => {}
                _ => {
                    self.0.insert(key, row.counts.clone());
                }
            }
        }
    }

    fn sum(&self, bucket: &BucketKey, step_secs: u64) -> (u64, u64, u64) {
        self.0
            .iter()
            .filter(|((b, s, _), _)| b == bucket && *s == step_secs)
            .fold((0, 0, 0), |(c, r, s), (_, counts)| {
                (
                    c + counts.checks,
                    r + counts.refusals,
                    s + counts.shadow_refusals,
                )
            })
    }
}

#[test]
fn a_slot_is_written_as_it_grows_and_once_more_when_it_ends() {
    let mut t = tally();
    let b = bucket("login");
    t.record(&b, at(61.0), ["alice"], Outcome::Allowed);
    t.record(&b, at(62.0), ["alice"], Outcome::Refused);
    let rows = t.take_rows();
    // The minute and the hour it falls in.
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].step_secs, 60);
    assert_eq!(rows[0].slot, at(60.0));
    assert_eq!(
        (rows[0].counts.checks, rows[0].counts.refusals),
        (2, 1),
        "{rows:?}"
    );
    assert_eq!(
        rows[0].counts.busiest,
        vec![BusyKey {
            key: "alice".into(),
            checks: 2,
            over: 0
        }]
    );
    // Nothing counted since: nothing to write.
    assert!(t.take_rows().is_empty());
    // The next minute closes the first: its last counts are written with
    // the new one's, and the hour's row grows.
    t.record(&b, at(119.0), ["bob"], Outcome::ShadowRefused);
    t.record(&b, at(121.0), ["bob"], Outcome::Allowed);
    let rows = t.take_rows();
    let minutes: Vec<(Timestamp, u64)> = rows
        .iter()
        .filter(|r| r.step_secs == 60)
        .map(|r| (r.slot, r.counts.checks))
        .collect();
    assert_eq!(minutes, vec![(at(60.0), 3), (at(120.0), 1)]);
    let hour = rows
        .iter()
        .find(|r| r.step_secs == 3_600)
        .expect("the hour");
    assert_eq!(
        (hour.counts.checks, hour.counts.shadow_refusals),
        (4, 1),
        "{hour:?}"
    );
}

#[test]
fn rows_whose_write_failed_are_written_with_the_next() {
    let mut t = tally();
    let b = bucket("login");
    t.record(&b, at(10.0), ["k"], Outcome::Allowed);
    let failed = t.take_rows();
    // The minute ends before the retry.
    t.record(&b, at(70.0), ["k"], Outcome::Allowed);
    t.unwritten(failed);
    let mut store = Rows::default();
    store.write(&t.take_rows());
    assert_eq!(store.sum(&b, 60), (2, 0, 0));
    assert_eq!(store.sum(&b, 3_600), (2, 0, 0));
    // A slot that ended with nothing counted after a failed write.
    let mut t = tally();
    t.record(&b, at(10.0), ["k"], Outcome::Refused);
    let failed = t.take_rows();
    t.unwritten(failed.clone());
    t.unwritten(failed);
    let mut store = Rows::default();
    store.write(&t.take_rows());
    assert_eq!(store.sum(&b, 60), (1, 1, 0));
}

#[test]
fn a_bucket_written_in_full_and_idle_for_two_slots_is_forgotten() {
    let mut t = CheckTally::new(vec![Resolution {
        step: Duration::from_secs(60),
        retention: Duration::from_secs(3_600),
    }]);
    let (idle, busy) = (bucket("idle"), bucket("busy"));
    t.record(&idle, at(0.0), ["k"], Outcome::Allowed);
    t.take_rows();
    t.record(&busy, at(90.0), ["k"], Outcome::Allowed);
    t.take_rows();
    assert_eq!(t.buckets(), 2, "one slot on: the idle one kept");
    t.record(&busy, at(120.0), ["k"], Outcome::Allowed);
    t.take_rows();
    assert_eq!(t.buckets(), 1);
}

#[test]
fn busiest_keys_sum_lower_bounds_over_rows() {
    let row = |replica: &str, keys: &[(&str, u64, u64)]| StoredCheckRow {
        slot: at(0.0),
        replica: replica.into(),
        counts: CheckCounts {
            checks: keys.iter().map(|k| k.1).sum(),
            busiest: keys
                .iter()
                .map(|&(key, checks, over)| BusyKey {
                    key: key.into(),
                    checks,
                    over,
                })
                .collect(),
            ..CheckCounts::default()
        },
    };
    let rows = [
        row("a", &[("alice", 10, 0), ("bob", 6, 4)]),
        row("b", &[("bob", 5, 0), ("carol", 3, 3)]),
    ];
    let top = busiest(&rows, 5);
    let seen: Vec<(&str, u64)> = top.iter().map(|k| (k.key.as_str(), k.checks)).collect();
    // carol's 3 may all have been others': not shown.
    assert_eq!(seen, vec![("alice", 10), ("bob", 7)]);
    let slots = per_slot(&rows, Duration::from_secs(60), at(30.0));
    assert_eq!(slots.len(), 1);
    assert_eq!((slots[0].checks, slots[0].replicas), (24, 2));
    assert_eq!(slots[0].to, at(30.0), "the slot in progress ends now");
    let ended = per_slot(&rows, Duration::from_secs(60), at(90.0));
    assert_eq!(ended[0].to, at(60.0));
    assert_eq!(slots[0].per_second(24), 0.8);
}

#[test]
fn a_chart_has_every_slot_and_sums_the_rows_in_each() {
    let row = |slot: f64, replica: &str, checks: u64| StoredCheckRow {
        slot: at(slot),
        replica: replica.into(),
        counts: CheckCounts {
            checks,
            refusals: 1,
            ..CheckCounts::default()
        },
    };
    let rows = [
        row(60.0, "a", 4),
        row(60.0, "b", 2),
        row(120.0, "a", 3),
        row(300.0, "a", 1),
    ];
    // Steps of two minutes from 1:30 to 5:10: slots at 0, 2 and 4 min.
    let slots = chart(&rows, at(90.0), at(310.0), Duration::from_secs(120));
    let seen: Vec<(f64, f64, u64, usize)> = slots
        .iter()
        .map(|s| {
            (
                s.from.seconds_since(Timestamp::EPOCH),
                s.to.seconds_since(Timestamp::EPOCH),
                s.checks,
                s.replicas,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (0.0, 120.0, 6, 2),
            (120.0, 240.0, 3, 1),
            (240.0, 310.0, 1, 1)
        ]
    );
    assert_eq!(slots[0].refusals, 2);
}

#[derive(Clone, Debug)]
enum Step {
    Check {
        bucket: usize,
        advance: f64,
        key: u8,
        outcome: u8,
    },
    Write {
        fails: bool,
    },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0..3usize, -20.0..40.0f64, 0..200u8, 0..3u8).prop_map(
                |(bucket, advance, key, outcome)| Step::Check { bucket, advance, key, outcome }
            ),
            1 => any::<bool>().prop_map(|fails| Step::Write { fails }),
        ],
        1..400,
    )
}

proptest! {
    /// Whatever the order of checks (a clock behind by less than a slot
    /// included) and of writes, failed or not, a replica's rows summed
    /// over its slots are exactly what it counted, in every resolution.
    #[test]
    fn rows_add_up_to_every_check_counted_once(steps in steps()) {
        let mut t = tally();
        let buckets = [bucket("a"), bucket("b"), bucket("c")];
        let mut store = Rows::default();
        let mut counted: HashMap<usize, (u64, u64, u64)> = HashMap::new();
        let mut clock = 1_000_000.0;
        for step in steps {
            match step {
                Step::Check { bucket, advance, key, outcome } => {
                    let now = clock + advance;
                    clock = clock.max(now);
                    let outcome = match outcome {
                        0 => Outcome::Allowed,
                        1 => Outcome::Refused,
                        _ => Outcome::ShadowRefused,
                    };
                    let key = format!("k{key}");
                    t.record(&buckets[bucket], at(now), [key.as_str()], outcome);
                    let c = counted.entry(bucket).or_default();
                    c.0 += 1;
                    c.1 += u64::from(outcome == Outcome::Refused);
                    c.2 += u64::from(outcome == Outcome::ShadowRefused);
                }
                Step::Write { fails } => {
                    let rows = t.take_rows();
                    if fails {
                        t.unwritten(rows);
                    } else {
                        store.write(&rows);
                    }
                }
            }
        }
        store.write(&t.take_rows());
        for (i, b) in buckets.iter().enumerate() {
            let want = counted.get(&i).copied().unwrap_or_default();
            prop_assert_eq!(store.sum(b, 60), want);
            prop_assert_eq!(store.sum(b, 3_600), want);
        }
    }

    /// Space-Saving's bounds: a key's true count lies between its count
    /// less its over-count and its count, and a key with more than
    /// 1/TRACKED_KEYS of the checks is tracked.
    #[test]
    fn the_busiest_keys_are_bounded_and_none_heavy_is_missed(
        keys in prop::collection::vec(prop_oneof![3 => 0..5u32, 2 => 0..1_000u32], 1..3_000)
    ) {
        let mut top = TopKeys::default();
        let mut truth: HashMap<String, u64> = HashMap::new();
        for k in &keys {
            let key = format!("k{k}");
            top.add(&key);
            *truth.entry(key).or_default() += 1;
        }
        let tracked = top.top(TRACKED_KEYS);
        for k in &tracked {
            let true_count = truth.get(&k.key).copied().unwrap_or(0);
            prop_assert!(k.at_least() <= true_count && true_count <= k.checks, "{:?} true {}", k, true_count);
        }
        let n = keys.len() as u64;
        for (key, count) in &truth {
            if *count * TRACKED_KEYS as u64 > n {
                prop_assert!(tracked.iter().any(|k| &k.key == key), "{} ({} of {}) missed", key, count, n);
            }
        }
    }
}
