//! How long a pod waits for the answer to one attempt of a request before
//! it gives the attempt up and sends it again.
//!
//! A fixed timeout of seconds is far longer than an answer takes (a few
//! milliseconds to a server nearby): a pod whose request or answer was
//! lost sat out a whole burst its peers shared, and a pod in an outage
//! waited as long to hear of it. So the pod measures how long its answers
//! take, as TCP does (RFC 6298): a smoothed answer time and its mean
//! deviation, and gives up on an attempt after the smoothed time plus four
//! deviations, and never before twice the smoothed time (a network with no
//! jitter has no deviation to speak of), nor before a floor that covers a
//! store's tail (a PostgreSQL commit that waits for a checkpoint), nor
//! after the caller's longest timeout. Every attempt given up in a row
//! doubles the next one's wait, so a server slowed down by load is not
//! flooded with attempts it cannot finish in time.
//!
//! Giving up is safe: a retry repeats the request, sequence number
//! included, so a server that applied the attempt given up answers the
//! retry with the same grant and counts nothing twice. The attempt given
//! up is cancelled, and its answer, if one comes, is never applied.

use std::time::Duration;

/// The wait before a pod has measured any answer (RFC 6298's initial RTO).
pub const FIRST_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Weight of the latest answer in the smoothed answer time.
const SMOOTHING: f64 = 1.0 / 8.0;
/// Weight of the latest answer in the mean deviation.
const DEVIATION_SMOOTHING: f64 = 1.0 / 4.0;
/// Deviations waited beyond the smoothed answer time.
const DEVIATIONS: f64 = 4.0;
/// The most doublings of the wait for attempts given up in a row.
const MAX_DOUBLINGS: u32 = 16;

/// The answer times a pod has measured, smoothed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AnswerTime {
    /// Smoothed answer time and its mean deviation, seconds; `None` until
    /// the first answer.
    measured: Option<(f64, f64)>,
}

impl AnswerTime {
    /// Folds in an attempt answered `elapsed` after it was sent.
    pub fn record(&mut self, elapsed: Duration) {
        let sample = elapsed.as_secs_f64();
        self.measured = Some(match self.measured {
            None => (sample, sample / 2.0),
            Some((smoothed, deviation)) => (
                smoothed + SMOOTHING * (sample - smoothed),
                deviation + DEVIATION_SMOOTHING * ((sample - smoothed).abs() - deviation),
            ),
        });
    }

    /// How long to wait for the answer to an attempt after `given_up`
    /// attempts of the same request in a row were given up: at least
    /// `floor`, at most `longest`.
    pub fn attempt_timeout(&self, given_up: u32, floor: Duration, longest: Duration) -> Duration {
        let base = match self.measured {
            None => FIRST_ATTEMPT_TIMEOUT,
            Some((smoothed, deviation)) => {
                let wait = smoothed + (DEVIATIONS * deviation).max(smoothed);
                Duration::try_from_secs_f64(wait).unwrap_or(longest)
            }
        };
        base.max(floor)
            .saturating_mul(1 << given_up.min(MAX_DOUBLINGS))
            .min(longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: Duration = Duration::from_millis(100);
    const LONGEST: Duration = Duration::from_secs(5);

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn before_any_answer_an_attempt_waits_a_second_within_its_bounds() {
        let time = AnswerTime::default();
        assert_eq!(time.attempt_timeout(0, FLOOR, LONGEST), ms(1_000));
        assert_eq!(time.attempt_timeout(0, FLOOR, ms(300)), ms(300));
        assert_eq!(time.attempt_timeout(0, ms(2_000), LONGEST), ms(2_000));
    }

    #[test]
    fn steady_answers_give_twice_their_time_and_never_less_than_the_floor() {
        let mut time = AnswerTime::default();
        for _ in 0..200 {
            time.record(ms(200));
        }
        let wait = time.attempt_timeout(0, FLOOR, LONGEST);
        assert!(
            (wait.as_secs_f64() - 0.4).abs() < 1e-3,
            "{wait:?}: the deviation has died away"
        );
        let mut fast = AnswerTime::default();
        for _ in 0..200 {
            fast.record(ms(2));
        }
        assert_eq!(fast.attempt_timeout(0, FLOOR, LONGEST), FLOOR);
    }

    #[test]
    fn jittery_answers_are_waited_for_beyond_most_of_their_spread() {
        // Answers of 10 ms with one in five at 210 ms: the wait must cover
        // the slow ones, or every fifth attempt would be given up.
        let mut time = AnswerTime::default();
        for i in 0..500 {
            time.record(if i % 5 == 4 { ms(210) } else { ms(10) });
        }
        let wait = time.attempt_timeout(0, ms(1), LONGEST);
        assert!(wait > ms(210), "{wait:?}");
        assert!(wait < ms(1_000), "{wait:?}");
    }

    #[test]
    fn answers_that_slow_down_are_followed() {
        let mut time = AnswerTime::default();
        for _ in 0..100 {
            time.record(ms(5));
        }
        for _ in 0..100 {
            time.record(ms(800));
        }
        let wait = time.attempt_timeout(0, FLOOR, LONGEST);
        assert!(wait > ms(1_590) && wait < ms(1_700), "{wait:?}");
    }

    #[test]
    fn attempts_given_up_in_a_row_double_the_wait_up_to_the_longest() {
        let mut time = AnswerTime::default();
        time.record(ms(50)); // first sample: 50 + 4 × 25 = 150 ms
        let waits: Vec<Duration> = (0..8)
            .map(|given_up| time.attempt_timeout(given_up, FLOOR, LONGEST))
            .collect();
        assert_eq!(waits[0], ms(150));
        assert_eq!(waits[1], ms(300));
        assert_eq!(waits[4], ms(2_400));
        assert_eq!(waits[5], ms(4_800));
        assert_eq!(waits[6], LONGEST);
        assert_eq!(time.attempt_timeout(u32::MAX, FLOOR, LONGEST), LONGEST);
    }
}
