//! One table-driven test per rule of the global bucket, then property tests
//! of its invariants over random request sequences.

use super::*;
use proptest::prelude::*;

const PERIOD: Duration = Duration::from_secs(10);

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn bucket(refill_rate: f64, burst_limit: f64, tokens: f64) -> BucketRows {
    BucketRows {
        head: BucketRow::new(
            Limits {
                refill_rate,
                burst_limit,
            },
            tokens,
            true,
            at(0.0),
        ),
        instances: BTreeMap::new(),
    }
}

fn req(
    instance_id: InstanceId,
    seq: u64,
    requested_tokens: f64,
    shares: f64,
) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id,
        lease: format!("lease-{instance_id}").into_bytes(),
        seq,
        requested_tokens,
        shares,
        target_request_period: PERIOD,
        consumption: Consumption::default(),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

fn serve(rows: &mut BucketRows, r: &TokenBucketRequest, now: f64) -> Grant {
    request(rows, r, at(now), &GlobalBucketConfig::default())
        .expect("request is valid")
        .grant
}

/// Instance `id` reports `shares` and asks for nothing (its request 1 at
/// time 0), so that its next request, with the same shares, is no jump.
fn register(rows: &mut BucketRows, id: InstanceId, shares: f64) {
    let g = serve(rows, &req(id, 1, 0.0, shares), 0.0);
    assert_eq!(g.granted_tokens, 0.0);
}

fn delivery_rate(g: &Grant) -> f64 {
    g.granted_tokens / g.trickle_duration.as_secs_f64()
}

fn assert_close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= 1e-6 * expected.abs().max(1.0),
        "{what}: expected {expected}, got {actual}"
    );
}

/// The whole instance list is consistent ([`BucketRows::check_whole_list`]).
fn assert_list_consistent(rows: &BucketRows) {
    if let Err(e) = rows.check_whole_list() {
        panic!("{e}");
    }
}

#[test]
fn refill_is_capped_by_the_burst_limit() {
    // (tokens before, refill rate, burst limit, from, to, tokens after)
    let cases = [
        (0.0, 10.0, 100.0, 0.0, 5.0, 50.0),
        (90.0, 10.0, 100.0, 0.0, 5.0, 100.0),
        (100.0, 10.0, 100.0, 0.0, 5.0, 100.0),
        // Set above the limit by an operator: kept, refill paused.
        (150.0, 10.0, 100.0, 0.0, 5.0, 150.0),
        // Debt is paid back by refill.
        (-50.0, 10.0, 100.0, 0.0, 3.0, -20.0),
        // No burst at all: refill only pays debt back.
        (-50.0, 10.0, 0.0, 0.0, 30.0, 0.0),
        // A clock that steps back refills nothing.
        (10.0, 10.0, 100.0, 5.0, 2.0, 10.0),
    ];
    for (before, rate, burst, from, to, after) in cases {
        let mut tenant = bucket(rate, burst, before).head;
        tenant.state.last_refill = at(from);
        tenant.state.refill(at(to), PERIOD);
        assert_close(
            tenant.state.tokens,
            after,
            &format!("{before} tokens, {from}s → {to}s"),
        );
        assert_eq!(
            tenant.state.last_refill,
            at(from.max(to)),
            "last_refill never moves back"
        );
    }
}

#[test]
fn a_bucket_with_enough_tokens_grants_at_once() {
    // (tokens, requested, tokens left)
    let cases = [(100.0, 40.0, 60.0), (100.0, 100.0, 0.0), (5.0, 0.0, 5.0)];
    for (tokens, requested, left) in cases {
        let mut rows = bucket(10.0, 1000.0, tokens);
        let g = serve(&mut rows, &req(1, 1, requested, 1.0), 0.0);
        assert_eq!(g.granted_tokens, requested);
        assert_eq!(g.trickle_duration, Duration::ZERO);
        assert_eq!(g.max_burst_tokens, 0.0);
        assert_close(rows.head.state.tokens, left, "tokens left");
    }
}

#[test]
fn a_short_bucket_grants_over_time_within_the_target_period() {
    // (tokens, requested, period s, granted, trickle s)
    let cases = [
        (0.0, 50.0, 10.0, 50.0, 5.0),
        // More than a period's refill: cut to one period.
        (0.0, 500.0, 10.0, 100.0, 10.0),
        // What the bucket holds plus the refill until the rest is covered.
        (30.0, 80.0, 10.0, 80.0, 5.0),
        (30.0, 500.0, 10.0, 130.0, 10.0),
        (0.0, 500.0, 2.0, 20.0, 2.0),
    ];
    for (tokens, requested, period, granted, trickle) in cases {
        let mut rows = bucket(10.0, 1000.0, tokens);
        register(&mut rows, 1, 1.0);
        let mut r = req(1, 2, requested, 1.0);
        r.target_request_period = Duration::from_secs_f64(period);
        let g = serve(&mut rows, &r, 0.0);
        let what = format!("{tokens} tokens, {requested} requested over {period}s");
        assert_close(g.granted_tokens, granted, &what);
        assert_close(g.trickle_duration.as_secs_f64(), trickle, &what);
        assert!(g.trickle_duration <= r.target_request_period);
        assert_close(rows.head.state.tokens, tokens - granted, &what);
        // One pod: its part of the burst is the whole burst.
        assert_close(g.max_burst_tokens, 1000.0, &what);
    }
}

#[test]
fn the_refill_rate_is_split_by_shares() {
    // (shares of instance 1, shares of instance 2, expected rate 1, rate 2)
    let cases = [
        (1.0, 3.0, 25.0, 75.0),
        (1.0, 1.0, 50.0, 50.0),
        (0.0, 2.0, 0.0, 100.0),
        // No shares anywhere: an even split.
        (0.0, 0.0, 50.0, 50.0),
    ];
    for (s1, s2, r1, r2) in cases {
        let mut rows = bucket(100.0, 1000.0, 0.0);
        // Both register their shares, then both ask for more than a period's worth.
        serve(&mut rows, &req(1, 1, 0.0, s1), 0.0);
        serve(&mut rows, &req(2, 1, 0.0, s2), 0.0);
        let g1 = serve(&mut rows, &req(1, 2, 1e6, s1), 0.0);
        let g2 = serve(&mut rows, &req(2, 2, 1e6, s2), 0.0);
        let what = format!("shares {s1}:{s2}");
        if r1 > 0.0 {
            assert_close(delivery_rate(&g1), r1, &what);
        } else {
            assert_eq!(g1.granted_tokens, 0.0, "{what}");
        }
        assert_close(delivery_rate(&g2), r2, &what);
    }
}

#[test]
fn systematic_debt_lowers_the_rate_handed_out() {
    // Refill 10/s, period 10 s. Debt up to what trickles have yet to deliver
    // (`committed`), and never more than one period of refill (100), is
    // expected; the rest is paid back over the next period.
    // (debt, committed, expected delivery rate for a lone pod)
    let cases = [
        (0.0, 0.0, 10.0),
        (100.0, 100.0, 10.0),
        (100.0, 50.0, 5.0),
        (100.0, 0.0, 0.0),
        (50.0, 0.0, 5.0),
        (150.0, 150.0, 5.0),
        (150.0, 1000.0, 5.0),
        (190.0, 190.0, 1.0),
        (200.0, 200.0, 0.0),
        (500.0, 500.0, 0.0),
    ];
    for (debt, committed, rate) in cases {
        let mut rows = bucket(10.0, 1000.0, -debt);
        rows.head.state.committed_tokens = committed;
        register(&mut rows, 1, 1.0);
        let g = serve(&mut rows, &req(1, 2, 1e6, 1.0), 0.0);
        let what = format!("debt {debt}, committed {committed}");
        if rate > 0.0 {
            assert_close(delivery_rate(&g), rate, &what);
            assert_eq!(g.trickle_duration, PERIOD, "{what}");
        } else {
            assert_eq!(g.granted_tokens, 0.0, "{what}");
        }
        // Grants never take the bucket deeper than two periods of refill.
        assert!(
            rows.head.state.tokens >= (-debt).min(-200.0) - 1e-9,
            "{what}: debt bound"
        );
    }
}

#[test]
fn commitments_follow_the_trickles_handed_out() {
    // An empty bucket, refill 10/s: a trickle grant commits its tokens.
    let mut rows = bucket(10.0, 1000.0, 0.0);
    register(&mut rows, 1, 1.0);
    let g = serve(&mut rows, &req(1, 2, 1e6, 1.0), 0.0);
    assert_close(g.granted_tokens, 100.0, "one period of refill");
    assert_close(rows.head.state.committed_tokens, 100.0, "committed");
    assert_close(rows.head.state.committed_rate, 10.0, "committed rate");
    // Four seconds later 40 were delivered; the pod asks again and folds
    // the 60 left into its new trickle, so they stay committed.
    let g2 = serve(&mut rows, &req(1, 3, 1e6, 1.0), 4.0);
    assert_close(
        rows.head.state.committed_tokens,
        60.0 + g2.granted_tokens,
        "fold",
    );
    assert_close(
        rows.head.state.committed_rate,
        (60.0 + g2.granted_tokens) / g2.trickle_duration.as_secs_f64(),
        "rate after fold",
    );
    // Once everything is delivered nothing is committed any more.
    rows.head
        .state
        .refill(Timestamp::from_secs_f64(100.0), PERIOD);
    assert_eq!(rows.head.state.committed_tokens, 0.0);
}

