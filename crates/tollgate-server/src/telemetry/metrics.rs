//! Prometheus metrics, in an explicit registry.
//!
//! Two kinds, aggregated differently across replicas:
//! - **Per bucket, from the store** (`tollgate_tenant_*`, labelled
//!   `tenant_id` and `bucket`; the request-unit bucket has `bucket=""`):
//!   cumulative consumption, tokens granted, the bucket level and limits,
//!   live instances. They are read from the store at most once per
//!   `--metrics-store-read-interval` ([`DEFAULT_STORE_READ_INTERVAL`]),
//!   not at every scrape: with 100 000 tenants a read is 100 pages of
//!   1 000 rows and some 70 MB of text, and every replica would do it at
//!   every scrape of every Prometheus. Scrapes in between are served the
//!   last read. Every replica sharing a store exports the same values:
//!   aggregate them with `max by (tenant_id, bucket)`, never `sum`.
//! - **Per key table, from the store**: `tollgate_stored_keys`,
//!   `tollgate_check_records` (aggregate with `max`).
//! - **Per replica** (RPCs by method and code, grants answered by tenant,
//!   bucket and kind, checks answered by tenant, bucket and verdict, build
//!   info, store transactions, retries, failures, instances
//!   and keys removed): this process's own counts; aggregate with
//!   `sum`. Checks are also kept per bucket for the last seconds
//!   (`check_rates`), for the rates the Admin API and the console show.
//! - **Of the process** (`process_cpu_seconds_total`,
//!   `process_resident_memory_bytes`, `process_open_fds`,
//!   `process_start_time_seconds`, …): the prometheus crate's process
//!   collector, on Linux, where it reads `/proc`.
//!
//! When the store cannot be read, a scrape still succeeds: it carries the
//! per-replica metrics and `tollgate_store_up 0`, without tenant metrics,
//! and the next scrape reads the store again.
//!
//! A read of the store (paged `list_buckets`, labels `tenant_id` and
//! `bucket`, with `tollgate_tenants` and `tollgate_buckets`) is encoded
//! once, and scrapes share the text until it is older than the read
//! interval; one read runs at a time, under a lock, however many scrapes
//! arrive together.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use tollgate_core::budget::BudgetView;
use tollgate_core::global_bucket::ShadowTotals;
use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_core::organisation::{Draw, MemberRates};
use tollgate_core::rate_window::{Outcome, WindowRates};
use tollgate_core::{BucketKey, Grant};
use tonic::Code;

use super::check_rates::CheckRates;
use crate::store::{
    BucketSnapshot, KeyCounts, STAGE_BOUNDS, Stage, StageHistograms, Store, StoreError, StoreStats,
};
use tollgate_core::history::Resolution;
use tollgate_core::history::checks::{CheckRow, CheckTally};

/// How old the store's metrics may be when a scrape is served them.
pub const DEFAULT_STORE_READ_INTERVAL: Duration = Duration::from_secs(30);

/// Buckets read per store call while scraping (and for the console).
const SCRAPE_PAGE: usize = 1000;

