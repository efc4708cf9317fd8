//! The local bucket, scripted second by second through the situations
//! CockroachDB's client tests cover (throttling, fallback, fallback while
//! throttled, debt, oversized requests, low tokens, no tokens, consumption
//! reporting, trickle anticipation), plus a closed loop of three pods
//! against the real global bucket for a virtual minute.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::global_bucket::{self, BucketRow, BucketRows, GlobalBucketConfig, Limits};

const EPS: f64 = 1e-6;

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

/// No initial allowance: a bucket holds what it was granted.
fn config() -> LocalBucketConfig {
    LocalBucketConfig {
        initial_tokens: 0.0,
        buffer_tokens: 100.0,
        ..LocalBucketConfig::default()
    }
}

/// An initial allowance of 1 000 tokens.
fn with_allowance() -> LocalBucketConfig {
    LocalBucketConfig {
        initial_tokens: 1000.0,
        ..config()
    }
}

fn bucket(config: LocalBucketConfig) -> LocalBucket {
    LocalBucket::new(config, 1, b"lease-1".to_vec(), at(0.0)).expect("valid config")
}

fn immediate(tokens: f64) -> Grant {
    Grant {
        granted_tokens: tokens,
        fallback_rate: 50.0,
        fallback_charged: ALL_CHARGED,
        ..Grant::default()
    }
}

/// A grant that does not say what it charged: every fallback token the
/// request carried counts as charged.
const ALL_CHARGED: Option<f64> = None;

fn trickle(tokens: f64, secs: f64, cap: f64) -> Grant {
    Grant {
        granted_tokens: tokens,
        trickle_duration: Duration::from_secs_f64(secs),
        max_burst_tokens: cap,
        fallback_rate: 50.0,
        fallback_charged: ALL_CHARGED,
        initial_allowance: None,
    }
}

fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 1e-6 * expected.abs().max(1.0),
        "expected {expected}, got {actual}"
    );
}

/// Sends the first request and answers it with `grant` at `t`.
fn started(grant: Grant, t: f64) -> LocalBucket {
    let mut b = bucket(config());
    let first = b.poll(at(0.0)).request.expect("first request at once");
    assert!(b.on_response(first.seq, &grant, at(t)));
    b
}

fn queued(admission: Admission) -> WaiterId {
    match admission {
        Admission::Queued(id) => id,
        other => panic!("expected to queue, got {other:?}"),
    }
}

#[test]
fn the_initial_allowance_is_usable_before_any_answer_and_what_was_used_is_charged() {
    let mut b = bucket(with_allowance());
    assert_eq!(
        b.acquire(600.0, at(0.0)).expect("valid"),
        Admission::Admitted
    );
    let first = b.poll(at(0.0)).request.expect("first request");
    assert_eq!(first.seq, 1);
    // The allowance does not count as on hand: the 600 used and the buffer.
    assert_close(first.requested_tokens, 700.0);
    assert_close(first.consumption.request_units(), 600.0);
    assert_eq!(first.fallback_tokens, 0.0);
    let answer = Grant {
        initial_allowance: Some(25.0),
        ..immediate(700.0)
    };
    assert!(b.on_response(1, &answer, at(0.1)));
    // The 400 not used are dropped (never granted); nothing to repay.
    assert_close(b.status().tokens, 700.0);
    assert_eq!(b.status().debt, 0.0);
    assert_eq!(b.initial_allowance(), Some(25.0));
    // The 600 used are charged as fallback tokens, over no time, with the
    // next request: no earlier than the report interval asks for one.
    assert!(b.poll(at(3.0)).request.is_none());
    let next = b.poll(at(10.0)).request.expect("the report interval");
    assert_close(next.fallback_tokens, 600.0);
    assert_eq!(next.fallback_duration, Duration::ZERO);
    assert!(b.on_response(next.seq, &immediate(0.0), at(10.1)));
    b.acquire(1.0, at(20.0)).expect("valid");
    let later = b.poll(at(20.1)).request.expect("a report");
    assert_eq!(later.fallback_tokens, 0.0, "charged once");
}

#[test]
fn an_allowance_a_closed_bucket_used_goes_with_its_last_request() {
    let mut b = bucket(with_allowance());
    b.acquire(30.0, at(0.0)).expect("valid");
    let first = b.poll(at(0.0)).request.expect("first request");
    assert!(b.on_response(first.seq, &immediate(0.0), at(0.1)));
    b.close();
    let last = b.poll(at(0.2)).request.expect("the final request");
    assert_close(last.fallback_tokens, 30.0);
    assert!(b.on_response(last.seq, &immediate(0.0), at(0.3)));
    assert!(b.is_finished());
}

#[test]
fn a_pod_that_knows_nothing_starts_small() {
    let b = bucket(LocalBucketConfig::default());
    assert_close(b.status().tokens, 10.0);
    assert_eq!(DEFAULT_INITIAL_TOKENS, 10.0);
    assert_eq!(b.initial_allowance(), None);
}

