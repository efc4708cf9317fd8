//! Events per second over the last seconds, counted in memory: what a
//! server replica shows as a per-key bucket's checks and refusals per
//! second.
//!
//! Why in memory and per replica: a check of a per-key bucket writes only
//! its key's row, so the checks of different keys never wait on each other.
//! A count per bucket in the store would be one more row every check of
//! every key writes, serialising them all. Each replica therefore counts
//! what it answered, and says so; summed over replicas, the rates are the
//! bucket's.
//!
//! A [`RateWindow`] keeps a count per whole second for the last
//! [`WINDOW_SECONDS`] seconds since an origin (the replica's start). Its
//! rates cover the seconds since the oldest kept one began, up to `now`:
//! between `WINDOW_SECONDS - 1` and `WINDOW_SECONDS` seconds, or the time
//! since the origin if that is shorter, and they say which
//! ([`WindowRates::window`]). Time is an argument: a `Duration` since the
//! origin.

use std::time::Duration;

/// How many whole seconds a window keeps.
pub const WINDOW_SECONDS: u64 = 10;

/// One second's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    second: u64,
    events: u64,
    refusals: u64,
    shadow_refusals: u64,
}

/// What became of one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Refused,
    /// Allowed only because its bucket is in shadow mode: enforcing, it
    /// would have been refused.
    ShadowRefused,
}

/// Counts of events (and of those refused) in the last seconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateWindow {
    slots: [Slot; WINDOW_SECONDS as usize],
}

/// What a window counted, and over how long.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowRates {
    pub events_per_second: f64,
    pub refusals_per_second: f64,
    /// The time the rates cover, up to `now`.
    pub window: Duration,
    pub events: u64,
    pub refusals: u64,
    /// Allowed in shadow mode that enforcing would have refused.
    pub shadow_refusals_per_second: f64,
    pub shadow_refusals: u64,
}

impl RateWindow {
    pub fn new() -> RateWindow {
        RateWindow::default()
    }

    /// Counts one event at `now` (since the origin), as `outcome` says.
    pub fn record(&mut self, now: Duration, outcome: Outcome) {
        let second = now.as_secs();
        let slot = &mut self.slots[(second % WINDOW_SECONDS) as usize];
        if slot.second != second {
            *slot = Slot {
                second,
                ..Slot::default()
            };
        }
        slot.events += 1;
        match outcome {
            Outcome::Allowed => {}
            Outcome::Refused => slot.refusals += 1,
            Outcome::ShadowRefused => slot.shadow_refusals += 1,
        }
    }

    /// True if nothing was counted in the window ending at `now`: the
    /// window can be dropped.
    pub fn is_idle(&self, now: Duration) -> bool {
        self.rates(now).events == 0
    }

    /// The rates over the window ending at `now`.
    pub fn rates(&self, now: Duration) -> WindowRates {
        let second = now.as_secs();
        let oldest = second.saturating_sub(WINDOW_SECONDS - 1);
        let (events, refusals, shadow_refusals) = self
            .slots
            .iter()
            .filter(|s| (oldest..=second).contains(&s.second) && s.events > 0)
            .fold((0, 0, 0), |(e, r, sh), s| {
                (e + s.events, r + s.refusals, sh + s.shadow_refusals)
            });
        // From the start of the oldest second kept (or the origin) to now.
        let window = now.saturating_sub(Duration::from_secs(oldest));
        let per_second = |n: u64| {
            if window.is_zero() {
                0.0
            } else {
                n as f64 / window.as_secs_f64()
            }
        };
        WindowRates {
            events_per_second: per_second(events),
            refusals_per_second: per_second(refusals),
            window,
            events,
            refusals,
            shadow_refusals_per_second: per_second(shadow_refusals),
            shadow_refusals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn rates_cover_the_last_ten_seconds_or_the_time_since_the_origin() {
        let mut w = RateWindow::new();
        for _ in 0..6 {
            w.record(at(2.5), Outcome::Allowed);
        }
        w.record(at(2.6), Outcome::Refused);
        w.record(at(2.7), Outcome::ShadowRefused);
        // Three seconds since the origin: 8 events over 3 s, one refused
        // and one allowed in shadow mode.
        let r = w.rates(at(3.0));
        assert_eq!((r.events, r.refusals, r.shadow_refusals), (8, 1, 1));
        assert_eq!(r.window, at(3.0));
        assert_eq!(r.events_per_second, 8.0 / 3.0);
        assert_eq!(r.shadow_refusals_per_second, 1.0 / 3.0);
        // At 12.5 s the window starts at second 3: the events of second 2
        // have left it.
        let r = w.rates(at(12.5));
        assert_eq!((r.events, r.refusals), (0, 0));
        assert_eq!(r.window, at(9.5));
        assert!(w.is_idle(at(12.5)));
        // At 11.5 s second 2 is still in: 8 over 9.5 s.
        let r = w.rates(at(11.5));
        assert_eq!(r.events, 8);
        assert_eq!(r.window, at(9.5));
    }

    #[test]
    fn a_slot_is_reused_for_a_later_second() {
        let mut w = RateWindow::new();
        w.record(at(1.0), Outcome::Refused);
        w.record(at(11.0), Outcome::Allowed);
        let r = w.rates(at(11.0));
        assert_eq!((r.events, r.refusals), (1, 0));
    }
}
