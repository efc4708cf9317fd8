//! Impact preview: what a bucket's limits would have done to its recorded
//! usage.
//!
//! An operator about to change a limit wants to know whom it would have
//! hurt. The usage history ([`crate::history`]) keeps what each bucket was
//! granted per slot (a minute for 14 days by default); [`replay`] feeds
//! those grants, as demand, through the ideal bucket ([`crate::ideal`], the
//! simulator's reference, instantly synchronised) under the limits given,
//! and says what it would not have served: demand that waited `max_wait`
//! and gave up. Run under the current limits and under the proposed ones,
//! the difference is what the change does.
//!
//! The history's spans are replayed as recorded: consecutive rows a minute
//! apart, and a bucket waking from idle gets a row closing the idle
//! stretch first, so a span's demand fell within it. It arrives evenly
//! over the span, a second at a time; a span the bucket covers without
//! anything waiting takes one step ([`IdealBucket::flow`]). The bucket starts the span full. The replay
//! runs on past the last slot until nothing waits, so demand at the end is
//! served or gives up as it would have.
//!
//! Recorded demand is what the bucket granted. Where the recorded limits
//! throttled (`Impact::recorded_throttled_seconds` > 0), the pods wanted
//! more than they were granted, and the preview can only under-state what
//! a lower limit throttles there.

use std::time::Duration;

use serde::Serialize;

use crate::budget::AtLimit;
use crate::global_bucket::Limits;
use crate::history::Usage;
use crate::ideal::IdealBucket;
use crate::time::Timestamp;

/// The replay's tick: a slot's demand arrives a second at a time.
pub const TICK: Duration = Duration::from_secs(1);

/// What the limits would have done to the recorded usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Impact {
    /// Tokens the history recorded as granted: the demand replayed.
    pub demand: f64,
    /// Demand not served: it waited `max_wait` and gave up (refused, for
    /// the pods).
    pub throttled: f64,
    /// Demand served after waiting.
    pub delayed: f64,
    /// The longest any served demand waited, in seconds.
    pub longest_wait_seconds: f64,
    /// The hour (UTC, on the hour) with the most demand; `None` without
    /// demand.
    pub busiest_hour: Option<Hour>,
    /// Pod-seconds the recorded limits throttled over the span.
    pub recorded_throttled_seconds: f64,
    /// When the grants reached the plan's budget; `None` if they did not
    /// (or without one).
    pub budget_reached: Option<Timestamp>,
}

/// One hour of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Hour {
    pub start: Timestamp,
    pub demand: f64,
    /// Demand that arrived in the hour and gave up.
    pub throttled: f64,
}

const HOUR_MICROS: i64 = 3_600_000_000;

/// Per-hour sums of a replay, by hour since the span's first hour.
struct Hours {
    first: i64,
    hours: Vec<Hour>,
}

impl Hours {
    fn new(start: Timestamp) -> Self {
        Hours {
            first: start.unix_micros().div_euclid(HOUR_MICROS),
            hours: Vec::new(),
        }
    }

    fn at(&mut self, micros: i64) -> &mut Hour {
        let index = usize::try_from(micros.div_euclid(HOUR_MICROS) - self.first).unwrap_or(0);
        while self.hours.len() <= index {
            let hour = self.first + self.hours.len() as i64;
            self.hours.push(Hour {
                start: Timestamp::from_unix_micros(hour * HOUR_MICROS),
                ..Hour::default()
            });
        }
        &mut self.hours[index]
    }

    fn busiest(&self) -> Option<Hour> {
        self.hours
            .iter()
            .filter(|h| h.demand > 0.0)
            .copied()
            .reduce(|a, b| if b.demand > a.demand { b } else { a })
    }
}

/// What a replay runs under: a bucket's limits, and its budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub limits: Limits,
    pub budget: Option<SpendLimit>,
}

impl Plan {
    /// Limits without a budget.
    pub fn limits(limits: Limits) -> Plan {
        Plan {
            limits,
            budget: None,
        }
    }
}

/// A budget in a replay: the tokens the span may grant before its limit,
/// and what happens then (as [`crate::budget`] does: `stop` grants nothing
/// more; `throttle` runs at the baseline, starting empty; `notify` only
/// says when).
#[derive(Clone, Debug, PartialEq)]
pub struct SpendLimit {
    pub amount: f64,
    pub at_limit: AtLimit,
}

