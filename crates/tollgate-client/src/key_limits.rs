//! Exact per-key checks: [`KeyLimiter`] asks the server's `KeyLimits`
//! service whether a key (a user, an API key, an IP address) may take
//! tokens now, one round trip per call.
//!
//! Unlike a [`Controller`](crate::Controller), nothing is kept locally:
//! every answer comes from a store transaction, so it is exact across
//! server replicas. Each call carries a request id (one the caller gives,
//! or a random one), so a call retried after a lost answer or a replica
//! that died mid-call is answered from the first check's record and takes
//! nothing twice.
//!
//! ```no_run
//! use tollgate_client::{KeyCheck, KeyLimiter, KeyLimiterOptions};
//!
//! # async fn example() -> Result<(), tollgate_client::ClientError> {
//! let limiter = KeyLimiter::connect("http://127.0.0.1:50051", KeyLimiterOptions::default())?;
//! // One user's call, and the tenant's total, taken together or not at all.
//! let verdict = limiter
//!     .check(&[
//!         KeyCheck::new("acme", "api-calls-per-user", "user-42", 1.0),
//!         KeyCheck::new("acme", "api-calls-per-tenant", "all", 1.0),
//!     ])
//!     .await?;
//! if !verdict.allowed {
//!     // Answer 429, with verdict.retry_after() as Retry-After.
//! }
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use rand::Rng;
use tollgate_core::key_bucket::{CheckCall, validate_request_id};
use tollgate_core::pushback::pushback_wait;
use tollgate_proto::v1;
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::error::ClientError;
use crate::transport::{ClientTls, PodToken, endpoint};

/// How a [`KeyLimiter`] talks to the server.
#[derive(Clone, Debug)]
pub struct KeyLimiterOptions {
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long one attempt may take before it is retried.
    pub attempt_timeout: Duration,
    /// Attempts per call (the first included), while the server is
    /// unreachable or slow.
    pub attempts: u32,
    /// The first retry's backoff; doubled each time, with jitter.
    pub backoff: Duration,
    /// TLS, for `https://` endpoints.
    pub tls: Option<ClientTls>,
    /// The pod token to send, for servers that bind pods to tenants.
    pub pod_token: Option<PodToken>,
}

impl Default for KeyLimiterOptions {
    fn default() -> Self {
        KeyLimiterOptions {
            connect_timeout: Duration::from_secs(2),
            attempt_timeout: Duration::from_secs(2),
            attempts: 3,
            backoff: Duration::from_millis(50),
            tls: None,
            pod_token: None,
        }
    }
}

/// One item of a check: `tokens` from `key` of the tenant's per-key bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyCheck {
    pub tenant: String,
    pub bucket: String,
    pub key: String,
    pub tokens: f64,
}

impl KeyCheck {
    pub fn new(
        tenant: impl Into<String>,
        bucket: impl Into<String>,
        key: impl Into<String>,
        tokens: f64,
    ) -> Self {
        KeyCheck {
            tenant: tenant.into(),
            bucket: bucket.into(),
            key: key.into(),
            tokens,
        }
    }
}

/// One item's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyAnswer {
    pub allowed: bool,
    /// Tokens the key holds after the check.
    pub remaining: f64,
    /// When the tokens asked for will be there (`None`: never).
    pub retry_after: Option<Duration>,
    /// When the key will be full (`None`: never).
    pub reset_after: Option<Duration>,
    /// The definition's limits.
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// True if answered from the record of an earlier attempt.
    pub replayed: bool,
    /// What is left of the key's calendar quota after the check, if its
    /// bucket has one.
    pub quota_remaining: Option<f64>,
    /// When the quota's cycle ends and it is whole again.
    pub quota_resets_at: Option<prost_types::Timestamp>,
}

/// A call's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// True if every item was allowed, and so taken.
    pub allowed: bool,
    pub items: Vec<KeyAnswer>,
}

impl Verdict {
    /// When the call could be allowed, as far as refill goes: the longest
    /// wait among its items; `None` if some item never will be.
    pub fn retry_after(&self) -> Option<Duration> {
        self.items.iter().try_fold(Duration::ZERO, |longest, item| {
            item.retry_after.map(|d| d.max(longest))
        })
    }
}

/// A client of the server's `KeyLimits` service (cheap to clone: clones
/// share one connection).
#[derive(Clone, Debug)]
pub struct KeyLimiter {
    client: KeyLimitsClient<Channel>,
    options: KeyLimiterOptions,
}

impl KeyLimiter {
    /// A limiter for the server at `url`. It connects lazily: creating it
    /// never waits for the server.
    pub fn connect(url: &str, options: KeyLimiterOptions) -> Result<Self, ClientError> {
        let channel = endpoint(url, options.connect_timeout, options.tls.as_ref())?.connect_lazy();
        Ok(KeyLimiter {
            client: KeyLimitsClient::new(channel),
            options,
        })
    }

