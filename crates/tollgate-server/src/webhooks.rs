//! Posting budget events to the webhooks an operator configured.
//!
//! A transaction that takes a budget across a threshold keeps a budget
//! event in the store (once per bucket, cycle and threshold). Every server
//! given webhooks runs [`deliver_budget_events`]: it claims due events
//! from the store, posts each to every webhook that has not acknowledged
//! it yet, and settles the claim with the webhooks that did; the rules of
//! claims and retries are `tollgate_core::budget::delivery`'s. Events are
//! in the store, so they outlive restarts of any server, and a server
//! killed mid-delivery leaves its claim to lapse ([`WebhookOptions::lease`])
//! for another to take up.
//!
//! A post is `POST <url>` with a JSON body ([`EventPayload`]) and:
//! - `Idempotency-Key`: the same for every post of one event (tenant,
//!   bucket, cycle and threshold); delivery is at least once, so a
//!   receiver deduplicates on it;
//! - `Tollgate-Signature: t=<unix seconds>,v1=<hex>`: HMAC-SHA256, keyed
//!   with the shared secret, of `<t>.<body>`; a receiver recomputes it and
//!   may refuse an old `t`;
//! - `Tollgate-Delivery-Attempt`: 1 for the first post of the event.
//!
//! Any 2xx answer acknowledges; anything else (a redirect included), a
//! timeout or a refused connection is a failure, tried again with backoff
//! (1 s doubling to 10 minutes by default).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::Sha256;
use tollgate_core::budget::BudgetEvent;
use tollgate_core::budget::delivery::{Attempt, Backoff, idempotency_key};
use tollgate_core::tenant_state::rfc3339;

use crate::client_tls;
use crate::store::{ClaimedEvent, Store};
use crate::telemetry::Metrics;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Tollgate-Signature";
/// The header carrying the attempt's number.
pub const ATTEMPT_HEADER: &str = "Tollgate-Delivery-Attempt";

/// Why webhooks could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("the webhook secret is empty: give a secret of at least 16 bytes")]
    EmptySecret,
    #[error("the webhook secret is {0} bytes: give at least 16")]
    ShortSecret(usize),
    #[error("set up the webhook HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("set up TLS for webhooks: {0}")]
    Tls(#[source] rustls::Error),
}

/// Where budget events go and how they are posted.
#[derive(Clone)]
pub struct WebhookOptions {
    /// The webhooks, each an `http://` or `https://` URL.
    pub urls: Vec<String>,
    /// The shared secret the signature is keyed with.
    pub secret: Vec<u8>,
    /// The longest a post may take, its connection included.
    pub timeout: Duration,
    /// How often the store is asked for due events.
    pub poll_interval: Duration,
    /// How long a claim holds an event: at least the time to post a batch
    /// to every webhook ([`WebhookOptions::timeout`] each).
    pub lease: Duration,
    pub backoff: Backoff,
    /// The most events claimed at once.
    pub batch: usize,
}

impl std::fmt::Debug for WebhookOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookOptions")
            .field("urls", &self.urls)
            .field("secret", &"<hidden>")
            .field("timeout", &self.timeout)
            .field("poll_interval", &self.poll_interval)
            .field("lease", &self.lease)
            .field("backoff", &self.backoff)
            .field("batch", &self.batch)
            .finish()
    }
}

/// The shortest secret accepted.
const MIN_SECRET: usize = 16;

impl WebhookOptions {
    /// Webhooks at `urls`, signed with `secret`, with the default timing:
    /// posts of at most 10 s, the store asked every second, claims of 2
    /// minutes, 16 events at once.
    pub fn new(urls: Vec<String>, secret: Vec<u8>) -> Result<WebhookOptions, WebhookError> {
        check_urls(&urls)?;
        if secret.is_empty() {
            return Err(WebhookError::EmptySecret);
        }
        if secret.len() < MIN_SECRET {
            return Err(WebhookError::ShortSecret(secret.len()));
        }
        Ok(WebhookOptions {
            urls,
            secret,
            ..WebhookOptions::default_timing()
        })
    }

