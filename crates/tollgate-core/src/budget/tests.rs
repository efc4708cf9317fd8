use proptest::prelude::*;

use super::*;
use crate::consumption::Consumption;
use crate::global_bucket::{BucketState, Limits};

/// Seconds since the epoch of a UTC date and time.
fn utc(date: &str) -> Timestamp {
    let ts: jiff::Timestamp = date.parse().expect("a test date");
    Timestamp::from_unix_micros(ts.as_microsecond())
}

fn monthly(anchor_day: u8, zone: &str) -> CycleRule {
    CycleRule {
        period: Period::Monthly { anchor_day },
        time_zone: zone.to_owned(),
    }
}

fn cycle(rule: &CycleRule, at: &str) -> (Timestamp, Timestamp) {
    let c = rule.cycle_at(utc(at)).expect("in the calendar");
    (c.start, c.end)
}

#[test]
fn an_anchor_of_the_31st_falls_on_the_last_day_of_shorter_months() {
    let rule = monthly(31, "UTC");
    assert_eq!(
        cycle(&rule, "2025-02-10T12:00:00Z"),
        (utc("2025-01-31T00:00:00Z"), utc("2025-02-28T00:00:00Z"))
    );
    assert_eq!(
        cycle(&rule, "2025-03-01T00:00:00Z"),
        (utc("2025-02-28T00:00:00Z"), utc("2025-03-31T00:00:00Z"))
    );
    assert_eq!(
        cycle(&rule, "2025-04-30T00:00:00Z"),
        (utc("2025-04-30T00:00:00Z"), utc("2025-05-31T00:00:00Z"))
    );
}

#[test]
fn a_leap_year_gives_february_its_29th() {
    let rule = monthly(30, "UTC");
    assert_eq!(
        cycle(&rule, "2024-02-29T23:59:59Z"),
        (utc("2024-02-29T00:00:00Z"), utc("2024-03-30T00:00:00Z"))
    );
    assert_eq!(
        cycle(&rule, "2024-02-28T23:59:59Z"),
        (utc("2024-01-30T00:00:00Z"), utc("2024-02-29T00:00:00Z"))
    );
}

#[test]
fn a_cycle_starts_at_local_midnight_and_spans_a_daylight_saving_change() {
    // New York: 2024-03-10 02:00 EST became 03:00 EDT.
    let daily = CycleRule {
        period: Period::Daily,
        time_zone: "America/New_York".to_owned(),
    };
    let (start, end) = cycle(&daily, "2024-03-10T12:00:00Z");
    assert_eq!(start, utc("2024-03-10T05:00:00Z"));
    assert_eq!(end, utc("2024-03-11T04:00:00Z"));
    assert_eq!(end.seconds_since(start), 23.0 * 3600.0);
    // A monthly cycle in Paris ends at midnight of the anchor day, summer
    // time (UTC+2), having started in winter time (UTC+1).
    let (start, end) = cycle(&monthly(15, "Europe/Paris"), "2024-04-01T00:00:00Z");
    assert_eq!(start, utc("2024-03-14T23:00:00Z"));
    assert_eq!(end, utc("2024-04-14T22:00:00Z"));
}

#[test]
fn a_day_without_midnight_starts_when_the_clock_jumps() {
    // São Paulo skipped 2018-11-04 00:00–00:59 (UTC-3 to UTC-2).
    let daily = CycleRule {
        period: Period::Daily,
        time_zone: "America/Sao_Paulo".to_owned(),
    };
    let (start, end) = cycle(&daily, "2018-11-04T12:00:00Z");
    assert_eq!(start, utc("2018-11-04T03:00:00Z"));
    assert_eq!(end, utc("2018-11-05T02:00:00Z"));
}

#[test]
fn weekly_cycles_start_on_their_weekday() {
    let rule = CycleRule::utc(Period::Weekly {
        anchor_weekday: Weekday::Wednesday,
    });
    // 2026-11-27 is a Friday.
    assert_eq!(
        cycle(&rule, "2026-11-27T08:00:00Z"),
        (utc("2026-11-25T00:00:00Z"), utc("2026-12-02T00:00:00Z"))
    );
    assert_eq!(
        cycle(&rule, "2026-11-25T00:00:00Z"),
        (utc("2026-11-25T00:00:00Z"), utc("2026-12-02T00:00:00Z"))
    );
}