#[test]
fn bucket_level_ema_policy_grants_a_period_minus_the_smoothed_debt() {
    let config = GlobalBucketConfig {
        policy: GrantPolicy::BucketLevelEma,
        ..GlobalBucketConfig::default()
    };
    // (tokens = average, requested, granted)
    let cases = [
        // Enough tokens: at once, like every policy.
        (100.0, 50.0, 50.0),
        // Empty bucket: one period of refill.
        (0.0, 500.0, 100.0),
        // Positive level: what is there plus a period of refill.
        (20.0, 500.0, 120.0),
        // Debt of 40 (smoothed 40): 100 - 40 allowed.
        (-40.0, 500.0, 60.0),
        // Debt of 140: allowance 100 - 140 < 0, nothing.
        (-140.0, 500.0, 0.0),
    ];
    for (tokens, requested, granted) in cases {
        let mut rows = bucket(10.0, 1000.0, tokens);
        let g = request(&mut rows, &req(1, 1, requested, 1.0), at(0.0), &config)
            .expect("valid")
            .grant;
        let what = format!("{tokens} tokens, {requested} requested");
        assert_close(g.granted_tokens, granted, &what);
        assert!(
            rows.head.state.tokens >= -150.0 - 1e-9,
            "{what}: 1.5 periods of debt at most"
        );
    }
    // The average follows the level with factor 0.25.
    let mut rows = bucket(10.0, 1000.0, 100.0);
    rows.head.state.tokens_avg = 0.0;
    request(&mut rows, &req(1, 1, 0.0, 1.0), at(0.0), &config).expect("valid");
    assert_close(rows.head.state.tokens_avg, 25.0, "EMA");
}

#[test]
fn the_first_of_pods_asking_at_once_takes_its_part_of_what_the_bucket_holds_not_all() {
    // Two pods with equal shares; the bucket holds 1000, refills 100/s.
    let mut rows = bucket(100.0, 1000.0, 1000.0);
    register(&mut rows, 2, 1.0);
    register(&mut rows, 1, 1.0);
    let a = serve(&mut rows, &req(1, 2, 2000.0, 1.0), 0.0);
    // Its half of what the bucket holds, and half the refill over a short
    // trickle (it was held back to its part, so it asks again soon).
    assert_close(a.granted_tokens, 500.0 + 50.0 * 2.5, "first pod");
    assert_eq!(a.trickle_duration, PERIOD / 4);
    assert_close(
        rows.head.state.committed_tokens,
        125.0,
        "only refill is committed",
    );
    let b = serve(&mut rows, &req(2, 2, 2000.0, 1.0), 0.0);
    // The second finds the other half still there (the tokens the bucket
    // held are handed out once, not excused again).
    assert!(
        b.granted_tokens >= 250.0 + 50.0 * 2.5,
        "second pod: {}",
        b.granted_tokens
    );
    // Both short trickles' refill is committed; nothing was taken twice.
    assert_close(rows.head.state.committed_tokens, 250.0, "committed");
    assert_close(
        a.granted_tokens + b.granted_tokens,
        1000.0 - rows.head.state.tokens,
        "everything granted left the bucket, once",
    );
}

/// Pods asking at once for more than a bucket holds each take their part
/// of it, whichever asks first: what a pod was granted at once counts as
/// held, so the parts of the later pods are of the same whole.
#[test]
fn pods_asking_at_once_get_equal_parts_of_what_the_bucket_holds_in_any_order() {
    for order in [[1, 2, 3, 4], [4, 3, 2, 1], [2, 4, 1, 3]] {
        let mut rows = bucket(10.0, 1000.0, 1000.0);
        for id in 1..=4 {
            register(&mut rows, id, 1.0);
        }
        let mut got = BTreeMap::new();
        for id in order {
            // Each asks for its part: 250 of the 1 000 the bucket holds.
            let g = serve(&mut rows, &req(id, 2, 250.0, 1.0), 0.0);
            got.insert(id, g);
        }
        for (id, g) in &got {
            assert_close(g.granted_tokens, 250.0, &format!("pod {id} in {order:?}"));
            assert_eq!(g.trickle_duration, Duration::ZERO, "at once");
        }
        assert_close(rows.head.state.held_tokens, 1000.0, "all of it is held");
        // Asking for more than its part, a pod gets none of what is left
        // at once: the others hold theirs.
        let more = serve(&mut rows, &req(1, 3, 500.0, 1.0), 0.0);
        assert!(more.trickle_duration > Duration::ZERO, "{more:?}");
    }
}

/// While demand climbs, pods use what they hold faster than their shares
/// (a moving average) say. The parts count it as used at twice their
/// shares, so pods asking at once whose use doubled get equal parts of
/// what the bucket holds whichever asks first; at their shares' rate the
/// others would seem to hold 80 each where they hold 60, and the first to
/// ask would take 15 of the last one's part.
#[test]
fn pods_asking_at_once_as_their_use_climbs_get_equal_parts_in_any_order() {
    for order in [[1, 2, 3, 4], [4, 3, 2, 1], [3, 1, 4, 2]] {
        // No refill: what each takes is what the bucket held.
        let mut rows = bucket(0.0, 10_000.0, 1000.0);
        for id in 1..=4 {
            register(&mut rows, id, 10.0);
        }
        for id in 1..=4 {
            let g = serve(&mut rows, &req(id, 2, 100.0, 10.0), 0.0);
            assert_close(g.granted_tokens, 100.0, "a grant at once");
        }
        // Two seconds later each has used 40 of its 100 (20/s, twice its
        // shares) and asks for far more than the 600 left.
        let mut got = BTreeMap::new();
        for id in order {
            let ask = TokenBucketRequest {
                held_tokens: 60.0,
                ..req(id, 3, 1e6, 10.0)
            };
            got.insert(id, serve(&mut rows, &ask, 2.0).granted_tokens);
        }
        for (id, granted) in &got {
            assert_close(*granted, 150.0, &format!("pod {id} in {order:?}"));
        }
        rows.check_whole_list().expect("the rows agree");
    }
}

/// What a pod holds is counted as used at its shares per second until it
/// reports again; each report replaces the pod's count exactly, and a pod
/// removed for silence takes its count with it.
#[test]
fn what_pods_hold_is_used_at_their_rate_and_replaced_by_each_report() {
    let mut rows = bucket(10.0, 100.0, 100.0);
    let g = serve(&mut rows, &req(1, 1, 100.0, 2.0), 0.0);
    assert_close(g.granted_tokens, 100.0, "the whole bucket, at once");
    assert_close(rows.head.state.held_at(at(10.0)), 80.0, "used at 2/s");
    // The bucket refills only to what the pod is not counted as holding.
    assert_close(rows.head.state.tokens_at(at(10.0)), 20.0, "level at 10 s");
    // It reports holding 50 at 10 s: the refill up to then stops there.
    let report = TokenBucketRequest {
        held_tokens: 50.0,
        ..req(1, 2, 0.0, 2.0)
    };
    serve(&mut rows, &report, 10.0);
    assert_close(rows.head.state.held_tokens, 50.0, "its report");
    assert_close(
        rows.head.state.tokens,
        50.0,
        "bucket and pod hold the burst",
    );
    // A second pod holding nothing changes nothing.
    serve(&mut rows, &req(2, 1, 0.0, 1.0), 10.0);
    assert_close(rows.head.state.held_tokens, 50.0, "unchanged");
    // Pod 1 falls silent; pod 2's request at 80 s removes it, and its
    // count (run dry at 35 s by its rate) goes with it: nothing is left.
    serve(&mut rows, &req(2, 2, 0.0, 1.0), 80.0);
    assert!(!rows.instances.contains_key(&1), "pod 1 removed");
    assert_close(rows.head.state.held_tokens, 0.0, "nothing held");
    assert_close(rows.head.state.held_use_rate, 0.0, "no rate left");
    assert_close(rows.head.state.tokens, 100.0, "refilled to the burst");
}

#[test]
fn a_pod_renewing_early_gets_one_period_of_its_rate_not_more() {
    // One pod alone, saturated: each renewal one second before its trickle
    // ends must top it up to a period at its rate, not add a whole period.
    let mut rows = bucket(100.0, 0.0, 0.0);
    register(&mut rows, 1, 1.0);
    let first = serve(&mut rows, &req(1, 2, 5000.0, 1.0), 0.0);
    assert_close(first.granted_tokens, 1000.0, "a period of refill");
    let renewed = serve(&mut rows, &req(1, 3, 5000.0, 1.0), 9.0);
    // 100 tokens of the first trickle are still due; they count.
    assert_close(renewed.granted_tokens, 900.0, "topped up to a period");
    assert_close(
        rows.head.state.committed_rate,
        100.0,
        "delivered at the refill rate",
    );
}

