//! Hot-partition limits at the pod: [`PartitionLimiter`] admits or rejects
//! each operation on a (table, partition, read|write) by the tenant's table
//! limits, and keeps the pod's share of hot partitions in line with the
//! other pods'.
//!
//! Admission is local and never waits: the core's
//! [`CounterTable`](tollgate_core::partition::CounterTable) counts the
//! operation (accepted or not) and decides it by ScyllaDB's rule, scaled by
//! this pod's share of the partition's limit. A rejected operation fails
//! with [`ClientError::PartitionRateLimited`], which must not be retried:
//! the partition is over its limit, and a retry is one more operation on
//! it. The client never retries it.
//!
//! In the background the limiter sends the server the partitions it sees
//! hottest (by hash: keys never leave the pod) through
//! `PartitionLimits/PartitionLoad`, and takes back the tenant's limits
//! (when they changed) and its shares. Everything a pod decides, the
//! counters, the report and when to send the next one (within a report
//! period of an answer, half that while a partition runs over the pod's
//! part of its limit, about a second after a failure, whole shares after
//! two periods without an answer), is the core's
//! [`PodLimiter`](tollgate_core::partition::PodLimiter), which the
//! simulator runs too; this module adds the lock, the clock, the random
//! draws, the task and the metrics. Until the first answer the pod knows
//! no limits and admits everything.
//!
//! The limiter starts on first use; a [`Partition`] (table and key,
//! hashed once) is what `Request::on_partition` names. Its clock
//! ([`PartitionClock`]) is the processor's time-stamp counter through
//! `quanta`, or tokio's for paused time in tests. Metrics:
//! `tollgate_client_partition_rejections_total`, `_partition_hot_rate`
//! (the hottest by hash) and `_partition_exchange_errors_total`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus::{GaugeVec, IntCounter, IntCounterVec, Opts, Registry};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::time::Instant;
pub use tollgate_core::partition::Op;
use tollgate_core::partition::{self, PodLimiter, PodVerdict, ReportedPartition, TableLimitSet};
use tollgate_core::validate::InvalidInput;
use tollgate_core::{TenantId, Timestamp};
use tollgate_proto::partition::PartitionLoadCall;

use crate::error::ClientError;
use crate::transport::Transport;

/// A partition an operation touches: its table and the hash of its key,
/// computed once (cheap to copy, and what the limiter and the server work
/// with: the key itself is never kept nor sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Partition {
    table: u64,
    hash: u64,
}

impl Partition {
    /// The partition of `key` (1 to 4 096 bytes) in `table`. A table with
    /// no limits (or a name no limit could have) is simply never limited.
    pub fn new(table: &str, key: &[u8]) -> Result<Partition, InvalidInput> {
        partition::validate_partition_key("key", key)?;
        let table = partition::table_seed(table);
        Ok(Partition {
            table,
            hash: partition::partition_hash(table, key),
        })
    }

    /// The partition's hash, as reports and metrics show it.
    pub fn hash(&self) -> u64 {
        self.hash
    }
}

/// How a [`PartitionLimiter`] behaves.
#[derive(Clone, Debug)]
pub struct PartitionOptions {
    /// How often the pod reports its hot partitions and learns new limits:
    /// a limit changed by an operator reaches the pod within one period.
    pub report_period: Duration,
    /// How many of its hottest partitions the pod reports (at most 64).
    pub top_k: usize,
    /// Counter slots (32 bytes each): how many partitions the pod tells
    /// apart at once; the coldest are forgotten first.
    pub capacity: usize,
    /// Give up one exchange with the server after this long.
    pub request_timeout: Duration,
    /// Where admission reads the time.
    pub clock: PartitionClock,
}

/// Where a [`PartitionLimiter`] reads the time (every admission of a
/// limited partition does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PartitionClock {
    /// The processor's time-stamp counter, through `quanta`: a few
    /// nanoseconds a read.
    #[default]
    Monotonic,
    /// tokio's clock: follows tokio's paused time in tests, at the cost of
    /// a system call per read.
    Tokio,
}

/// The clock itself, started with the limiter.
enum Clock {
    Monotonic {
        clock: quanta::Clock,
        origin: quanta::Instant,
    },
    Tokio {
        origin: Instant,
    },
}

impl Clock {
    fn new(kind: PartitionClock) -> Self {
        match kind {
            PartitionClock::Monotonic => {
                let clock = quanta::Clock::new();
                let origin = clock.now();
                Clock::Monotonic { clock, origin }
            }
            PartitionClock::Tokio => Clock::Tokio {
                origin: Instant::now(),
            },
        }
    }