#[test]
fn a_rule_names_the_field_at_fault() {
    let bad_zone = monthly(1, "Mars/Olympus_Mons")
        .validate()
        .expect_err("refused");
    assert_eq!(bad_zone.field, "time_zone");
    let bad_day = monthly(32, "UTC").validate().expect_err("refused");
    assert_eq!(bad_day.field, "anchor_day");
    assert_eq!(
        monthly(0, "UTC").validate().expect_err("refused").field,
        "anchor_day"
    );
    assert!(monthly(31, "Pacific/Chatham").validate().is_ok());
}

const ZONES: [&str; 12] = [
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "America/Sao_Paulo",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Pacific/Apia",
    "Asia/Kathmandu",
    "Asia/Tehran",
    "Africa/Casablanca",
    "America/St_Johns",
];

fn any_rule() -> impl Strategy<Value = CycleRule> {
    let period = prop_oneof![
        (1u8..=31).prop_map(|anchor_day| Period::Monthly { anchor_day }),
        (0usize..7).prop_map(|i| Period::Weekly {
            anchor_weekday: Weekday::ALL[i]
        }),
        Just(Period::Daily),
    ];
    (period, 0..ZONES.len()).prop_map(|(period, zone)| CycleRule {
        period,
        time_zone: ZONES[zone].to_owned(),
    })
}

/// Any instant from 1900 to 2100.
fn any_instant() -> impl Strategy<Value = Timestamp> {
    (-2_208_988_800_000_000i64..4_102_444_800_000_000).prop_map(Timestamp::from_unix_micros)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// An instant lies in exactly one cycle, and cycles tile time: the
    /// cycle before ends where this one starts, the next starts where it
    /// ends, and each is as long as its period allows.
    #[test]
    fn cycles_tile_time(rule in any_rule(), at in any_instant()) {
        let this = rule.cycle_at(at).expect("valid");
        prop_assert!(this.start <= at && at < this.end, "{at:?} not in {this:?}");
        let next = rule.cycle_at(this.end).expect("valid");
        prop_assert_eq!(next.start, this.end);
        let before = rule.cycle_at(this.start.saturating_sub(std::time::Duration::from_micros(1))).expect("valid");
        prop_assert_eq!(before.end, this.start);
        let hours = this.end.seconds_since(this.start) / 3600.0;
        let (low, high) = match rule.period {
            // A day may lose or gain up to a whole day (Apia skipped 2011-12-30).
            Period::Daily => (22.0, 49.0),
            Period::Weekly { .. } => (7.0 * 24.0 - 25.0, 7.0 * 24.0 + 25.0),
            Period::Monthly { .. } => (27.0 * 24.0 - 25.0, 34.0 * 24.0 + 25.0),
        };
        prop_assert!((low..=high).contains(&hours), "{hours} h for {rule:?} at {at:?}");
    }

    /// Monthly cycles start on the anchor day, or the month's last day.
    #[test]
    fn monthly_cycles_start_on_their_anchor(anchor in 1u8..=31, zone in 0..ZONES.len(), at in any_instant()) {
        let rule = monthly(anchor, ZONES[zone]);
        let this = rule.cycle_at(at).expect("valid");
        let tz = jiff::tz::TimeZone::get(ZONES[zone]).expect("valid");
        let start = jiff::Timestamp::from_microsecond(this.start.unix_micros()).expect("valid").to_zoned(tz);
        let day = start.date();
        prop_assert_eq!(day.day(), (anchor as i8).min(day.days_in_month()), "{:?}", start);
    }
}

// Budgets.

fn bucket(refill_rate: f64) -> BucketState {
    BucketState::new(
        Limits {
            refill_rate,
            burst_limit: refill_rate * 10.0,
        },
        0.0,
        true,
        Timestamp::EPOCH,
    )
}

