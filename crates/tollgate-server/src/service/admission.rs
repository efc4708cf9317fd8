//! Admission: the bound on pod-facing work waiting for the store.
//!
//! A server past its capacity with a queue of unbounded length collapses:
//! every request waits behind all the others, callers give up and retry,
//! and the server spends its time on answers nobody reads. So each
//! pod-facing request (a token-bucket request, a per-key check, a partition
//! exchange) holds a [`Permit`] from validation until its store operation
//! is answered, at most [`Admission::limit`] at once. A request that finds
//! every permit taken is refused at once, before it touches the store, with
//! UNAVAILABLE and a retry hint in the `grpc-retry-pushback-ms` trailer
//! (gRPC's name for a server's pushback): nothing was applied, and the pod
//! retries the same request later, or on another replica, running on its
//! local bucket meanwhile. Each refused request is given its own time to
//! come back ([`Pacer`]): the refused are lined up at the rate the server
//! admits work, so a herd of forty thousand pods returns spread over the
//! seconds the server needs to serve them, neither all at once (refusing
//! them again costs more than the work admitted) nor later than needed
//! (which would leave the server idle).
//!
//! The limit bounds the time an admitted request waits: about the limit
//! divided by the store's throughput. The `Admin` service is not bounded:
//! an operator must be able to act on an overloaded server.
//!
//! Work whose caller has given up is not done either: the edge answers
//! DEADLINE_EXCEEDED once the caller's `grpc-timeout` passes
//! ([`super::edge`]), and the stores never start an operation whose caller
//! has gone.
//!
//! The numbers: [`DEFAULT_MAX_PENDING`] (128, `--max-pending-requests`)
//! places; the pacer measures the admitted rate every quarter second,
//! assumes 10 000 a second before its first measure, and hands out pauses
//! between [`MIN_PUSHBACK`] (250 ms) and [`MAX_PUSHBACK`] (10 s).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tollgate_proto::pushback::unavailable_with_pushback;
use tonic::Status;

use crate::telemetry::Metrics;

/// Requests pending at once unless configured otherwise: at the store's
/// capacity (about 8 000 to 20 000 token-bucket requests a second embedded,
/// 9 000 on PostgreSQL, on two cores) an admitted request waits some
/// milliseconds to tens of them, while the store still has enough at once
/// to batch (64 pods in a closed loop reach the store's maximum).
pub const DEFAULT_MAX_PENDING: usize = 128;

/// The shortest and longest pause asked of refused pods. Pods run on their
/// local buckets meanwhile, so a pause of seconds costs them little; a
/// pause too short for the number of pods waiting brings them all back at
/// once, and refusing them again costs more than the work admitted.
pub const MIN_PUSHBACK: Duration = Duration::from_millis(250);
pub const MAX_PUSHBACK: Duration = Duration::from_secs(10);

/// How often the admitted rate is measured.
const PACING_WINDOW: Duration = Duration::from_millis(250);
/// The rate assumed before any window has shown what the server admits
/// (a herd meets a fresh server before the first window ends). High
/// rather than low: refused pods told to return too early are refused
/// again, at about a third of the cost of serving them, and then paced at
/// the rate measured by then; told to return too late, they leave the
/// server idle.
const INITIAL_RATE: f64 = 10_000.0;
/// The lowest admitted rate the pacing assumes, so that a store stalled
/// for a while (nothing admitted) does not push every pause to the cap at
/// once.
const MIN_RATE: f64 = 100.0;

/// The bound on pending pod-facing requests, shared by the services of one
/// server.
#[derive(Clone, Debug)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    pending: AtomicUsize,
    pacer: Mutex<Pacer>,
    metrics: Option<Arc<Metrics>>,
}

/// Gives each refused request its time to come back: the next free slot of
/// a line that moves at the rate the server admits requests when full. A
/// herd is spread over the time the server needs to serve it; refusals
/// that stop let the line fall back to now, and the next pause is the
/// shortest again.
#[derive(Debug)]
struct Pacer {
    window_started: Instant,
    window_admitted: u64,
    window_refused: u64,
    /// Requests admitted per second while the limit was reached: the
    /// server's capacity as last seen.
    rate: f64,
    /// The slot given to the last refused request.
    line: Instant,
}

