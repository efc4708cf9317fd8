//! How long a client waits when an overloaded server refused its request
//! and asked for a pause (`grpc-retry-pushback-ms`): between one and two
//! pauses. The server gives each refused request its own time to come
//! back, lined up at the rate it admits work; the jitter spreads the pods
//! told the same time (at the pause's cap), and the ones told too early
//! because the server had not measured its rate yet (a herd meeting a
//! fresh server). Measured with the overload benchmark, honouring the
//! pause more closely (at most a quarter more) halved what a herd got
//! served. One rule for the token-bucket controller, the partition
//! limiter, the key-limits client and the load generator.

use std::time::Duration;

/// The most a client adds to the pause asked for, as a fraction of it.
pub const PUSHBACK_JITTER: f64 = 1.0;

/// The wait before retrying a refused request: the pause asked for, plus
/// up to [`PUSHBACK_JITTER`] of it (`draw` uniform in `[0, 1)`; anything
/// else counts as 0 or 1).
pub fn pushback_wait(pushback: Duration, draw: f64) -> Duration {
    let draw = if draw.is_finite() {
        draw.clamp(0.0, 1.0)
    } else {
        0.0
    };
    pushback.mul_f64(1.0 + PUSHBACK_JITTER * draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_between_one_and_two_pauses() {
        let pause = Duration::from_secs(4);
        assert_eq!(pushback_wait(pause, 0.0), pause);
        assert_eq!(pushback_wait(pause, 0.5), Duration::from_secs(6));
        assert_eq!(pushback_wait(pause, 1.0), Duration::from_secs(8));
        assert_eq!(pushback_wait(pause, f64::NAN), pause);
        assert_eq!(pushback_wait(pause, -3.0), pause);
        assert_eq!(pushback_wait(Duration::ZERO, 0.7), Duration::ZERO);
    }
}
