//! The per-key bucket's rules, and a property: over any window, a key
//! admits at most its burst plus its refill.

use proptest::prelude::*;

use super::*;

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn limits(refill_rate: f64, burst_limit: f64) -> Limits {
    Limits {
        refill_rate,
        burst_limit,
    }
}

fn slot(refill_rate: f64, burst_limit: f64, state: Option<KeyState>) -> KeySlot {
    KeySlot {
        quota: None,
        limits: limits(refill_rate, burst_limit),
        state,
        enforce: true,
    }
}

fn shadow(slot: KeySlot) -> KeySlot {
    KeySlot {
        enforce: false,
        ..slot
    }
}

/// A check refused only for a bucket in shadow mode is allowed; every
/// bucket is left as enforcing leaves it, so the enforcing one takes its
/// tokens and the shadow one takes none; the short item is marked.
#[test]
fn shadow_buckets_refuse_nothing_and_keep_the_state_enforcing_gives() {
    let now = at(0.0);
    let empty = Some(KeyState {
        tokens: 1.0,
        last_refill: now,
        quota: None,
    });
    // Alone: allowed, marked, nothing taken.
    let alone = check(&[shadow(slot(1.0, 10.0, empty))], &[item(0, 4.0)], now);
    assert!(alone.allowed);
    assert!(alone.answers[0].allowed && alone.answers[0].shadow_refused);
    assert_eq!(alone.answers[0].remaining, 1.0);
    assert_eq!(alone.states[0], empty, "as the refusal leaves it");
    // Enforcing, the same check is refused and leaves the same state:
    // switching keeps it.
    let enforced = check(&[slot(1.0, 10.0, empty)], &[item(0, 4.0)], now);
    assert!(!enforced.allowed);
    assert_eq!(enforced.states[0], alone.states[0]);
    // With an enforcing bucket that has the tokens: it takes them.
    let both = check(
        &[slot(1.0, 10.0, None), shadow(slot(1.0, 10.0, empty))],
        &[item(0, 3.0), item(1, 4.0)],
        now,
    );
    assert!(both.allowed);
    assert_eq!(both.answers[0].remaining, 7.0);
    assert!(!both.answers[0].shadow_refused);
    assert!(both.answers[1].shadow_refused);
    assert_eq!(both.states[1], empty);
    // An enforcing bucket short refuses the call, shadow or not.
    let refused = check(
        &[slot(1.0, 10.0, empty), shadow(slot(1.0, 10.0, empty))],
        &[item(0, 4.0), item(1, 4.0)],
        now,
    );
    assert!(!refused.allowed);
    assert!(
        refused
            .answers
            .iter()
            .all(|a| !a.allowed && !a.shadow_refused)
    );
    assert_eq!(refused.states, vec![empty, empty]);
    // A shadow bucket with the tokens takes them, as enforcing would.
    let taken = check(&[shadow(slot(1.0, 10.0, None))], &[item(0, 4.0)], now);
    assert!(taken.allowed && !taken.answers[0].shadow_refused);
    assert_eq!(taken.answers[0].remaining, 6.0);
}

fn item(slot: usize, tokens: f64) -> CheckItem {
    CheckItem { slot, tokens }
}

#[test]
fn a_key_never_seen_starts_full_and_a_full_key_needs_no_row() {
    let outcome = check(&[slot(1.0, 10.0, None)], &[item(0, 4.0)], at(0.0));
    assert!(outcome.allowed);
    assert_eq!(outcome.answers[0].remaining, 6.0);
    assert_eq!(outcome.answers[0].retry_after, Some(Duration::ZERO));
    assert_eq!(outcome.answers[0].reset_after, Some(Duration::from_secs(4)));
    let state = outcome.states[0].expect("below the burst: stored");
    assert_eq!(
        state,
        KeyState {
            quota: None,
            tokens: 6.0,
            last_refill: at(0.0)
        }
    );
    // Four seconds later it is full again: no row.
    assert!(state.is_idle(&limits(1.0, 10.0), at(4.0)));
    let read = check(&[slot(1.0, 10.0, Some(state))], &[item(0, 0.0)], at(5.0));
    assert_eq!(read.states, vec![None]);
    assert_eq!(read.answers[0].remaining, 10.0, "capped at the burst");
}