/// RPC latency buckets, in seconds: 250 µs to 10 s.
const LATENCY_BUCKETS: [f64; 14] = [
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// The methods the RPC metrics name; anything else is `other`.
const METHODS: [&str; 30] = [
    "TokenBucket",
    "UpdateTenantResourceLimits",
    "GetTenant",
    "ListTenants",
    "ListKeyBuckets",
    "DeleteTenant",
    "ListClosedBuckets",
    "SuspendTenant",
    "ResumeTenant",
    "PutTier",
    "GetTier",
    "ListTiers",
    "DeleteTier",
    "CreateTenant",
    "SetTenantTier",
    "SetBucketOverride",
    "ClearBucketOverride",
    "DescribeTenant",
    "SetTableLimits",
    "ClearTableLimits",
    "SetBudget",
    "ClearBudget",
    "GetBudget",
    "GetUsage",
    "GetHistory",
    "Check",
    "PartitionLoad",
    "ShouldRateLimit",
    "Watch",
    "ServerReflectionInfo",
];

/// Why metrics could not be set up or rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("register metric: {0}")]
    Register(#[from] prometheus::Error),
    #[error("encode metrics: {0}")]
    Encode(String),
}

/// The process's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    rpc_requests: IntCounterVec,
    rpc_duration: HistogramVec,
    grants: IntCounterVec,
    checks: IntCounterVec,
    pending: IntGauge,
    overload_refusals: IntCounter,
    auth_refusals: IntCounterVec,
    credentials_reloads: IntCounterVec,
    webhook_posts: IntCounterVec,
    /// The same checks by bucket over the last seconds, for operators'
    /// views of per-key buckets.
    check_rates: CheckRates,
    /// The same checks per slot, until written to the usage history
    /// ([`super::check_history`]); `None` until the server starts
    /// counting.
    check_tally: std::sync::Mutex<Option<CheckTally>>,
    /// This process's name in the history's check rows: random, so that a
    /// restarted server's counts (from zero) are rows of their own.
    replica: String,
    /// See [`Metrics::set_store_read_interval`].
    store_read_interval_ms: AtomicU64,
    store_snapshot: tokio::sync::Mutex<Option<Arc<StoreSnapshot>>>,
}