fn budget(amount: f64, at_limit: AtLimit) -> BucketBudget {
    let budget = Budget::new(amount, CycleRule::utc(Period::Daily), at_limit)
        .validated()
        .expect("valid");
    BucketBudget::start(budget, Timestamp::EPOCH).expect("valid")
}

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

const BASELINE: Limits = Limits {
    refill_rate: 10.0,
    burst_limit: 50.0,
};

#[test]
fn the_cap_is_what_remains_then_nothing_under_stop() {
    let mut b = budget(1_000.0, AtLimit::Stop);
    let mut state = bucket(100.0);
    assert_eq!(b.cap(at(1.0)), 1_000.0);
    b.record(&mut state, 600.0, 0.0, &Consumption::default(), at(1.0));
    assert_eq!(b.cap(at(2.0)), 400.0);
    b.record(&mut state, 400.0, 0.0, &Consumption::default(), at(2.0));
    assert_eq!(b.state.limit_reached_at, Some(at(2.0)));
    assert_eq!(b.cap(at(3_000.0)), 0.0);
    assert_eq!(state.limits.refill_rate, 100.0, "stop keeps the limits");
}

fn shadow(mut b: BucketBudget) -> BucketBudget {
    b.budget.enforce = false;
    b
}

/// In shadow mode, stop and throttle cap nothing and leave the limits,
/// the view says what enforcing would have held back, and enforcing
/// again applies them where the cycle stands.
#[test]
fn a_shadow_budget_caps_nothing_and_says_what_it_would_have_held_back() {
    let mut b = shadow(budget(1_000.0, AtLimit::Stop));
    let mut state = bucket(100.0);
    b.record(&mut state, 1_600.0, 0.0, &Consumption::default(), at(2.0));
    assert_eq!(b.state.limit_reached_at, Some(at(2.0)));
    assert_eq!(b.cap(at(3.0)), f64::INFINITY);
    assert!(b.fallback_allowed());
    let view = b.view(&state, at(3.0));
    assert_eq!(view.standing, Standing::Over);
    assert_eq!(view.shadow_excess, Some(600.0));
    // Enforced again: stopped where the cycle stands.
    let mut enforced = b.budget.clone();
    enforced.enforce = true;
    b.change(&mut state, enforced, at(4.0)).expect("change");
    assert_eq!(b.cap(at(4.0)), 0.0);
    assert_eq!(b.view(&state, at(4.0)).standing, Standing::Stopped);
    assert_eq!(b.view(&state, at(4.0)).shadow_excess, None);

    let mut b = shadow(budget(1_000.0, AtLimit::Throttle { baseline: BASELINE }));
    let mut state = bucket(100.0);
    b.record(&mut state, 1_000.0, 0.0, &Consumption::default(), at(10.0));
    assert!(!b.throttled());
    assert_eq!(state.limits.refill_rate, 100.0, "its own limits stay");
    b.record(&mut state, 500.0, 0.0, &Consumption::default(), at(20.0));
    // Enforcing, 10 s at the baseline's 10/s would have allowed 100 more.
    let view = b.view(&state, at(20.0));
    assert_eq!(view.standing, Standing::Over);
    assert_eq!(view.shadow_excess, Some(400.0));
    // Under notify there is nothing to hold back.
    let b = shadow(budget(1_000.0, AtLimit::Notify));
    assert_eq!(b.view(&state, at(20.0)).shadow_excess, None);
}

#[test]
fn notify_never_caps() {
    let mut b = budget(1_000.0, AtLimit::Notify);
    let mut state = bucket(100.0);
    let recorded = b.record(&mut state, 5_000.0, 0.0, &Consumption::default(), at(1.0));
    assert_eq!(b.cap(at(1.0)), f64::INFINITY);
    let fired: Vec<u32> = recorded.iter().map(|e| e.threshold.percent).collect();
    assert_eq!(fired, vec![50, 75, 90, 100]);
}