impl Pacer {
    fn new(now: Instant) -> Self {
        Pacer {
            window_started: now,
            window_admitted: 0,
            window_refused: 0,
            rate: INITIAL_RATE,
            line: now,
        }
    }

    /// Counts one request; for a refused one, the pause it is asked for.
    fn count(&mut self, admitted: bool, now: Instant) -> Option<Duration> {
        let elapsed = now.duration_since(self.window_started);
        if elapsed >= PACING_WINDOW {
            let rate = self.window_admitted as f64 / elapsed.as_secs_f64();
            // A window with refusals was full: what it admitted is the
            // capacity. One without shows only that the server can admit
            // at least that much.
            self.rate = if self.window_refused > 0 {
                (self.rate + rate) / 2.0
            } else {
                self.rate.max(rate)
            }
            .max(MIN_RATE);
            self.window_started = now;
            self.window_admitted = 0;
            self.window_refused = 0;
        }
        if admitted {
            self.window_admitted += 1;
            return None;
        }
        self.window_refused += 1;
        let slot =
            (self.line.max(now) + Duration::from_secs_f64(1.0 / self.rate)).min(now + MAX_PUSHBACK);
        self.line = slot;
        Some(slot.duration_since(now).max(MIN_PUSHBACK))
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(DEFAULT_MAX_PENDING, None)
    }
}

impl Admission {
    /// At most `limit` requests pending at once (at least one), counted in
    /// `metrics` if given.
    pub fn new(limit: usize, metrics: Option<Arc<Metrics>>) -> Self {
        Admission {
            inner: Arc::new(Inner {
                limit: limit.max(1),
                pending: AtomicUsize::new(0),
                pacer: Mutex::new(Pacer::new(Instant::now())),
                metrics,
            }),
        }
    }

    /// The most requests pending at once.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Requests admitted and not yet answered.
    pub fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// A permit to run one request, or the UNAVAILABLE a client sees when
    /// `limit` requests are already pending.
    pub fn admit(&self) -> Result<Permit, Status> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Result<Permit, Status> {
        let inner = &self.inner;
        let before = inner.pending.fetch_add(1, Ordering::AcqRel);
        let admitted = before < inner.limit;
        let pushback = inner
            .pacer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .count(admitted, now);
        if let Some(pushback) = pushback {
            inner.pending.fetch_sub(1, Ordering::AcqRel);
            if let Some(metrics) = &inner.metrics {
                metrics.observe_overload_refusal();
            }
            return Err(overloaded(inner.limit, pushback));
        }
        if let Some(metrics) = &inner.metrics {
            metrics.set_pending(before + 1);
        }
        Ok(Permit {
            inner: Arc::clone(inner),
        })
    }
}

/// One admitted request; dropping it (answered, failed or cancelled) frees
/// its place.
#[derive(Debug)]
pub struct Permit {
    inner: Arc<Inner>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let left = self.inner.pending.fetch_sub(1, Ordering::AcqRel) - 1;
        if let Some(metrics) = &self.inner.metrics {
            metrics.set_pending(left);
        }
    }
}

