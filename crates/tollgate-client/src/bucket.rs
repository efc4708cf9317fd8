//! One of the tenant's buckets at the pod: its state, shared by its
//! handles and its driver task, and the gating on it.
//!
//! A tenant owns one bucket per rate-limited action (`schedule-email`,
//! `invoke-doc-summary-ai`) besides its request-unit bucket (the empty
//! name). A controller gates each bucket its pod uses on a local bucket of
//! its own, refilled by a driver task of its own (`driver`), so a bucket
//! out of tokens, or whose server requests are slow, never holds up
//! another. [`Bucket`]'s methods are the one implementation of acquiring
//! and charging; a [`BucketHandle`](crate::BucketHandle) exposes them, and
//! the [`Controller`](crate::Controller)'s methods are those of its
//! request-unit bucket's handle. Once the server refused the bucket for
//! good, each of them fails with the refusal ([`ClientError::Refused`]),
//! which the gate holds.
//!
//! Nothing here knows the controller: the handles and the pod they keep
//! alive are above this module (`controller`), as is the driver, which
//! holds only a [`Bucket`].
//!
//! `acquire(n)` takes n tokens at once, first in, first out per bucket,
//! and is cancellation-safe: a dropped waiter leaves the queue, or gives
//! its tokens back if it was admitted meanwhile. A handle reaches its gate
//! in one hop, so the fast path of a held handle (and of the controller)
//! takes no lock and looks nothing up.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_core::{Admission, BucketName, Consumption, LocalBucketStatus, WaiterId};

use crate::error::ClientError;
use crate::gate::{self, Gate};

/// One bucket's state, shared by its handles and its driver task. The
/// driver holds only this (not the controller), so dropping the last handle
/// still stops it.
#[derive(Debug)]
pub(crate) struct Bucket {
    pub name: BucketName,
    pub gate: Gate,
}

/// The gating on one bucket, which [`BucketHandle`](crate::BucketHandle)
/// (and so the [`Controller`](crate::Controller)) exposes: each method is
/// documented there.
impl Bucket {
    /// The future of [`BucketHandle::acquire`](crate::BucketHandle::acquire).
    #[inline]
    pub(crate) fn acquire(&self, tokens: f64) -> Acquire<'_> {
        Acquire {
            bucket: self,
            tokens,
            slow: None,
        }
    }

    /// The acquisition the fast path could not serve, decided by the local
    /// bucket itself: admitted (`None`), refused, or queued (its place and
    /// the channel its admission will come on).
    fn enqueue(
        &self,
        tokens: f64,
    ) -> Result<Option<(WaiterId, oneshot::Receiver<()>)>, ClientError> {
        self.gate.with_bucket(|inner, now| {
            if let Some(refused) = inner.refused() {
                return Err(refused);
            }
            match inner.bucket.acquire(tokens, now)? {
                Admission::Admitted => Ok(None),
                Admission::Closed => Err(ClientError::Closed),
                Admission::Queued(id) => {
                    let (tx, rx) = oneshot::channel();
                    inner.waiters.insert(id, (tx, tokens));
                    Ok(Some((id, rx)))
                }
            }
        })
    }

    /// Waits for a queued acquisition's admission.
    async fn wait_queued(
        &self,
        id: WaiterId,
        rx: oneshot::Receiver<()>,
        tokens: f64,
    ) -> Result<(), ClientError> {
        let gate = &self.gate;
        gate.wake.notify_one();
        let started = Instant::now();
        let mut wait = Wait {
            gate,
            id,
            tokens,
            rx: Some(rx),
        };
        let admitted = wait.wait().await;
        let waited = started.elapsed().as_secs_f64();
        let refused = gate.with_bucket(|inner, _| {
            if let Some(metrics) = &inner.metrics {
                metrics.wait_seconds.observe(waited);
            }
            inner.refused()
        });
        match (admitted, refused) {
            (true, _) => Ok(()),
            // Refused while waiting: the refusal dropped the waiters.
            (false, Some(refused)) => Err(refused),
            (false, None) => Err(ClientError::Closed),
        }
    }

    /// See [`BucketHandle::try_acquire`](crate::BucketHandle::try_acquire).
    #[inline]
    pub(crate) fn try_acquire(&self, tokens: f64) -> Result<bool, ClientError> {
        let gate = &self.gate;
        if let Some(micros) = fast_micros(tokens)
            && gate.fast_take(micros)
        {
            return Ok(true);
        }
        gate.with_bucket(|inner, now| match inner.refused() {
            Some(refused) => Err(refused),
            None => Ok(inner.bucket.try_acquire(tokens, now)?),
        })
    }

    /// See [`BucketHandle::charge_after`](crate::BucketHandle::charge_after).
    pub(crate) fn charge_after(&self, consumption: Consumption) -> Result<(), ClientError> {
        self.gate.with_bucket(|inner, now| match inner.refused() {
            Some(refused) => Err(refused),
            None => Ok(inner.bucket.charge_after(&consumption, now)?),
        })
    }

    /// See [`BucketHandle::give_back`](crate::BucketHandle::give_back).
    pub(crate) fn give_back(&self, tokens: f64) -> Result<f64, ClientError> {
        let gate = &self.gate;
        let returned = gate.with_bucket(|inner, _| match inner.refused() {
            Some(refused) => Err(refused),
            None => Ok(inner.bucket.give_back(tokens)?),
        })?;
        if returned > 0.0 {
            // A waiter may fit now: its driver admits it.
            gate.wake.notify_one();
        }
        Ok(returned)
    }

    /// Records the counters (reads, writes, bytes) of work whose tokens
    /// were already acquired.
    pub(crate) fn record_counters(&self, consumption: &Consumption) -> Result<(), ClientError> {
        consumption.validate()?;
        self.gate.record_counters(consumption);
        Ok(())
    }

    /// This bucket's local bucket as it is now.
    pub(crate) fn status(&self) -> LocalBucketStatus {
        self.gate
            .with_bucket(|inner, now| inner.bucket.status_at(now))
    }

    /// What the server last said a new pod of this bucket may start on.
    pub(crate) fn initial_allowance(&self) -> Option<f64> {
        self.gate
            .with_bucket(|inner, _| inner.bucket.initial_allowance())
    }
}