#[test]
fn greedy_policy_hands_out_what_the_bucket_holds_and_no_more() {
    let config = GlobalBucketConfig {
        policy: GrantPolicy::Greedy,
        ..GlobalBucketConfig::default()
    };
    // (tokens, requested, granted)
    let cases = [
        (100.0, 50.0, 50.0),
        (100.0, 500.0, 100.0),
        (0.0, 500.0, 0.0),
        (-40.0, 500.0, 0.0),
    ];
    for (tokens, requested, granted) in cases {
        let mut rows = bucket(10.0, 1000.0, tokens);
        let g = request(&mut rows, &req(1, 1, requested, 1.0), at(0.0), &config)
            .expect("valid")
            .grant;
        let what = format!("{tokens} tokens, {requested} requested");
        assert_close(g.granted_tokens, granted, &what);
        assert_eq!(
            g.trickle_duration,
            Duration::ZERO,
            "{what}: never a trickle"
        );
        assert_close(rows.head.state.tokens, tokens - granted, &what);
    }
}

#[test]
fn instances_form_a_sorted_circular_list() {
    // Pods arrive in any order; the list stays sorted with 0 as sentinel.
    let orders: [&[InstanceId]; 3] = [&[5, 2, 9, 7], &[1, 2, 3], &[9, 8, 7, 1]];
    for order in orders {
        let mut rows = bucket(10.0, 100.0, 100.0);
        for &id in order {
            serve(&mut rows, &req(id, 1, 1.0, 1.0), 0.0);
            assert_list_consistent(&rows);
        }
        let last = *order.iter().max().expect("non-empty");
        assert_eq!(
            rows.instances[&last].next_instance_id, 0,
            "the highest points back at 0"
        );
    }
}

#[test]
fn silent_instances_are_removed_and_their_shares_leave_the_sum() {
    // (silence of instance 2 in s, hint sent by instance 1, removed?)
    let cases = [
        (59.0, None, false),
        (61.0, None, true),
        // Instance 1 reports that the next live instance after it is 3, so
        // 2 is dead: removed after the shorter reported-dead timeout.
        (11.0, Some(3), true),
        (9.0, Some(3), false),
        // A hint that does not cover instance 2 changes nothing.
        (11.0, Some(2), false),
    ];
    for (silence, hint, removed) in cases {
        // No burst, so every grant is the pod's share of the rate.
        let mut rows = bucket(100.0, 0.0, 0.0);
        serve(&mut rows, &req(1, 1, 0.0, 1.0), 0.0);
        serve(&mut rows, &req(2, 1, 0.0, 1.0), 0.0);
        serve(&mut rows, &req(3, 1, 0.0, 1.0), 0.0);
        // Instances 1 and 3 keep talking; instance 2 goes silent.
        serve(&mut rows, &req(1, 2, 0.0, 1.0), silence - 1.0);
        serve(&mut rows, &req(3, 2, 0.0, 1.0), silence - 1.0);
        assert_eq!(
            rows.head.members.live_instances, 3,
            "nobody is silent long enough yet"
        );
        let mut r = req(1, 3, 1e6, 1.0);
        r.next_live_instance_id = hint;
        let outcome =
            request(&mut rows, &r, at(silence), &GlobalBucketConfig::default()).expect("valid");
        let what = format!("silent {silence}s, hint {hint:?}");
        assert_eq!(!rows.instances.contains_key(&2), removed, "{what}");
        assert_eq!(
            outcome.changes.removed.len(),
            usize::from(removed),
            "{what}"
        );
        assert_list_consistent(&rows);
        let survivors = if removed { 2.0 } else { 3.0 };
        assert_close(delivery_rate(&outcome.grant), 100.0 / survivors, &what);
    }
}

#[test]
fn a_lone_survivor_gets_the_whole_rate() {
    let mut rows = bucket(100.0, 0.0, 0.0);
    serve(&mut rows, &req(1, 1, 0.0, 5.0), 0.0);
    serve(&mut rows, &req(2, 1, 0.0, 15.0), 0.0);
    // Instance 2 goes silent; a minute later instance 1 asks.
    let g = serve(&mut rows, &req(1, 2, 1e6, 5.0), 61.0);
    assert!(!rows.instances.contains_key(&2));
    assert_eq!(rows.head.members.live_instances, 1);
    assert_eq!(rows.head.members.share_sum, 5.0);
    assert_close(delivery_rate(&g), 100.0, "survivor's rate");
    assert_list_consistent(&rows);
}

#[test]
fn cleanup_wraps_around_the_sentinel_and_is_bounded_per_request() {
    let config = GlobalBucketConfig {
        cleanup_window: 3,
        ..GlobalBucketConfig::default()
    };
    let mut rows = bucket(100.0, 1000.0, 0.0);
    for id in 1..=7 {
        request(&mut rows, &req(id, 1, 0.0, 1.0), at(0.0), &config).expect("valid");
    }
    // Only instance 5 stays alive; 6, 7, then 1..4 are behind it in list order.
    let mut removed = Vec::new();
    for seq in 2..=4 {
        let outcome =
            request(&mut rows, &req(5, seq, 0.0, 1.0), at(100.0), &config).expect("valid");
        assert!(outcome.changes.removed.len() <= 3, "bounded per request");
        removed.extend(outcome.changes.removed.iter().map(|i| i.instance_id));
        assert_list_consistent(&rows);
    }
    assert_eq!(removed, vec![6, 7, 1, 2, 3, 4]);
    assert_eq!(rows.instances.keys().copied().collect::<Vec<_>>(), vec![5]);
}

#[test]
fn live_instances_are_those_heard_from_within_the_timeout() {
    let config = GlobalBucketConfig::default();
    let timeout = config.inactivity_timeout.as_secs_f64();
    let mut rows = bucket(100.0, 0.0, 0.0);
    serve(&mut rows, &req(1, 1, 0.0, 1.0), 0.0);
    serve(&mut rows, &req(2, 1, 0.0, 1.0), 0.0);
    let mut last = req(3, 1, 0.0, 1.0);
    last.consumption = Consumption::from_request_units(2.0);
    serve(&mut rows, &last, 30.0);
    let instances: Vec<InstanceState> = rows.instances.values().cloned().collect();
    // (seconds, with the rows at hand, without (a listing))
    let cases = [
        (30.0, 3, 3),
        (timeout, 3, 3),
        // 1 and 2 fell silent; a listing still counts the list.
        (timeout + 1.0, 1, 3),
        (30.0 + timeout, 1, 3),
        // No request since 30 s: the bucket is idle, nobody is live.
        (30.0 + timeout + 0.001, 0, 0),
        (3600.0, 0, 0),
    ];
    for (now, with_rows, listed) in cases {
        let live = |rows_at_hand| {
            live_instances(&rows.head, rows_at_hand, at(now), config.inactivity_timeout)
        };
        assert_eq!(live(Some(instances.as_slice())), with_rows, "at {now} s");
        assert_eq!(live(None), listed, "at {now} s, listed");
    }
    // The rows stay: instance 3's last request, retried an hour later
    // by a pod that never heard the answer, is answered, not counted.
    let retry = request(&mut rows, &last, at(3600.0), &config).expect("valid");
    assert!(retry.duplicate);
    assert_eq!(rows.head.totals.consumption.request_units(), 2.0);
}

#[test]
fn a_duplicate_gets_the_first_response_and_changes_nothing() {
    // (requested, tokens) — an immediate grant and a trickle grant.
    let cases = [(40.0, 100.0), (500.0, 0.0)];
    for (requested, tokens) in cases {
        let mut rows = bucket(10.0, 1000.0, tokens);
        let mut r = req(1, 7, requested, 2.0);
        r.consumption = Consumption {
            request_unit_micros: 12_500_000,
            write_bytes: 4096,
            ..Consumption::default()
        };
        let first = request(&mut rows, &r, at(1.0), &GlobalBucketConfig::default()).expect("valid");
        assert!(!first.duplicate);
        let after_first = rows.clone();
        // The retry arrives later, when the bucket would answer differently.
        let retry = request(&mut rows, &r, at(5.0), &GlobalBucketConfig::default()).expect("valid");
        assert!(retry.duplicate);
        assert_eq!(retry.grant, first.grant, "replayed exactly");
        assert_eq!(retry.changes, RowChanges::default());
        assert_eq!(
            rows, after_first,
            "neither tokens nor consumption taken again"
        );
        assert_eq!(rows.head.totals.consumption.request_units(), 12.5);
    }
}

#[test]
fn a_late_older_request_is_refused_without_change() {
    let mut rows = bucket(10.0, 1000.0, 100.0);
    serve(&mut rows, &req(1, 5, 1.0, 1.0), 0.0);
    let before = rows.clone();
    let err = request(
        &mut rows,
        &req(1, 4, 1.0, 1.0),
        at(1.0),
        &GlobalBucketConfig::default(),
    )
    .expect_err("stale");
    assert_eq!(
        err,
        RequestError::StaleSequence {
            seq: 4,
            last_seq: 5
        }
    );
    assert_eq!(rows, before);
}