/// Found by the `key_sequences` fuzz target: a key last refilled by a
/// clock ahead of this one refills only from then, and the waits say so.
#[test]
fn waits_count_from_a_last_refill_after_now() {
    let state = KeyState {
        quota: None,
        tokens: 0.0,
        last_refill: at(100.0),
    };
    let outcome = check(&[slot(1.0, 10.0, Some(state))], &[item(0, 1.0)], at(90.0));
    assert!(!outcome.allowed);
    assert_eq!(outcome.states[0], Some(state), "refused: unchanged");
    let answer = outcome.answers[0];
    assert_eq!(answer.retry_after, Some(Duration::from_secs(11)));
    assert_eq!(answer.reset_after, Some(Duration::from_secs(20)));
    let retried = check(&[slot(1.0, 10.0, Some(state))], &[item(0, 1.0)], at(101.0));
    assert!(retried.allowed, "the tokens are there when it said");
}

#[test]
fn a_refused_check_takes_nothing_and_says_when_to_retry() {
    let state = KeyState {
        quota: None,
        tokens: 2.0,
        last_refill: at(0.0),
    };
    let outcome = check(&[slot(2.0, 10.0, Some(state))], &[item(0, 5.0)], at(0.5));
    assert!(!outcome.allowed);
    let answer = outcome.answers[0];
    assert_eq!(answer.remaining, 3.0, "2 + 0.5 s × 2/s, nothing taken");
    assert_eq!(answer.retry_after, Some(Duration::from_secs(1)));
    assert_eq!(answer.reset_after, Some(Duration::from_millis(3500)));
    // More than the burst, or no refill: never.
    let never = check(&[slot(2.0, 10.0, None)], &[item(0, 11.0)], at(0.0));
    assert_eq!(never.answers[0].retry_after, None);
    let frozen = check(&[slot(0.0, 10.0, Some(state))], &[item(0, 5.0)], at(9.0));
    assert_eq!(frozen.answers[0].retry_after, None);
    assert_eq!(frozen.answers[0].reset_after, None);
}

#[test]
fn items_are_taken_together_or_not_at_all() {
    let user = slot(1.0, 5.0, None);
    let tenant = slot(
        10.0,
        100.0,
        Some(KeyState {
            quota: None,
            tokens: 1.0,
            last_refill: at(0.0),
        }),
    );
    let refused = check(
        &[user.clone(), tenant.clone()],
        &[item(0, 3.0), item(1, 3.0)],
        at(0.0),
    );
    assert!(!refused.allowed);
    assert!(refused.answers.iter().all(|a| !a.allowed));
    assert_eq!(
        refused.answers[0].remaining, 5.0,
        "the user's key is untouched"
    );
    assert_eq!(refused.answers[0].retry_after, Some(Duration::ZERO));
    assert_eq!(
        refused.answers[1].retry_after,
        Some(Duration::from_millis(200))
    );
    assert_eq!(refused.states[0], None);
    let allowed = check(&[user, tenant], &[item(0, 3.0), item(1, 3.0)], at(0.2));
    assert!(allowed.allowed);
    assert_eq!(allowed.answers[0].remaining, 2.0);
    assert_eq!(allowed.answers[1].remaining, 0.0);
}

#[test]
fn items_on_one_key_take_in_turn() {
    let key = slot(1.0, 10.0, None);
    let outcome = check(
        std::slice::from_ref(&key),
        &[item(0, 6.0), item(0, 4.0)],
        at(0.0),
    );
    assert!(outcome.allowed);
    assert_eq!(outcome.answers[1].remaining, 0.0);
    let outcome = check(&[key], &[item(0, 6.0), item(0, 5.0)], at(0.0));
    assert!(!outcome.allowed, "11 of 10");
    assert_eq!(outcome.states, vec![None]);
}