/// A replay under way: the ideal bucket, what it did so far, and the
/// budget until its limit is reached.
struct Replay {
    bucket: IdealBucket,
    origin: Timestamp,
    max_wait: f64,
    impact: Impact,
    hours: Hours,
    admitted: f64,
    budget: Option<SpendLimit>,
}

impl Replay {
    fn at(&self, seconds: f64) -> Timestamp {
        Timestamp::from_unix_micros(self.origin.unix_micros() + (seconds * 1e6) as i64)
    }

    /// Whether demand of `tokens` stays within the budget.
    fn within_budget(&self, tokens: f64) -> bool {
        self.budget
            .as_ref()
            .is_none_or(|b| self.admitted + tokens < b.amount)
    }

    /// A tick at `now` with `demand` arriving.
    fn tick(&mut self, now: f64, demand: f64) {
        if let Some(budget) = &self.budget {
            // The budget's cap on grants: what is left of its amount.
            self.bucket.cap_tokens(budget.amount - self.admitted);
        }
        let arrivals = if demand > 0.0 {
            vec![(0, demand)]
        } else {
            Vec::new()
        };
        let out = self.bucket.tick(now, arrivals, &[]);
        // What gives up now arrived `max_wait` ago, at the end of the
        // second it stands for (counted in that second's hour, as a span's
        // demand is in its end's).
        let arrived = self.at(now - self.max_wait).unix_micros() - 1;
        for &(_, tokens, wait) in &out.admitted {
            self.admitted += tokens;
            if wait > 0.0 && tokens > 0.0 {
                self.impact.delayed += tokens;
                self.impact.longest_wait_seconds = self.impact.longest_wait_seconds.max(wait);
            }
        }
        let gave_up: f64 = out.timed_out.iter().map(|&(_, tokens)| tokens).sum();
        self.impact.throttled += gave_up;
        self.hours.at(arrived).throttled += gave_up;
        self.reach_budget(now);
    }

    /// Applies the budget's limit once the grants reach its amount.
    fn reach_budget(&mut self, now: f64) {
        let Some(budget) = self.budget.take_if(|b| self.admitted >= b.amount - 1e-9) else {
            return;
        };
        self.impact.budget_reached = Some(self.at(now));
        match budget.at_limit {
            AtLimit::Notify => {}
            AtLimit::Stop => self.bucket.reconfigure(0.0, 0.0, 0.0),
            AtLimit::Throttle { baseline } => {
                self.bucket
                    .reconfigure(baseline.refill_rate, baseline.burst_limit, 0.0)
            }
        }
    }

    /// A span's `demand` arriving evenly from `from` to `to` (seconds).
    fn span(&mut self, from: f64, to: f64, demand: f64) {
        let length = to - from;
        if length > 0.0
            && self.within_budget(demand)
            && self.bucket.flow(from, 0.0)
            && self.bucket.flow(to, demand / length)
        {
            self.admitted += demand;
            return;
        }
        let tick = TICK.as_secs_f64();
        let ticks = (length / tick).ceil().max(1.0);
        let step = length / ticks;
        let each = demand / ticks;
        for k in 1..=ticks as u64 {
            self.tick(from + step * k as f64, each);
        }
    }
}