#[test]
fn throttle_switches_to_the_baseline_and_caps_at_its_rate_since_the_limit() {
    let mut b = budget(1_000.0, AtLimit::Throttle { baseline: BASELINE });
    let mut state = bucket(100.0);
    state.tokens = -300.0;
    state.committed_tokens = 300.0;
    state.committed_rate = 30.0;
    b.record(&mut state, 1_000.0, 0.0, &Consumption::default(), at(10.0));
    assert!(b.throttled());
    assert_eq!(state.limits, BASELINE);
    assert_eq!(
        (state.tokens, state.committed_tokens, state.committed_rate),
        (0.0, 0.0, 0.0)
    );
    assert_eq!(b.cap(at(10.0)), 0.0);
    assert_eq!(b.cap(at(15.0)), 50.0);
    b.record(&mut state, 30.0, 0.0, &Consumption::default(), at(15.0));
    assert_eq!(b.cap(at(16.0)), 30.0);
    assert_eq!(b.own_limits(&state).refill_rate, 100.0);
    // The next cycle gives the bucket its own limits back.
    let record = b.roll(&mut state, at(86_400.0)).expect("a closed cycle");
    assert_eq!(record.usage.granted_tokens, 1_030.0);
    assert_eq!(record.limit_reached_at, Some(at(10.0)));
    assert_eq!(state.limits.refill_rate, 100.0);
    assert!(!b.throttled());
    assert_eq!(b.cap(at(86_400.0)), 1_000.0);
    assert_eq!(b.state.cycle.start, at(86_400.0));
}

#[test]
fn thresholds_fire_once_per_cycle() {
    let mut b = budget(1_000.0, AtLimit::Notify);
    let mut state = bucket(100.0);
    let none = Consumption::default();
    let percents = |events: Vec<BudgetEvent>| {
        events
            .iter()
            .map(|e| e.threshold.percent)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        percents(b.record(&mut state, 499.0, 0.0, &none, at(1.0))),
        Vec::<u32>::new()
    );
    assert_eq!(
        percents(b.record(&mut state, 1.0, 0.0, &none, at(2.0))),
        vec![50]
    );
    assert_eq!(
        percents(b.record(&mut state, 1.0, 0.0, &none, at(3.0))),
        Vec::<u32>::new()
    );
    assert_eq!(
        percents(b.record(&mut state, 0.0, 400.0, &none, at(4.0))),
        vec![75, 90]
    );
    b.roll(&mut state, at(86_401.0)).expect("valid");
    assert_eq!(
        percents(b.record(&mut state, 600.0, 0.0, &none, at(86_402.0))),
        vec![50]
    );
}

#[test]
fn the_cycle_record_sums_what_was_reported() {
    let mut b = budget(1e9, AtLimit::Stop);
    let mut state = bucket(100.0);
    let report = Consumption {
        request_unit_micros: 1_500_000,
        read_bytes: 10,
        ..Consumption::default()
    };
    for i in 0..10 {
        b.record(&mut state, 1.5, 0.25, &report, at(f64::from(i)));
    }
    let record = b.roll(&mut state, at(90_000.0)).expect("valid");
    assert_eq!(record.usage.consumption.request_unit_micros, 15_000_000);
    assert_eq!(record.usage.consumption.read_bytes, 100);
    assert_eq!(record.usage.granted_tokens, 15.0);
    assert_eq!(record.usage.fallback_tokens, 2.5);
    assert_eq!(record.cycle.end, utc("1970-01-02T00:00:00Z"));
    assert!(b.roll(&mut state, at(90_001.0)).is_none());
}

#[test]
fn the_forecast_follows_the_recent_rate() {
    let mut b = budget(1e9, AtLimit::Notify);
    let mut state = bucket(100.0);
    // 10 tokens a second for two hours.
    for s in 0..7_200 {
        b.record(
            &mut state,
            10.0,
            0.0,
            &Consumption::default(),
            at(f64::from(s)),
        );
    }
    let now = at(7_200.0);
    let rate = b.rate_at(now);
    assert!((rate - 10.0).abs() < 1.5, "rate {rate}");
    let expected = 72_000.0 + rate * (86_400.0 - 7_200.0);
    assert!((b.forecast(now) - expected).abs() < 1e-6);
}

