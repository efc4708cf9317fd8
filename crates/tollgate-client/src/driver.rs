//! The task behind each bucket: polls its local bucket, sends its requests
//! to the server one at a time, and hands the answers back.
//!
//! Every bucket of a controller has a driver of its own, all sharing the
//! controller's one transport. A bucket waiting for a slow answer, or
//! retrying a failed one, therefore never delays another bucket's requests;
//! and each bucket's sequence numbers stay its own, as the server keeps one
//! lease and sequence per instance per bucket.
//!
//! A failed request is retried if the failure is an outage, and the pod
//! runs on its fallback rate meanwhile, which the driver logs when it
//! starts, at most once a minute while it lasts, and when it ends. A
//! refusal ([`crate::error::classify`]) stops the bucket: the driver hands
//! it to the gate, where every call on the bucket finds it, logs it once,
//! and ends, as nothing it could send would be taken.
//!
//! Each attempt of a request is given up when its answer is overdue, by
//! the bucket's measure of its answer times
//! ([`tollgate_core::local_bucket::answer_time`]), at most the
//! controller's `request_timeout`: dropping the call cancels it, so its
//! answer never reaches the bucket, and the retry carries the same
//! sequence number. After the stop signal the driver
//! sends the bucket's final report: shares 0, the consumption not yet
//! reported, and the tokens it holds given back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_core::{Grant, InstanceId, TenantId, TokenBucketRequest};

use crate::bucket::Bucket;
use crate::error::{Failure, Refusal, TransportError};
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::transport::Transport;

/// How often a bucket still on its fallback rate says so in the log.
const FALLBACK_LOG_INTERVAL: Duration = Duration::from_secs(60);

type InFlight = Pin<Box<dyn Future<Output = (u64, Result<Grant, TransportError>)> + Send>>;

/// Drives `bucket` of pod `instance` of `tenant` until `stopped` says so
/// (or its sender is gone, which means every handle is), then until the
/// bucket's final report is answered. Returns whether that report made it;
/// returns false at once when the server refuses the bucket.
pub(crate) async fn drive(
    bucket: Arc<Bucket>,
    transport: Arc<dyn Transport>,
    request_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
    tenant: TenantId,
    instance: InstanceId,
) -> bool {
    let gate = &bucket.gate;
    let name = bucket.name.as_str();
    let controller = format!("{tenant}/{instance}");
    let mut in_flight: Option<InFlight> = None;
    let mut closing = false;
    let mut failing = false;
    let mut fallback = FallbackLog::default();
    loop {
        let (request, wake_at, finished, status) = gate.with_bucket(|inner, now| {
            let outcome = inner.bucket.poll(now);
            let request = outcome
                .request
                .map(|request| (request, inner.bucket.attempt_timeout(request_timeout)));
            for id in outcome.admitted {
                if let Some((tx, tokens)) = inner.waiters.remove(&id)
                    && tx.send(()).is_err()
                {
                    // Its acquirer is gone without running its work.
                    inner.bucket.refund(tokens);
                }
            }
            (
                request,
                outcome.wake_at,
                inner.bucket.is_finished(),
                inner.bucket.status(),
            )
        });
        fallback.observe(
            &controller,
            name,
            status.fallback_active,
            status.fallback_tokens,
            status.fallback_rate,
        );
        if closing && finished {
            return true;
        }
        if let Some((request, timeout)) = request {
            if let Some(metrics) = metrics_of(gate) {
                metrics.server_requests.inc();
            }
            in_flight = Some(send(
                Arc::clone(&transport),
                Arc::clone(&bucket),
                request,
                timeout,
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
                    Err(e) if e.failure() == Failure::Refusal => {
                        if let Some(metrics) = metrics_of(gate) {
                            metrics.server_errors.inc();
                        }
                        let refusal = Refusal {
                            tenant: tenant.clone(),
                            bucket: bucket.name.clone(),
                            code: e.code.unwrap_or(tonic::Code::Unknown),
                            message: e.message.clone(),
                        };
                        let refused = gate.with_bucket(|inner, now| {
                            let Some(waiting) = inner.bucket.on_refusal(seq, now) else {
                                return false;
                            };
                            for id in waiting {
                                inner.waiters.remove(&id); // their receivers see the refusal
                            }
                            inner.waiters.clear();
                            inner.refusal = Some(refusal);
                            true
                        });
                        if refused {
                            tracing::error!(%controller, bucket = name, error = %e, "tollgate server refused the bucket: its calls fail from now on, until the controller is built again");
                            return false;
                        }
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

/// What the log has said of a bucket's fallback: when it started (and the
/// bucket's fallback tokens then), and when it last said so.
#[derive(Default)]
struct FallbackLog {
    since: Option<(Instant, f64)>,
    logged_at: Option<Instant>,
}

impl FallbackLog {
    /// Logs the start and end of a fallback, and at most once per
    /// [`FALLBACK_LOG_INTERVAL`] that it goes on, whatever the number of
    /// requests admitted on it. Returns whether it logged.
    fn observe(
        &mut self,
        controller: &str,
        bucket: &str,
        active: bool,
        tokens: f64,
        rate: f64,
    ) -> bool {
        let now = Instant::now();
        match (self.since, active) {
            (None, true) => {
                tracing::warn!(
                    controller,
                    bucket,
                    fallback_rate = rate,
                    "tollgate server does not answer: the bucket runs on its fallback rate"
                );
                self.since = Some((now, tokens));
                self.logged_at = Some(now);
                true
            }
            (Some((since, at_start)), true) => {
                if self
                    .logged_at
                    .is_none_or(|at| now.duration_since(at) >= FALLBACK_LOG_INTERVAL)
                {
                    tracing::warn!(
                        controller,
                        bucket,
                        fallback_rate = rate,
                        seconds = now.duration_since(since).as_secs(),
                        fallback_tokens = tokens - at_start,
                        "tollgate bucket still runs on its fallback rate"
                    );
                    self.logged_at = Some(now);
                    return true;
                }
                false
            }
            (Some((since, at_start)), false) => {
                tracing::info!(
                    controller,
                    bucket,
                    seconds = now.duration_since(since).as_secs(),
                    fallback_tokens = (tokens - at_start).max(0.0),
                    "tollgate bucket left its fallback rate"
                );
                *self = FallbackLog::default();
                true
            }
            (None, false) => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_long_fallback_is_logged_once_a_minute_not_once_a_request() {
        let mut log = FallbackLog::default();
        let mut lines = 0;
        // Off fallback: nothing to say.
        assert!(!log.observe("acme/1", "", false, 0.0, 10.0));
        // 150 s on fallback, observed every 10 ms.
        for i in 0..15_000 {
            if log.observe("acme/1", "", true, f64::from(i), 10.0) {
                lines += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(lines, 3, "at the start, after 60 s and after 120 s");
        assert!(log.observe("acme/1", "", false, 15_000.0, 10.0), "its end");
        assert!(!log.observe("acme/1", "", false, 15_000.0, 10.0));
    }
}