#[test]
fn throttling_delivers_a_trickle_at_its_rate() {
    let mut b = started(trickle(1000.0, 10.0, 500.0), 0.0);
    b.poll(at(2.0));
    assert_close(b.status().tokens, 200.0); // 2 s of 100/s trickle
    let id = queued(b.acquire(300.0, at(2.0)).expect("valid"));
    let outcome = b.poll(at(2.5));
    assert!(outcome.admitted.is_empty());
    let wake = outcome.wake_at.expect("wakes for the waiter");
    assert!(wake <= at(3.01), "wakes when 300 are there, got {wake:?}");
    assert_eq!(b.poll(at(3.0)).admitted, vec![id]);
    assert_close(b.status().tokens, 0.0);
    assert_close(b.status().trickle_rate, 100.0);
}

#[test]
fn unused_trickle_tokens_beyond_max_burst_are_discarded() {
    let mut b = started(trickle(1000.0, 10.0, 150.0), 0.0);
    // Nothing polls for 6 s: 600 arrive, 150 are kept.
    let request = b
        .poll(at(6.0))
        .request
        .expect("the trickle outran the pod's use");
    assert_close(b.status().discarded_tokens, 450.0);
    // The 400 still to come go back, and what it holds beyond its buffer.
    assert_close(request.returned_tokens, 400.0 + 50.0);
}

#[test]
fn a_trickle_that_outruns_the_pods_use_is_ended_and_its_rest_given_back() {
    // 100/s for 10 s, at most 150 held; the pod uses nothing.
    let mut b = started(trickle(1000.0, 10.0, 150.0), 0.0);
    assert!(
        b.poll(at(1.0)).request.is_none(),
        "100 of 150: not full yet"
    );
    let request = b
        .poll(at(2.0))
        .request
        .expect("a full bucket nobody uses: the trickle is ended");
    // The 800 still to come go back, and what it holds beyond its buffer.
    assert_close(request.returned_tokens, 800.0 + 50.0);
    assert_close(request.held_tokens, 100.0);
    assert_eq!(request.requested_tokens, 0.0);
    assert_eq!(b.status().trickle_rate, 0.0);
    assert!(b.on_response(request.seq, &immediate(0.0), at(2.1)));
    b.poll(at(5.0));
    assert_close(b.status().tokens, 100.0);
}

#[test]
fn a_trickle_the_pod_uses_as_it_comes_runs_to_its_end() {
    let mut b = started(trickle(1000.0, 10.0, 150.0), 0.0);
    for s in 1..=8 {
        let t = f64::from(s);
        assert_eq!(b.acquire(100.0, at(t)).expect("valid"), Admission::Admitted);
        let request = b.poll(at(t)).request;
        assert!(request.is_none(), "at {t} s: {request:?}");
    }
    assert_close(b.status().trickle_rate, 100.0);
}

#[test]
fn trickle_anticipation_asks_one_second_before_the_end_and_folds_the_rest() {
    let mut b = started(trickle(1000.0, 10.0, 2000.0), 0.0);
    // Steady usage of 100/s, all admitted from the trickle.
    for s in 1..=8 {
        let t = f64::from(s);
        b.acquire(100.0, at(t)).expect("valid");
        let outcome = b.poll(at(t));
        assert!(
            outcome.request.is_none(),
            "no request before anticipation, at {t}"
        );
    }
    let outcome = b.poll(at(9.0));
    let second = outcome.request.expect("asks 1 s before the trickle ends");
    assert_eq!(second.seq, 2);
    // Answered at 9.5 with a new trickle: the 50 tokens still due fold in.
    assert!(b.on_response(2, &trickle(1000.0, 10.0, 2000.0), at(9.5)));
    assert_close(b.status().trickle_rate, 105.0);
}

#[test]
fn a_trickles_rest_folded_into_a_grant_made_at_once_is_reported() {
    let mut b = started(trickle(1000.0, 10.0, 2000.0), 0.0);
    for s in 1..=8 {
        let t = f64::from(s);
        b.acquire(100.0, at(t)).expect("valid");
        assert!(b.poll(at(t)).request.is_none());
    }
    let second = b
        .poll(at(9.0))
        .request
        .expect("asks 1 s before the trickle ends");
    // Answered at once: the 50 still due arrive with it, and the server,
    // which counts only what it granted, learns of them from a report.
    assert!(b.on_response(second.seq, &immediate(1000.0), at(9.5)));
    let report = b.poll(at(9.5)).request.expect("reports what it now holds");
    // 150 on hand at 9.5 (900 delivered, 800 used), 1 000 granted, 50 folded.
    assert_close(
        report.held_tokens + report.returned_tokens,
        150.0 + 1000.0 + 50.0,
    );
    assert!(b.on_response(report.seq, &immediate(0.0), at(9.6)));
    assert!(b.poll(at(9.7)).request.is_none());
}