/// A queued acquisition's wait.
type QueuedAcquire<'a> = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send + 'a>>;

/// The future of [`BucketHandle::acquire`](crate::BucketHandle::acquire)
/// (and [`Controller::acquire`](crate::Controller::acquire)).
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a> {
    bucket: &'a Bucket,
    tokens: f64,
    /// The queued acquisition's wait, once the local bucket queued it.
    slow: Option<QueuedAcquire<'a>>,
}

impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("bucket", &self.bucket.name)
            .field("tokens", &self.tokens)
            .field("queued", &self.slow.is_some())
            .finish()
    }
}

impl Future for Acquire<'_> {
    type Output = Result<(), ClientError>;

    /// The fast path, inlined into the caller; the rest out of line.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.slow.is_none()
            && let Some(micros) = fast_micros(self.tokens)
            && self.bucket.gate.fast_take(micros)
        {
            return Poll::Ready(Ok(()));
        }
        self.poll_queued(cx)
    }
}

impl Acquire<'_> {
    /// Too few tokens in the reservoir: the local bucket decides, and a
    /// queued acquisition waits.
    #[cold]
    #[inline(never)]
    fn poll_queued(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ClientError>> {
        if self.slow.is_none() {
            let (bucket, tokens) = (self.bucket, self.tokens);
            match bucket.enqueue(tokens) {
                Ok(None) => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Some((id, rx))) => {
                    self.slow = Some(Box::pin(bucket.wait_queued(id, rx, tokens)));
                }
            }
        }
        match self.slow.as_mut() {
            Some(slow) => slow.as_mut().poll(cx),
            None => Poll::Ready(Err(ClientError::Closed)),
        }
    }
}

#[inline]
fn fast_micros(tokens: f64) -> Option<i64> {
    if tokens.is_finite() && tokens >= 0.0 {
        gate::micros(tokens)
    } else {
        None
    }
}

/// A queued acquisition. Dropped before it learns the outcome, it takes
/// itself out of the queue — or, if it was admitted meanwhile, gives the
/// tokens back.
struct Wait<'a> {
    gate: &'a Gate,
    id: WaiterId,
    tokens: f64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Wait<'_> {
    /// True if admitted, false if the controller shut down.
    async fn wait(&mut self) -> bool {
        let Some(rx) = self.rx.as_mut() else {
            return false;
        };
        let admitted = rx.await.is_ok();
        self.rx = None;
        admitted
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return; // finished
        };
        let (id, tokens) = (self.id, self.tokens);
        self.gate.with_bucket(|inner, _| {
            inner.waiters.remove(&id);
            if !inner.bucket.cancel(id) && rx.try_recv().is_ok() {
                // Admitted, but the work will never run.
                inner.bucket.refund(tokens);
            }
        });
        // Tokens may have become usable for the next waiter.
        self.gate.wake.notify_one();
    }
}
