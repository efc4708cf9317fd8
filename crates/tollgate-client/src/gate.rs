//! The gate: the core local bucket behind a lock, with a lock-free fast path.
//!
//! Admitting work when tokens are available is the hot path of every pod, so
//! it must cost no more than a plain rate limiter. Whenever nobody waits, the
//! bucket lends all its usable tokens to an atomic *reservoir*; an admission
//! that fits takes from it with one compare-and-swap, with no lock and no
//! clock read. Everything else — queueing, trickle delivery, debt, requests
//! to the server — happens under the lock, which first takes back what is
//! left in the reservoir ([`LocalBucket::settle`]) so the core bucket always
//! decides with the whole truth, and lends again afterwards.
//!
//! The reservoir holds micro-tokens. Only a lock holder swaps or stores it;
//! the fast path only ever subtracts from a non-negative value, so the
//! amount taken back is exact and nothing is charged twice or lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tollgate_core::{Consumption, LocalBucket, Timestamp, WaiterId};

use crate::error::{ClientError, Refusal};
use crate::metrics::Metrics;

/// The reservoir's value while nothing is lent: below any admission.
const CLOSED: i64 = i64::MIN;
const MICROS: f64 = 1e6;

/// Tokens (finite, not negative) in whole micro-tokens, rounded up so the
/// fast path never admits more than asked for. `None` if too large for the
/// fast path. (Rounded up by hand: `f64::ceil` is a call into libm on
/// baseline x86-64, a third of the fast path's time.)
#[inline]
pub(crate) fn micros(tokens: f64) -> Option<i64> {
    let scaled = tokens * MICROS;
    if scaled.is_nan() || scaled >= 9e18 {
        return None;
    }
    let whole = scaled as i64;
    Some(if (whole as f64) < scaled {
        whole + 1
    } else {
        whole
    })
}

pub(crate) struct Inner {
    pub bucket: LocalBucket,
    /// Queued acquisitions: how to tell each it is admitted, and its tokens.
    pub waiters: HashMap<WaiterId, (oneshot::Sender<()>, f64)>,
    pub metrics: Option<Metrics>,
    /// The server's final answer, once it refused the bucket: every call
    /// on the bucket fails with it from then on.
    pub refusal: Option<Refusal>,
}