#[test]
fn keys_and_tokens_are_checked() {
    assert_eq!(
        validate_key("items[0].key", "").expect_err("empty").field,
        "items[0].key"
    );
    assert!(validate_key("k", &"x".repeat(MAX_KEY_LEN)).is_ok());
    assert!(validate_key("k", &"x".repeat(MAX_KEY_LEN + 1)).is_err());
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        assert_eq!(
            validate_tokens("items[0].tokens", bad)
                .expect_err("bad")
                .field,
            "items[0].tokens"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the sequence of checks, the tokens one key admits within
    /// any window of time T are at most burst + rate × T (up to float
    /// rounding), and a key that was never refused holds what a reference
    /// bucket would.
    #[test]
    fn a_key_admits_at_most_its_burst_plus_its_refill_over_any_window(
        rate in 0.0..100.0f64,
        burst in 0.0..1000.0f64,
        steps in proptest::collection::vec((0u32..3_000, 0.0..300.0f64), 1..200),
    ) {
        let limits = limits(rate, burst);
        let mut state = None;
        let mut now_ms: i64 = 0;
        let mut admitted: Vec<(i64, f64)> = Vec::new();
        for (advance_ms, tokens) in &steps {
            now_ms += i64::from(*advance_ms);
            let now = Timestamp::from_unix_micros(now_ms * 1000);
            let outcome = check(
                &[KeySlot {
                    quota: None,
                    limits,
                    state,
                    enforce: true,
                }],
                &[item(0, *tokens)],
                now,
            );
            let answer = outcome.answers[0];
            prop_assert!(answer.remaining >= -1e-9 && answer.remaining <= burst + 1e-9);
            if outcome.allowed {
                admitted.push((now_ms, *tokens));
            }
            state = outcome.states[0];
        }
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let mut sum = 0.0;
            for &(t, tokens) in &admitted[i..] {
                sum += tokens;
                let window = (t - start) as f64 / 1000.0;
                let bound = burst + rate * window;
                prop_assert!(
                    sum <= bound + 1e-9 * bound.max(1.0),
                    "{} admitted in {} s, bound {}", sum, window, bound
                );
            }
        }
    }
}

mod batch {
    //! The store's script: definitions resolved, retries answered from
    //! their record, writes.

    use std::collections::BTreeMap;

    use super::*;
    use crate::tier::{BucketDefinition, BucketKind};
    use crate::validate::{BucketName, TenantId};

    fn tenant(name: &str) -> TenantId {
        TenantId::parse("tenant_id", name).expect("valid tenant")
    }

    fn bucket(name: &str) -> BucketName {
        BucketName::parse("bucket", name).expect("valid bucket")
    }

    fn definitions() -> BTreeMap<TenantId, BTreeMap<BucketName, BucketDefinition>> {
        let per_key = |rate, burst| BucketDefinition {
            quota: None,
            limits: limits(rate, burst),
            initial_tokens: None,
            kind: BucketKind::PerKey,
            enforce: true,
        };
        let shared = BucketDefinition {
            quota: None,
            limits: limits(1.0, 1.0),
            initial_tokens: None,
            kind: BucketKind::Shared,
            enforce: true,
        };
        BTreeMap::from([
            (
                tenant("acme"),
                BTreeMap::from([
                    (bucket("per-user"), per_key(1.0, 3.0)),
                    (bucket("per-tenant"), per_key(10.0, 100.0)),
                    (bucket("emails"), shared),
                ]),
            ),
            (
                tenant("globex"),
                BTreeMap::from([(bucket("per-user"), per_key(1.0, 3.0))]),
            ),
        ])
    }

    fn item(t: &str, b: &str, key: &str, tokens: f64, id: Option<&str>) -> RequestItem {
        RequestItem {
            key: KeyId::new(tenant(t), bucket(b), key),
            tokens,
            request_id: id.map(str::to_owned),
        }
    }