impl Metrics {
    pub fn new() -> Result<Metrics, MetricsError> {
        let registry = Registry::new();
        let rpc_requests = IntCounterVec::new(
            Opts::new(
                "tollgate_rpc_requests_total",
                "gRPC requests this replica answered, by method and status code.",
            ),
            &["method", "code"],
        )?;
        let rpc_duration = HistogramVec::new(
            HistogramOpts::new(
                "tollgate_rpc_duration_seconds",
                "Time from receiving a gRPC request to sending its response headers, by method and status code.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["method", "code"],
        )?;
        let grants = IntCounterVec::new(
            Opts::new(
                "tollgate_token_bucket_grants_total",
                "Token-bucket answers this replica gave, by bucket and kind: immediate (the bucket held the tokens) or trickle (delivered over time: the pod is throttled).",
            ),
            &["tenant_id", "bucket", "grant"],
        )?;
        let checks = IntCounterVec::new(
            Opts::new(
                "tollgate_key_checks_total",
                "Checks of per-key buckets this replica answered, by tenant, bucket and verdict (allowed, refused, or shadow_refused: allowed only because the bucket is in shadow mode; a replayed retry counts again). Never labelled by key.",
            ),
            &["tenant_id", "bucket", "verdict"],
        )?;
        let build_info = IntGaugeVec::new(
            Opts::new(
                "tollgate_build_info",
                "Always 1; the version label names the running build.",
            ),
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        registry.register(Box::new(rpc_requests.clone()))?;
        registry.register(Box::new(rpc_duration.clone()))?;
        registry.register(Box::new(grants.clone()))?;
        registry.register(Box::new(checks.clone()))?;
        let pending = IntGauge::new(
            "tollgate_pending_requests",
            "Pod-facing requests this replica admitted whose store operation has not been answered yet (bounded by --max-pending-requests).",
        )?;
        let overload_refusals = IntCounter::new(
            "tollgate_overload_refusals_total",
            "Pod-facing requests this replica refused at once (UNAVAILABLE, with a retry hint) because --max-pending-requests were already pending.",
        )?;
        let auth_refusals = IntCounterVec::new(
            Opts::new(
                "tollgate_auth_refusals_total",
                "Calls this replica refused for their credentials, by service (pod: the pod-facing services; admin) and reason: unauthenticated (no credential or an unknown one) or permission_denied (a pod credential not naming the tenant, a read-only admin token on a change).",
            ),
            &["service", "reason"],
        )?;
        // Every series at 0 from the start, so that rates and alerts see
        // the first refusal.
        for service in ["pod", "admin"] {
            for reason in ["unauthenticated", "permission_denied"] {
                auth_refusals.with_label_values(&[service, reason]);
            }
        }
        registry.register(Box::new(auth_refusals.clone()))?;
        let credentials_reloads = IntCounterVec::new(
            Opts::new(
                "tollgate_credentials_reloads_total",
                "Reloads of a credentials file after it changed or on SIGHUP, by file option and result: ok (its credentials are in force) or failed (the previous ones stay; the log says why).",
            ),
            &["file", "result"],
        )?;
        for file in ["admin-tokens-file", "pod-tokens-file"] {
            for result in ["ok", "failed"] {
                credentials_reloads.with_label_values(&[file, result]);
            }
        }
        registry.register(Box::new(credentials_reloads.clone()))?;
        let webhook_posts = IntCounterVec::new(
            Opts::new(
                "tollgate_budget_webhook_posts_total",
                "Budget events this replica posted to a webhook, by result: acknowledged (a 2xx answer) or failed (another answer, a timeout or no connection; tried again with backoff, the log says why).",
            ),
            &["result"],
        )?;
        for result in ["acknowledged", "failed"] {
            webhook_posts.with_label_values(&[result]);
        }
        registry.register(Box::new(webhook_posts.clone()))?;
        registry.register(Box::new(build_info))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(overload_refusals.clone()))?;
        Ok(Metrics {
            registry,
            rpc_requests,
            rpc_duration,
            grants,
            checks,
            pending,
            overload_refusals,
            auth_refusals,
            credentials_reloads,
            webhook_posts,
            check_rates: CheckRates::new(),
            check_tally: std::sync::Mutex::new(None),
            replica: format!("{:016x}", rand::random::<u64>()),
            store_read_interval_ms: AtomicU64::new(
                u64::try_from(DEFAULT_STORE_READ_INTERVAL.as_millis()).unwrap_or(u64::MAX),
            ),
            store_snapshot: tokio::sync::Mutex::new(None),
        })
    }

    /// Counts one answered RPC.
    pub fn observe_rpc(&self, method: &str, code: Code, elapsed: Duration) {
        let method = METHODS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("other");
        let code = code_name(code);
        self.rpc_requests.with_label_values(&[method, code]).inc();
        self.rpc_duration
            .with_label_values(&[method, code])
            .observe(elapsed.as_secs_f64());
    }

    /// Sets the number of admitted requests still pending.
    pub fn set_pending(&self, pending: usize) {
        self.pending.set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    /// Counts one request refused because the server was overloaded.
    pub fn observe_overload_refusal(&self) {
        self.overload_refusals.inc();
    }

    /// Counts one call refused for its credentials.
    pub fn observe_auth_refusal(&self, service: &str, reason: &str) {
        self.auth_refusals
            .with_label_values(&[service, reason])
            .inc();
    }

    /// Counts one reload of the credentials file `option` names.
    pub fn observe_credentials_reload(&self, option: &str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.credentials_reloads
            .with_label_values(&[option.trim_start_matches('-'), result])
            .inc();
    }

    /// Counts one post of a budget event to a webhook.
    pub fn observe_webhook_post(&self, acknowledged: bool) {
        let result = if acknowledged {
            "acknowledged"
        } else {
            "failed"
        };
        self.webhook_posts.with_label_values(&[result]).inc();
    }

    /// Counts one token-bucket answer for a bucket.
    pub fn observe_grant(&self, key: &BucketKey, grant: &Grant) {
        let kind = if grant.trickle_duration.is_zero() {
            "immediate"
        } else {
            "trickle"
        };
        self.grants
            .with_label_values(&[key.tenant.as_str(), key.bucket.as_str(), kind])
            .inc();
    }

    /// This replica's trickle grants so far, per bucket that had any.
    pub fn trickle_grants(&self) -> std::collections::HashMap<BucketKey, u64> {
        let mut found = std::collections::HashMap::new();
        for family in prometheus::core::Collector::collect(&self.grants) {
            for metric in family.get_metric() {
                let label = |name: &str| {
                    metric
                        .get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map(|l| l.value().to_owned())
                };
                if label("grant").as_deref() != Some("trickle") {
                    continue;
                }
                let (Some(tenant), Some(bucket)) = (label("tenant_id"), label("bucket")) else {
                    continue;
                };
                // Labels were made from valid keys; anything else is skipped.
                let (Ok(tenant), Ok(bucket)) = (
                    tollgate_core::TenantId::parse("tenant_id", &tenant),
                    tollgate_core::BucketName::parse("bucket", &bucket),
                ) else {
                    continue;
                };
                found.insert(
                    BucketKey::new(tenant, bucket),
                    metric.get_counter().get_value() as u64,
                );
            }
        }
        found
    }

    /// Pod-facing requests this replica has admitted and not yet answered.
    pub fn pending_requests(&self) -> i64 {
        self.pending.get()
    }

    /// Counts one answered check: once per bucket it touched, with the
    /// call's verdict.
    pub fn observe_check(&self, call: &CheckCall, answer: &CallAnswer) {
        let buckets: BTreeSet<&BucketKey> = call.items.iter().map(|i| &i.key.bucket).collect();
        for key in buckets {
            // A bucket in shadow mode whose tokens were not there would
            // have refused the call.
            let shadow_refused = call
                .items
                .iter()
                .zip(&answer.items)
                .any(|(i, a)| &i.key.bucket == key && a.answer.shadow_refused);
            let (verdict, outcome) = match (answer.allowed, shadow_refused) {
                (false, _) => ("refused", Outcome::Refused),
                (true, true) => ("shadow_refused", Outcome::ShadowRefused),
                (true, false) => ("allowed", Outcome::Allowed),
            };
            self.checks
                .with_label_values(&[key.tenant.as_str(), key.bucket.as_str(), verdict])
                .inc();
            self.check_rates.observe(key, outcome);
            // The history counts a retry answered from its record once.
            let fresh = call
                .items
                .iter()
                .zip(&answer.items)
                .filter(|(i, a)| &i.key.bucket == key && !a.replayed);
            if fresh.clone().next().is_some()
                && let Some(tally) = self.tally().as_mut()
            {
                let keys = fresh.map(|(i, _)| i.key.key.as_str());
                tally.record(key, answer.at, keys, outcome);
            }
        }
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Option<CheckTally>> {
        // Plain counts: a panic elsewhere leaves them usable.
        self.check_tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts counting checks per slot of `resolutions` for the usage
    /// history; a second call keeps what the first counts.
    pub fn count_checks_for_history(&self, resolutions: Vec<Resolution>) {
        self.tally()
            .get_or_insert_with(|| CheckTally::new(resolutions));
    }

    /// The check rows to write (`CheckTally::take_rows`); none before
    /// [`Metrics::count_checks_for_history`].
    pub fn take_check_rows(&self) -> Vec<CheckRow> {
        self.tally()
            .as_mut()
            .map(CheckTally::take_rows)
            .unwrap_or_default()
    }

    /// This process's name in the history's check rows.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Gives back check rows whose write failed (`CheckTally::unwritten`).
    pub fn unwritten_check_rows(&self, rows: Vec<CheckRow>) {
        if let Some(tally) = self.tally().as_mut() {
            tally.unwritten(rows);
        }
    }

    /// This replica's checks and refusals of a per-key bucket per second
    /// over the last seconds (the counts `tollgate_key_checks_total` adds
    /// up).
    pub fn check_rates(&self, key: &BucketKey) -> WindowRates {
        self.check_rates.rates(key)
    }

    /// Reads the store for the per-bucket and per-key-table metrics at
    /// most once per `interval`; scrapes in between are served what the
    /// last read found. Zero reads at every scrape.
    pub fn set_store_read_interval(&self, interval: Duration) {
        let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.store_read_interval_ms
            .store(millis, std::sync::atomic::Ordering::Relaxed);
    }

    /// The metrics in Prometheus's text format: this replica's own, and
    /// the store's from a read at most `set_store_read_interval` old.
    pub async fn render(&self, store: &dyn Store) -> Result<String, MetricsError> {
        let snapshot = self.store_snapshot(store).await?;
        let mut families = self.registry.gather();
        families.extend(store_families(store.stats(), snapshot.store_up));
        families.retain(|f| !f.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = encode(&families)?;
        out.push_str(&snapshot.text);
        Ok(out)
    }

    /// The store's metrics, read now if the last read is older than the
    /// interval (or failed). One read at a time: scrapes that arrive during
    /// a read wait for it and share it.
    async fn store_snapshot(&self, store: &dyn Store) -> Result<Arc<StoreSnapshot>, MetricsError> {
        let interval = Duration::from_millis(
            self.store_read_interval_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let mut cached = self.store_snapshot.lock().await;
        if let Some(snapshot) = cached.as_ref()
            && snapshot.store_up
            && snapshot.read_at.elapsed() < interval
        {
            return Ok(Arc::clone(snapshot));
        }
        let buckets = read_buckets(store, usize::MAX).await;
        let keys = store.key_counts().await;
        let store_up = buckets.is_ok() && keys.is_ok();
        let mut families = Vec::new();
        match keys {
            Ok(counts) => families.extend(key_families(counts)),
            Err(e) => tracing::warn!(error = %e, "metrics: cannot count keys in the store"),
        }
        match buckets {
            Ok(buckets) => families.extend(bucket_families(&buckets)),
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read buckets from the store"),
        }
        families.retain(|f| !f.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let snapshot = Arc::new(StoreSnapshot {
            read_at: std::time::Instant::now(),
            store_up,
            text: encode(&families)?,
        });
        *cached = Some(Arc::clone(&snapshot));
        Ok(snapshot)
    }
}

/// What the last read of the store for metrics found, encoded.
#[derive(Debug)]
struct StoreSnapshot {
    read_at: std::time::Instant,
    store_up: bool,
    text: String,
}

fn encode(families: &[MetricFamily]) -> Result<String, MetricsError> {
    let mut out = Vec::new();
    prometheus::TextEncoder::new()
        .encode(families, &mut out)
        .map_err(|e| MetricsError::Encode(e.to_string()))?;
    String::from_utf8(out).map_err(|e| MetricsError::Encode(e.to_string()))
}

/// The first `at_most` buckets in key order (`usize::MAX`: every one), a
/// page of [`SCRAPE_PAGE`] at a time.
pub(crate) async fn read_buckets(
    store: &dyn Store,
    at_most: usize,
) -> Result<Vec<BucketSnapshot>, StoreError> {
    let mut buckets: Vec<BucketSnapshot> = Vec::new();
    while buckets.len() < at_most {
        let after = buckets.last().map(|b| b.key.clone());
        let want = SCRAPE_PAGE.min(at_most - buckets.len());
        let page = store.list_buckets(after.as_ref(), want).await?;
        let full = page.len() == want;
        buckets.extend(page);
        if !full {
            break;
        }
    }
    Ok(buckets)
}

/// gRPC's canonical name of a status code, as gRPC's own metrics spell it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

/// A metric with these labels and no value yet.
fn labelled(labels: &[(&str, &str)]) -> proto::Metric {
    let mut metric = proto::Metric::default();
    metric.set_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name((*name).to_owned());
                pair.set_value((*value).to_owned());
                pair
            })
            .collect(),
    );
    metric
}

fn sample(labels: &[(&str, &str)], kind: MetricType, value: f64) -> proto::Metric {
    let mut metric = labelled(labels);
    match kind {
        MetricType::COUNTER => {
            let mut counter = proto::Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        }
        _ => {
            let mut gauge = proto::Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        }
    }
    metric
}

/// `tollgate_store_stage_seconds`: one histogram per stage of a write.
fn stage_family(stages: &StageHistograms) -> MetricFamily {
    let metrics = Stage::ALL
        .iter()
        .zip(stages)
        .map(|(stage, times)| {
            let mut histogram = proto::Histogram::default();
            histogram.set_sample_count(times.count);
            histogram.set_sample_sum(times.sum_seconds());
            histogram.set_bucket(
                STAGE_BOUNDS
                    .iter()
                    .zip(times.cumulative)
                    .map(|(bound, count)| {
                        let mut bucket = proto::Bucket::default();
                        bucket.set_upper_bound(*bound);
                        bucket.set_cumulative_count(count);
                        bucket
                    })
                    .collect(),
            );
            let mut metric = labelled(&[("stage", stage.name())]);
            metric.set_histogram(histogram);
            metric
        })
        .collect();
    family(
        "tollgate_store_stage_seconds",
        "Time writes spent in each stage on this replica: queued (a request waiting for its transaction, once per request), begin (taking a connection), read (BEGIN, locking and reading the rows: one round trip), write (serving the batch), commit (the writes and COMMIT, until durable: one round trip); the last four once per transaction attempt.",
        MetricType::HISTOGRAM,
        metrics,
    )
}

fn store_families(stats: StoreStats, store_up: bool) -> Vec<MetricFamily> {
    let one = |name: &str, help: &str, kind: MetricType, value: f64| {
        family(name, help, kind, vec![sample(&[], kind, value)])
    };
    vec![
        stage_family(&stats.stages),
        one(
            "tollgate_store_up",
            "1 if this replica's last read of the store for metrics succeeded (tenant metrics come from it), else 0.",
            MetricType::GAUGE,
            if store_up { 1.0 } else { 0.0 },
        ),
        one(
            "tollgate_store_transactions_total",
            "Write transactions this replica committed (a batch of token-bucket requests counts once).",
            MetricType::COUNTER,
            stats.transactions as f64,
        ),
        one(
            "tollgate_store_retries_total",
            "Store transaction attempts that failed (conflicts, lost connections) and were run again.",
            MetricType::COUNTER,
            stats.retries as f64,
        ),
        one(
            "tollgate_store_failures_total",
            "Store operations that failed after their last attempt.",
            MetricType::COUNTER,
            stats.failures as f64,
        ),
        one(
            "tollgate_store_draw_round_trips_total",
            "Round trips token-bucket transactions took for the organisation rows their members' draws needed, beyond their own (PostgreSQL).",
            MetricType::COUNTER,
            stats.draw_round_trips as f64,
        ),
        one(
            "tollgate_store_owed_draws_total",
            "Organisation draws a transaction skipped because the organisation's row was held, tried again by the next transaction of the same worker (PostgreSQL).",
            MetricType::COUNTER,
            stats.owed_draws as f64,
        ),
        one(
            "tollgate_instances_removed_total",
            "Instances this replica removed from their tenant's list for being silent too long.",
            MetricType::COUNTER,
            stats.instances_removed as f64,
        ),
        one(
            "tollgate_keys_removed_total",
            "Keys of per-key buckets this replica removed for being full again (found so by a check, or by the sweep).",
            MetricType::COUNTER,
            stats.keys_removed as f64,
        ),
    ]
}

/// The per-key tables' sizes, read from the store (the same on every
/// replica: aggregate with `max`).
fn key_families(counts: KeyCounts) -> Vec<MetricFamily> {
    let one = |name: &str, help: &str, value: u64| {
        family(
            name,
            help,
            MetricType::GAUGE,
            vec![sample(&[], MetricType::GAUGE, value as f64)],
        )
    };
    vec![
        one(
            "tollgate_stored_keys",
            "Keys of per-key buckets the store holds: those below their burst (a full key has no row). Read from the store.",
            counts.keys,
        ),
        one(
            "tollgate_check_records",
            "Records of checks with a request id, kept for their retries. Read from the store.",
            counts.records,
        ),
    ]
}

type BucketValue = fn(&BucketSnapshot) -> f64;

/// The per-bucket metrics: name, help, type, value.
const BUCKET_METRICS: [(&str, &str, MetricType, BucketValue); 14] = [
    (
        "tollgate_tenant_request_units_total",
        "Request units the tenant's pods reported consuming, since the tenant was created (read from the store).",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.request_units(),
    ),
    (
        "tollgate_tenant_read_batches_total",
        "Read batches the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.read_batches as f64,
    ),
    (
        "tollgate_tenant_read_requests_total",
        "Read requests the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.read_requests as f64,
    ),
    (
        "tollgate_tenant_read_bytes_total",
        "Bytes read that the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.read_bytes as f64,
    ),
    (
        "tollgate_tenant_write_batches_total",
        "Write batches the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.write_batches as f64,
    ),
    (
        "tollgate_tenant_write_requests_total",
        "Write requests the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.write_requests as f64,
    ),
    (
        "tollgate_tenant_write_bytes_total",
        "Bytes written that the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.write_bytes as f64,
    ),
    (
        "tollgate_tenant_cpu_seconds_total",
        "CPU seconds the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.cpu_seconds(),
    ),
    (
        "tollgate_tenant_egress_bytes_total",
        "Egress bytes the tenant's pods reported.",
        MetricType::COUNTER,
        |b| b.head.totals.consumption.egress_bytes as f64,
    ),
    (
        "tollgate_tenant_granted_tokens_total",
        "Tokens granted to the tenant's pods since the tenant was created.",
        MetricType::COUNTER,
        |b| b.head.totals.granted_tokens,
    ),
    (
        "tollgate_tenant_tokens",
        "Tokens in the tenant's global bucket now, refill included (negative: debt).",
        MetricType::GAUGE,
        BucketSnapshot::current_tokens,
    ),
    (
        "tollgate_tenant_refill_rate",
        "Tokens per second added to the tenant's bucket.",
        MetricType::GAUGE,
        |b| b.head.state.limits.refill_rate,
    ),
    (
        "tollgate_tenant_burst_limit",
        "Tokens at which the tenant's bucket stops refilling.",
        MetricType::GAUGE,
        |b| b.head.state.limits.burst_limit,
    ),
    (
        "tollgate_tenant_instances",
        "Live instances (pods) of the tenant's bucket: none once it has had no request for the inactivity timeout.",
        MetricType::GAUGE,
        |b| f64::from(b.live_instances()),
    ),
];

type ShadowValue = fn(&ShadowTotals) -> f64;

/// The metrics of shared buckets in shadow mode (`enforce = false`), or
/// that were: name, help, value.
const SHADOW_METRICS: [(&str, &str, ShadowValue); 2] = [
    (
        "tollgate_tenant_shadow_throttled_tokens_total",
        "Tokens the bucket's pods were granted at once in shadow mode that enforcing would not have given them at once.",
        |s| s.throttled_tokens,
    ),
    (
        "tollgate_tenant_shadow_throttled_seconds_total",
        "Seconds of trickles enforcing would have put the bucket's pods on in shadow mode, summed over the pods.",
        |s| s.throttled_micros as f64 / 1e6,
    ),
];

type BudgetValue = fn(&BudgetView) -> f64;

/// The per-budget metrics (gauges of the current cycle, as of the read):
/// name, help, value. Only buckets with a budget have samples.
const BUDGET_METRICS: [(&str, &str, BudgetValue); 6] = [
    (
        "tollgate_budget_amount_tokens",
        "Tokens the bucket's budget allows per cycle (read from the store).",
        |v| v.budget.amount,
    ),
    (
        "tollgate_budget_spend_tokens",
        "Tokens spent in the current cycle: granted by the server plus fallback tokens charged.",
        |v| v.usage.spend(),
    ),
    (
        "tollgate_budget_granted_tokens",
        "Tokens the server granted in the current cycle.",
        |v| v.usage.granted_tokens,
    ),
    (
        "tollgate_budget_forecast_tokens",
        "Tokens the current cycle is expected to have spent at its end, at the recent rate.",
        |v| v.forecast,
    ),
    (
        "tollgate_budget_limit_reached",
        "1 once the current cycle's spend has reached the amount, else 0.",
        |v| f64::from(u8::from(v.limit_reached_at.is_some())),
    ),
    (
        "tollgate_budget_cycle_end_timestamp_seconds",
        "When the current cycle ends, in seconds since the Unix epoch.",
        |v| v.cycle.end.unix_micros() as f64 / 1e6,
    ),
];

type MemberValue = fn(&MemberRates) -> f64;

/// The per-member-bucket metrics of organisations (as of the bucket's
/// last draw): name, help, type, value. Only buckets of a member of an
/// organisation have samples; the organisation's own buckets are a
/// tenant's (`tenant_id` is the organisation's id).
const MEMBER_METRICS: [(&str, &str, MetricType, MemberValue); 3] = [
    (
        "tollgate_member_wanted_rate",
        "Tokens per second a member's bucket asked its organisation for at its last draw.",
        MetricType::GAUGE,
        |r| r.wanted,
    ),
    (
        "tollgate_member_drawn_rate",
        "Tokens per second a member's bucket refills at from its organisation until its draw ends (0 once it has).",
        MetricType::GAUGE,
        |r| r.drawn,
    ),
    (
        "tollgate_member_draws_total",
        "Draws a member's bucket made from its organisation's bucket (at most one per draw period).",
        MetricType::COUNTER,
        |r| r.draws as f64,
    ),
];

fn bucket_families(buckets: &[BucketSnapshot]) -> Vec<MetricFamily> {
    let mut families: Vec<MetricFamily> = BUCKET_METRICS
        .iter()
        .map(|(name, help, kind, value)| {
            family(
                name,
                help,
                *kind,
                buckets
                    .iter()
                    .map(|b| {
                        // In name order, as Prometheus writes labels.
                        let labels = [
                            ("bucket", b.key.bucket.as_str()),
                            ("tenant_id", b.key.tenant.as_str()),
                        ];
                        sample(&labels, *kind, value(b))
                    })
                    .collect(),
            )
        })
        .collect();
    // Each budget as it stands at its snapshot's clock (a cycle over but
    // not yet closed by a request reads as the next one).
    let budgets: Vec<(&BucketSnapshot, BudgetView)> = buckets
        .iter()
        .filter_map(|b| Some((b, b.head.budget.as_ref()?.view(&b.head.state, b.read_at))))
        .collect();
    for (name, help, value) in BUDGET_METRICS {
        families.push(family(
            name,
            help,
            MetricType::GAUGE,
            budgets
                .iter()
                .map(|(b, view)| {
                    let labels = [
                        ("bucket", b.key.bucket.as_str()),
                        ("tenant_id", b.key.tenant.as_str()),
                    ];
                    sample(&labels, MetricType::GAUGE, value(view))
                })
                .collect(),
        ));
    }
    // Each shared bucket in shadow mode, or that was: what enforcing
    // would have held back.
    let shadowed: Vec<&BucketSnapshot> = buckets
        .iter()
        .filter(|b| !b.head.enforce || b.head.shadow != ShadowTotals::default())
        .collect();
    for (name, help, value) in SHADOW_METRICS {
        families.push(family(
            name,
            help,
            MetricType::COUNTER,
            shadowed
                .iter()
                .map(|b| {
                    let labels = [
                        ("bucket", b.key.bucket.as_str()),
                        ("tenant_id", b.key.tenant.as_str()),
                    ];
                    sample(&labels, MetricType::COUNTER, value(&b.head.shadow))
                })
                .collect(),
        ));
    }
    // Each bucket of an organisation's member, with its organisation.
    let members: Vec<(&BucketSnapshot, &Draw)> = buckets
        .iter()
        .filter_map(|b| Some((b, b.head.draw.as_deref()?)))
        .collect();
    for (name, help, kind, value) in MEMBER_METRICS {
        families.push(family(
            name,
            help,
            kind,
            members
                .iter()
                .map(|(b, draw)| {
                    let labels = [
                        ("bucket", b.key.bucket.as_str()),
                        ("organization", draw.organisation.as_str()),
                        ("tenant_id", b.key.tenant.as_str()),
                    ];
                    let rates = MemberRates::of(&b.head, None, &b.key.bucket, b.read_at);
                    sample(&labels, kind, value(&rates))
                })
                .collect(),
        ));
    }
    // Buckets come in key order, so a tenant's are adjacent.
    let mut tenants = buckets.iter().map(|b| &b.key.tenant).collect::<Vec<_>>();
    tenants.dedup();
    families.push(family(
        "tollgate_tenants",
        "Tenants in the store.",
        MetricType::GAUGE,
        vec![sample(&[], MetricType::GAUGE, tenants.len() as f64)],
    ));
    families.push(family(
        "tollgate_buckets",
        "Buckets in the store, over all tenants.",
        MetricType::GAUGE,
        vec![sample(&[], MetricType::GAUGE, buckets.len() as f64)],
    ));
    families
}