#[test]
fn a_new_lease_resets_the_sequence() {
    let mut rows = bucket(10.0, 1000.0, 100.0);
    serve(&mut rows, &req(1, 50, 10.0, 1.0), 0.0);
    // The pod restarted: new lease, sequence from 1 again.
    let mut restarted = req(1, 1, 10.0, 3.0);
    restarted.lease = b"second-incarnation".to_vec();
    restarted.consumption = Consumption::from_request_units(2.0);
    let outcome = request(
        &mut rows,
        &restarted,
        at(1.0),
        &GlobalBucketConfig::default(),
    )
    .expect("a new lease may start anywhere");
    assert!(!outcome.duplicate);
    assert_eq!(outcome.grant.granted_tokens, 10.0);
    let instance = &rows.instances[&1];
    assert_eq!(instance.lease, b"second-incarnation");
    assert_eq!(instance.seq, 1);
    assert_eq!(rows.head.members.share_sum, 3.0);
    assert_eq!(rows.head.members.live_instances, 1);
    assert_eq!(rows.head.totals.consumption.request_units(), 2.0);
}

/// A request of `instance` 1 from the incarnation with `lease`.
fn incarnation(lease: &str, seq: u64, request_units: f64) -> TokenBucketRequest {
    let mut r = req(1, seq, 5.0, 1.0);
    r.lease = lease.as_bytes().to_vec();
    r.consumption = Consumption::from_request_units(request_units);
    r
}

#[test]
fn a_late_copy_from_an_older_incarnation_is_refused_and_counts_nothing() {
    let config = GlobalBucketConfig::default();
    let mut rows = bucket(10.0, 1000.0, 1000.0);
    let a3 = incarnation("A", 3, 1.0);
    let b1 = incarnation("B", 1, 2.0);
    let first_a = request(&mut rows, &a3, at(1.0), &config).expect("A's request");
    let first_b = request(&mut rows, &b1, at(2.0), &config).expect("B takes over");
    assert_eq!(rows.head.totals.consumption.request_units(), 3.0);
    assert_ne!(first_a.grant, Grant::default());

    // The late copy of A's answered request, and a request A never got
    // answered, both arrive after B took over.
    let before = rows.clone();
    for late in [a3.clone(), incarnation("A", 4, 7.0)] {
        let err = request(&mut rows, &late, at(3.0), &config).expect_err("older incarnation");
        assert_eq!(err, RequestError::SupersededLease { instance_id: 1 });
        assert_eq!(rows, before, "nothing changed");
    }
    // A never-seen lease below B's is an older incarnation too: an attempt
    // abandoned when the pod restarted, arriving after its successor.
    let abandoned = incarnation("A0", 1, 5.0);
    let err = request(&mut rows, &abandoned, at(3.0), &config).expect_err("older incarnation");
    assert_eq!(err, RequestError::SupersededLease { instance_id: 1 });
    assert_eq!(rows, before);

    // B's own retry is still recognised as a duplicate.
    let retry = request(&mut rows, &b1, at(4.0), &config).expect("B's retry");
    assert!(retry.duplicate);
    assert_eq!(retry.grant, first_b.grant);
    assert_eq!(rows.head.totals.consumption.request_units(), 3.0);
    assert_eq!(rows.instances[&1].lease, b"B");
}

#[test]
fn a_lower_lease_takes_over_only_once_the_newer_incarnation_fell_silent() {
    let config = GlobalBucketConfig::default();
    let mut rows = bucket(10.0, 1000.0, 1000.0);
    request(&mut rows, &incarnation("B", 1, 1.0), at(0.0), &config).expect("B");
    let timeout = config.inactivity_timeout.as_secs_f64();
    let lower = incarnation("A", 1, 1.0);
    request(&mut rows, &lower, at(timeout), &config).expect_err("B still counts as live");
    let outcome = request(&mut rows, &lower, at(timeout + 0.001), &config)
        .expect("B is silent past the inactivity timeout: the id is free");
    assert!(!outcome.duplicate);
    assert_eq!(rows.instances[&1].lease, b"A");
    assert_eq!(rows.head.totals.consumption.request_units(), 2.0);
}

#[test]
fn as_of_consumed_tokens_may_be_any_value_up_to_the_total() {
    let mut rows = bucket(1.0, 1.0, 0.0);
    // Two reports of the most one report may carry.
    for seq in 1..=2 {
        let mut r = req(1, seq, 0.0, 1.0);
        r.consumption = Consumption::from_request_units(validate::MAX_REPORTED_REQUEST_UNITS);
        serve(&mut rows, &r, 0.0);
    }
    let total = rows.head.totals.consumption.request_units();
    assert_eq!(total, 2e12);
    let mut update = LimitsUpdate {
        available_tokens: 10.0,
        limits: Limits {
            refill_rate: 0.0,
            burst_limit: 10.0,
        },
        as_of: Some(at(0.0)),
        as_of_consumed_tokens: total,
        mask: LimitsMask::ALL,
    };
    reconfigure(&mut rows.head, &update, at(1.0)).expect("the total itself is valid");
    assert_eq!(rows.head.state.tokens, 10.0);
    update.as_of_consumed_tokens = total - 4.0;
    reconfigure(&mut rows.head, &update, at(1.0)).expect("below the total");
    assert_eq!(rows.head.state.tokens, 6.0);
    for beyond in [total + 1.0, 1e300, f64::MAX] {
        update.as_of_consumed_tokens = beyond;
        let err = reconfigure(&mut rows.head, &update, at(1.0)).expect_err("beyond the total");
        assert!(
            err.to_string().contains("exceeds the tenant's total"),
            "{err}"
        );
    }
}

#[test]
fn reconfiguration_corrects_for_refill_and_consumption_since_as_of() {
    // (available, refill, burst, as_of s, total consumed, as_of consumed, tokens at t=100)
    let cases = [
        // No as_of: taken as it is.
        (500.0, 10.0, 1000.0, None, 300.0, 0.0, 500.0),
        // 20 s of refill at 10/s, 50 consumed since.
        (500.0, 10.0, 1000.0, Some(80.0), 300.0, 250.0, 650.0),
        // Refill capped at the burst limit before consumption is taken off.
        (900.0, 10.0, 1000.0, Some(80.0), 300.0, 250.0, 950.0),
        // Available above the burst limit: no refill, only the consumption.
        (2000.0, 10.0, 1000.0, Some(80.0), 300.0, 250.0, 1950.0),
        // Consumption beyond the new allowance puts the bucket in debt.
        (0.0, 1.0, 100.0, Some(90.0), 300.0, 100.0, -190.0),
        // as_of a little in the future (a clock ahead): no refill.
        (500.0, 10.0, 1000.0, Some(104.0), 300.0, 300.0, 500.0),
    ];
    for (available, refill_rate, burst_limit, as_of, total, as_of_consumed, expected) in cases {
        let mut tenant = bucket(1.0, 1.0, 0.0).head;
        tenant.totals.consumption = Consumption::from_request_units(total);
        let update = LimitsUpdate {
            available_tokens: available,
            limits: Limits {
                refill_rate,
                burst_limit,
            },
            as_of: as_of.map(at),
            as_of_consumed_tokens: as_of_consumed,
            mask: LimitsMask::ALL,
        };
        reconfigure(&mut tenant, &update, at(100.0)).expect("valid");
        assert_close(tenant.state.tokens, expected, &format!("{update:?}"));
        assert_eq!(tenant.state.limits, update.limits);
        assert!(tenant.state.configured);
        assert_eq!(tenant.state.last_refill, at(100.0));
    }
}

#[test]
fn an_as_of_beyond_the_clock_skew_is_refused_without_change() {
    let mut tenant = bucket(1.0, 1.0, 7.0).head;
    let before = tenant.clone();
    let update = LimitsUpdate {
        available_tokens: 10.0,
        limits: Limits {
            refill_rate: 1.0,
            burst_limit: 10.0,
        },
        as_of: Some(at(100.0 + MAX_AS_OF_AHEAD.as_secs_f64() + 0.5)),
        as_of_consumed_tokens: 0.0,
        mask: LimitsMask::ALL,
    };
    let err = reconfigure(&mut tenant, &update, at(100.0)).expect_err("in the future");
    assert!(err.to_string().contains("as_of"), "{err}");
    assert_eq!(tenant, before);
}