    fn call(items: Vec<RequestItem>) -> CheckCall {
        CheckCall::new(items).expect("valid call")
    }

    #[test]
    fn calls_of_one_batch_take_in_turn_and_keys_of_tenants_never_mix() {
        let defs = definitions();
        let calls = [
            call(vec![item("acme", "per-user", "u1", 2.0, None)]),
            call(vec![item("acme", "per-user", "u1", 2.0, None)]),
            call(vec![item("globex", "per-user", "u1", 2.0, None)]),
        ];
        let batch = KeyBatch::new(&calls);
        assert_eq!(batch.keys().len(), 2);
        let mut table = KeyTable::new([], []);
        let now = at(0.0);
        let answers: Vec<bool> = calls
            .iter()
            .map(|c| table.serve(c, &defs, now).expect("served").allowed)
            .collect();
        assert_eq!(answers, vec![true, false, true]);
        let writes = table.writes();
        assert_eq!(writes.upserts.len(), 2);
        assert!(writes.upserts.iter().all(|(_, k)| k.state.tokens == 1.0));
        assert_eq!(
            writes.upserts[0].1.full_at,
            Some(at(2.0)),
            "1 token short at 1/s"
        );
    }

    #[test]
    fn a_retry_gets_the_first_answer_and_takes_nothing() {
        let defs = definitions();
        let first = call(vec![
            item("acme", "per-user", "u1", 2.0, Some("r1")),
            item("acme", "per-tenant", "acme", 2.0, Some("r1")),
        ]);
        let mut table = KeyTable::new([], []);
        let answer = table.serve(&first, &defs, at(0.0)).expect("served");
        assert!(answer.allowed);
        let writes = table.writes();
        assert_eq!(writes.records.len(), 2);
        // A later transaction loads what the first wrote.
        let keys = writes.upserts.iter().map(|(k, s)| (k.clone(), s.state));
        let mut later = KeyTable::new(keys, writes.records.clone());
        let retry = later.serve(&first, &defs, at(0.5)).expect("served");
        assert!(retry.items.iter().all(|i| i.replayed));
        assert_eq!(retry.items[0].answer, answer.items[0].answer);
        assert!(later.writes().is_empty(), "a retry writes nothing");
        // Other tokens under the same id: refused, naming the field.
        let other = call(vec![item("acme", "per-user", "u1", 1.0, Some("r1"))]);
        let err = later.serve(&other, &defs, at(0.5)).expect_err("refused");
        assert!(err.to_string().contains("items[0].request_id"), "{err}");
        // Once expired, the same id is a new check.
        let expired = at(REQUEST_RECORD_TTL.as_secs_f64() + 1.0);
        let again = later.serve(&first, &defs, expired).expect("served");
        assert!(again.items.iter().all(|i| !i.replayed));
    }

    #[test]
    fn unknown_and_shared_buckets_refuse_the_whole_call() {
        let defs = definitions();
        let mut table = KeyTable::new([], []);
        let unknown = call(vec![
            item("acme", "per-user", "u1", 1.0, None),
            item("acme", "nope", "u1", 1.0, None),
        ]);
        assert!(matches!(
            table.serve(&unknown, &defs, at(0.0)),
            Err(CheckError::BucketNotFound { field, .. }) if field == "items[1].bucket"
        ));
        let shared = call(vec![item("acme", "emails", "u1", 1.0, None)]);
        assert!(matches!(
            table.serve(&shared, &defs, at(0.0)),
            Err(CheckError::NotPerKey { .. })
        ));
        let no_tier = call(vec![item("initech", "per-user", "u1", 1.0, None)]);
        assert!(matches!(
            table.serve(&no_tier, &defs, at(0.0)),
            Err(CheckError::BucketNotFound { .. })
        ));
        assert!(table.writes().is_empty(), "nothing taken");
    }