#[test]
fn a_pod_holding_what_a_trickle_delivered_reports_it_when_the_trickle_ends() {
    // 100/s for 2 s, far below the cap; the pod uses none of it.
    let mut b = started(trickle(200.0, 2.0, 1000.0), 0.0);
    assert!(b.poll(at(1.0)).request.is_none());
    let report = b
        .poll(at(2.0))
        .request
        .expect("the trickle ended: a report");
    assert_close(report.held_tokens + report.returned_tokens, 200.0);
    assert_eq!(report.requested_tokens, 0.0);
    assert!(b.on_response(report.seq, &immediate(0.0), at(2.1)));
    assert!(b.poll(at(3.0)).request.is_none());
}

#[test]
fn debt_is_paid_over_two_seconds_without_stalling() {
    let mut b = started(immediate(2000.0), 0.0);
    b.poll(at(2.0)); // the grant, nothing else
    assert_close(b.status().tokens, 2000.0);
    b.charge_after(&Consumption::from_request_units(1000.0), at(2.0))
        .expect("valid");
    // Half the debt is paid after one second; work still runs meanwhile.
    b.poll(at(3.0));
    assert_close(b.status().tokens, 1500.0);
    assert_close(b.status().debt, 500.0);
    assert_eq!(
        b.acquire(1400.0, at(3.0)).expect("valid"),
        Admission::Admitted
    );
    b.poll(at(4.0));
    assert_close(b.status().tokens, -400.0);
    assert_eq!(b.status().debt, 0.0);
    // In debt now: the next acquisition waits for tokens.
    assert!(matches!(
        b.acquire(1.0, at(4.0)).expect("valid"),
        Admission::Queued(_)
    ));
}

#[test]
fn a_request_larger_than_the_bucket_can_hold_runs_into_debt() {
    let mut b = started(trickle(2000.0, 20.0, 200.0), 0.0);
    // 200 on hand at 2 s (the cap). Admitted at once: the bucket holds all
    // a trickle with cap 200 ever can.
    assert_eq!(
        b.acquire(1000.0, at(2.0)).expect("valid"),
        Admission::Admitted
    );
    assert_close(b.status().tokens, -800.0);
    let small = queued(b.acquire(1.0, at(2.0)).expect("valid"));
    assert!(b.poll(at(10.0)).admitted.is_empty());
    // 8.01 s of 100/s pays the 800 back and the 1 for the next one.
    assert_eq!(b.poll(at(10.02)).admitted, vec![small]);
}

#[test]
fn low_tokens_trigger_a_request_sized_for_one_period() {
    let mut b = started(immediate(3000.0), 0.0);
    b.poll(at(2.0));
    assert_close(b.status().tokens, 3000.0);
    // 400 tokens a second: plenty on hand, no request until under 1 s left.
    let mut t = 2.0;
    let mut asked = None;
    while t < 12.0 {
        t += 0.25;
        assert_eq!(b.acquire(100.0, at(t)).expect("valid"), Admission::Admitted);
        if let Some(request) = b.poll(at(t)).request {
            asked = Some((t, request));
            break;
        }
    }
    let (when, request) = asked.expect("asks before running out");
    let left = b.status().tokens;
    assert!(left > 0.0, "asked before running out, {left} left");
    assert!(left < 400.0 + EPS, "asked with < 1 s of usage left: {left}");
    assert!(when > 8.0, "not asked early: {when}");
    // One period of usage (≈400/s × 10 s) plus the buffer, less what is on hand.
    let usage = b.status().usage_rate;
    assert!((300.0..=400.0).contains(&usage), "usage {usage}");
    assert_close(request.requested_tokens, usage * 10.0 + 100.0 - left);
}

/// The buffer is at most the pod's part of what its tenant's bucket holds
/// (the server's `initial_allowance`); an idle pod gives back what it holds
/// beyond a period of its usage and that buffer, with its next report, and
/// every request says what the pod still holds.
#[test]
fn an_idle_pod_gives_back_what_it_holds_beyond_its_part_and_says_what_it_holds() {
    let mut b = bucket(config());
    let first = b.poll(at(0.0)).request.expect("first request");
    assert_eq!(first.held_tokens, 0.0, "holds nothing yet");
    let grant = Grant {
        initial_allowance: Some(20.0),
        ..immediate(300.0)
    };
    assert!(b.on_response(first.seq, &grant, at(0.0)));
    assert_eq!(b.acquire(1.0, at(1.0)).expect("valid"), Admission::Admitted);
    // The consumption is reported within the report interval.
    let report = (1..=60)
        .find_map(|s| b.poll(at(f64::from(s))).request)
        .expect("a report");
    let usage = b.status().usage_rate;
    let want = usage * 10.0 + 20.0;
    assert_close(report.held_tokens, want);
    assert_close(report.returned_tokens, 299.0 - want);
    assert_close(b.status().tokens, want);
    assert_eq!(report.requested_tokens, 0.0, "it asks for nothing");
    // A pod that was never told its part keeps its whole buffer.
    let mut alone = started(immediate(300.0), 0.0);
    assert_eq!(
        alone.acquire(1.0, at(1.0)).expect("valid"),
        Admission::Admitted
    );
    let report = (1..=60)
        .find_map(|s| alone.poll(at(f64::from(s))).request)
        .expect("a report");
    assert!(report.returned_tokens > 150.0, "{report:?}");
    assert!(report.held_tokens >= 100.0, "{report:?}");
}

