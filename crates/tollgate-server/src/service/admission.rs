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
//! local bucket meanwhile. The pause asked for grows while refusals are
//! many against the work admitted and shrinks once they are few
//! ([`Pressure`]): forty thousand pods told to
//! come back in a quarter of a second would cost more to refuse than the
//! work admitted, and told to come back in ten seconds would leave the
//! server idle.
//!
//! The limit bounds the time an admitted request waits: about the limit
//! divided by the store's throughput. The `Admin` service is not bounded:
//! an operator must be able to act on an overloaded server.
//!
//! Work whose caller has given up is not done either: the edge answers
//! DEADLINE_EXCEEDED once the caller's `grpc-timeout` passes
//! ([`super::edge`]), and the stores never start an operation whose caller
//! has gone.

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

/// How often the pushback is revised from the refusals seen.
const PRESSURE_WINDOW: Duration = Duration::from_millis(500);
/// More refusals than this fraction of the requests admitted in a window
/// doubles the pushback; fewer halves it. No band between: a pause longer
/// than the pods waiting need leaves the server idle, which costs more than
/// refusing some of them again, so the pause keeps refusals near this
/// fraction rather than resting anywhere below it.
const PRESS_ABOVE: f64 = 0.25;

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
    pressure: Mutex<Pressure>,
    metrics: Option<Arc<Metrics>>,
}

/// What the refusals of the current window say about the pause to ask for.
#[derive(Debug)]
struct Pressure {
    started: Instant,
    admitted: u64,
    refused: u64,
    /// The pause asked of requests refused now.
    pushback: Duration,
}

impl Pressure {
    /// Counts one request, and at the end of a window revises the pushback:
    /// doubled while refusals are many against the work admitted (the pods
    /// waiting are too many for the pause they were given), halved once
    /// they are fewer (paused pods come back too late).
    fn count(&mut self, admitted: bool, now: Instant) -> Duration {
        if admitted {
            self.admitted += 1;
        } else {
            self.refused += 1;
        }
        if now.duration_since(self.started) >= PRESSURE_WINDOW {
            let refused = self.refused as f64;
            let admitted = self.admitted.max(1) as f64;
            self.pushback = if refused > PRESS_ABOVE * admitted {
                (self.pushback * 2).min(MAX_PUSHBACK)
            } else {
                (self.pushback / 2).max(MIN_PUSHBACK)
            };
            *self = Pressure {
                started: now,
                admitted: 0,
                refused: 0,
                pushback: self.pushback,
            };
        }
        self.pushback
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
                pressure: Mutex::new(Pressure {
                    started: Instant::now(),
                    admitted: 0,
                    refused: 0,
                    pushback: MIN_PUSHBACK,
                }),
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
            .pressure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .count(admitted, now);
        if !admitted {
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

    #[test]
    fn the_pushback_doubles_under_many_refusals_and_halves_under_few() {
        let admission = Admission::new(4, None);
        let start = Instant::now();
        let hint = |status: Status| tollgate_proto::pushback::pushback(&status).expect("hint");
        let full: Vec<Permit> = (0..4)
            .map(|_| admission.admit_at(start).expect("place"))
            .collect();
        let mut hints = Vec::new();
        for window in 1..=8 {
            // Each window: many refused, none admitted.
            let at = start + PRESSURE_WINDOW * window;
            for _ in 0..10 {
                hints.push(hint(admission.admit_at(at).expect_err("full")));
            }
        }
        assert_eq!(hints[0], MIN_PUSHBACK);
        assert_eq!(
            hints.last().copied(),
            Some(MAX_PUSHBACK),
            "doubled up to the cap: {hints:?}"
        );
        // The places empty: most requests admitted, a few refused in
        // bursts, and the pause halves each window to the floor.
        drop(full);
        let mut last = MAX_PUSHBACK;
        for window in 9..=20 {
            let at = start + PRESSURE_WINDOW * window;
            for _ in 0..40 {
                drop(admission.admit_at(at).expect("room"));
            }
            let burst: Vec<Permit> = (0..4)
                .map(|_| admission.admit_at(at).expect("place"))
                .collect();
            for _ in 0..10 {
                last = hint(admission.admit_at(at).expect_err("burst"));
            }
            drop(burst);
        }
        assert_eq!(last, MIN_PUSHBACK);
    }
}
