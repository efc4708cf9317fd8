//! This replica's checks and refusals of each per-key bucket per second,
//! over the last seconds: what `ListKeyBuckets`, `DescribeTenant` and the
//! console show beside the keys the store holds.
//!
//! Kept in memory, per replica, and never in the store: a check of a
//! per-key bucket writes only its key's row, so checks of different keys
//! run side by side; a count per bucket in the store would be a row that
//! every check of every key writes, and would serialise them all (on
//! PostgreSQL, a row lock held to each transaction's end). Each replica
//! therefore shows what it answered itself, and says so; the rule of the
//! window is `tollgate_core::rate_window`. A bucket nobody checked for a
//! whole window is forgotten at the next tidy-up.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tollgate_core::BucketKey;
use tollgate_core::rate_window::{Outcome, RateWindow, WINDOW_SECONDS, WindowRates};

/// Every bucket's window, and when they were last tidied.
#[derive(Debug)]
pub struct CheckRates {
    /// The origin of the windows' time: when the replica started counting.
    started: Instant,
    windows: Mutex<Windows>,
}

#[derive(Debug, Default)]
struct Windows {
    by_bucket: HashMap<BucketKey, RateWindow>,
    tidied: Duration,
}

impl CheckRates {
    pub fn new() -> CheckRates {
        CheckRates {
            started: Instant::now(),
            windows: Mutex::new(Windows::default()),
        }
    }

    fn windows(&self) -> std::sync::MutexGuard<'_, Windows> {
        // The windows are plain counts: a panic elsewhere leaves them usable.
        self.windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one check of `key`, as `outcome` says.
    pub fn observe(&self, key: &BucketKey, outcome: Outcome) {
        let now = self.started.elapsed();
        let mut windows = self.windows();
        // Once a window, drop the buckets idle for a whole one.
        if now.saturating_sub(windows.tidied) >= Duration::from_secs(WINDOW_SECONDS) {
            windows.by_bucket.retain(|_, w| !w.is_idle(now));
            windows.tidied = now;
        }
        match windows.by_bucket.get_mut(key) {
            Some(window) => window.record(now, outcome),
            None => {
                let mut window = RateWindow::new();
                window.record(now, outcome);
                windows.by_bucket.insert(key.clone(), window);
            }
        }
    }

    /// The rates of `key` over the window ending now (zero for a bucket
    /// not checked in it).
    pub fn rates(&self, key: &BucketKey) -> WindowRates {
        let now = self.started.elapsed();
        let windows = self.windows();
        windows
            .by_bucket
            .get(key)
            .map_or_else(|| RateWindow::new().rates(now), |w| w.rates(now))
    }
}

impl Default for CheckRates {
    fn default() -> Self {
        CheckRates::new()
    }
}