#[test]
fn no_tokens_means_asking_again_after_a_pause_not_in_a_loop() {
    let mut b = bucket(config());
    let first = b.poll(at(0.0)).request.expect("first request");
    b.on_response(first.seq, &immediate(1000.0), at(0.0));
    b.poll(at(2.0));
    // Use everything, then ask: the server has nothing (a zero grant).
    assert_eq!(
        b.acquire(1000.0, at(2.0)).expect("valid"),
        Admission::Admitted
    );
    let id = queued(b.acquire(10.0, at(2.0)).expect("valid"));
    let second = b.poll(at(2.0)).request.expect("asks for the waiter");
    b.on_response(second.seq, &immediate(0.0), at(2.0));
    assert!(
        b.poll(at(2.5)).request.is_none(),
        "pauses after a zero grant"
    );
    let third = b.poll(at(3.0)).request.expect("asks again after the pause");
    assert_eq!(third.seq, 3);
    b.on_response(third.seq, &immediate(50.0), at(3.0));
    assert_eq!(b.poll(at(3.0)).admitted, vec![id]);
}

#[test]
fn fallback_runs_at_the_servers_rate_after_a_second_without_answer() {
    let mut b = started(immediate(100.0), 0.0);
    b.poll(at(2.0));
    assert_close(b.status().tokens, 100.0);
    assert_eq!(
        b.acquire(100.0, at(2.0)).expect("valid"),
        Admission::Admitted
    );
    let id = queued(b.acquire(30.0, at(2.0)).expect("valid"));
    let request = b.poll(at(2.0)).request.expect("asks");
    // No answer. Nothing for the first second…
    assert!(b.poll(at(2.9)).admitted.is_empty());
    assert!(!b.status().fallback_active);
    // …then 50 tokens/s (the last grant's fallback rate).
    b.poll(at(3.0));
    assert!(b.status().fallback_active);
    assert_eq!(b.poll(at(3.61)).admitted, vec![id]);
    // The server comes back: the answer ends fallback, and the next request
    // has the tenant's bucket charged for what fallback gave (1 s at 50/s),
    // with since when (3 s: 2.1 s before), so the server can pay it from
    // refill it lost meanwhile. The pod owes nothing itself.
    let given = b.status().fallback_tokens;
    assert!(given > 29.0, "fallback gave {given}");
    assert!(b.on_response(request.seq, &immediate(0.0), at(4.0)));
    assert!(!b.status().fallback_active);
    assert_close(b.status().fallback_tokens, 50.0);
    assert_close(b.status().debt, 0.0);
    b.acquire(10.0, at(4.0)).expect("valid");
    let next = b.poll(at(5.1)).request.expect("asks to be charged");
    assert_close(next.fallback_tokens, 50.0);
    assert_eq!(next.fallback_duration, Duration::from_millis(2100));
    // Once charged, a request carries no fallback.
    b.on_response(next.seq, &immediate(next.requested_tokens), at(5.2));
    b.acquire(b.status().tokens, at(5.2)).expect("valid");
    let after = b.poll(at(6.5)).request.expect("asks again");
    assert_eq!(
        (after.fallback_tokens, after.fallback_duration),
        (0.0, Duration::ZERO)
    );
}

#[test]
fn fallback_while_throttled_takes_over_when_the_trickle_ends() {
    let mut b = started(trickle(1000.0, 10.0, 1000.0), 0.0);
    b.poll(at(2.0));
    // Use everything as it arrives.
    let mut t = 2.0;
    while t < 8.5 {
        t += 0.5;
        b.acquire(50.0, at(t)).expect("valid");
        assert!(b.poll(at(t)).request.is_none(), "the trickle covers {t}");
    }
    let request = b.poll(at(9.0)).request.expect("anticipation");
    assert_eq!(request.seq, 2);
    // The server is gone. The trickle runs out at 10, fallback starts at 10
    // (1 s after sending) at the last grant's 50/s.
    b.poll(at(10.0));
    assert!(b.status().fallback_active);
    let left = b.status().tokens;
    assert_eq!(
        b.acquire(left, at(10.0)).expect("valid"),
        Admission::Admitted
    );
    b.poll(at(10.5));
    assert_close(b.status().tokens, 25.0);
    // A retry of the same request goes out after a failure and its backoff.
    assert!(b.on_failure(2, at(10.5), 0.0, None));
    assert!(b.poll(at(10.52)).request.is_none());
    let retry = b.poll(at(10.6)).request.expect("retried after backoff");
    // The retry repeats the request, and carries the fallback used since
    // (0.6 s at 50/s), with since when.
    assert_close(retry.fallback_tokens, 30.0);
    assert_eq!(retry.fallback_duration, Duration::from_millis(600));
    assert_eq!(
        TokenBucketRequest {
            fallback_tokens: 0.0,
            fallback_duration: Duration::ZERO,
            ..retry
        },
        request,
        "otherwise a retry repeats the request exactly"
    );
}