#[test]
fn a_masked_update_keeps_what_it_leaves_out() {
    // 7 tokens at t=0, 1 token/s, burst 100: 17 tokens at t=10.
    let head = bucket(1.0, 100.0, 7.0).head;
    let only = |available_tokens, refill_rate, burst_limit| LimitsMask {
        available_tokens,
        refill_rate,
        burst_limit,
    };
    let update = |mask| LimitsUpdate {
        available_tokens: 50.0,
        limits: Limits {
            refill_rate: 5.0,
            burst_limit: 500.0,
        },
        as_of: None,
        as_of_consumed_tokens: 0.0,
        mask,
    };
    // (mask, tokens, refill rate, burst limit) after the update at t=10.
    let cases = [
        (only(false, true, false), 17.0, 5.0, 100.0),
        (only(false, false, true), 17.0, 1.0, 500.0),
        (only(true, false, false), 50.0, 1.0, 100.0),
        (only(false, true, true), 17.0, 5.0, 500.0),
        (LimitsMask::ALL, 50.0, 5.0, 500.0),
    ];
    for (mask, tokens, refill_rate, burst_limit) in cases {
        let mut row = head.clone();
        reconfigure(&mut row, &update(mask), at(10.0)).expect("valid");
        assert_close(row.state.tokens, tokens, &format!("{mask:?}"));
        assert_eq!(row.state.limits.refill_rate, refill_rate, "{mask:?}");
        assert_eq!(row.state.limits.burst_limit, burst_limit, "{mask:?}");
        assert!(row.state.configured);
        // The new rate counts from the update on: 10 s later, 10 × rate more.
        assert_close(
            row.state.tokens_at(at(20.0)),
            (tokens + 10.0 * refill_rate).min(burst_limit),
            &format!("{mask:?}"),
        );
    }
    // Nothing to set, as_of without available_tokens, part of a bucket
    // that does not exist: refused.
    let mut row = head.clone();
    let err =
        reconfigure(&mut row, &update(only(false, false, false)), at(10.0)).expect_err("empty");
    assert!(err.to_string().contains("update_mask"), "{err}");
    let mut with_as_of = update(only(false, true, false));
    with_as_of.as_of = Some(at(5.0));
    let err = reconfigure(&mut row, &with_as_of, at(10.0)).expect_err("as_of alone");
    assert!(err.to_string().contains("as_of"), "{err}");
    assert_eq!(row, head);
    let err = configure(None, &update(only(false, true, false)), at(10.0)).expect_err("new");
    assert!(err.to_string().contains("update_mask"), "{err}");
    configure(None, &update(LimitsMask::ALL), at(10.0)).expect("a new bucket, whole");
}

#[test]
fn reconfiguration_refuses_bad_input_without_change() {
    let mut tenant = bucket(1.0, 1.0, 7.0).head;
    tenant.totals.consumption = Consumption::from_request_units(100.0);
    let good = LimitsUpdate {
        available_tokens: 10.0,
        limits: Limits {
            refill_rate: 1.0,
            burst_limit: 10.0,
        },
        as_of: Some(at(0.0)),
        as_of_consumed_tokens: 50.0,
        mask: LimitsMask::ALL,
    };
    let cases: Vec<(&str, LimitsUpdate)> = vec![
        (
            "available_tokens",
            LimitsUpdate {
                available_tokens: f64::NAN,
                ..good.clone()
            },
        ),
        (
            "available_tokens",
            LimitsUpdate {
                available_tokens: -1.0,
                ..good.clone()
            },
        ),
        (
            "refill_rate",
            LimitsUpdate {
                limits: Limits {
                    refill_rate: f64::INFINITY,
                    burst_limit: 1.0,
                },
                ..good.clone()
            },
        ),
        (
            "burst_limit",
            LimitsUpdate {
                limits: Limits {
                    refill_rate: 1.0,
                    burst_limit: 1e300,
                },
                ..good.clone()
            },
        ),
        (
            "as_of_consumed_tokens",
            LimitsUpdate {
                as_of_consumed_tokens: 100.5,
                ..good.clone()
            },
        ),
        (
            "as_of_consumed_tokens",
            LimitsUpdate {
                as_of: None,
                ..good.clone()
            },
        ),
    ];
    for (field, update) in cases {
        let before = tenant.clone();
        match reconfigure(&mut tenant, &update, at(10.0)) {
            Err(RequestError::InvalidInput(e)) => assert_eq!(e.field, field, "{update:?}"),
            other => panic!("{update:?}: expected an error on {field}, got {other:?}"),
        }
        assert_eq!(tenant, before, "{field}: state unchanged");
    }
}

#[test]
fn consumption_totals_accumulate_per_request() {
    let mut rows = bucket(10.0, 1000.0, 1000.0);
    let deltas = [
        Consumption {
            request_unit_micros: 1_500_000,
            read_batches: 1,
            read_requests: 2,
            read_bytes: 100,
            ..Consumption::default()
        },
        Consumption {
            write_batches: 1,
            write_requests: 3,
            write_bytes: 300,
            cpu_micros: 500_000,
            egress_bytes: 7,
            ..Consumption::default()
        },
    ];
    for (seq, delta) in deltas.iter().enumerate() {
        let mut r = req(1, seq as u64 + 1, 0.0, 1.0);
        r.consumption = *delta;
        serve(&mut rows, &r, seq as f64);
    }
    let total = rows.head.totals.consumption;
    assert_eq!(
        total,
        Consumption {
            request_unit_micros: 1_500_000,
            read_batches: 1,
            read_requests: 2,
            read_bytes: 100,
            write_batches: 1,
            write_requests: 3,
            write_bytes: 300,
            cpu_micros: 500_000,
            egress_bytes: 7,
        }
    );
}

#[test]
fn every_response_carries_a_fallback_rate() {
    // (refill, shares of pods 1..n as they ask, fallback rate of the last
    // pod): half its share of the refill rate and half an even split.
    let cases: [(f64, &[f64], f64); 4] = [
        (100.0, &[1.0], 100.0),
        (100.0, &[1.0, 3.0], 62.5),
        // An idle pod (no shares) still gets half an even split.
        (100.0, &[3.0, 0.0], 25.0),
        (0.0, &[1.0], 0.0),
    ];
    for (refill_rate, shares, expected) in cases {
        let mut rows = bucket(refill_rate, 1000.0, 1000.0);
        let mut last = Grant::default();
        for (i, &s) in shares.iter().enumerate() {
            last = serve(&mut rows, &req(i as InstanceId + 1, 1, 1.0, s), 0.0);
        }
        assert_close(last.fallback_rate, expected, &format!("{shares:?}"));
    }
}

#[test]
fn the_fallback_rates_of_all_pods_sum_to_the_refill_rate() {
    let shares = [5.0, 0.0, 1.0, 2.5, 0.5];
    let mut rows = bucket(120.0, 1000.0, 1000.0);
    for (i, &s) in shares.iter().enumerate() {
        serve(&mut rows, &req(i as InstanceId + 1, 1, 1.0, s), 0.0);
    }
    // Each asks again, now that every pod is known.
    let sum: f64 = shares
        .iter()
        .enumerate()
        .map(|(i, &s)| serve(&mut rows, &req(i as InstanceId + 1, 2, 1.0, s), 0.0).fallback_rate)
        .sum();
    assert_close(sum, 120.0, "sum of fallback rates");
}

/// A request charging `fallback` tokens used over the `secs` before it,
/// asking for nothing.
fn repaying(instance_id: InstanceId, seq: u64, fallback: f64, secs: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        fallback_tokens: fallback,
        fallback_duration: Duration::from_secs_f64(secs),
        ..req(instance_id, seq, 0.0, 1.0)
    }
}

#[test]
fn fallback_used_while_the_bucket_sat_full_is_paid_from_the_refill_it_lost() {
    // 100/s, burst 500. Pod 1 empties the bucket at 0 s; the server hears
    // nothing more until 30 s, while the pod runs on its fallback rate
    // (100/s from 1 s: 2 900 tokens).
    let mut rows = bucket(100.0, 500.0, 500.0);
    serve(&mut rows, &req(1, 1, 500.0, 1.0), 0.0);
    assert_close(rows.head.state.tokens, 0.0, "emptied");
    let grant = serve(&mut rows, &repaying(1, 2, 2900.0, 29.0), 30.0);
    assert_close(grant.granted_tokens, 0.0, "charged, not granted");
    // The bucket refilled to 500 and lost 2 500 to the cap; of that, the
    // refill of the 29 s the pod ran on fallback (all 2 500) pays for the
    // fallback: the bucket ends where an uncapped one would, 3 000 − 2 900.
    assert_close(rows.head.state.tokens, 100.0, "level after the charge");
    assert_close(rows.head.state.capped_refill, 0.0, "the loss is used up");
    let granted_total = rows.head.totals.granted_tokens;
    assert_close(granted_total, 500.0 + 2900.0, "fallback counts as granted");

    // A retry of the same request charges nothing more.
    let again = serve(&mut rows, &repaying(1, 2, 2900.0, 29.0), 30.5);
    assert_eq!(again, grant);
    assert_close(rows.head.state.tokens, 100.0, "charged once");

    // Without a fallback span nothing is forgiven: the bucket carries it
    // as debt.
    let mut rows = bucket(100.0, 500.0, 500.0);
    serve(&mut rows, &req(1, 1, 500.0, 1.0), 0.0);
    serve(&mut rows, &repaying(1, 2, 2900.0, 0.0), 30.0);
    assert_close(rows.head.state.tokens, -2400.0, "charged from the burst");
}