    /// The default timing, with no webhooks and no secret.
    pub fn default_timing() -> WebhookOptions {
        WebhookOptions {
            urls: Vec::new(),
            secret: Vec::new(),
            timeout: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(120),
            backoff: Backoff::default(),
            batch: 16,
        }
    }
}

/// Checks that each of `urls` is an `http://` or `https://` URL.
pub fn check_urls(urls: &[String]) -> Result<(), WebhookError> {
    for url in urls {
        let parsed = reqwest::Url::parse(url).map_err(|e| WebhookError::Url {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(WebhookError::Url {
                url: url.clone(),
                reason: format!("scheme {:?}: give http:// or https://", parsed.scheme()),
            });
        }
    }
    Ok(())
}

/// The JSON body of a post.
#[derive(Debug, Serialize)]
pub struct EventPayload<'a> {
    /// The idempotency key.
    pub id: &'a str,
    /// Always `budget.threshold`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub tenant: &'a str,
    /// The bucket's name; empty for the request-unit bucket.
    pub bucket: &'a str,
    /// The cycle's bounds, RFC 3339 in UTC.
    pub cycle_start: String,
    pub cycle_end: String,
    /// `75` (of the spend) or `forecast:100`.
    pub threshold: String,
    /// `spend` or `forecast`.
    pub measure: &'static str,
    pub percent: u32,
    pub amount: f64,
    pub spend: f64,
    pub forecast: f64,
    /// When the transaction crossed the threshold, by the store's clock.
    pub crossed_at: String,
}

impl<'a> EventPayload<'a> {
    fn new(id: &'a str, claimed: &'a ClaimedEvent) -> Self {
        let event: &BudgetEvent = &claimed.kept.event;
        EventPayload {
            id,
            kind: "budget.threshold",
            tenant: claimed.key.tenant.as_str(),
            bucket: claimed.key.bucket.as_str(),
            cycle_start: rfc3339(event.cycle.start),
            cycle_end: rfc3339(event.cycle.end),
            threshold: event.threshold.label(),
            measure: event.threshold.on.name(),
            percent: event.threshold.percent,
            amount: event.amount,
            spend: event.spend,
            forecast: event.forecast,
            crossed_at: rfc3339(event.at),
        }
    }
}

/// The signature header's value for `body` signed at `unix_seconds`.
pub fn signature(secret: &[u8], unix_seconds: u64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={unix_seconds},v1={hex}")
}

/// Posts budget events to the webhooks until the task is dropped: every
/// poll interval, claims due events (a few batches back to back while they
/// come full, by `store::every`), posts each to the webhooks that have not
/// acknowledged it, and settles the claim.
pub async fn deliver_budget_events(
    store: Arc<dyn Store>,
    options: WebhookOptions,
    metrics: Option<Arc<Metrics>>,
) {
    let client = match http_client(&options) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "budget events will not be posted to webhooks");
            return;
        }
    };
    tracing::info!(
        webhooks = ?options.urls,
        "posting budget events to webhooks"
    );
    let sender = Sender {
        store,
        client,
        options,
        metrics,
    };
    let interval = sender.options.poll_interval;
    crate::store::every(interval, "reading budget events for delivery", || {
        sender.round()
    })
    .await
}

struct Sender {
    store: Arc<dyn Store>,
    client: reqwest::Client,
    options: WebhookOptions,
    metrics: Option<Arc<Metrics>>,
}

impl Sender {
    /// One batch: claims, posts, settles. Answers whether the batch was
    /// full (more may wait).
    async fn round(&self) -> Result<bool, crate::store::StoreError> {
        let claimed = self
            .store
            .claim_budget_events(self.options.batch, self.options.lease)
            .await?;
        let full = claimed.len() >= self.options.batch;
        let posts = claimed.iter().map(|c| self.deliver(c));
        futures_util::future::join_all(posts).await;
        Ok(full)
    }