/// A pod whose request went unanswered through an outage: its fallback so
/// far goes with the retry, so a bucket the first attempt never reached is
/// charged before it grants; a retry answered with an earlier attempt's
/// grant leaves the rest to charge, once.
#[test]
fn a_retry_carries_the_fallback_used_since_and_each_token_is_charged_once() {
    let run = |charged_by_answer: Option<f64>| {
        let mut b = started(immediate(100.0), 0.0);
        b.poll(at(2.0));
        b.acquire(100.0, at(2.0)).expect("valid");
        queued(b.acquire(30.0, at(2.0)).expect("valid"));
        let request = b.poll(at(2.0)).request.expect("asks");
        assert_close(request.fallback_tokens, 0.0);
        // No answer: fallback from 3 s at 50/s, used as it comes.
        let mut t = 3.0;
        while t < 5.0 {
            t += 0.25;
            b.poll(at(t));
            let held = b.status().tokens;
            b.acquire(held, at(t)).expect("valid");
        }
        assert!(b.on_failure(request.seq, at(5.0), 0.0, None));
        let retry = b.poll(at(5.2)).request.expect("retry");
        assert_eq!(retry.seq, request.seq);
        let carried = retry.fallback_tokens;
        assert!(carried > 90.0, "the retry carries {carried}");
        let grant = Grant {
            fallback_charged: Some(charged_by_answer.unwrap_or(carried)),
            ..immediate(10.0)
        };
        assert!(b.on_response(retry.seq, &grant, at(5.2)));
        b.acquire(b.status().tokens + 5.0, at(5.2)).expect("valid");
        let next = b.poll(at(6.5)).request.expect("asks again");
        (carried, next.fallback_tokens, b.status().fallback_tokens)
    };
    // The retry was applied: everything it carried is charged, and the
    // next request carries nothing more.
    let (carried, next, used) = run(None);
    assert_close(next, 0.0);
    assert_close(used, carried);
    // An earlier attempt was applied (it carried nothing): all of it is
    // charged with the next request instead.
    let (carried, next, _) = run(Some(0.0));
    assert_close(next, carried);
}

#[test]
fn consumption_is_reported_once_retries_repeat_it_and_nothing_is_lost() {
    let mut b = bucket(with_allowance());
    b.acquire(10.0, at(0.0)).expect("valid");
    b.record_counters(&Consumption {
        write_batches: 1,
        write_requests: 2,
        write_bytes: 300,
        request_unit_micros: 999_000_000, // ignored: acquiring charged the tokens
        ..Consumption::default()
    })
    .expect("valid");
    let first = b.poll(at(0.0)).request.expect("first");
    assert_close(first.consumption.request_units(), 10.0);
    assert_eq!(first.consumption.write_requests, 2);
    // Charged while the request is out: kept for the next one.
    b.charge_after(
        &Consumption {
            request_unit_micros: 5_000_000,
            cpu_micros: 15_000,
            ..Consumption::default()
        },
        at(0.5),
    )
    .expect("valid");
    b.on_failure(first.seq, at(0.5), 0.5, None);
    let retry = b.poll(at(1.0)).request.expect("retry");
    assert_eq!(retry, first);
    b.on_response(first.seq, &immediate(1000.0), at(1.0));
    // Nothing needed, but the report interval forces a report.
    assert!(b.poll(at(5.0)).request.is_none());
    let report = b
        .poll(at(10.0))
        .request
        .expect("reported within the interval");
    assert_close(report.consumption.request_units(), 5.0);
    assert_eq!(report.consumption.cpu_micros, 15_000);
    assert_close(b.status().charged_tokens, 15.0);
}

#[test]
fn answers_to_other_requests_are_ignored() {
    let mut b = bucket(config());
    let first = b.poll(at(0.0)).request.expect("first");
    assert!(!b.on_response(first.seq + 1, &immediate(5.0), at(0.1)));
    assert!(!b.on_failure(first.seq + 1, at(0.1), 0.0, None));
    assert!(b.on_response(first.seq, &immediate(5.0), at(0.1)));
    assert!(
        !b.on_response(first.seq, &immediate(5.0), at(0.2)),
        "answered once"
    );
}