    #[inline]
    fn now(&self) -> Timestamp {
        let elapsed = match self {
            Clock::Monotonic { clock, origin } => clock.now().duration_since(*origin),
            Clock::Tokio { origin } => origin.elapsed(),
        };
        Timestamp::from_unix_micros(i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX))
    }
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            report_period: tollgate_core::validate::DEFAULT_TARGET_REQUEST_PERIOD,
            top_k: 8,
            capacity: partition::DEFAULT_CAPACITY,
            request_timeout: Duration::from_secs(5),
            clock: PartitionClock::default(),
        }
    }
}

impl PartitionOptions {
    fn validate(&self) -> Result<(), InvalidInput> {
        tollgate_core::validate::target_request_period("report_period", self.report_period)?;
        if !(1..=partition::MAX_REPORTED_PARTITIONS).contains(&self.top_k) {
            return Err(InvalidInput::new(
                "top_k",
                format!(
                    "must be between 1 and {}, got {}",
                    partition::MAX_REPORTED_PARTITIONS,
                    self.top_k
                ),
            ));
        }
        if self.capacity == 0 {
            return Err(InvalidInput::new("capacity", "must be greater than zero"));
        }
        if self.request_timeout.is_zero() {
            return Err(InvalidInput::new(
                "request_timeout",
                "must be greater than zero",
            ));
        }
        Ok(())
    }
}

/// What admission and the exchange share, under one lock.
struct State {
    limiter: PodLimiter,
    rng: SmallRng,
}

/// The limiter's metrics: rejections by table and operation, and the
/// hottest partitions of the last report (top-k, hashed keys, replaced at
/// every report so their number stays bounded).
#[derive(Clone, Debug)]
struct PartitionMetrics {
    rejections: IntCounterVec,
    hot: GaugeVec,
    exchange_errors: IntCounter,
}

impl PartitionMetrics {
    fn register(
        registry: &Registry,
        tenant: &TenantId,
        pod: u32,
    ) -> Result<Self, prometheus::Error> {
        let labels = |opts: Opts| {
            opts.const_label("tenant", tenant.as_str())
                .const_label("instance", pod.to_string())
        };
        let rejections = IntCounterVec::new(
            labels(Opts::new(
                "tollgate_client_partition_rejections_total",
                "Operations rejected for their partition's rate limit",
            )),
            &["table", "op"],
        )?;
        let hot = GaugeVec::new(
            labels(Opts::new(
                "tollgate_client_partition_hot_rate",
                "Operations per second (accepted or not) on the pod's hottest partitions, by key hash, as of the last report",
            )),
            &["table", "op", "partition"],
        )?;
        let exchange_errors = IntCounter::with_opts(labels(Opts::new(
            "tollgate_client_partition_exchange_errors_total",
            "Partition-load exchanges with the server that failed",
        )))?;
        registry.register(Box::new(rejections.clone()))?;
        registry.register(Box::new(hot.clone()))?;
        registry.register(Box::new(exchange_errors.clone()))?;
        Ok(PartitionMetrics {
            rejections,
            hot,
            exchange_errors,
        })
    }
}

struct Shared {
    tenant: TenantId,
    pod: u32,
    options: PartitionOptions,
    state: Mutex<State>,
    clock: Clock,
    metrics: Option<PartitionMetrics>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it in a way that leaves the state
        // inconsistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[inline]
    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

/// A pod's per-partition admission. Cheap to clone: every clone shares the
/// same counters. Dropping the last clone stops its background exchange.
#[derive(Clone)]
pub struct PartitionLimiter {
    shared: Arc<Shared>,
    /// Tells the exchange task to stop when the last clone goes.
    _stop: Arc<watch::Sender<()>>,
}

impl std::fmt::Debug for PartitionLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLimiter")
            .field("tenant", &self.shared.tenant)
            .field("pod", &self.shared.pod)
            .finish_non_exhaustive()
    }
}

