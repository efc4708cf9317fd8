//! The client's Prometheus metrics, registered in the registry the caller
//! passes in (never a global one), labelled with the tenant, instance and
//! bucket so several controllers, and the several buckets one controller
//! gates, can share a registry. The request-unit bucket's label is `""`.
//! A pod on its fallback rate shows here (`_fallback_active`,
//! `_fallback_entries_total`, `_fallback_tokens_total`), as does a bucket
//! the server refused (`_refused`).
//!
//! The rest: `tollgate_client_waiting_requests`, `_wait_seconds`,
//! `_granted_tokens_total`, `_charged_tokens_total`,
//! `_server_requests_total`, `_server_errors_total`, `_tokens`. The
//! lock-free fast path does not touch them; the next locked operation on
//! the bucket brings them up to date.

use prometheus::{Counter, Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};
use tollgate_core::{BucketName, InstanceId, LocalBucketStatus, TenantId};

/// Wait-time buckets, seconds: from a millisecond to a target period and beyond.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    /// Acquisitions waiting for tokens.
    pub waiting: IntGauge,
    /// How long acquisitions that had to wait waited.
    pub wait_seconds: Histogram,
    pub granted_tokens: Counter,
    pub charged_tokens: Counter,
    pub server_requests: IntCounter,
    pub server_errors: IntCounter,
    pub fallback_active: IntGauge,
    /// Times the bucket went onto its fallback rate.
    pub fallback_entries: IntCounter,
    /// Tokens the pod gave itself at the fallback rate.
    pub fallback_tokens: Counter,
    /// 1 once the server refused the bucket for good.
    pub refused: IntGauge,
    pub tokens: Gauge,
    /// Last values folded into the counters (they only move forward).
    granted_seen: f64,
    charged_seen: f64,
    fallback_seen: f64,
}

impl Metrics {
    pub fn register(
        registry: &Registry,
        tenant: &TenantId,
        instance: InstanceId,
        bucket: &BucketName,
    ) -> Result<Self, prometheus::Error> {
        let labels = |opts: Opts| {
            opts.const_label("tenant", tenant.as_str())
                .const_label("instance", instance.to_string())
                .const_label("bucket", bucket.as_str())
        };
        let waiting = IntGauge::with_opts(labels(Opts::new(
            "tollgate_client_waiting_requests",
            "Acquisitions waiting for tokens",
        )))?;
        let wait_opts = HistogramOpts::new(
            "tollgate_client_wait_seconds",
            "Time acquisitions that could not be admitted at once waited",
        )
        .const_label("tenant", tenant.as_str())
        .const_label("instance", instance.to_string())
        .const_label("bucket", bucket.as_str())
        .buckets(WAIT_BUCKETS.to_vec());
        let wait_seconds = Histogram::with_opts(wait_opts)?;
        let granted_tokens = Counter::with_opts(labels(Opts::new(
            "tollgate_client_granted_tokens_total",
            "Tokens granted by the server",
        )))?;
        let charged_tokens = Counter::with_opts(labels(Opts::new(
            "tollgate_client_charged_tokens_total",
            "Tokens charged for the pod's work (its request units)",
        )))?;
        let server_requests = IntCounter::with_opts(labels(Opts::new(
            "tollgate_client_server_requests_total",
            "Token-bucket requests sent to the server, retries included",
        )))?;
        let server_errors = IntCounter::with_opts(labels(Opts::new(
            "tollgate_client_server_errors_total",
            "Token-bucket requests that failed",
        )))?;
        let fallback_active = IntGauge::with_opts(labels(Opts::new(
            "tollgate_client_fallback_active",
            "1 while the pod runs on the fallback rate because the server does not answer",
        )))?;
        let fallback_entries = IntCounter::with_opts(labels(Opts::new(
            "tollgate_client_fallback_entries_total",
            "Times the bucket went onto its fallback rate",
        )))?;
        let fallback_tokens = Counter::with_opts(labels(Opts::new(
            "tollgate_client_fallback_tokens_total",
            "Tokens the pod gave itself at the fallback rate, without the server",
        )))?;
        let refused = IntGauge::with_opts(labels(Opts::new(
            "tollgate_client_refused",
            "1 once the server refused the bucket for good (no such bucket or tenant, \
             credentials, a suspended tenant, a superseded lease): its calls fail",
        )))?;
        let tokens = Gauge::with_opts(labels(Opts::new(
            "tollgate_client_tokens",
            "Tokens in the local bucket (negative while paying debt)",
        )))?;
        registry.register(Box::new(waiting.clone()))?;
        registry.register(Box::new(wait_seconds.clone()))?;
        registry.register(Box::new(granted_tokens.clone()))?;
        registry.register(Box::new(charged_tokens.clone()))?;
        registry.register(Box::new(server_requests.clone()))?;
        registry.register(Box::new(server_errors.clone()))?;
        registry.register(Box::new(fallback_active.clone()))?;
        registry.register(Box::new(fallback_entries.clone()))?;
        registry.register(Box::new(fallback_tokens.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(tokens.clone()))?;
        Ok(Metrics {
            waiting,
            wait_seconds,
            granted_tokens,
            charged_tokens,
            server_requests,
            server_errors,
            fallback_active,
            fallback_entries,
            fallback_tokens,
            refused,
            tokens,
            granted_seen: 0.0,
            charged_seen: 0.0,
            fallback_seen: 0.0,
        })
    }

    /// Brings the gauges and counters in line with the bucket (`refused`
    /// once the server refused it).
    pub fn observe(&mut self, status: &LocalBucketStatus, refused: bool) {
        if status.fallback_active && self.fallback_active.get() == 0 {
            self.fallback_entries.inc();
        }
        self.fallback_active.set(i64::from(status.fallback_active));
        self.refused.set(i64::from(refused));
        if status.fallback_tokens > self.fallback_seen {
            self.fallback_tokens
                .inc_by(status.fallback_tokens - self.fallback_seen);
            self.fallback_seen = status.fallback_tokens;
        }
        self.tokens.set(status.tokens);
        if status.granted_tokens > self.granted_seen {
            self.granted_tokens
                .inc_by(status.granted_tokens - self.granted_seen);
            self.granted_seen = status.granted_tokens;
        }
        if status.charged_tokens > self.charged_seen {
            self.charged_tokens
                .inc_by(status.charged_tokens - self.charged_seen);
            self.charged_seen = status.charged_tokens;
        }
    }
}