#[test]
fn the_queue_is_fifo_and_cancelling_lets_the_next_through() {
    let mut b = started(immediate(0.0), 0.0);
    b.poll(at(2.0));
    assert_close(b.status().tokens, 0.0);
    let big = queued(b.acquire(500.0, at(2.0)).expect("valid"));
    let small = queued(b.acquire(5.0, at(2.0)).expect("valid"));
    let request = b.poll(at(2.0)).request.expect("asks for the queue");
    assert!(request.requested_tokens >= 505.0);
    b.on_response(request.seq, &immediate(100.0), at(2.1));
    // 100 on hand would do for the small one, but it is behind the big one.
    assert!(b.poll(at(2.1)).admitted.is_empty());
    assert!(
        !b.try_acquire(1.0, at(2.1)).expect("valid"),
        "no overtaking"
    );
    assert!(b.cancel(big));
    assert!(!b.cancel(big));
    assert_eq!(b.poll(at(2.1)).admitted, vec![small]);
    assert_close(b.status().tokens, 95.0);
}

#[test]
fn the_backlog_term_grows_with_the_age_of_queued_work() {
    let mut b = started(immediate(0.0), 0.0);
    b.poll(at(2.0));
    let fresh = b.shares(at(2.0));
    queued(b.acquire(100.0, at(2.0)).expect("valid"));
    let young = b.shares(at(2.0));
    let old = b.shares(at(22.0));
    assert_close(young - fresh, 0.01 * 100.0);
    // 20 s old with a 10 s time scale: e² as much.
    assert_close(old - b.status().usage_rate, 0.01 * 100.0 * 2f64.exp());
    // Absurd ages keep shares finite and within what the server accepts.
    assert!(b.shares(at(1e9)) <= MAX_SHARES);
}

#[test]
fn refunds_uncharge_and_lending_charges_what_the_fast_path_used() {
    let mut b = started(immediate(2000.0), 0.0);
    b.poll(at(2.0));
    let lent = b.lend();
    assert_close(lent, 2000.0);
    assert_close(b.status().tokens, 2000.0);
    b.settle(lent - 300.0);
    assert_close(b.status().tokens, 1700.0);
    assert_close(b.status().charged_tokens, 300.0);
    b.acquire(50.0, at(2.0)).expect("valid");
    b.refund(50.0);
    assert_close(b.status().charged_tokens, 300.0);
    assert_close(b.status().tokens, 1700.0);
    // Below the low-water level of the lent tokens, a request is due.
    let low = b.low_water().expect("no request in flight, no trickle");
    assert_close(low, b.status().usage_rate - b.status().tokens);
    // Nothing is lent while somebody waits (the fast path must not overtake).
    queued(b.acquire(5000.0, at(2.0)).expect("valid"));
    assert_eq!(b.lend(), 0.0);
}

#[test]
fn giving_back_returns_only_what_no_request_has_reported_yet() {
    let mut b = started(immediate(500.0), 0.0);
    b.poll(at(3.0));
    let before = b.status();
    b.acquire(100.0, at(3.0)).expect("valid");
    assert_close(b.give_back(40.0).expect("valid"), 40.0);
    let after = b.status();
    assert_close(after.tokens, before.tokens - 60.0);
    assert_close(after.charged_tokens, before.charged_tokens + 60.0);
    assert_eq!(b.unreported().request_unit_micros, 60_000_000);
    // More than is unreported: only the unreported part comes back.
    assert_close(b.give_back(1000.0).expect("valid"), 60.0);
    assert_close(b.status().tokens, before.tokens);
    assert_close(b.status().charged_tokens, before.charged_tokens);
    assert_eq!(b.give_back(5.0).expect("valid"), 0.0);

    // Once a request carries the consumption, nothing of it comes back.
    b.acquire(30.0, at(3.0)).expect("valid");
    let report = b.poll(at(13.5)).request.expect("a report is due");
    assert_eq!(report.consumption.request_unit_micros, 30_000_000);
    assert_eq!(b.give_back(30.0).expect("valid"), 0.0);
    // What was charged after it can.
    b.acquire(7.5, at(13.5)).expect("valid");
    assert_close(b.give_back(30.0).expect("valid"), 7.5);
}

#[test]
fn giving_back_refuses_bad_amounts_and_changes_nothing() {
    let mut b = started(immediate(500.0), 0.0);
    b.acquire(10.0, at(0.5)).expect("valid");
    let before = b.status();
    for bad in [f64::NAN, f64::INFINITY, -1.0, 2e15] {
        let error = b.give_back(bad).expect_err("refused");
        assert_eq!(error.field, "tokens", "{bad}");
    }
    assert_eq!(b.status(), before);
    assert_eq!(b.give_back(0.0).expect("valid"), 0.0);
}

