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
        limits: limits(refill_rate, burst_limit),
        state,
    }
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

#[test]
fn a_refused_check_takes_nothing_and_says_when_to_retry() {
    let state = KeyState {
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
            tokens: 1.0,
            last_refill: at(0.0),
        }),
    );
    let refused = check(&[user, tenant], &[item(0, 3.0), item(1, 3.0)], at(0.0));
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
    let outcome = check(&[key], &[item(0, 6.0), item(0, 4.0)], at(0.0));
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
            let outcome = check(&[KeySlot { limits, state }], &[item(0, *tokens)], now);
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
