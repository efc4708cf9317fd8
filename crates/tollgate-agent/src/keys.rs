//! CheckKeys: exact per-key checks, passed to the server's
//! `KeyLimits.Check` as they are.
//!
//! A per-key bucket is exact because every check is a store transaction:
//! nothing about it can be answered locally, so the agent only relays the
//! call (with its pod token) and the answer, or the server's error, code
//! and message as they are. One attempt per call: a check that the server
//! may have applied is not sent again (the caller retries with its
//! items' request ids, which the server answers from its records). With
//! several servers, a call that found one unreachable moves the next call
//! to the next.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_client::{ClientError, Options, PodToken};
use tollgate_proto::v1;
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tonic::transport::Channel;

use crate::error::AgentError;

/// Clients of every server's `KeyLimits`.
#[derive(Debug)]
pub struct KeyChecks {
    servers: Vec<(String, KeyLimitsClient<Channel>)>,
    next: AtomicUsize,
    pod_token: Option<PodToken>,
    timeout: Duration,
}

impl KeyChecks {
    /// Lazy channels to `urls` (nothing connects before the first check).
    pub fn new(
        urls: &[&str],
        options: &Options,
        pod_token: Option<PodToken>,
    ) -> Result<KeyChecks, ClientError> {
        let servers = urls
            .iter()
            .map(|url| {
                let endpoint =
                    tollgate_client::endpoint(url, options.connect_timeout, options.tls.as_ref())?;
                Ok((
                    (*url).to_owned(),
                    KeyLimitsClient::new(endpoint.connect_lazy()),
                ))
            })
            .collect::<Result<_, ClientError>>()?;
        Ok(KeyChecks {
            servers,
            next: AtomicUsize::new(0),
            pod_token,
            timeout: options.request_timeout,
        })
    }

    /// Sends `request` to a server, within `deadline` (the caller's) or
    /// the agent's request timeout, whichever is shorter.
    pub async fn check(
        &self,
        request: v1::CheckRequest,
        deadline: Option<Duration>,
    ) -> Result<v1::CheckResponse, AgentError> {
        let index = self.next.load(Ordering::Relaxed) % self.servers.len().max(1);
        let Some((url, client)) = self.servers.get(index) else {
            return Err(AgentError::Internal("no server to send checks to".into()));
        };
        let timeout = deadline.map_or(self.timeout, |d| d.min(self.timeout));
        let mut call = tonic::Request::new(request);
        call.set_timeout(timeout);
        if let Some(token) = &self.pod_token {
            token.attach(&mut call);
        }
        let mut client = client.clone();
        match tokio::time::timeout(timeout, client.check(call)).await {
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
                        "the tollgate server at {url} did not answer the check within {timeout:?} \
                         (it may have been applied: retry with the items' request ids)"
                    ),
                })
            }
        }
    }

    /// Moves the next check to the next server.
    fn failed(&self, index: usize) {
        let _ = self.next.compare_exchange(
            index,
            (index + 1) % self.servers.len().max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}