#[test]
fn a_refused_bucket_takes_nothing_back() {
    let mut b = bucket(config());
    let first = b.poll(at(0.0)).request.expect("first request");
    b.acquire(10.0, at(0.1)).expect("valid");
    b.on_refusal(first.seq, at(0.2))
        .expect("the request in flight");
    assert_eq!(b.give_back(10.0).expect("valid"), 0.0);
}

#[test]
fn closing_refuses_waiters_and_sends_a_final_report() {
    let mut b = started(immediate(500.0), 0.0);
    b.acquire(20.0, at(0.5)).expect("valid");
    let waiter = queued(b.acquire(1e6, at(0.5)).expect("valid"));
    b.poll(at(0.5));
    assert_eq!(b.close(), vec![waiter]);
    assert_eq!(b.acquire(1.0, at(0.6)).expect("valid"), Admission::Closed);
    // Whatever request was in flight is answered first, then the report.
    if let Some(in_flight) = b.in_flight.as_ref().map(|f| f.request.seq) {
        b.on_response(in_flight, &immediate(0.0), at(0.7));
    }
    // CPU used while shutting down is still charged and reported.
    b.charge_after(&Consumption::from_request_units(3.0), at(0.7))
        .expect("valid");
    let last = b.poll(at(0.7)).request.expect("final report");
    assert_eq!(last.requested_tokens, 0.0);
    assert_eq!(last.shares, 0.0, "leaves the refill to the others");
    // It gives back what it holds: the allowance and the grant, less the
    // work admitted, the CPU charged and the allowance it repays.
    assert_close(last.returned_tokens, 1000.0 + 500.0 - 20.0 - 3.0 - 1000.0);
    assert!(!b.is_finished());
    b.on_response(last.seq, &immediate(0.0), at(0.8));
    assert!(b.is_finished());
    assert!(b.poll(at(0.9)).request.is_none());
}

#[test]
fn a_refusal_stops_the_bucket_for_good_even_on_fallback() {
    let mut b = bucket(with_allowance());
    let first = b.poll(at(0.0)).request.expect("first request");
    // No answer for over a second: the pod runs on its fallback rate, and
    // work that does not fit waits.
    assert!(b.try_acquire(1000.0, at(0.5)).expect("valid"));
    b.poll(at(1.5));
    assert!(b.status().fallback_active);
    let waiter = queued(b.acquire(500.0, at(1.5)).expect("valid"));
    // An answer to another request changes nothing.
    assert_eq!(b.on_refusal(first.seq + 1, at(1.6)), None);
    assert!(!b.is_refused());

    assert_eq!(b.on_refusal(first.seq, at(1.6)), Some(vec![waiter]));
    assert!(b.is_refused() && b.is_finished());
    let status = b.status();
    assert!(!status.fallback_active, "off the fallback rate");
    assert_eq!((status.tokens, status.waiters), (0.0, 0));
    assert_eq!(b.acquire(1.0, at(1.7)).expect("valid"), Admission::Closed);
    assert!(!b.try_acquire(0.0, at(1.7)).expect("valid"));
    assert_eq!(b.lend(), 0.0);
    // Later, with consumption charged and time passing: nothing is sent,
    // not even a final report, and no fallback tokens arrive.
    b.charge_after(&Consumption::from_request_units(3.0), at(1.8))
        .expect("valid");
    b.close();
    for t in [2.0, 15.0, 60.0] {
        assert!(b.poll(at(t)).request.is_none(), "at {t}");
    }
    let later = b.status();
    assert!(!later.fallback_active);
    assert_eq!(later.fallback_tokens, status.fallback_tokens);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mut b = bucket(config());
    let before = b.status();
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        assert!(b.acquire(bad, at(0.0)).is_err());
        assert!(b.try_acquire(bad, at(0.0)).is_err());
    }
    let absurd = Consumption {
        request_unit_micros: u64::MAX,
        ..Consumption::default()
    };
    assert!(b.charge_after(&absurd, at(0.0)).is_err());
    assert_eq!(b.status(), before);
    let bad_config = LocalBucketConfig {
        usage_smoothing: 0.0,
        ..config()
    };
    assert_eq!(
        LocalBucket::new(bad_config, 1, b"l".to_vec(), at(0.0))
            .expect_err("bad smoothing")
            .field,
        "usage_smoothing"
    );
    assert!(LocalBucket::new(config(), 0, b"l".to_vec(), at(0.0)).is_err());
    assert!(LocalBucket::new(config(), 1, Vec::new(), at(0.0)).is_err());
}