/// Replays `usage` (spans in time order, as the history gives them)
/// through the ideal bucket of `plan`, whose demand gives up after
/// `max_wait`.
pub fn replay(usage: &[Usage], plan: &Plan, max_wait: Duration) -> Impact {
    let Some(first) = usage.first() else {
        return Impact::default();
    };
    let origin = first.from;
    let max_wait = max_wait.as_secs_f64();
    let limits = plan.limits;
    let mut replay = Replay {
        bucket: IdealBucket::new(
            limits.refill_rate,
            limits.burst_limit,
            limits.burst_limit,
            max_wait,
        ),
        origin,
        max_wait,
        impact: Impact::default(),
        hours: Hours::new(origin),
        admitted: 0.0,
        budget: plan.budget.clone(),
    };
    replay.reach_budget(0.0);
    for span in usage {
        let from = span.from.seconds_since(origin).max(0.0);
        let to = span.to.seconds_since(origin).max(from);
        let demand = span.granted_tokens.max(0.0);
        replay.impact.demand += demand;
        replay.impact.recorded_throttled_seconds += span.throttled_micros as f64 / 1e6;
        replay
            .hours
            .at(span.to.unix_micros().saturating_sub(1))
            .demand += demand;
        replay.span(from, to, demand);
    }
    // Demand still waiting is served or gives up as it would have.
    let mut now = usage.last().map_or(0.0, |u| u.to.seconds_since(origin));
    while !replay.bucket.is_idle() {
        now += TICK.as_secs_f64();
        replay.tick(now, 0.0);
    }
    let mut impact = replay.impact;
    impact.busiest_hour = replay.hours.busiest();
    impact
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rate` tokens a second in minute spans for `minutes`.
    fn minutes(start: i64, rate: f64, minutes: i64) -> Vec<Usage> {
        (0..minutes)
            .map(|m| Usage {
                from: Timestamp::from_unix_micros((start + m * 60) * 1_000_000),
                to: Timestamp::from_unix_micros((start + (m + 1) * 60) * 1_000_000),
                granted_tokens: rate * 60.0,
                ..Usage::default()
            })
            .collect()
    }

    fn limits(refill_rate: f64, burst_limit: f64) -> Limits {
        Limits {
            refill_rate,
            burst_limit,
        }
    }

    #[test]
    fn an_hour_at_150_previewed_at_100_throttles_50_a_second() {
        let usage = minutes(1_800_000_000, 150.0, 60);
        let impact = replay(
            &usage,
            &Plan::limits(limits(100.0, 1000.0)),
            Duration::from_secs(5),
        );
        let expected = 50.0 * 3600.0;
        assert!(
            (impact.throttled - expected).abs() / expected < 0.01,
            "{impact:?}"
        );
        assert_eq!(impact.demand, 150.0 * 3600.0);
        assert!(
            (impact.longest_wait_seconds - 5.0).abs() <= 1.0,
            "{impact:?}"
        );
        let hour = impact.busiest_hour.expect("an hour");
        assert_eq!(hour.start.unix_micros(), 1_800_000_000_000_000);
        assert!((hour.throttled - impact.throttled).abs() < 1e-6);
    }

    #[test]
    fn limits_that_cover_the_usage_throttle_nothing_and_take_a_step_a_slot() {
        let usage = minutes(0, 150.0, 24 * 60);
        let impact = replay(
            &usage,
            &Plan::limits(limits(150.0, 100.0)),
            Duration::from_secs(5),
        );
        assert_eq!(impact.throttled, 0.0);
        assert_eq!(impact.delayed, 0.0);
        assert_eq!(impact.longest_wait_seconds, 0.0);
    }

    #[test]
    fn a_burst_the_bucket_holds_is_served_and_the_busiest_hour_is_found() {
        // Quiet at 1/s, then one minute at 100/s in the third hour: a
        // burst of 6 000 against 60/s and a burst limit of 6 000.
        let mut usage = minutes(0, 1.0, 150);
        usage[130].granted_tokens = 6_000.0;
        let impact = replay(
            &usage,
            &Plan::limits(limits(60.0, 6_000.0)),
            Duration::from_secs(5),
        );
        assert_eq!(impact.throttled, 0.0);
        let hour = impact.busiest_hour.expect("an hour");
        assert_eq!(hour.start.unix_micros(), 2 * HOUR_MICROS);
        // A burst limit of 2 000 and 60/s cannot hold 100/s for a minute
        // (it runs dry after 50 s), and what waits past 5 s gives up.
        let impact = replay(
            &usage,
            &Plan::limits(limits(60.0, 2_000.0)),
            Duration::from_secs(5),
        );
        assert!(
            impact.throttled > 0.0 && impact.throttled < 6_000.0,
            "{impact:?}"
        );
        assert!(impact.longest_wait_seconds > 0.0);
    }

    #[test]
    fn a_budget_stops_throttles_or_only_says_when_it_is_reached() {
        // 150/s for an hour under 200/s: 540 000 tokens; a budget of half.
        let usage = minutes(0, 150.0, 60);
        let plan = |at_limit| Plan {
            limits: limits(200.0, 2_000.0),
            budget: Some(SpendLimit {
                amount: 270_000.0,
                at_limit,
            }),
        };
        let wait = Duration::from_secs(5);
        let half_way = 1_800_000_000;
        let near = |t: Option<Timestamp>| {
            (t.expect("reached").unix_micros() - half_way).abs() <= 1_000_000
        };

        let stop = replay(&usage, &plan(AtLimit::Stop), wait);
        assert!(near(stop.budget_reached), "{stop:?}");
        assert!((stop.throttled - 270_000.0).abs() < 200.0, "{stop:?}");

        let baseline = limits(100.0, 1_000.0);
        let throttle = replay(&usage, &plan(AtLimit::Throttle { baseline }), wait);
        assert!(near(throttle.budget_reached), "{throttle:?}");
        // The second half at 100/s of 150/s, starting empty; the last 5 s
        // of demand are served after the hour.
        assert!(
            (throttle.throttled - 90_000.0).abs() < 1_000.0,
            "{throttle:?}"
        );

        let notify = replay(&usage, &plan(AtLimit::Notify), wait);
        assert!(near(notify.budget_reached), "{notify:?}");
        assert_eq!(notify.throttled, 0.0);
        // A budget the span does not reach changes nothing.
        let mut unreached = plan(AtLimit::Stop);
        unreached.budget = Some(SpendLimit {
            amount: 1e9,
            at_limit: AtLimit::Stop,
        });
        let none = replay(&usage, &unreached, wait);
        assert_eq!(none.budget_reached, None);
        assert_eq!(none.throttled, 0.0);
    }

    proptest::proptest! {
        /// Over any minute spans and limits: the replay never serves more
        /// than the bucket can (its burst and its refill over the span and
        /// the wait after it), never throttles more than the demand, and
        /// throttles nothing where every span's rate is within the refill
        /// rate. Spans it takes in one step ([`IdealBucket::flow`]) and
        /// spans it ticks through are both in it.
        #[test]
        fn a_replay_serves_what_a_bucket_can_and_no_less_than_the_covered_demand(
            rates in proptest::collection::vec(0.0f64..400.0, 1..90),
            refill_rate in 1.0f64..300.0,
            burst_limit in 0.0f64..5_000.0,
        ) {
            let usage: Vec<Usage> = rates
                .iter()
                .enumerate()
                .map(|(m, &rate)| {
                    let m = m as i64;
                    Usage {
                        from: Timestamp::from_unix_micros(m * 60_000_000),
                        to: Timestamp::from_unix_micros((m + 1) * 60_000_000),
                        granted_tokens: rate * 60.0,
                        ..Usage::default()
                    }
                })
                .collect();
            let wait = Duration::from_secs(5);
            let impact = replay(&usage, &Plan::limits(limits(refill_rate, burst_limit)), wait);
            let demand: f64 = rates.iter().map(|r| r * 60.0).sum();
            let slack = 1e-6 * demand.max(1.0);
            proptest::prop_assert!((impact.demand - demand).abs() <= slack);
            proptest::prop_assert!(impact.throttled <= demand + slack);
            let seconds = 60.0 * rates.len() as f64 + wait.as_secs_f64() + TICK.as_secs_f64();
            let most = burst_limit + refill_rate * seconds;
            proptest::prop_assert!(
                demand - impact.throttled <= most + slack,
                "served {} of at most {most}",
                demand - impact.throttled
            );
            if rates.iter().all(|&r| r <= refill_rate) {
                proptest::prop_assert_eq!(impact.throttled, 0.0);
                proptest::prop_assert_eq!(impact.longest_wait_seconds, 0.0);
            }
        }
    }

    #[test]
    fn gaps_refill_the_bucket_and_nothing_is_an_empty_impact() {
        assert_eq!(
            replay(&[], &Plan::limits(limits(1.0, 1.0)), TICK),
            Impact::default()
        );
        let mut usage = minutes(0, 100.0, 1);
        usage.extend(minutes(3_600, 100.0, 1));
        // 6 000 a minute against a burst of 6 000 and no refill to speak
        // of: the hour between refills it.
        let impact = replay(
            &usage,
            &Plan::limits(limits(2.0, 6_000.0)),
            Duration::from_secs(5),
        );
        assert!(impact.throttled < 300.0, "{impact:?}");
    }
}
