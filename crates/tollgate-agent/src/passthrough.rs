//! Calls passed to the server as they are: CheckKeys (to
//! `KeyLimits.Check`) and the per-key descriptors of Envoy's
//! `ShouldRateLimit`.
//!
//! A per-key bucket is exact because every check is a store transaction:
//! nothing about it can be answered locally, so the agent only relays the
//! call (with its pod token) and the answer, or the server's error, code
//! and message as they are. One attempt per call: a check the server may
//! have applied is not sent again (a caller retries with its items'
//! request ids, which the server answers from its records). With several
//! servers, a call that found one unreachable moves the next call to the
//! next.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_client::{ClientError, Options, PodToken};
use tollgate_proto::v1;
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tonic::transport::Channel;

use crate::error::AgentError;

/// Lazy channels to every server, and the one to use next.
#[derive(Debug)]
pub struct Passthrough {
    servers: Vec<(String, Channel)>,
    next: AtomicUsize,
    pod_token: Option<PodToken>,
    timeout: Duration,
}

impl Passthrough {
    /// Channels to `urls` (nothing connects before the first call).
    pub fn new(
        urls: &[&str],
        options: &Options,
        pod_token: Option<PodToken>,
    ) -> Result<Passthrough, ClientError> {
        let servers = urls
            .iter()
            .map(|url| {
                let endpoint =
                    tollgate_client::endpoint(url, options.connect_timeout, options.tls.as_ref())?;
                Ok(((*url).to_owned(), endpoint.connect_lazy()))
            })
            .collect::<Result<_, ClientError>>()?;
        Ok(Passthrough {
            servers,
            next: AtomicUsize::new(0),
            pod_token,
            timeout: options.request_timeout,
        })
    }

    /// `KeyLimits.Check`.
    pub async fn check(
        &self,
        request: v1::CheckRequest,
        deadline: Option<Duration>,
    ) -> Result<v1::CheckResponse, AgentError> {
        self.call(request, deadline, |channel, call| async move {
            KeyLimitsClient::new(channel).check(call).await
        })
        .await
    }

    /// Envoy's `ShouldRateLimit`, as the server serves it.
    pub async fn should_rate_limit(
        &self,
        request: RateLimitRequest,
        deadline: Option<Duration>,
    ) -> Result<RateLimitResponse, AgentError> {
        self.call(request, deadline, |channel, call| async move {
            RateLimitServiceClient::new(channel)
                .should_rate_limit(call)
                .await
        })
        .await
    }

    /// Sends `message` with `send` to the current server, within
    /// `deadline` (the caller's) or the agent's request timeout, whichever
    /// is shorter, with the pod token.
    async fn call<M, T, F, Fut>(
        &self,
        message: M,
        deadline: Option<Duration>,
        send: F,
    ) -> Result<T, AgentError>
    where
        F: FnOnce(Channel, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let index = self.next.load(Ordering::Relaxed) % self.servers.len().max(1);
        let Some((url, channel)) = self.servers.get(index) else {
            return Err(AgentError::Internal("no server to send calls to".into()));
        };
        let timeout = deadline.map_or(self.timeout, |d| d.min(self.timeout));
        let mut call = tonic::Request::new(message);
        call.set_timeout(timeout);
        if let Some(token) = &self.pod_token {
            token.attach(&mut call);
        }
        match tokio::time::timeout(timeout, send(channel.clone(), call)).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(status)) => {
                if status.code() == tonic::Code::Unavailable {
                    self.failed(index);
                }
                Err(AgentError::Server {
                    code: status.code(),
                    message: status.message().to_owned(),
                })
            }
            Err(_) => {
                self.failed(index);
                Err(AgentError::Server {
                    code: tonic::Code::DeadlineExceeded,
                    message: format!(
                        "the tollgate server at {url} did not answer within {timeout:?} \
                         (the call may have been applied: retry with the items' request ids)"
                    ),
                })
            }
        }
    }

    /// Moves the next call to the next server.
    fn failed(&self, index: usize) {
        let _ = self.next.compare_exchange(
            index,
            (index + 1) % self.servers.len().max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}
