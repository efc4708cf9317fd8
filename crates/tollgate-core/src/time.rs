//! Points in time, as the stores keep them.
//!
//! A [`Timestamp`] is microseconds since the Unix epoch — PostgreSQL's
//! resolution — so a value read from any store round-trips exactly. Elapsed
//! time is clamped at zero: clocks of different replicas may disagree, and a
//! clock that steps back must never un-refill a bucket.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch; also the origin of the simulator's virtual time.
    pub const EPOCH: Timestamp = Timestamp(0);

    pub const fn from_unix_micros(micros: i64) -> Self {
        Timestamp(micros)
    }

    pub const fn unix_micros(self) -> i64 {
        self.0
    }

    /// `time` (a system clock's reading, a stored TIMESTAMPTZ), before
    /// the epoch too; clamped to the range of a timestamp.
    pub fn from_system_time(time: std::time::SystemTime) -> Self {
        Timestamp(match time.duration_since(std::time::UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |m| -m),
        })
    }

    /// A timestamp `secs` after the epoch; convenient for tests and virtual time.
    pub fn from_secs_f64(secs: f64) -> Self {
        Timestamp((secs * 1e6).round() as i64)
    }

    /// Seconds from `earlier` to `self`, or zero if `earlier` is not earlier.
    pub fn seconds_since(self, earlier: Timestamp) -> f64 {
        self.0.saturating_sub(earlier.0).max(0) as f64 / 1e6
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is not earlier.
    pub fn duration_since(self, earlier: Timestamp) -> Duration {
        let micros = self.0.saturating_sub(earlier.0).max(0);
        Duration::from_micros(micros.unsigned_abs())
    }

    pub fn saturating_add(self, d: Duration) -> Timestamp {
        let micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(micros))
    }

    pub fn saturating_sub(self, d: Duration) -> Timestamp {
        let micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_time_is_clamped_at_zero() {
        let t1 = Timestamp::from_secs_f64(10.0);
        let t0 = Timestamp::from_secs_f64(4.5);
        assert_eq!(t1.seconds_since(t0), 5.5);
        assert_eq!(t0.seconds_since(t1), 0.0);
        assert_eq!(t0.duration_since(t1), Duration::ZERO);
    }

    #[test]
    fn durations_add_and_saturate() {
        let t = Timestamp::from_unix_micros(1_000);
        assert_eq!(
            t.saturating_add(Duration::from_millis(2)).unix_micros(),
            3_000
        );
        assert_eq!(
            t.saturating_sub(Duration::from_millis(2)).unix_micros(),
            -1_000
        );
        assert_eq!(
            Timestamp::from_unix_micros(i64::MAX - 1).saturating_add(Duration::from_secs(1)),
            Timestamp::from_unix_micros(i64::MAX)
        );
    }
}