    /// Posts one claimed event to the webhooks still waiting for it, and
    /// settles its claim. A failed settlement leaves the claim to lapse:
    /// the event is posted again after the lease, with the same key.
    async fn deliver(&self, claimed: &ClaimedEvent) {
        let kept = &claimed.kept;
        let key = idempotency_key(
            claimed.key.tenant.as_str(),
            claimed.key.bucket.as_str(),
            &kept.event,
        );
        let number = kept.delivery.attempts.saturating_add(1);
        let mut attempt = Attempt::default();
        let mut errors = Vec::new();
        let body = match serde_json::to_vec(&EventPayload::new(&key, claimed)) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(idempotency_key = %key, error = %e, "cannot encode a budget event");
                return;
            }
        };
        for url in kept.delivery.waiting_for(&self.options.urls) {
            let posted = self.post(url, &key, number, &body).await;
            if let Some(metrics) = &self.metrics {
                metrics.observe_webhook_post(posted.is_ok());
            }
            match posted {
                Ok(()) => attempt.acknowledged.push(url.clone()),
                Err(reason) => errors.push(format!("{url}: {reason}")),
            }
        }
        if !errors.is_empty() {
            let error = errors.join("; ");
            let retry_in = self.options.backoff.delay(number);
            // The first failure of an event is a warning; its retries are
            // logged at debug level, so a receiver down for an hour does
            // not fill the log.
            if number == 1 {
                tracing::warn!(idempotency_key = %key, %error, ?retry_in, "a webhook did not acknowledge a budget event; trying again with backoff");
            } else {
                tracing::debug!(idempotency_key = %key, %error, attempt = number, ?retry_in, "a webhook did not acknowledge a budget event again");
            }
            attempt.error = Some(error);
        } else if number > 1 {
            tracing::info!(idempotency_key = %key, attempt = number, "budget event delivered after retries");
        }
        if let Err(e) = self
            .store
            .settle_budget_event(claimed, &attempt, &self.options.urls, &self.options.backoff)
            .await
        {
            tracing::warn!(idempotency_key = %key, error = %e, lease = ?self.options.lease, "cannot record a budget event's delivery; it is posted again once the claim lapses");
        }
    }

    /// Posts `body` to `url`; `Err` says why it was not acknowledged.
    async fn post(&self, url: &str, key: &str, number: u32, body: &[u8]) -> Result<(), String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let response = self
            .client
            .post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key)
            .header(SIGNATURE_HEADER, signature(&self.options.secret, now, body))
            .header(ATTEMPT_HEADER, number.to_string())
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}"))
        }
    }
}

/// A failed post, with its causes (reqwest's top-level message alone is
/// "error sending request").
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_owned()
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The HTTP client: the options' timeout, no redirects (a redirect is not
/// an acknowledgement), TLS trusting the system's certificate
/// authorities.
fn http_client(options: &WebhookOptions) -> Result<reqwest::Client, WebhookError> {
    let tls = client_tls::client_config(client_tls::system_roots()).map_err(WebhookError::Tls)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(options.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(WebhookError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_the_time_and_body() {
        // Computed independently (Python's hmac module).
        assert_eq!(
            signature(b"Jefe", 1_764_547_200, br#"{"a":1}"#),
            "t=1764547200,v1=7b8a50de13edf80d29467e69b3a6cd061857a7682c1e306383d6083f1efe11d4"
        );
    }

    #[test]
    fn options_refuse_bad_urls_and_weak_secrets() {
        let secret = b"0123456789abcdef".to_vec();
        assert!(WebhookOptions::new(vec!["https://example.com/h".into()], secret.clone()).is_ok());
        for bad in ["ftp://example.com/", "example.com/hook", ""] {
            let e = WebhookOptions::new(vec![bad.into()], secret.clone())
                .expect_err("a bad URL is refused");
            assert!(e.to_string().contains("webhook URL"), "{e}");
        }
        assert!(matches!(
            WebhookOptions::new(vec!["http://a/".into()], Vec::new()),
            Err(WebhookError::EmptySecret)
        ));
        assert!(matches!(
            WebhookOptions::new(vec!["http://a/".into()], b"short".to_vec()),
            Err(WebhookError::ShortSecret(5))
        ));
    }
}