    /// A limiter on an already-made channel (one that carries the
    /// caller's TLS and interceptors, say).
    pub fn from_channel(channel: Channel, options: KeyLimiterOptions) -> Self {
        KeyLimiter {
            client: KeyLimitsClient::new(channel),
            options,
        }
    }

    /// Checks `items` together under a fresh request id.
    pub async fn check(&self, items: &[KeyCheck]) -> Result<Verdict, ClientError> {
        self.check_as(&new_request_id(), items).await
    }

    /// Checks `items` together under the caller's `request_id`: calling
    /// again with the same id (within 10 minutes) returns the first answer
    /// and takes nothing again.
    pub async fn check_as(
        &self,
        request_id: &str,
        items: &[KeyCheck],
    ) -> Result<Verdict, ClientError> {
        let request = to_wire(request_id, items)?;
        let mut backoff = self.options.backoff;
        let mut attempt = 1;
        loop {
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(self.options.attempt_timeout);
            if let Some(token) = &self.options.pod_token {
                token.attach(&mut call);
            }
            match self.client.clone().check(call).await {
                Ok(response) => return Ok(from_wire(response.into_inner())),
                Err(status) if retried(status.code()) && attempt < self.options.attempts => {
                    tracing::debug!(attempt, code = ?status.code(), "check failed; retrying with the same request id");
                    let jitter = rand::rng().random_range(0.5..1.5);
                    // Never sooner than an overloaded server asked.
                    let pushback = tollgate_proto::pushback::pushback(&status).unwrap_or_default();
                    let wait = backoff
                        .mul_f64(jitter)
                        .max(pushback_wait(pushback, jitter - 0.5));
                    tokio::time::sleep(wait).await;
                    backoff = backoff.saturating_mul(2);
                    attempt += 1;
                }
                Err(status) => {
                    return Err(ClientError::Server {
                        code: status.code(),
                        message: status.message().to_owned(),
                    });
                }
            }
        }
    }
}

/// True for the codes after which the check may not have been applied and
/// a retry with the same request id is safe.
fn retried(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

/// 128 random bits, hex.
fn new_request_id() -> String {
    let bits: u128 = rand::rng().random();
    format!("{bits:032x}")
}

/// The wire request, validated by the server's own rule
/// (`CheckCall::try_from`, in `tollgate-proto`) first, so a bad item never
/// travels.
fn to_wire(request_id: &str, items: &[KeyCheck]) -> Result<v1::CheckRequest, ClientError> {
    // On the wire an empty id means none; here it is the caller's mistake.
    validate_request_id("request_id", request_id)?;
    let request = v1::CheckRequest {
        items: items
            .iter()
            .map(|item| v1::CheckItem {
                tenant_id: item.tenant.clone(),
                bucket: item.bucket.clone(),
                key: item.key.clone(),
                tokens: item.tokens,
                request_id: request_id.to_owned(),
            })
            .collect(),
    };
    CheckCall::try_from(request.clone())?;
    Ok(request)
}

fn from_wire(response: v1::CheckResponse) -> Verdict {
    let duration = |d: Option<prost_types::Duration>| {
        d.map(|d| {
            Duration::new(
                u64::try_from(d.seconds).unwrap_or(0),
                u32::try_from(d.nanos).unwrap_or(0),
            )
        })
    };
    Verdict {
        allowed: response.allowed,
        items: response
            .answers
            .into_iter()
            .map(|a| KeyAnswer {
                allowed: a.allowed,
                remaining: a.remaining_tokens,
                retry_after: duration(a.retry_after),
                reset_after: duration(a.reset_after),
                refill_rate: a.refill_rate,
                burst_limit: a.burst_limit,
                replayed: a.replayed,
                quota_remaining: a.quota_remaining,
                quota_resets_at: a.quota_resets_at,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_item_never_travels_and_names_its_field() {
        let good = KeyCheck::new("acme", "per-user", "u1", 1.0);
        let request = to_wire("r1", std::slice::from_ref(&good)).expect("valid");
        assert_eq!(request.items[0].request_id, "r1");
        let cases = [
            (KeyCheck::new("acme", "per-user", "", 1.0), "items[1].key"),
            (KeyCheck::new("acme", "", "u1", 1.0), "items[1].bucket"),
            (
                KeyCheck::new("acme", "per-user", "u1", f64::NAN),
                "items[1].tokens",
            ),
        ];
        for (bad, field) in cases {
            match to_wire("r1", &[good.clone(), bad]) {
                Err(ClientError::InvalidInput(e)) => assert_eq!(e.field, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(matches!(
            to_wire("", &[good]),
            Err(ClientError::InvalidInput(e)) if e.field == "request_id"
        ));
    }
}