impl Inner {
    /// The error a call on the bucket fails with once the server refused
    /// it, or `None` while it has not.
    pub fn refused(&self) -> Option<ClientError> {
        self.refusal.clone().map(ClientError::Refused)
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("bucket", &self.bucket.status())
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

/// Reads and writes counted by the fast path (`on_request`) without the
/// lock, folded into the bucket at its next locked operation (every report
/// to the server is one): read batches, read requests, read bytes, write
/// batches, write requests, write bytes.
#[derive(Debug, Default)]
struct PendingCounters([AtomicU64; 6]);

impl PendingCounters {
    fn add(&self, c: &Consumption) {
        let values = [
            c.read_batches,
            c.read_requests,
            c.read_bytes,
            c.write_batches,
            c.write_requests,
            c.write_bytes,
        ];
        for (counter, value) in self.0.iter().zip(values) {
            if value > 0 {
                counter.fetch_add(value, Ordering::Relaxed);
            }
        }
    }

    /// What was counted since the last call, as counters only.
    fn take(&self) -> Option<Consumption> {
        let [a, b, c, d, e, f] = &self.0;
        let take = |counter: &AtomicU64| {
            if counter.load(Ordering::Relaxed) == 0 {
                0
            } else {
                counter.swap(0, Ordering::Relaxed)
            }
        };
        let consumption = Consumption {
            read_batches: take(a),
            read_requests: take(b),
            read_bytes: take(c),
            write_batches: take(d),
            write_requests: take(e),
            write_bytes: take(f),
            ..Consumption::default()
        };
        (consumption != Consumption::default()).then_some(consumption)
    }
}

#[derive(Debug)]
pub(crate) struct Gate {
    reservoir: AtomicI64,
    pending: PendingCounters,
    /// Below this reservoir level the driver must look at the bucket.
    low_water: AtomicI64,
    inner: Mutex<Inner>,
    /// Wakes the driver: work queued, tokens low, shutdown.
    pub wake: Notify,
    origin: Instant,
}

impl Gate {
    pub fn new(bucket: LocalBucket, metrics: Option<Metrics>, origin: Instant) -> Self {
        let gate = Gate {
            reservoir: AtomicI64::new(CLOSED),
            low_water: AtomicI64::new(CLOSED),
            inner: Mutex::new(Inner {
                bucket,
                waiters: HashMap::new(),
                metrics,
                refusal: None,
            }),
            wake: Notify::new(),
            origin,
            pending: PendingCounters::default(),
        };
        gate.with_bucket(|_, _| ());
        gate
    }

    /// The bucket's clock: time since the controller started, so that paused
    /// tokio time drives it in tests.
    pub fn now(&self) -> Timestamp {
        let micros = self.origin.elapsed().as_micros();
        Timestamp::from_unix_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// Counts the reads and writes of `consumption` (its counters only)
    /// without the lock; the bucket takes them at its next locked
    /// operation.
    #[inline]
    pub fn record_counters(&self, consumption: &Consumption) {
        self.pending.add(consumption);
    }

    /// Admits `micros` from the reservoir if it holds that many.
    #[inline]
    pub fn fast_take(&self, micros: i64) -> bool {
        let mut current = self.reservoir.load(Ordering::Relaxed);
        loop {
            if current < micros {
                return false;
            }
            match self.reservoir.compare_exchange_weak(
                current,
                current - micros,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if current - micros < self.low_water.load(Ordering::Relaxed) {
                        self.wake.notify_one();
                    }
                    return true;
                }
                Err(actual) => current = actual,
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the bucket in a
        // state that is still consistent enough to keep admitting work.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the whole bucket: takes the reservoir back first, lends
    /// again afterwards, and keeps the metrics current.
    pub fn with_bucket<R>(&self, f: impl FnOnce(&mut Inner, Timestamp) -> R) -> R {
        let mut inner = self.lock();
        let left = self.reservoir.swap(CLOSED, Ordering::AcqRel);
        if left != CLOSED {
            inner.bucket.settle(left as f64 / MICROS);
        }
        if let Some(counted) = self.pending.take()
            && let Err(e) = inner.bucket.record_counters(&counted)
        {
            // Only sums past 2^53 of one counter between two locked
            // operations could be refused.
            tracing::warn!(error = %e, "tollgate: counters of reads and writes not recorded");
        }
        let now = self.now();
        let result = f(&mut inner, now);
        let lent = inner.bucket.lend();
        if lent > 0.0 {
            let lent_micros = (lent * MICROS).round() as i64;
            let low = inner
                .bucket
                .low_water()
                .map_or(CLOSED, |level| micros(level.max(0.0)).unwrap_or(i64::MAX));
            self.low_water.store(low, Ordering::Relaxed);
            self.reservoir.store(lent_micros, Ordering::Release);
        } else {
            self.low_water.store(CLOSED, Ordering::Relaxed);
        }
        let status = inner.bucket.status();
        let refused = inner.refusal.is_some();
        if let Some(metrics) = inner.metrics.as_mut() {
            metrics.observe(&status, refused);
            metrics
                .waiting
                .set(i64::try_from(status.waiters).unwrap_or(i64::MAX));
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_round_up_as_ceil_does() {
        let values = [
            0.0,
            1e-7,
            1e-6,
            1.0,
            1.000_000_1,
            0.333_333_333,
            2.5e-6,
            123_456.789,
            8.9e12,
            9e12,
            1e13,
        ];
        for tokens in values {
            let expected = (tokens * MICROS).ceil();
            let got = micros(tokens);
            if expected < 9e18 {
                assert_eq!(got, Some(expected as i64), "{tokens}");
            } else {
                assert_eq!(got, None, "{tokens}");
            }
        }
        assert_eq!(micros(f64::INFINITY), None);
        assert_eq!(micros(f64::NAN), None);
    }
}