/// An outage: two pods run on their fallback rates (50/s each) from 1 s to
/// 30 s while the bucket refills to its burst and loses the rest. The first
/// request back is a retry of the one the outage cut off, carrying the
/// fallback used since: it is charged before the bucket grants, so the
/// refill the fallback used is not granted again.
#[test]
fn a_retry_back_from_an_outage_is_charged_its_fallback_before_it_is_granted() {
    let mut rows = bucket(100.0, 500.0, 0.0);
    serve(&mut rows, &req(1, 1, 0.0, 50.0), 0.0);
    serve(&mut rows, &req(2, 1, 0.0, 50.0), 0.0);
    let cut_off = TokenBucketRequest {
        requested_tokens: 400.0,
        ..repaying(1, 2, 1450.0, 29.0)
    };
    let grant = serve(&mut rows, &cut_off, 30.0);
    assert_eq!(
        grant.fallback_charged,
        Some(1450.0),
        "what it carried is charged"
    );
    // 3 000 of refill: 500 kept, 2 500 lost. This pod's 1 450 are paid by
    // the 400 kept while it ran (1 s to 5 s), then from the loss; the 100
    // of the first second remain, with the other pod's 1 450 still to come.
    // So the 400 it asks for are not there at once (charged after the
    // grant, they were): it gets the 100 and a trickle.
    assert!(!grant.trickle_duration.is_zero(), "{grant:?}");
    assert!(
        grant.granted_tokens < 200.0,
        "granted {} from a bucket its fallback emptied",
        grant.granted_tokens
    );
    // The other pod's charge comes with its next request.
    serve(&mut rows, &repaying(2, 2, 1450.0, 29.0), 30.1);
    assert!(rows.head.state.tokens < 100.0, "{}", rows.head.state.tokens);

    // Answered again (an earlier attempt of it reached the bucket), the
    // stored grant says what that attempt charged; nothing more is.
    let before = rows.head.state.tokens;
    let again = serve(
        &mut rows,
        &TokenBucketRequest {
            fallback_tokens: 2000.0,
            ..cut_off
        },
        30.2,
    );
    assert_eq!(again, grant);
    assert_eq!(
        again.fallback_charged,
        Some(1450.0),
        "the applied attempt's"
    );
    assert!(rows.head.state.tokens >= before, "charged once");
}

#[test]
fn fallback_is_forgiven_only_for_refill_lost_while_it_ran() {
    let mut rows = bucket(100.0, 500.0, 500.0);
    serve(&mut rows, &req(1, 1, 0.0, 1.0), 0.0);
    // Nobody asks from 0 s to 20 s: 2 000 tokens of refill lost, all of it
    // before pod 2's fallback began (it reports 5 s of fallback at 30 s).
    serve(&mut rows, &req(1, 2, 0.0, 1.0), 20.0);
    serve(&mut rows, &repaying(2, 1, 400.0, 5.0), 30.0);
    assert_close(
        rows.head.state.tokens,
        100.0,
        "nothing forgiven: the loss came before the fallback",
    );

    // Two pods over one 10 s stretch share the loss; neither gets more
    // than the refill of the time it ran on fallback.
    let mut rows = bucket(100.0, 500.0, 500.0);
    serve(&mut rows, &req(1, 1, 500.0, 1.0), 0.0);
    serve(&mut rows, &req(2, 1, 0.0, 1.0), 0.0);
    // At 15 s: 1 000 tokens lost to the cap between 5 s and 15 s.
    serve(&mut rows, &repaying(1, 2, 800.0, 4.0), 15.0);
    assert_close(rows.head.state.capped_refill, 600.0, "400 of 1 000 used");
    serve(&mut rows, &repaying(2, 2, 800.0, 14.0), 15.0);
    assert_close(rows.head.state.capped_refill, 0.0, "the rest used");
    assert_close(
        rows.head.state.tokens,
        500.0 + 1000.0 - 1600.0,
        "charged what the lost refill did not pay",
    );

    // The loss forgives nothing once a target request period old: 2 500
    // lost by 30 s; then pod 1 takes the bucket 1 000 into debt, which the
    // refill repays exactly by 45 s, losing nothing more. (Pod 1 uses what
    // it takes at 100/s: it holds none of it by 5 s, nor by 35 s.)
    let mut rows = bucket(100.0, 500.0, 500.0);
    serve(&mut rows, &req(1, 1, 500.0, 100.0), 0.0);
    serve(&mut rows, &req(1, 2, 1500.0, 100.0), 30.0);
    assert_close(rows.head.state.capped_refill, 2500.0, "lost by 30 s");
    serve(&mut rows, &repaying(2, 1, 1000.0, 44.0), 45.0);
    assert_close(rows.head.state.capped_refill, 2500.0, "expired, not used");
    assert_close(rows.head.state.tokens, -500.0, "charged in full");

    // An operator's new level owes nothing to earlier losses.
    let mut rows = bucket(100.0, 500.0, 500.0);
    serve(&mut rows, &req(1, 1, 500.0, 1.0), 0.0);
    serve(&mut rows, &req(1, 2, 0.0, 1.0), 30.0);
    let update = LimitsUpdate {
        available_tokens: 100.0,
        limits: rows.head.state.limits,
        as_of: None,
        as_of_consumed_tokens: 0.0,
        mask: LimitsMask::ALL,
    };
    reconfigure(&mut rows.head, &update, at(30.0)).expect("valid");
    serve(&mut rows, &repaying(2, 1, 100.0, 29.0), 30.0);
    assert_close(rows.head.state.tokens, 0.0, "nothing forgiven");
}

#[test]
fn invalid_requests_are_refused_without_change() {
    let good = req(1, 1, 10.0, 1.0);
    let mut cases: Vec<(&str, TokenBucketRequest)> = vec![
        (
            "instance_id",
            TokenBucketRequest {
                instance_id: 0,
                ..good.clone()
            },
        ),
        (
            "instance_lease",
            TokenBucketRequest {
                lease: Vec::new(),
                ..good.clone()
            },
        ),
        (
            "instance_lease",
            TokenBucketRequest {
                lease: vec![1; 257],
                ..good.clone()
            },
        ),
        (
            "seq",
            TokenBucketRequest {
                seq: u64::MAX,
                ..good.clone()
            },
        ),
        (
            "requested_tokens",
            TokenBucketRequest {
                requested_tokens: f64::NAN,
                ..good.clone()
            },
        ),
        (
            "requested_tokens",
            TokenBucketRequest {
                requested_tokens: -1.0,
                ..good.clone()
            },
        ),
        (
            "requested_tokens",
            TokenBucketRequest {
                requested_tokens: 1e16,
                ..good.clone()
            },
        ),
        (
            "shares",
            TokenBucketRequest {
                shares: f64::NEG_INFINITY,
                ..good.clone()
            },
        ),
        (
            "target_request_period",
            TokenBucketRequest {
                target_request_period: Duration::ZERO,
                ..good.clone()
            },
        ),
        (
            "target_request_period",
            TokenBucketRequest {
                target_request_period: Duration::from_secs(3600),
                ..good.clone()
            },
        ),
    ];
    cases.extend([
        (
            "fallback_tokens",
            TokenBucketRequest {
                fallback_tokens: f64::NAN,
                ..good.clone()
            },
        ),
        (
            "fallback_tokens",
            TokenBucketRequest {
                fallback_tokens: -1.0,
                ..good.clone()
            },
        ),
        (
            "fallback_duration",
            TokenBucketRequest {
                fallback_duration: MAX_FALLBACK_DURATION + Duration::from_secs(1),
                ..good.clone()
            },
        ),
    ]);
    let mut bad_consumption = good.clone();
    bad_consumption.consumption.cpu_micros = u64::MAX;
    cases.push(("consumption_since_last_request.cpu_micros", bad_consumption));

    let mut rows = bucket(10.0, 1000.0, 100.0);
    serve(&mut rows, &req(1, 0, 1.0, 1.0), 0.0);
    for (field, bad) in cases {
        let before = rows.clone();
        match request(&mut rows, &bad, at(1.0), &GlobalBucketConfig::default()) {
            Err(RequestError::InvalidInput(e)) => assert_eq!(e.field, field),
            other => panic!("expected an error on {field}, got {other:?}"),
        }
        assert_eq!(rows, before, "{field}: state unchanged");
    }
}

#[test]
fn rows_without_the_true_predecessor_are_refused() {
    let mut rows = bucket(10.0, 1000.0, 100.0);
    serve(&mut rows, &req(2, 1, 0.0, 1.0), 0.0);
    serve(&mut rows, &req(4, 1, 0.0, 1.0), 0.0);
    // A transaction that loaded instance 2 but not 4 cannot link 5 after 2.
    let mut partial = rows.clone();
    partial.instances.remove(&4);
    let before = partial.clone();
    let err = request(
        &mut partial,
        &req(5, 1, 0.0, 1.0),
        at(1.0),
        &GlobalBucketConfig::default(),
    )
    .expect_err("inconsistent");
    assert!(matches!(err, RequestError::Inconsistent(_)), "{err}");
    assert_eq!(partial, before);
}

// ---------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------

