//! The agent's Prometheus metrics, on its own `/metrics`.
//!
//! One registry holds the agent's metrics and, beside them, every bucket's
//! `tollgate_client_*` metrics (the controllers register theirs in it,
//! labelled with tenant, instance and bucket, so one registry takes them
//! all). The agent's own:
//!
//! - `tollgate_agent_acquisitions_total{tenant,bucket,result}`: Acquire and
//!   TryAcquire calls by outcome: `admitted`, `not_admitted` (no tokens in
//!   time), `cancelled` (the caller went away while it waited), `error`.
//! - `tollgate_agent_acquire_wait_seconds{tenant,bucket}`: how long
//!   Acquire calls waited, admitted or not.
//! - `tollgate_agent_calls_total{method,code}`: every call, gRPC and
//!   HTTP, by method (the proto's) and answer code.
//! - `tollgate_agent_fallback_seconds_total{tenant,bucket}`: time buckets
//!   spent on their fallback rate (the server out of reach), sampled once
//!   a second.
//! - `tollgate_agent_envoy_kept_tokens_total{tenant,bucket}`: tokens of
//!   Envoy checks refused overall that stayed charged to a shared bucket,
//!   because its local bucket had reported them before they could be
//!   given back.
//! - `tollgate_agent_request_ids`: answers kept for retries.
//! - `tollgate_agent_tenants`: tenants the agent holds buckets for.
//!
//! Tenant and bucket labels appear only for buckets the agent holds, never
//! for names a caller made up and the agent refused.

use prometheus::{
    CounterVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Wait-time buckets, seconds: from the fast path to the longest wait.
const WAIT_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
];

/// How an Acquire or TryAcquire ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Admitted,
    NotAdmitted,
    Cancelled,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::NotAdmitted => "not_admitted",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

#[derive(Clone, Debug)]
pub struct AgentMetrics {
    acquisitions: IntCounterVec,
    wait_seconds: HistogramVec,
    calls: IntCounterVec,
    fallback_seconds: CounterVec,
    envoy_kept_tokens: CounterVec,
    pub request_ids: IntGauge,
    pub tenants: IntGauge,
    pub journal_errors: IntCounter,
}

impl AgentMetrics {
    pub fn register(registry: &Registry) -> Result<AgentMetrics, prometheus::Error> {
        let acquisitions = IntCounterVec::new(
            Opts::new(
                "tollgate_agent_acquisitions_total",
                "Acquire and TryAcquire calls, by outcome",
            ),
            &["tenant", "bucket", "result"],
        )?;
        let wait_seconds = HistogramVec::new(
            HistogramOpts::new(
                "tollgate_agent_acquire_wait_seconds",
                "How long Acquire calls waited for their tokens, admitted or not",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["tenant", "bucket"],
        )?;
        let calls = IntCounterVec::new(
            Opts::new(
                "tollgate_agent_calls_total",
                "Calls to the agent (gRPC and HTTP), by method and answer code",
            ),
            &["method", "code"],
        )?;
        let fallback_seconds = CounterVec::new(
            Opts::new(
                "tollgate_agent_fallback_seconds_total",
                "Time buckets spent on their fallback rate because the server was out of reach \
                 (sampled once a second)",
            ),
            &["tenant", "bucket"],
        )?;
        let envoy_kept_tokens = CounterVec::new(
            Opts::new(
                "tollgate_agent_envoy_kept_tokens_total",
                "Tokens of Envoy checks refused overall that stayed charged to a shared bucket: \
                 its local bucket had reported them before they could be given back",
            ),
            &["tenant", "bucket"],
        )?;
        let request_ids = IntGauge::new(
            "tollgate_agent_request_ids",
            "Answers kept for the retries of calls with a request id",
        )?;
        let tenants = IntGauge::new(
            "tollgate_agent_tenants",
            "Tenants the agent holds buckets for",
        )?;
        let journal_errors = IntCounter::new(
            "tollgate_agent_journal_errors_total",
            "Answered calls the journal could not record: a crash before their bucket's next \
             report would lose them",
        )?;
        registry.register(Box::new(journal_errors.clone()))?;
        registry.register(Box::new(acquisitions.clone()))?;
        registry.register(Box::new(wait_seconds.clone()))?;
        registry.register(Box::new(calls.clone()))?;
        registry.register(Box::new(fallback_seconds.clone()))?;
        registry.register(Box::new(envoy_kept_tokens.clone()))?;
        registry.register(Box::new(request_ids.clone()))?;
        registry.register(Box::new(tenants.clone()))?;
        Ok(AgentMetrics {
            acquisitions,
            wait_seconds,
            calls,
            fallback_seconds,
            envoy_kept_tokens,
            request_ids,
            tenants,
            journal_errors,
        })
    }

    pub fn acquisition(&self, tenant: &str, bucket: &str, outcome: Outcome) {
        self.acquisitions
            .with_label_values(&[tenant, bucket, outcome.label()])
            .inc();
    }

    pub fn waited(&self, tenant: &str, bucket: &str, seconds: f64) {
        self.wait_seconds
            .with_label_values(&[tenant, bucket])
            .observe(seconds);
    }

    pub fn call(&self, method: &str, code: tonic::Code) {
        self.calls
            .with_label_values(&[method, crate::error::code_name(code)])
            .inc();
    }

    pub fn envoy_kept(&self, tenant: &str, bucket: &str, tokens: f64) {
        self.envoy_kept_tokens
            .with_label_values(&[tenant, bucket])
            .inc_by(tokens);
    }

    pub fn on_fallback(&self, tenant: &str, bucket: &str, seconds: f64) {
        self.fallback_seconds
            .with_label_values(&[tenant, bucket])
            .inc_by(seconds);
    }
}