#[test]
fn a_lower_amount_mid_cycle_applies_to_what_remains() {
    let mut b = budget(1_000.0, AtLimit::Throttle { baseline: BASELINE });
    let mut state = bucket(100.0);
    b.record(&mut state, 700.0, 0.0, &Consumption::default(), at(1.0));
    let mut lower = b.budget.clone();
    lower.amount = 500.0;
    assert!(
        b.change(&mut state, lower, at(2.0))
            .expect("valid")
            .is_empty()
    );
    assert!(b.throttled());
    assert_eq!(state.limits, BASELINE);
    assert_eq!(
        b.cap(at(3.0)),
        0.0,
        "700 spent of 500, plus 10 s of baseline"
    );
    let mut higher = b.budget.clone();
    higher.amount = 2_000.0;
    b.change(&mut state, higher, at(3.0)).expect("valid");
    assert!(!b.throttled());
    assert_eq!(state.limits.refill_rate, 100.0);
    assert_eq!(b.cap(at(3.0)), 1_300.0);
}

#[test]
fn a_new_cycle_rule_closes_the_cycle_now() {
    let mut b = budget(1_000.0, AtLimit::Stop);
    let mut state = bucket(100.0);
    b.record(&mut state, 100.0, 0.0, &Consumption::default(), at(3_600.0));
    let mut weekly = b.budget.clone();
    weekly.cycle = CycleRule::utc(Period::Weekly {
        anchor_weekday: Weekday::Monday,
    });
    let records = b.change(&mut state, weekly, at(7_200.0)).expect("valid");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.cycle.start, Timestamp::EPOCH);
    assert_eq!(record.cycle.end, at(7_200.0));
    assert_eq!(record.usage.granted_tokens, 100.0);
    assert_eq!(b.state.cycle.start, at(7_200.0));
    // 1970-01-01 was a Thursday: the next Monday is the 5th.
    assert_eq!(b.state.cycle.end, utc("1970-01-05T00:00:00Z"));
}

#[test]
fn budgets_name_the_field_at_fault() {
    let rule = CycleRule::utc(Period::Daily);
    let field = |b: Budget| b.validated().expect_err("refused").field;
    assert_eq!(
        field(Budget::new(0.0, rule.clone(), AtLimit::Stop)),
        "amount"
    );
    assert_eq!(
        field(Budget::new(f64::NAN, rule.clone(), AtLimit::Stop)),
        "amount"
    );
    let slow = AtLimit::Throttle {
        baseline: Limits {
            refill_rate: -1.0,
            burst_limit: 1.0,
        },
    };
    assert_eq!(
        field(Budget::new(1.0, rule.clone(), slow)),
        "baseline.refill_rate"
    );
    let mut priced = Budget::new(1.0, rule.clone(), AtLimit::Stop);
    priced.price = Some(Price {
        per_million_tokens: 0.2,
        currency: "usd".into(),
    });
    assert_eq!(field(priced), "price.currency");
    assert_eq!(
        Threshold::parse("thresholds", "0")
            .expect_err("refused")
            .field,
        "thresholds"
    );
    assert_eq!(
        Threshold::parse("thresholds", "forecast:100").expect("valid"),
        Threshold {
            on: Measure::Forecast,
            percent: 100
        }
    );
}

#[test]
fn a_change_or_an_end_after_the_cycle_closes_that_cycle_first() {
    let mut b = budget(1_000.0, AtLimit::Stop);
    let mut state = bucket(100.0);
    b.record(&mut state, 300.0, 0.0, &Consumption::default(), at(10.0));
    // Nobody asked since the day ended: ending now leaves yesterday's
    // record and today's (empty) one.
    let records = b.clone().end(&mut state.clone(), at(86_400.0 + 60.0));
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].usage.granted_tokens, 300.0);
    assert_eq!(records[0].cycle.end, at(86_400.0));
    assert_eq!(records[1].cycle.start, at(86_400.0));
    assert_eq!(records[1].usage.granted_tokens, 0.0);
    let mut more = b.budget.clone();
    more.amount = 2_000.0;
    let closed = b
        .change(&mut state, more, at(86_400.0 + 60.0))
        .expect("valid");
    assert_eq!(closed.len(), 1, "yesterday's");
    assert_eq!(b.cap(at(86_400.0 + 61.0)), 2_000.0, "today starts afresh");
}