fn overloaded(limit: usize, pushback: Duration) -> Status {
    unavailable_with_pushback(
        format!(
            "server overloaded: {limit} requests already pending; nothing was applied, retry \
             the same request after {} ms (or on another replica)",
            pushback.as_millis()
        ),
        pushback,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_beyond_the_limit_are_refused_with_a_hint_until_one_is_answered() {
        let admission = Admission::new(2, None);
        let first = admission.admit().expect("first");
        let _second = admission.admit().expect("second");
        let refused = admission.admit().expect_err("third");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(refused.message().contains("overloaded"), "{refused:?}");
        assert_eq!(
            tollgate_proto::pushback::pushback(&refused),
            Some(MIN_PUSHBACK)
        );
        assert_eq!(admission.pending(), 2);
        drop(first);
        assert_eq!(admission.pending(), 1);
        let _third = admission.admit().expect("a place was freed");
    }

    #[test]
    fn a_limit_of_zero_still_admits_one() {
        let admission = Admission::new(0, None);
        assert_eq!(admission.limit(), 1);
        let _one = admission.admit().expect("one");
        assert!(admission.admit().is_err());
    }

    fn hint(status: Status) -> Duration {
        tollgate_proto::pushback::pushback(&status).expect("hint")
    }

    /// A server that admitted `rate` requests a second while full, in one
    /// window before `start` + a window.
    fn full_at_rate(admission: &Admission, start: Instant, rate: u32) -> (Instant, Vec<Permit>) {
        let per_window = (f64::from(rate) * PACING_WINDOW.as_secs_f64()) as u32;
        for _ in 0..per_window {
            drop(admission.admit_at(start).expect("room"));
        }
        let full: Vec<Permit> = (0..admission.limit())
            .map(|_| admission.admit_at(start).expect("place"))
            .collect();
        let _ = admission
            .admit_at(start)
            .expect_err("full: the window saw a refusal");
        (start + PACING_WINDOW, full)
    }

    #[test]
    fn a_herd_is_told_to_return_spread_at_the_rate_the_server_admits() {
        let admission = Admission::new(4, None);
        let start = Instant::now();
        let (at, _full) = full_at_rate(&admission, start, 4000);
        // The measured rate is the mean of the initial guess and the
        // window's (what it admitted, the 4 places included).
        let window = PACING_WINDOW.as_secs_f64();
        let admitted = (4000.0 * window).floor() + 4.0;
        let rate = (INITIAL_RATE + admitted / window) / 2.0;
        let hints: Vec<Duration> = (0..80_000)
            .map(|_| hint(admission.admit_at(at).expect_err("full")))
            .collect();
        assert!(
            hints
                .iter()
                .all(|h| (MIN_PUSHBACK..=MAX_PUSHBACK).contains(h))
        );
        assert!(hints.windows(2).all(|w| w[0] <= w[1]), "in line order");
        // The 5 000th refused returns after about 5 000 / rate seconds.
        let expected = 5000.0 / rate;
        let got = hints[4999].as_secs_f64();
        assert!(
            (got - expected).abs() < 0.01,
            "{got} s, expected {expected} s"
        );
        // The line stops at the cap: the rest are told the longest pause.
        assert_eq!(hints.last().copied(), Some(MAX_PUSHBACK));
    }

    #[test]
    fn once_refusals_stop_the_line_falls_back_to_the_shortest_pause() {
        let admission = Admission::new(2, None);
        let start = Instant::now();
        let (at, full) = full_at_rate(&admission, start, 400);
        let long = (0..20_000)
            .map(|_| hint(admission.admit_at(at).expect_err("full")))
            .max()
            .unwrap_or_default();
        assert!(long > Duration::from_secs(2), "{long:?}");
        drop(full);
        // Later than the line's last slot, a refusal waits the least.
        let later = at + long + PACING_WINDOW;
        let _again: Vec<Permit> = (0..2)
            .map(|_| admission.admit_at(later).expect("room again"))
            .collect();
        assert_eq!(
            hint(admission.admit_at(later).expect_err("full")),
            MIN_PUSHBACK
        );
    }

    #[test]
    fn a_stalled_store_does_not_send_every_pod_to_the_cap_at_once() {
        // Nothing admitted for many windows (every place held): the rate
        // assumed stays at its floor, and refusals are spread at it.
        let admission = Admission::new(1, None);
        let start = Instant::now();
        let _held = admission.admit_at(start).expect("one");
        let mut at = start;
        for _ in 0..10 {
            at += PACING_WINDOW;
            let _ = admission.admit_at(at).expect_err("held");
        }
        let first = hint(admission.admit_at(at).expect_err("held"));
        assert!(first <= Duration::from_secs(2), "{first:?}");
    }
}