    #[test]
    fn a_key_found_full_is_deleted_and_a_call_is_validated() {
        let defs = definitions();
        let key = KeyId::new(tenant("acme"), bucket("per-user"), "u1");
        let stored = KeyState {
            quota: None,
            tokens: 1.0,
            last_refill: at(0.0),
        };
        let mut table = KeyTable::new([(key.clone(), stored)], []);
        let read = call(vec![item("acme", "per-user", "u1", 0.0, None)]);
        let answer = table.serve(&read, &defs, at(10.0)).expect("served");
        assert_eq!(answer.items[0].answer.remaining, 3.0);
        assert_eq!(table.writes().deletes, vec![key]);
        assert!(CheckCall::new(vec![]).is_err());
        let too_many = vec![item("acme", "per-user", "u1", 0.0, None); MAX_CHECK_ITEMS + 1];
        assert!(CheckCall::new(too_many).is_err());
        let long_id = "x".repeat(MAX_REQUEST_ID_LEN + 1);
        let err = CheckCall::new(vec![item("acme", "per-user", "u1", 1.0, Some(&long_id))])
            .expect_err("too long");
        assert_eq!(err.field, "items[0].request_id");
        let err =
            CheckCall::new(vec![item("acme", "per-user", "", 1.0, None)]).expect_err("empty key");
        assert_eq!(err.field, "items[0].key");
        let err =
            CheckCall::new(vec![item("acme", "per-user", "u", f64::NAN, None)]).expect_err("NaN");
        assert_eq!(err.field, "items[0].tokens");
    }
}

mod operators_view {
    use super::super::*;
    use crate::global_bucket::Limits;

    fn stored(tokens: f64, last_refill: f64, limits: &Limits) -> StoredKey {
        StoredKey::new(
            KeyState {
                quota: None,
                tokens,
                last_refill: Timestamp::from_secs_f64(last_refill),
            },
            limits,
        )
    }

    #[test]
    fn the_busiest_keys_are_the_furthest_from_full_then_by_key() {
        let limits = Limits {
            refill_rate: 1.0,
            burst_limit: 10.0,
        };
        let never = Limits {
            refill_rate: 0.0,
            burst_limit: 10.0,
        };
        let mut busiest = BusiestKeys::new(3);
        busiest.push("b".into(), stored(5.0, 0.0, &limits));
        busiest.push("a".into(), stored(5.0, 0.0, &limits));
        busiest.push("nearly-full".into(), stored(9.0, 0.0, &limits));
        busiest.push("empty".into(), stored(0.0, 0.0, &limits));
        busiest.push("stuck".into(), stored(3.0, 0.0, &never));
        let order: Vec<String> = busiest.into_vec().into_iter().map(|(k, _)| k).collect();
        assert_eq!(order, ["stuck", "empty", "a"]);
    }

    #[test]
    fn a_reading_is_the_level_now_under_the_definition_in_force() {
        let limits = Limits {
            refill_rate: 2.0,
            burst_limit: 10.0,
        };
        let key = stored(4.0, 0.0, &limits);
        let reading = KeyReading::new("u".into(), &key, &limits, Timestamp::from_secs_f64(1.0));
        assert_eq!(reading.tokens, 6.0);
        assert_eq!(reading.full_in, Some(Duration::from_secs(2)));
        // A smaller burst since: capped, full now.
        let smaller = Limits {
            refill_rate: 2.0,
            burst_limit: 5.0,
        };
        let reading = KeyReading::new("u".into(), &key, &smaller, Timestamp::from_secs_f64(1.0));
        assert_eq!(reading.tokens, 5.0);
        assert_eq!(reading.full_in, Some(Duration::ZERO));
    }
}

fn utc(text: &str) -> Timestamp {
    let t: jiff::Timestamp = text.parse().expect("a test date");
    Timestamp::from_unix_micros(t.as_microsecond())
}

/// 100 a day in Paris on a bucket of 10 a second (burst 50).
fn daily_quota(amount: f64) -> Quota {
    Quota {
        amount,
        cycle: crate::budget::CycleRule {
            period: crate::budget::Period::Daily,
            time_zone: "Europe/Paris".into(),
        },
    }
}

