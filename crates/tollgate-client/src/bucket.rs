//! A handle on one of the tenant's buckets: where the gating logic lives.
//!
//! A tenant owns one bucket per rate-limited action (`schedule-email`,
//! `invoke-doc-summary-ai`) besides its request-unit bucket (the empty
//! name). A controller gates each bucket its pod uses on a local bucket of
//! its own, refilled by a driver task of its own (`driver`), so a bucket
//! out of tokens, or whose server requests are slow, never holds up
//! another. [`BucketHandle`] is the one implementation of acquiring and
//! charging; the [`Controller`](crate::Controller)'s methods are those of
//! its request-unit bucket's handle.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_core::{Admission, BucketName, Consumption, LocalBucketStatus, WaiterId};

use crate::controller::Pod;
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

/// A pod's handle on one of its tenant's buckets, from
/// [`Controller::bucket`](crate::Controller::bucket). Cheap to clone; every
/// clone, and every handle the controller gives out for the same name,
/// gates on the same local bucket. A handle keeps its controller alive
/// (its connection and the other buckets' tasks) as a clone of the
/// controller would.
#[derive(Clone)]
pub struct BucketHandle {
    /// The fast path's only hop: the gate is inline in the bucket.
    bucket: Arc<Bucket>,
    pod: Arc<Pod>,
}

impl std::fmt::Debug for BucketHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketHandle")
            .field("bucket", &self.bucket.name)
            .finish_non_exhaustive()
    }
}

impl BucketHandle {
    pub(crate) fn new(bucket: Arc<Bucket>, pod: Arc<Pod>) -> Self {
        BucketHandle { bucket, pod }
    }

    pub(crate) fn pod(&self) -> &Arc<Pod> {
        &self.pod
    }

    /// The bucket's name; empty for the request-unit bucket.
    pub fn name(&self) -> &BucketName {
        &self.bucket.name
    }

    /// Waits until `tokens` are available in this bucket and takes them
    /// all at once. Waiters are served first come, first served, per
    /// bucket: a bucket out of tokens never delays another.
    /// Cancellation-safe: dropping the future before it completes gives its
    /// claim back.
    pub async fn acquire(&self, tokens: f64) -> Result<(), ClientError> {
        let gate = &self.bucket.gate;
        if let Some(micros) = fast_micros(tokens)
            && gate.fast_take(micros)
        {
            return Ok(());
        }
        let waiting =
            gate.with_bucket(|inner, now| match inner.bucket.acquire(tokens, now)? {
                Admission::Admitted => Ok(None),
                Admission::Closed => Err(ClientError::Closed),
                Admission::Queued(id) => {
                    let (tx, rx) = oneshot::channel();
                    inner.waiters.insert(id, (tx, tokens));
                    Ok(Some((id, rx)))
                }
            })?;
        let Some((id, rx)) = waiting else {
            return Ok(());
        };
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
        gate.with_bucket(|inner, _| {
            if let Some(metrics) = &inner.metrics {
                metrics.wait_seconds.observe(waited);
            }
        });
        if admitted {
            Ok(())
        } else {
            Err(ClientError::Closed)
        }
    }

    /// Takes `tokens` from this bucket if they are available now; never
    /// waits, never queues.
    #[inline]
    pub fn try_acquire(&self, tokens: f64) -> Result<bool, ClientError> {
        let gate = &self.bucket.gate;
        if let Some(micros) = fast_micros(tokens)
            && gate.fast_take(micros)
        {
            return Ok(true);
        }
        let admitted = gate.with_bucket(|inner, now| inner.bucket.try_acquire(tokens, now))?;
        Ok(admitted)
    }

    /// Charges `consumption` to this bucket after the fact, as it is: its
    /// request units are the tokens (for an action bucket,
    /// `Consumption::from_request_units(n)` charges `n` actions). Never
    /// waits; may put the bucket in debt.
    pub fn charge_after(&self, consumption: Consumption) -> Result<(), ClientError> {
        self.bucket
            .gate
            .with_bucket(|inner, now| inner.bucket.charge_after(&consumption, now))?;
        Ok(())
    }

    /// Records the counters (reads, writes, bytes) of work whose tokens
    /// were already acquired.
    pub(crate) fn record_counters(&self, consumption: &Consumption) -> Result<(), ClientError> {
        self.bucket
            .gate
            .with_bucket(|inner, _| inner.bucket.record_counters(consumption))?;
        Ok(())
    }

    /// This bucket's local bucket as it is now.
    pub fn status(&self) -> LocalBucketStatus {
        self.bucket
            .gate
            .with_bucket(|inner, _| inner.bucket.status())
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