/// Three pods with unlimited demand against the real global bucket, in
/// virtual time: what they admit over 60 s is what an ideal bucket allows.
#[test]
fn pods_against_the_global_bucket_admit_refill_times_time_plus_burst() {
    let limits = Limits {
        refill_rate: 1000.0,
        burst_limit: 5000.0,
    };
    let mut rows = BucketRows {
        head: BucketRow::new(limits, 5000.0, true, at(0.0)),
        instances: BTreeMap::new(),
    };
    let server = GlobalBucketConfig::default();
    let mut pods: Vec<LocalBucket> = (1..=3)
        .map(|i| {
            LocalBucket::new(config(), i, format!("lease-{i}").into_bytes(), at(0.0))
                .expect("valid")
        })
        .collect();
    let step = 0.01;
    let mut admitted = 0.0;
    let mut t = 0.0;
    while t < 60.0 - EPS {
        t += step;
        for pod in &mut pods {
            // Each pod wants 20 tokens per step (2000/s), far above its share.
            if pod.status().waiters == 0
                && pod.acquire(20.0, at(t)).expect("valid") == Admission::Admitted
            {
                admitted += 20.0;
            }
            let mut outcome = pod.poll(at(t));
            admitted += 20.0 * outcome.admitted.len() as f64;
            while let Some(request) = outcome.request {
                let answer = global_bucket::request(&mut rows, &request, at(t), &server)
                    .expect("valid request");
                assert!(pod.on_response(request.seq, &answer.grant, at(t)));
                outcome = pod.poll(at(t));
                admitted += 20.0 * outcome.admitted.len() as f64;
            }
        }
    }
    let ideal = 1000.0 * 60.0 + 5000.0;
    let error = (admitted - ideal) / ideal;
    assert!(
        error.abs() < 0.05,
        "admitted {admitted}, ideal {ideal}, error {:.2}%",
        error * 100.0
    );
    let charged: f64 = pods.iter().map(|p| p.status().charged_tokens).sum();
    assert_close(charged, admitted);
}

#[test]
fn an_overloaded_servers_pushback_delays_the_retry_between_one_and_two_hints() {
    let hint = Duration::from_millis(250);
    for jitter in [0.0, 0.5, 0.999] {
        let mut b = bucket(config());
        let first = b.poll(at(0.0)).request.expect("first");
        b.on_failure(first.seq, at(0.0), jitter, Some(hint));
        let earliest = hint.as_secs_f64();
        assert!(
            b.poll(at(earliest - 0.001)).request.is_none(),
            "not before the hint (jitter {jitter})"
        );
        let retry = b
            .poll(at(2.0 * earliest + 0.001))
            .request
            .expect("retried by two hints");
        assert_eq!(retry, first, "the same request, for deduplication");
    }
}

#[test]
fn an_attempt_is_given_up_after_the_pods_own_answer_times_doubled_per_failure() {
    const LONGEST: Duration = Duration::from_secs(5);
    let mut b = bucket(config());
    let first = b.poll(at(0.0)).request.expect("first");
    assert_eq!(
        b.attempt_timeout(LONGEST),
        answer_time::FIRST_ATTEMPT_TIMEOUT,
        "nothing measured yet"
    );
    // Answers in 300 ms, steadily: the wait settles at twice that.
    b.on_response(first.seq, &immediate(0.0), at(0.3));
    let mut now = 0.3;
    for _ in 0..100 {
        now += 2.0;
        b.acquire(1.0, at(now)).expect("valid");
        let Some(request) = b.poll(at(now)).request else {
            continue;
        };
        b.on_response(request.seq, &immediate(0.0), at(now + 0.3));
        now += 0.3;
    }
    let settled = b.attempt_timeout(LONGEST);
    assert!(
        (settled.as_secs_f64() - 0.6).abs() < 0.01,
        "{settled:?}: twice the answer time"
    );
    // A request whose attempts are given up: each waits twice the last,
    // and the retry is the same request.
    now += 2.0;
    b.acquire(1.0, at(now)).expect("valid");
    let request = b.poll(at(now)).request.expect("asks");
    let mut wait = b.attempt_timeout(LONGEST);
    for _ in 0..5 {
        now += wait.as_secs_f64();
        assert!(b.on_failure(request.seq, at(now), 0.0, None));
        now += 5.0; // past any backoff
        let retry = b.poll(at(now)).request.expect("retried");
        assert_eq!(retry.seq, request.seq);
        let next = b.attempt_timeout(LONGEST);
        assert_eq!(next, (wait * 2).min(LONGEST));
        wait = next;
    }
    assert_eq!(wait, LONGEST);
    // An answer ends the doubling; a slow one moves the measure only by
    // its weight.
    b.on_response(request.seq, &immediate(10.0), at(now + 0.3));
    let after = b.attempt_timeout(LONGEST);
    assert!((after.as_secs_f64() - 0.6).abs() < 0.01, "{after:?}");
    // The floor holds against answers faster than a store's tail.
    let floor = LocalBucketConfig::default().min_attempt_timeout;
    let mut fast = bucket(config());
    let request = fast.poll(at(0.0)).request.expect("first");
    fast.on_response(request.seq, &immediate(0.0), at(0.001));
    assert_eq!(fast.attempt_timeout(LONGEST), floor);
}