/// One step of a random workload.
#[derive(Clone, Debug)]
struct Step {
    advance_ms: u32,
    instance: InstanceId,
    requested: f64,
    shares: f64,
    period_ms: u64,
    consumed: f64,
    retry: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        // Pods that ask more often than once a period are what drives a
        // bucket into debt, so most steps are short.
        prop_oneof![0u32..2_000, 0u32..30_000],
        1u32..6,
        prop_oneof![Just(0.0), 0.0..50.0, 0.0..100_000.0],
        0.0..10.0,
        prop_oneof![Just(10_000u64), 1_000u64..20_000, 10u64..300_000],
        0.0..100.0,
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(advance_ms, instance, requested, shares, period_ms, consumed, retry)| Step {
                advance_ms,
                instance,
                requested,
                shares,
                period_ms,
                consumed,
                retry,
            },
        )
}

fn policy() -> impl Strategy<Value = GrantPolicy> {
    prop_oneof![
        Just(GrantPolicy::Shares),
        Just(GrantPolicy::BucketLevelEma),
        Just(GrantPolicy::Greedy)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn refill_never_lifts_tokens_above_the_burst_limit(
        tokens in -1e6..1e6f64,
        rate in 0.0..1e4f64,
        burst in 0.0..1e5f64,
        elapsed in 0.0..1e4f64,
    ) {
        let mut tenant = bucket(rate, burst, tokens).head;
        tenant.state.refill(Timestamp::from_secs_f64(elapsed), PERIOD);
        prop_assert!(tenant.state.tokens <= burst.max(tokens));
        prop_assert!(tenant.state.tokens >= tokens);
    }

    #[test]
    fn grants_stay_within_refill_plus_the_debt_bound(
        initial in 0.0..2_000.0f64,
        rate in 0.0..500.0f64,
        burst in 0.0..5_000.0f64,
        policy in policy(),
        steps in proptest::collection::vec(step(), 1..300),
    ) {
        let config = GlobalBucketConfig { policy, ..GlobalBucketConfig::default() };
        let mut rows = bucket(rate, burst, initial);
        let mut now_ms: i64 = 0;
        let mut seqs = BTreeMap::<InstanceId, u64>::new();
        let mut max_period: f64 = 0.0;
        let mut granted = 0.0;
        let mut consumption = Consumption::default();
        for s in &steps {
            now_ms += i64::from(s.advance_ms);
            let seq = seqs.entry(s.instance).or_insert(0);
            if !s.retry || *seq == 0 {
                *seq += 1;
            }
            let mut r = req(s.instance, *seq, s.requested, s.shares);
            r.target_request_period = Duration::from_millis(s.period_ms);
            r.consumption = Consumption::from_request_units(s.consumed);
            let tokens_before = rows.head.state.tokens;
            let outcome = request(&mut rows, &r, Timestamp::from_unix_micros(now_ms * 1000), &config)
                .expect("valid request");
            if !outcome.duplicate {
                // A grant never takes the bucket below two periods of refill
                // (or below where it already was).
                let floor = tokens_before.min(-2.0 * rate * r.target_request_period.as_secs_f64());
                prop_assert!(
                    rows.head.state.tokens >= floor - 1e-6 * floor.abs().max(1.0),
                    "tokens {} below {}", rows.head.state.tokens, floor
                );
                max_period = max_period.max(r.target_request_period.as_secs_f64());
                granted += outcome.grant.granted_tokens;
            }
            prop_assert!(outcome.grant.granted_tokens >= 0.0);
            if !outcome.duplicate {
                prop_assert!(outcome.grant.trickle_duration <= r.target_request_period);
            }
            // Totals never decrease.
            prop_assert!(rows.head.totals.consumption.dominates(&consumption));
            consumption = rows.head.totals.consumption;
            assert_list_consistent(&rows);
        }
        let elapsed = now_ms as f64 / 1000.0;
        let debt_bound = 2.0 * rate * max_period;
        let slack = 1e-6 * (initial + rate * elapsed + debt_bound).max(1.0);
        prop_assert!(
            granted <= initial + rate * elapsed + debt_bound + slack,
            "granted {} > initial {} + refill {} + debt bound {}",
            granted, initial, rate * elapsed, debt_bound
        );
        prop_assert!((rows.head.totals.granted_tokens - granted).abs() <= slack);
        prop_assert!(rows.head.state.tokens >= -debt_bound - slack);
    }
}

// Budgets: the grant is cut to the budget, in the request.

fn with_budget(rows: &mut BucketRows, amount: f64, at_limit: crate::budget::AtLimit) {
    use crate::budget::{BucketBudget, Budget, CycleRule, Period};
    let budget = Budget::new(amount, CycleRule::utc(Period::Daily), at_limit)
        .validated()
        .expect("a valid budget");
    rows.head.budget = Some(Box::new(
        BucketBudget::start(budget, at(0.0)).expect("in the calendar"),
    ));
}

#[test]
fn a_grant_near_the_limit_is_cut_to_what_remains_trickles_included() {
    let mut rows = bucket(100.0, 1_000.0, 1_000.0);
    with_budget(&mut rows, 1_500.0, crate::budget::AtLimit::Stop);
    assert_eq!(
        serve(&mut rows, &req(1, 1, 1_000.0, 1.0), 1.0).granted_tokens,
        1_000.0
    );
    // The bucket holds 100; a trickle would hand out a period more.
    let g = serve(&mut rows, &req(1, 2, 2_000.0, 1.0), 2.0);
    assert_close(g.granted_tokens, 500.0, "cut to the budget");
    let g = serve(&mut rows, &req(1, 3, 10.0, 1.0), 30.0);
    assert_eq!(g.granted_tokens, 0.0, "stopped");
    assert_eq!(g.fallback_rate, 0.0, "no fallback past a stop");
    assert_close(rows.head.totals.granted_tokens, 1_500.0, "granted in all");
}

#[test]
fn every_answer_says_what_a_new_pod_may_start_on() {
    // (refill rate, burst limit, live pods, allowance per pod)
    let cases = [
        (10.0, 100.0, 1, 100.0),
        (10.0, 100.0, 4, 25.0),
        // A burst smaller than a second of refill: a second of refill.
        (50.0, 0.0, 2, 25.0),
        (1_000.0, 100.0, 10, 100.0),
    ];
    for (rate, burst, pods, allowance) in cases {
        let mut rows = bucket(rate, burst, burst);
        for id in 1..=pods {
            let g = serve(&mut rows, &req(id, 1, 0.0, 1.0), 0.0);
            assert_close(
                g.initial_allowance.expect("said"),
                initial_allowance(&rows.head.state.limits, id),
                "as of the pods then",
            );
        }
        // A repeat gets the answer it got, allowance included.
        let again = serve(&mut rows, &req(1, 1, 0.0, 1.0), 0.0);
        assert_close(
            again.initial_allowance.expect("said"),
            initial_allowance(&rows.head.state.limits, 1),
            "as first answered",
        );
        let last = serve(&mut rows, &req(pods, 2, 0.0, 1.0), 1.0);
        assert_close(
            last.initial_allowance.expect("said"),
            allowance,
            &format!("{rate}/s, burst {burst}, {pods} pods"),
        );
    }
    // A budget that stopped allows nothing before an answer.
    let mut rows = bucket(100.0, 1_000.0, 1_000.0);
    with_budget(&mut rows, 100.0, crate::budget::AtLimit::Stop);
    serve(&mut rows, &req(1, 1, 500.0, 1.0), 1.0);
    let g = serve(&mut rows, &req(1, 2, 10.0, 1.0), 2.0);
    assert_eq!(g.initial_allowance, Some(0.0));
}

#[test]
fn the_next_cycle_serves_again_and_keeps_the_record() {
    let mut rows = bucket(100.0, 1_000.0, 1_000.0);
    with_budget(&mut rows, 100.0, crate::budget::AtLimit::Stop);
    let mut r = req(1, 1, 500.0, 1.0);
    r.consumption = Consumption::from_request_units(42.0);
    serve(&mut rows, &r, 1.0);
    let outcome = request(
        &mut rows,
        &req(1, 2, 50.0, 1.0),
        at(86_400.0 + 5.0),
        &GlobalBucketConfig::default(),
    )
    .expect("served");
    assert_eq!(outcome.grant.granted_tokens, 50.0);
    let closed = outcome.budget.closed.expect("the first day closed");
    assert_eq!(closed.usage.granted_tokens, 100.0);
    assert_eq!(closed.usage.consumption.request_unit_micros, 42_000_000);
    let fired: Vec<u32> = outcome
        .budget
        .events
        .iter()
        .map(|e| e.threshold.percent)
        .collect();
    assert_eq!(fired, vec![50], "the new day's 50 %");
}

proptest! {
    /// Whatever pods ask, and whenever, a throttled budget never lets the
    /// cycle's grants exceed the amount plus the baseline rate times the
    /// time since the limit was reached and one target period ahead.
    #[test]
    fn a_throttled_budget_grants_at_most_the_amount_plus_the_baseline(
        steps in proptest::collection::vec((1u32..5, 0.0f64..3_000.0, 0.0f64..20.0, 0.0f64..4.0), 1..120),
    ) {
        let baseline = Limits { refill_rate: 10.0, burst_limit: 40.0 };
        let mut rows = bucket(200.0, 2_000.0, 500.0);
        with_budget(&mut rows, 5_000.0, crate::budget::AtLimit::Throttle { baseline });
        let mut now = 0.0;
        let mut seqs = [0u64; 5];
        for (pod, tokens, shares, gap) in steps {
            now += gap;
            seqs[pod as usize] += 1;
            let g = serve(&mut rows, &req(pod, seqs[pod as usize], tokens, shares), now);
            prop_assert!(g.granted_tokens >= 0.0);
            let b = rows.head.budget.as_ref().expect("a budget");
            // Past the limit: the baseline's refill since, and one period
            // ahead (the trickles it hands out).
            let past = b.state.limit_reached_at.map_or(0.0, |t| {
                at(now).seconds_since(t) + PERIOD.as_secs_f64()
            });
            let bound = 5_000.0 + baseline.refill_rate * past;
            prop_assert!(
                b.state.usage.granted_tokens <= bound * (1.0 + 1e-12),
                "granted {} > {bound} at {now}", b.state.usage.granted_tokens
            );
        }
    }
}

/// Two pods with shares `before` each, an empty bucket refilling 100/s;
/// both report `after` at once, with work queued. Each gets an even split
/// for a quarter of a period (not its fraction of the other's old shares);
/// once both shares are known, neither moved: each gets half the refill
/// for a whole period.
#[track_caller]
fn two_pods_whose_shares_move_at_once_get_short_even_trickles(before: f64, after: f64) {
    let mut rows = bucket(100.0, 0.0, 0.0);
    register(&mut rows, 1, before);
    register(&mut rows, 2, before);
    let a = serve(&mut rows, &req(1, 2, 1e6, after), 0.0);
    assert_eq!(a.trickle_duration, PERIOD / 4);
    assert_close(delivery_rate(&a), 50.0, "the first, an even split");
    let b = serve(&mut rows, &req(2, 2, 1e6, after), 0.0);
    assert_eq!(b.trickle_duration, PERIOD / 4);
    assert_close(delivery_rate(&b), 50.0, "the second, the same");
    let a2 = serve(&mut rows, &req(1, 3, 1e6, after), 2.5);
    let b2 = serve(&mut rows, &req(2, 3, 1e6, after), 2.5);
    for g in [&a2, &b2] {
        assert_eq!(g.trickle_duration, PERIOD);
    }
    assert_close(
        rows.instances[&1].committed_rate,
        rows.instances[&2].committed_rate,
        "an even split",
    );
}

#[test]
fn a_pod_whose_shares_jumped_gets_a_short_trickle_and_the_split_evens_out() {
    // Two idle pods (shares 1 each), an empty bucket refilling 100/s; both
    // queue up work at once (shares 10). The first to ask would hold
    // 10/11 of the refill for a whole period while the other's shares are
    // still old: it gets an even split for a quarter of a period instead,
    // and so does the second.
    two_pods_whose_shares_move_at_once_get_short_even_trickles(1.0, 10.0);
    // A pod that did not queue up more keeps its whole period.
    let mut rows = bucket(100.0, 0.0, 0.0);
    register(&mut rows, 1, 1.0);
    let steady = serve(&mut rows, &req(1, 2, 1e6, 1.5), 0.0);
    assert_eq!(steady.trickle_duration, PERIOD);
}

#[test]
fn a_pod_whose_shares_dropped_gets_a_short_trickle_at_an_even_split_at_least() {
    // Two busy pods (shares 40 each), an empty bucket refilling 100/s; the
    // demand of both falls at once (shares 1) while work is still queued.
    // Against the other's old shares the first to ask would get 1/41 of the
    // refill for a whole period: it gets an even split for a quarter of a
    // period instead, and so does the second.
    two_pods_whose_shares_move_at_once_get_short_even_trickles(40.0, 1.0);
    // Shares falling by less than the factor are no drop: the pod keeps
    // its whole period, at its fraction.
    let mut rows = bucket(100.0, 0.0, 0.0);
    register(&mut rows, 1, 40.0);
    register(&mut rows, 2, 40.0);
    let steady = serve(&mut rows, &req(1, 2, 1e6, 11.0), 0.0);
    assert_eq!(steady.trickle_duration, PERIOD);
    assert_close(delivery_rate(&steady), 100.0 * 11.0 / 51.0, "its fraction");
}

#[test]
fn a_member_drawing_with_jumped_shares_keeps_its_whole_period() {
    // A member of an organisation draws once per draw period whatever its
    // trickle: a short one would leave it without a rate until its next
    // draw.
    let mut rows = bucket(100.0, 0.0, 0.0);
    let config = GlobalBucketConfig::default();
    request_guaranteed(&mut rows, &req(1, 1, 0.0, 1.0), 0.0, at(0.0), &config).expect("valid");
    let g = request_guaranteed(&mut rows, &req(1, 2, 1e6, 10.0), 0.0, at(0.0), &config)
        .expect("valid")
        .grant;
    assert_eq!(g.trickle_duration, PERIOD);
}

#[test]
fn the_time_pods_spend_on_trickles_is_counted_when_they_ask_again() {
    // An empty bucket, refill 10/s: each ask of a pod wanting more than
    // the bucket holds is answered with a trickle of a period.
    let mut rows = bucket(10.0, 1000.0, 0.0);
    register(&mut rows, 1, 1.0);
    register(&mut rows, 2, 1.0);
    // Given at once (nothing asked): no throttled time.
    serve(&mut rows, &req(1, 2, 0.0, 1.0), 1.0);
    assert_eq!(rows.head.totals.throttled_micros, 0);
    let micros = |g: &Grant| u64::try_from(g.trickle_duration.as_micros()).expect("micros");
    let g = serve(&mut rows, &req(1, 3, 1e6, 1.0), 2.0);
    assert!(micros(&g) > 1_000_000, "a trickle: {g:?}");
    // Asked again 1 s into its trickle: 1 s throttled.
    serve(&mut rows, &req(1, 4, 0.0, 1.0), 3.0);
    assert_eq!(rows.head.totals.throttled_micros, 1_000_000);
    // A second pod on a trickle, asking again long after it ended: only
    // the trickle's length counts.
    let g2 = serve(&mut rows, &req(2, 2, 1e6, 1.0), 3.0);
    assert!(micros(&g2) > 0, "a trickle: {g2:?}");
    serve(&mut rows, &req(2, 3, 0.0, 1.0), 100.0);
    let expected = 1_000_000 + micros(&g2);
    assert_eq!(rows.head.totals.throttled_micros, expected);
    // A duplicate changes nothing.
    serve(&mut rows, &req(2, 3, 0.0, 1.0), 200.0);
    assert_eq!(rows.head.totals.throttled_micros, expected);
}

proptest! {
    /// A bucket in shadow mode decides every request as the same bucket
    /// enforcing would (its state stays the enforced one), grants what was
    /// asked at once, and counts exactly what enforcing held back; switched
    /// to enforcing, it answers as the enforcing bucket does.
    #[test]
    fn shadow_mode_decides_as_enforcing_and_counts_what_it_held_back(
        steps in proptest::collection::vec((1u32..4, 0.0f64..400.0, 0.0f64..3.0, 0.0f64..30.0), 1..40),
        refill_rate in 1.0f64..100.0,
        burst_limit in 0.0f64..500.0,
    ) {
        let mut enforcing = bucket(refill_rate, burst_limit, burst_limit);
        let mut shadow = bucket(refill_rate, burst_limit, burst_limit);
        shadow.head.enforce = false;
        let mut now = 0.0;
        let mut seqs = BTreeMap::new();
        let (mut held_back, mut trickled, mut asked) = (0.0, 0u64, 0.0);
        for (id, requested, gap, held) in steps {
            now += gap;
            let seq = seqs.entry(id).and_modify(|s| *s += 1).or_insert(1u64);
            let mut r = req(id, *seq, requested, 1.0);
            r.held_tokens = held;
            let enforced = serve(&mut enforcing, &r, now);
            let granted = serve(&mut shadow, &r, now);
            prop_assert_eq!(granted.granted_tokens, requested);
            prop_assert!(granted.trickle_duration.is_zero());
            let at_once = if enforced.trickle_duration.is_zero() { enforced.granted_tokens } else { 0.0 };
            held_back += (requested - at_once).max(0.0);
            trickled += u64::try_from(enforced.trickle_duration.as_micros()).expect("micros");
            asked += requested;
            prop_assert_eq!(&shadow.head.state, &enforcing.head.state);
            prop_assert_eq!(&shadow.head.members, &enforcing.head.members);
        }
        prop_assert!((shadow.head.shadow.throttled_tokens - held_back).abs() <= 1e-6 * held_back.max(1.0));
        prop_assert_eq!(shadow.head.shadow.throttled_micros, trickled);
        prop_assert!((shadow.head.totals.granted_tokens - asked).abs() <= 1e-6 * asked.max(1.0));
        prop_assert_eq!(enforcing.head.shadow, ShadowTotals::default());
        // Enforcing again: the same answer as the bucket that always did.
        shadow.head.enforce = true;
        now += 1.0;
        let r = req(1, 1_000, 250.0, 1.0);
        prop_assert_eq!(serve(&mut shadow, &r, now), serve(&mut enforcing, &r, now));
    }
}