fn quota_slot(amount: f64, state: Option<KeyState>) -> KeySlot {
    KeySlot {
        quota: Some(daily_quota(amount)),
        ..slot(10.0, 50.0, state)
    }
}

#[test]
fn a_quota_caps_a_key_per_cycle_and_the_next_cycle_restores_it() {
    // 2026-06-10 in Paris (UTC+2): the day ends at 22:00 UTC.
    let mut now = utc("2026-06-10T08:00:00Z");
    let day_end = utc("2026-06-10T22:00:00Z");
    let mut state = None;
    let mut allowed = 0.0;
    for _ in 0..30 {
        let outcome = check(&[quota_slot(100.0, state)], &[item(0, 8.0)], now);
        let answer = outcome.answers[0];
        if outcome.allowed {
            allowed += 8.0;
        }
        let quota = answer.quota.expect("a quota answer");
        assert_eq!(quota.resets_at, day_end);
        assert_eq!(quota.remaining, 100.0 - allowed);
        state = outcome.states[0];
        now = now.saturating_add(Duration::from_secs(60));
    }
    assert_eq!(allowed, 96.0, "12 checks of 8 fit in 100");
    // Refused for the quota, not the bucket: retry at the cycle's end.
    let refused = check(&[quota_slot(100.0, state)], &[item(0, 8.0)], now);
    assert!(!refused.allowed);
    assert_eq!(
        refused.answers[0].retry_after,
        Some(day_end.duration_since(now))
    );
    // The 4 tokens left still go.
    let rest = check(&[quota_slot(100.0, state)], &[item(0, 4.0)], now);
    assert!(rest.allowed);
    assert_eq!(rest.answers[0].quota.map(|q| q.remaining), Some(0.0));
    // More than a whole cycle's quota: never.
    let never = check(&[quota_slot(100.0, state)], &[item(0, 101.0)], now);
    assert_eq!(never.answers[0].retry_after, None);
    // The key's bucket is full again, but its row stays until the day
    // ends: the quota use is kept.
    let stored = rest.states[0].expect("quota in use: a row");
    let later = utc("2026-06-10T21:59:59Z");
    assert!(!stored.is_idle(&limits(10.0, 50.0), later));
    assert_eq!(
        StoredKey::new(stored, &limits(10.0, 50.0)).full_at,
        Some(day_end)
    );
    assert!(stored.is_idle(&limits(10.0, 50.0), day_end));
    // The next day: the whole quota again.
    let next = check(&[quota_slot(100.0, Some(stored))], &[item(0, 8.0)], day_end);
    assert!(next.allowed);
    assert_eq!(next.answers[0].quota.map(|q| q.remaining), Some(92.0));
}

#[test]
fn a_refused_check_takes_nothing_from_the_quota() {
    let now = utc("2026-06-10T08:00:00Z");
    // The quota has room; the other item's key does not.
    let empty = slot(
        0.0,
        5.0,
        Some(KeyState {
            tokens: 0.0,
            last_refill: now,
            quota: None,
        }),
    );
    let outcome = check(
        &[quota_slot(100.0, None), empty],
        &[item(0, 10.0), item(1, 1.0)],
        now,
    );
    assert!(!outcome.allowed);
    assert_eq!(outcome.answers[0].quota.map(|q| q.remaining), Some(100.0));
    assert_eq!(outcome.states[0], None, "nothing taken, nothing stored");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Over any sequence of checks at any pace, the tokens a key is
    /// allowed in each cycle never exceed its quota, and every answer's
    /// remaining quota is the quota less what the cycle allowed so far.
    #[test]
    fn a_key_is_never_allowed_more_than_its_quota_in_a_cycle(
        amount in 1.0f64..500.0,
        steps in proptest::collection::vec((0.0f64..60.0, 0u64..7_200), 1..150),
    ) {
        let mut now = utc("2026-03-28T12:00:00Z"); // the day before Paris's DST change
        let mut state = None;
        let mut per_cycle: std::collections::BTreeMap<i64, f64> = Default::default();
        for (tokens, wait) in steps {
            let outcome = check(&[quota_slot(amount, state)], &[item(0, tokens)], now);
            let quota = outcome.answers[0].quota.expect("a quota answer");
            let spent = per_cycle.entry(quota.resets_at.unix_micros()).or_insert(0.0);
            if outcome.allowed {
                *spent += tokens;
            }
            prop_assert!(*spent <= amount * (1.0 + 1e-12), "{spent} > {amount}");
            prop_assert!((quota.remaining - (amount - *spent)).abs() <= 1e-9 * amount);
            state = outcome.states[0];
            now = now.saturating_add(Duration::from_secs(wait));
        }
    }
}

