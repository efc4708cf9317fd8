//! The task behind each bucket: polls its local bucket, sends its requests
//! to the server one at a time, and hands the answers back.
//!
//! Every bucket of a controller has a driver of its own, all sharing the
//! controller's one transport. A bucket waiting for a slow answer, or
//! retrying a failed one, therefore never delays another bucket's requests;
//! and each bucket's sequence numbers stay its own, as the server keeps one
//! lease and sequence per instance per bucket.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_core::{Grant, TokenBucketRequest};

use crate::bucket::Bucket;
use crate::error::TransportError;
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::transport::Transport;

type InFlight = Pin<Box<dyn Future<Output = (u64, Result<Grant, TransportError>)> + Send>>;

/// Drives `bucket` until `stopped` says so (or its sender is gone, which
/// means every handle is), then until the bucket's final report is
/// answered. Returns whether that report made it.
pub(crate) async fn drive(
    bucket: Arc<Bucket>,
    transport: Arc<dyn Transport>,
    request_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
    controller: String,
) -> bool {
    let gate = &bucket.gate;
    let name = bucket.name.as_str();
    let mut in_flight: Option<InFlight> = None;
    let mut closing = false;
    let mut failing = false;
    loop {
        let (request, wake_at, finished) = gate.with_bucket(|inner, now| {
            let outcome = inner.bucket.poll(now);
            for id in outcome.admitted {
                if let Some((tx, tokens)) = inner.waiters.remove(&id)
                    && tx.send(()).is_err()
                {
                    // Its acquirer is gone without running its work.
                    inner.bucket.refund(tokens);
                }
            }
            (outcome.request, outcome.wake_at, inner.bucket.is_finished())
        });
        if closing && finished {
            return true;
        }
        if let Some(request) = request {
            if let Some(metrics) = metrics_of(gate) {
                metrics.server_requests.inc();
            }
            in_flight = Some(send(
                Arc::clone(&transport),
                Arc::clone(&bucket),
                request,
                request_timeout,
            ));
        }
        let sleep = async {
            match wake_at {
                Some(at) => {
                    let after = at.duration_since(gate.now());
                    tokio::time::sleep_until(Instant::now() + after).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (seq, result) = async { in_flight.as_mut().expect("guarded by the branch condition").await }, if in_flight.is_some() => {
                in_flight = None;
                match result {
                    Ok(grant) => {
                        if failing {
                            tracing::info!(%controller, bucket = name, "tollgate server answers again");
                            failing = false;
                        }
                        gate.with_bucket(|inner, now| inner.bucket.on_response(seq, &grant, now));
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(%controller, bucket = name, error = %e, "tollgate server request failed; retrying, fallback rate after 1 s");
                            failing = true;
                        } else {
                            tracing::debug!(%controller, bucket = name, error = %e, "tollgate server request failed again");
                        }
                        if let Some(metrics) = metrics_of(gate) {
                            metrics.server_errors.inc();
                        }
                        let jitter: f64 = rand::random();
                        gate.with_bucket(|inner, now| {
                            inner.bucket.on_failure(seq, now, jitter, e.retry_after)
                        });
                    }
                }
            }
            () = sleep => {}
            () = gate.wake.notified() => {}
            changed = stopped.changed(), if !closing => {
                // A dropped sender means every handle is gone: close too.
                let _ = changed;
                closing = true;
                gate.with_bucket(|inner, _| {
                    for id in inner.bucket.close() {
                        inner.waiters.remove(&id); // their receivers see Closed
                    }
                    inner.waiters.clear();
                });
            }
        }
    }
}

fn metrics_of(gate: &Gate) -> Option<Metrics> {
    gate.with_bucket(|inner, _| inner.metrics.clone())
}

fn send(
    transport: Arc<dyn Transport>,
    bucket: Arc<Bucket>,
    request: TokenBucketRequest,
    timeout: Duration,
) -> InFlight {
    let seq = request.seq;
    Box::pin(async move {
        let answer = transport.token_bucket(&bucket.name, request);
        let result = match tokio::time::timeout(timeout, answer).await {
            Ok(result) => result,
            Err(_) => Err(TransportError::new(format!("no answer within {timeout:?}"))),
        };
        (seq, result)
    })
}