impl PartitionLimiter {
    /// Starts the limiter of pod `pod` (its instance id, not 0) of
    /// `tenant`, exchanging with the server through `transport`. Returns at
    /// once; the first exchange goes out in the background.
    ///
    /// Must be called within a tokio runtime.
    pub fn start(
        transport: Arc<dyn Transport>,
        tenant: &TenantId,
        pod: u32,
        options: PartitionOptions,
        registry: Option<&Registry>,
    ) -> Result<Self, ClientError> {
        options.validate()?;
        if pod == 0 {
            return Err(InvalidInput::new("instance", "must not be 0 (reserved)").into());
        }
        let metrics = registry
            .map(|r| PartitionMetrics::register(r, tenant, pod))
            .transpose()?;
        let shared = Arc::new(Shared {
            tenant: tenant.clone(),
            pod,
            state: Mutex::new(State {
                limiter: PodLimiter::new(options.capacity, options.report_period, options.top_k),
                rng: SmallRng::from_os_rng(),
            }),
            clock: Clock::new(options.clock),
            options,
            metrics,
        });
        let (stop, stopped) = watch::channel(());
        tokio::spawn(exchange_loop(Arc::downgrade(&shared), transport, stopped));
        Ok(PartitionLimiter {
            shared,
            _stop: Arc::new(stop),
        })
    }

    /// Admits one `op` on `partition`, or rejects it with
    /// [`ClientError::PartitionRateLimited`]: the partition is over its
    /// limit, and the operation must not be retried. Never waits.
    #[inline]
    pub fn admit(&self, partition: Partition, op: Op) -> Result<(), ClientError> {
        let mut state = self.shared.lock();
        let State { limiter, rng } = &mut *state;
        let verdict = limiter.admit(
            partition.table,
            partition.hash,
            op,
            self.shared.now(),
            rng.random::<f64>(),
        );
        match verdict {
            PodVerdict::Unlimited | PodVerdict::Accepted => Ok(()),
            PodVerdict::Rejected(index) => {
                let Some(table) = limiter.table_name(index).cloned() else {
                    return Ok(());
                };
                drop(state);
                if let Some(metrics) = &self.shared.metrics {
                    metrics
                        .rejections
                        .with_label_values(&[table.as_str(), op.name()])
                        .inc();
                }
                Err(ClientError::PartitionRateLimited { table, op })
            }
        }
    }

    /// The limits the pod applies now (empty until the server's first
    /// answer).
    pub fn limits(&self) -> TableLimitSet {
        self.shared.lock().limiter.limits()
    }

    /// The version of those limits (0 until the server's first answer).
    pub fn limits_version(&self) -> u64 {
        self.shared.lock().limiter.version()
    }

    /// The pod's hottest partitions now, as it would report them.
    pub fn hottest(&self) -> Vec<ReportedPartition> {
        let now = self.shared.now();
        self.shared.lock().limiter.report(now)
    }

    /// This pod's share (0 to 1) of `partition`'s `op` limit.
    pub fn share(&self, partition: Partition, op: Op) -> f64 {
        self.shared
            .lock()
            .limiter
            .share(partition.table, partition.hash, op)
    }
}

/// Exchanges with the server until the limiter is dropped, on the core
/// limiter's cadence (within a period after an answer, soon after a
/// failure; whole shares after two periods without an answer).
async fn exchange_loop(
    shared: std::sync::Weak<Shared>,
    transport: Arc<dyn Transport>,
    mut stopped: watch::Receiver<()>,
) {
    let mut failing = false;
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let call = {
            let now = shared.now();
            PartitionLoadCall {
                tenant: shared.tenant.clone(),
                exchange: shared.lock().limiter.exchange(shared.pod, now),
            }
        };
        if let Some(metrics) = &shared.metrics {
            metrics.hot.reset();
            for p in &call.exchange.partitions {
                metrics
                    .hot
                    .with_label_values(&[
                        p.table.as_str(),
                        p.op.name(),
                        &format!("{:016x}", p.partition),
                    ])
                    .set(p.rate);
            }
        }
        let answer = tokio::time::timeout(
            shared.options.request_timeout,
            transport.partition_load(&call),
        )
        .await
        .unwrap_or_else(|_| {
            Err(crate::error::TransportError::new(
                "the server did not answer in time",
            ))
        });
        let now = shared.now();
        let next = match answer {
            Ok(answer) => {
                if std::mem::take(&mut failing) {
                    tracing::info!(tenant = %shared.tenant, "partition limits: the server answers again");
                }
                let mut state = shared.lock();
                let draw = state.rng.random::<f64>();
                state.limiter.on_answer(&answer, now, draw)
            }
            Err(e) => {
                if let Some(metrics) = &shared.metrics {
                    metrics.exchange_errors.inc();
                }
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(tenant = %shared.tenant, error = %e, "partition limits: exchange with the server failed; applying each limit locally until it answers");
                }
                let mut state = shared.lock();
                let draw = state.rng.random::<f64>();
                state.limiter.on_failure(now, draw, e.retry_after).0
            }
        };
        drop(shared);
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = stopped.changed() => return,
        }
    }
}