#[test]
fn a_clock_that_steps_back_never_opens_a_cycle_again() {
    // The key took its whole day on June 11th; a replica whose clock is
    // behind, still on June 10th, must not give it June 10th's quota.
    let eleventh = utc("2026-06-11T08:00:00Z");
    let spent = check(&[quota_slot(10.0, None)], &[item(0, 10.0)], eleventh);
    assert!(spent.allowed);
    let behind = utc("2026-06-10T21:00:00Z");
    let outcome = check(
        &[quota_slot(10.0, spent.states[0])],
        &[item(0, 1.0)],
        behind,
    );
    assert!(!outcome.allowed, "June 11th's quota is spent");
    let quota = outcome.answers[0].quota.expect("a quota answer");
    assert_eq!(quota.remaining, 0.0);
    assert_eq!(quota.resets_at, utc("2026-06-11T22:00:00Z"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the buckets, their levels and the items: a check with
    /// buckets in shadow mode leaves each shadow bucket as the fully
    /// enforced check does and each enforcing one as the check of its
    /// items alone does; it is refused exactly when that check of the
    /// enforcing items is; only shadow items are marked, and only short
    /// ones; and with no shadow bucket nothing changes.
    #[test]
    fn shadow_buckets_leave_every_key_as_enforcing_would(
        slots in proptest::collection::vec((0.0f64..20.0, 1.0f64..20.0, any::<bool>()), 1..4),
        asks in proptest::collection::vec((0usize..4, 0.0f64..15.0), 1..6),
    ) {
        let now = at(10.0);
        let shadowed: Vec<KeySlot> = slots
            .iter()
            .map(|&(tokens, burst, enforce)| KeySlot {
                enforce,
                ..slot(
                    0.5,
                    burst,
                    Some(KeyState {
                        tokens: tokens.min(burst),
                        last_refill: now,
                        quota: None,
                    }),
                )
            })
            .collect();
        let enforced: Vec<KeySlot> = shadowed
            .iter()
            .map(|s| KeySlot { enforce: true, ..s.clone() })
            .collect();
        let items: Vec<CheckItem> = asks
            .iter()
            .map(|&(slot, tokens)| item(slot % slots.len(), tokens))
            .collect();
        let enforcing_items: Vec<CheckItem> = items
            .iter()
            .copied()
            .filter(|i| shadowed[i.slot].enforce)
            .collect();
        let outcome = check(&shadowed, &items, now);
        let all = check(&enforced, &items, now);
        let alone = check(&enforced, &enforcing_items, now);
        if shadowed.iter().all(|s| s.enforce) {
            prop_assert_eq!(&outcome, &all);
        }
        prop_assert_eq!(outcome.allowed, alone.allowed);
        for (i, s) in shadowed.iter().enumerate() {
            let want = if !s.enforce || !alone.allowed {
                all.states[i]
            } else {
                alone.states[i]
            };
            prop_assert_eq!(outcome.states[i], want, "slot {}", i);
        }
        for (n, item) in items.iter().enumerate() {
            let answer = outcome.answers[n];
            prop_assert_eq!(answer.allowed, outcome.allowed);
            if answer.shadow_refused {
                prop_assert!(!shadowed[item.slot].enforce);
                prop_assert!(!all.allowed);
                prop_assert_ne!(all.answers[n].retry_after, Some(Duration::ZERO));
            }
        }
    }
}
