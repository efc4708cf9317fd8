//! At most one log line per interval for a condition that fails many
//! requests at once. During a database failover every pending request
//! fails the same way; one line a second with the count of the others says
//! as much as hundreds, and keeps the rest of the log readable. The
//! `store unavailable` line goes through it, and so do the refusals of pod
//! authentication.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets one line through per interval and counts the ones it holds back.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval_ms: u64,
    /// Milliseconds since the process's first throttled line before which
    /// nothing more is logged.
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    pub(crate) const fn new(interval: Duration) -> Self {
        Self {
            interval_ms: interval.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one let through)` if a line
    /// may be logged now, else `None` (and this one is counted). A line
    /// held back by another thread while this one is let through may be
    /// counted in this line rather than the next; none is lost.
    pub(crate) fn allow(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        let elapsed = START.get_or_init(Instant::now).elapsed();
        self.allow_at(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }

    fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(self.interval_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        assert_eq!(throttle.allow_at(0), Some(0));
        assert_eq!(throttle.allow_at(10), None);
        assert_eq!(throttle.allow_at(999), None);
        assert_eq!(throttle.allow_at(1000), Some(2));
        assert_eq!(throttle.allow_at(1500), None);
        assert_eq!(throttle.allow_at(5000), Some(1));
        assert_eq!(throttle.allow_at(5001), None);
    }

    #[test]
    fn concurrent_callers_let_one_line_through() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let lines: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        (0..1000)
                            .filter_map(|_| throttle.allow_at(0))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a caller thread panicked"))
                .collect()
        });
        assert_eq!(lines.len(), 1, "one line let through: {lines:?}");
        // Lines counted while the first was let through may be reported
        // in it; every one of the 7 999 held back is reported once.
        let next = throttle
            .allow_at(1000)
            .expect("the next interval lets a line through");
        assert_eq!(lines[0] + next, 7999);
    }
}
