//! The controller: the one handle a pod holds on its tenant's buckets, over
//! one connection to the server.
//!
//! A [`Controller`] is its request-unit bucket's [`BucketHandle`] plus the
//! KV cost model in front of it; every other bucket is reached with
//! [`Controller::bucket`]. The buckets are kept by the `Pod`, the state all
//! handles of one controller share: the transport, the settings new buckets
//! are made with, and each bucket's driver task.
//!
//! The handles live here, beside the `Pod` they keep alive; what they gate
//! on is below: each bucket's state and gating (`bucket`) and its task
//! (`driver`), neither of which knows the controller.
//!
//! `connect` returns at once and never waits for the server. A bucket
//! starts on its first use, from any thread (its driver runs on the
//! runtime the controller was made on), and every later use of its name
//! gets a handle on the same bucket. The map of buckets is locked only
//! when a bucket is looked up by name or started and at shutdown, never on
//! the admission or request paths. `shutdown` closes every bucket (their
//! waiters are refused, and so are new buckets) and waits, until one
//! deadline shared by all of them, for each bucket's final report; the
//! [`ShutdownReport`] says whether all arrived, its [`BucketReport`]s
//! which.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_core::{
    Batch, BucketName, Consumption, CostModel, InstanceId, InvalidInput, LocalBucket,
    LocalBucketConfig, LocalBucketStatus, TenantId,
};

use crate::bucket::{Acquire, Bucket};
use crate::error::{ClientError, Refusal};
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::partition::{Op, Partition, PartitionLimiter, PartitionOptions};
use crate::transport::{
    ClientTls, FailoverTransport, GrpcTransport, PodToken, Transport, endpoint_list,
};

/// How a controller behaves. `Options::default()` is what most pods want.
#[derive(Clone, Debug)]
pub struct Options {
    /// The local bucket's knobs (target period, initial allowance, …), for
    /// every bucket the controller gates.
    pub bucket: LocalBucketConfig,
    /// What reads, writes, CPU and egress cost.
    pub cost_model: CostModel,
    /// Give up one attempt of a request after this long at most (it is
    /// retried). An attempt is given up sooner once answers are known to
    /// come faster: after twice their usual time, or more when they vary,
    /// and at least `bucket.min_attempt_timeout`.
    pub request_timeout: Duration,
    /// Give up connecting to the server after this long (and retry).
    pub connect_timeout: Duration,
    /// How long [`Controller::shutdown`] waits to deliver the final reports
    /// (of all buckets together).
    pub shutdown_timeout: Duration,
    /// Where to register the client's metrics (each bucket's, labelled with
    /// its name); none if unset.
    pub registry: Option<Registry>,
    /// TLS for an `https://` endpoint (the system's roots if unset).
    pub tls: Option<ClientTls>,
    /// The pod token to send, for servers that bind pods to tenants.
    pub pod_token: Option<PodToken>,
    /// Hot-partition limits, for [`Controller::partitions`] and requests
    /// that name their partition.
    pub partitions: PartitionOptions,
    /// What the server said a new pod of a bucket may start on (every
    /// answer says: [`BucketHandle::initial_allowance`]), by bucket name,
    /// kept from an earlier life of the process. A bucket named here starts
    /// on it instead of `bucket.initial_tokens`.
    pub initial_allowances: HashMap<BucketName, f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bucket: LocalBucketConfig::default(),
            cost_model: CostModel::default(),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(5),
            registry: None,
            tls: None,
            pod_token: None,
            partitions: PartitionOptions::default(),
            initial_allowances: HashMap::new(),
        }
    }
}

/// One batch of work about to be sent, as [`Controller::on_request`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub batch: Batch,
    /// Exempt work is neither gated nor charged (health checks, internal
    /// bookkeeping the tenant does not pay for).
    pub exempt: bool,
    /// The partition the batch reads or writes, if it names one: it is
    /// admitted by the tenant's hot-partition limits first.
    pub partition: Option<Partition>,
}

impl Request {
    pub fn read(requests: u64) -> Self {
        Request {
            batch: Batch::Read { requests },
            exempt: false,
            partition: None,
        }
    }

    pub fn write(requests: u64, bytes: u64) -> Self {
        Request {
            batch: Batch::Write { requests, bytes },
            exempt: false,
            partition: None,
        }
    }

    /// The same batch, on `partition`: [`Controller::on_request`] admits it
    /// by the partition's read or write limit before taking tokens.
    pub fn on_partition(self, partition: Partition) -> Self {
        Request {
            partition: Some(partition),
            ..self
        }
    }

    /// What the batch does to its partition.
    pub fn op(&self) -> Op {
        match self.batch {
            Batch::Read { .. } => Op::Read,
            Batch::Write { .. } => Op::Write,
        }
    }

    pub fn exempt(self) -> Self {
        Request {
            exempt: true,
            ..self
        }
    }
}

/// What [`Controller::shutdown`] achieved.
#[derive(Clone, Debug, PartialEq)]
pub struct ShutdownReport {
    /// True if the final report of every bucket reached the server.
    pub consumption_reported: bool,
    /// The request-unit bucket as it was left.
    pub status: LocalBucketStatus,
    /// Every bucket the controller gated, by name (the request-unit bucket,
    /// `""`, first).
    pub buckets: Vec<BucketReport>,
}

/// What [`Controller::shutdown`] achieved for one bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketReport {
    pub bucket: BucketName,
    /// True if this bucket's final report reached the server; false for a
    /// bucket the server refused (it sent none: the server would refuse it
    /// too).
    pub consumption_reported: bool,
    /// The bucket as it was left.
    pub status: LocalBucketStatus,
    /// The server's refusal, if it refused the bucket.
    pub refusal: Option<Refusal>,
}

/// A pod's handle on its tenant's tokens. Cheap to clone; every clone gates
/// on the same buckets. Dropping the last clone (and the last
/// [`BucketHandle`]) stops the background tasks (use
/// [`Controller::shutdown`] to report the final consumption first).
///
/// The controller's own methods gate the tenant's request-unit bucket;
/// [`Controller::bucket`] reaches the others. Once the server refused a
/// bucket (see [`crate::classify`]), every method on it fails with
/// [`ClientError::Refused`], exempt work aside.
#[derive(Clone, Debug)]
pub struct Controller {
    /// The request-unit bucket, held directly so that its fast path looks
    /// nothing up.
    request_units: BucketHandle,
}

/// The transport [`Controller::connect`] uses: gRPC to `endpoint`, or to
/// several replicas of the server (`http://a:50051,http://b:50051`), pod
/// `instance` starting on the one at `instance % count` and moving to the
/// next whenever a request fails. For a controller whose requests pass
/// through a layer of the caller's own (a journal, a proxy) before
/// [`Controller::with_transport`].
pub fn connect_transport(
    endpoint: &str,
    tenant: &TenantId,
    instance: InstanceId,
    options: &Options,
) -> Result<Arc<dyn Transport>, ClientError> {
    let grpc = |url: &str| {
        GrpcTransport::new(
            url,
            tenant.clone(),
            options.connect_timeout,
            options.tls.as_ref(),
        )
        .map(|t| {
            t.with_deadline(options.request_timeout)
                .with_token(options.pod_token.clone())
        })
    };
    let endpoints = endpoint_list(endpoint)?;
    if let [single] = endpoints.as_slice() {
        return Ok(Arc::new(grpc(single)?));
    }
    let replicas = endpoints
        .iter()
        .map(|url| grpc(url))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(FailoverTransport::new(
        replicas,
        instance as usize,
    )?))
}

impl Controller {
    /// Starts the controller of pod `instance` of `tenant`, talking gRPC to
    /// `endpoint` (`http://host:port`). Returns at once: the pod can work on
    /// its initial allowance while the first request is under way, and on
    /// the fallback rate if the server cannot be reached.
    ///
    /// `endpoint` may list several replicas of the server, separated by
    /// commas (`http://a:50051,http://b:50051`): the pod starts on the one
    /// at `instance % count`, so a tenant's pods spread over them, and
    /// moves to the next whenever a request fails ([`FailoverTransport`]).
    ///
    /// Must be called within a tokio runtime.
    pub fn connect(
        endpoint: &str,
        tenant: &str,
        instance: InstanceId,
        options: Options,
    ) -> Result<Self, ClientError> {
        let tenant = TenantId::parse("tenant", tenant)?;
        let transport = connect_transport(endpoint, &tenant, instance, &options)?;
        Self::with_transport(transport, &tenant, instance, options)
    }

    /// Starts a controller that reaches the server through `transport`.
    ///
    /// Must be called within a tokio runtime: the buckets' tasks run on it.
    pub fn with_transport(
        transport: impl Transport,
        tenant: &TenantId,
        instance: InstanceId,
        options: Options,
    ) -> Result<Self, ClientError> {
        options
            .cost_model
            .validate()
            .map_err(ClientError::InvalidInput)?;
        if options.request_timeout.is_zero() {
            return Err(InvalidInput::new("request_timeout", "must be greater than zero").into());
        }
        for (bucket, allowance) in &options.initial_allowances {
            tollgate_core::validate::non_negative(
                &format!("initial_allowances[{bucket}]"),
                *allowance,
                tollgate_core::validate::MAX_TOKENS,
            )?;
        }
        // No receiver yet: each bucket's driver subscribes when it starts.
        let (stop, _) = watch::channel(false);
        let pod = Arc::new(Pod {
            tenant: tenant.clone(),
            instance,
            transport: Arc::new(transport),
            bucket_config: options.bucket,
            initial_allowances: options.initial_allowances,
            cost_model: options.cost_model,
            request_timeout: options.request_timeout,
            shutdown_timeout: options.shutdown_timeout,
            registry: options.registry,
            partition_options: options.partitions,
            partitions: OnceLock::new(),
            runtime: tokio::runtime::Handle::current(),
            stop,
            buckets: Mutex::new(Buckets::default()),
        });
        // The request-unit bucket starts at once, as it always has: the
        // pod's first request goes out while it works on its allowance.
        let request_units = pod.bucket(BucketName::REQUEST_UNITS.as_str())?;
        Ok(Controller { request_units })
    }

    /// A handle on the tenant's bucket `name` (1 to 64 characters from
    /// `[A-Za-z0-9._:-]`, or `""` for the request-unit bucket this
    /// controller's own methods gate). The bucket starts on first use, with
    /// the controller's options and its own lease, and every later call with
    /// the same name returns a handle on that same bucket. Keep the handle:
    /// this call looks the name up, the handle's methods do not.
    ///
    /// Fails with [`ClientError::InvalidInput`] (field `bucket`) for a name
    /// that breaks the rule, with [`ClientError::Closed`] for a new bucket
    /// after [`Controller::shutdown`], with [`ClientError::Metrics`] if
    /// a new bucket's metrics cannot be registered, and with
    /// [`ClientError::Refused`] for a bucket the server has refused.
    ///
    /// A bucket the tenant does not have (a misspelt name, a bucket its
    /// tier no longer has) works on its initial allowance until the
    /// server's first answer, `NOT_FOUND`, comes back: from then on every
    /// call on it fails with [`ClientError::Refused`], and it never runs
    /// on the fallback rate. See [`crate::classify`] for the answers that
    /// refuse a bucket and those that are outages.
    pub fn bucket(&self, name: &str) -> Result<BucketHandle, ClientError> {
        self.request_units.pod().bucket(name)
    }

    /// Waits until `tokens` are available in the request-unit bucket and
    /// takes them. See [`BucketHandle::acquire`].
    ///
    /// Returns the handle's future itself, so the fast path costs what it
    /// costs on the handle.
    #[inline]
    pub fn acquire(&self, tokens: f64) -> Acquire<'_> {
        self.request_units.acquire(tokens)
    }

    /// Takes `tokens` from the request-unit bucket if they are available
    /// now; never waits, never queues.
    #[inline]
    pub fn try_acquire(&self, tokens: f64) -> Result<bool, ClientError> {
        self.request_units.try_acquire(tokens)
    }

    /// Gates a batch before it is sent: waits for what it costs up front
    /// (writes in full; for reads, all but the bytes they will return).
    ///
    /// A batch that names its partition is first admitted by the tenant's
    /// hot-partition limits, and fails at once with
    /// [`ClientError::PartitionRateLimited`] (nothing charged; **do not
    /// retry**) if its partition is over its limit.
    pub async fn on_request(&self, request: &Request) -> Result<(), ClientError> {
        if request.exempt {
            return Ok(());
        }
        if let Some(partition) = request.partition {
            self.partitions()?.admit(partition, request.op())?;
        }
        let cost = self.cost_model().before(request.batch);
        self.request_units.acquire(cost.request_units()).await?;
        self.request_units.record_counters(&cost)
    }

    /// Charges what a batch's response cost once it has arrived: the bytes
    /// it read. Never waits; may put the bucket in debt.
    pub fn on_response(&self, request: &Request, read_bytes: u64) -> Result<(), ClientError> {
        if request.exempt || read_bytes == 0 {
            return Ok(());
        }
        self.charge_after(self.cost_model().after_read(read_bytes))
    }

    /// Charges CPU time the pod used (measured by the caller, e.g. every
    /// second). Never waits; may put the bucket in debt.
    pub fn record_cpu(&self, seconds: f64) -> Result<(), ClientError> {
        tollgate_core::validate::non_negative(
            "seconds",
            seconds,
            tollgate_core::validate::MAX_CPU_SECONDS,
        )?;
        self.charge_after(self.cost_model().cpu(seconds))
    }

    /// Charges bytes the pod sent to its users. Never waits.
    pub fn record_egress(&self, bytes: u64) -> Result<(), ClientError> {
        self.charge_after(self.cost_model().egress(bytes))
    }

    /// Charges `consumption` to the request-unit bucket after the fact, as
    /// it is.
    pub fn charge_after(&self, consumption: Consumption) -> Result<(), ClientError> {
        self.request_units.charge_after(consumption)
    }

    /// The request-unit bucket as it is now.
    pub fn status(&self) -> LocalBucketStatus {
        self.request_units.status()
    }

    /// The pod's hot-partition limiter, started on first use (its first
    /// exchange with the server goes out then; until it is answered no
    /// limit is known and every operation is admitted). Fails with
    /// [`ClientError::Metrics`] if its metrics cannot be registered.
    pub fn partitions(&self) -> Result<&PartitionLimiter, ClientError> {
        self.request_units.pod().partitions()
    }

    /// Admits one `op` on `partition` by the tenant's hot-partition limits
    /// (see [`PartitionLimiter::admit`]): a rejection is
    /// [`ClientError::PartitionRateLimited`], not to be retried.
    #[inline]
    pub fn admit_partition(&self, partition: Partition, op: Op) -> Result<(), ClientError> {
        self.partitions()?.admit(partition, op)
    }

    /// Stops admitting in every bucket (waiting acquisitions fail with
    /// [`ClientError::Closed`], and no new bucket starts), then reports each
    /// bucket's consumption not yet reported, with the tokens it holds
    /// given back, waiting at most the shutdown timeout for the server.
    /// A bucket the server refused has nothing to report and takes no
    /// time.
    pub async fn shutdown(&self) -> ShutdownReport {
        let buckets = self.request_units.pod().shutdown().await;
        ShutdownReport {
            consumption_reported: buckets.iter().all(|b| b.consumption_reported),
            status: self.status(),
            buckets,
        }
    }

    /// What reads, writes, CPU and egress cost, as this controller prices
    /// them (its [`Options::cost_model`]).
    pub fn cost_model(&self) -> &CostModel {
        &self.request_units.pod().cost_model
    }
}

/// A pod's handle on one of its tenant's buckets, from
/// [`Controller::bucket`]. Cheap to clone; every clone, and every handle
/// the controller gives out for the same name, gates on the same local
/// bucket. A handle keeps its controller alive (its connection and the
/// other buckets' tasks) as a clone of the controller would.
#[derive(Clone)]
pub struct BucketHandle {
    /// The fast path's only hop: the gate is inline in the bucket.
    bucket: Arc<Bucket>,
    pod: Arc<Pod>,
}

impl std::fmt::Debug for BucketHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketHandle")
            .field("bucket", &self.bucket.name)
            .finish_non_exhaustive()
    }
}

impl BucketHandle {
    fn new(bucket: Arc<Bucket>, pod: Arc<Pod>) -> Self {
        BucketHandle { bucket, pod }
    }

    fn pod(&self) -> &Arc<Pod> {
        &self.pod
    }

    /// The bucket's name; empty for the request-unit bucket.
    pub fn name(&self) -> &BucketName {
        &self.bucket.name
    }

    /// Waits until `tokens` are available in this bucket and takes them
    /// all at once. Waiters are served first come, first served, per
    /// bucket: a bucket out of tokens never delays another.
    /// Cancellation-safe: dropping the future before it completes gives its
    /// claim back. Like any future it does nothing until polled.
    ///
    /// When the tokens are there, the first poll takes them and is ready:
    /// the future is a few words on the stack, and only an acquisition
    /// that has to wait allocates its queued state.
    ///
    /// Fails with [`ClientError::Refused`] once the server refused the
    /// bucket (an acquisition already waiting, as soon as the refusal
    /// comes), and with [`ClientError::Closed`] after shutdown.
    #[inline]
    pub fn acquire(&self, tokens: f64) -> Acquire<'_> {
        self.bucket.acquire(tokens)
    }

    /// Takes `tokens` from this bucket if they are available now; never
    /// waits, never queues. Fails with [`ClientError::Refused`] once the
    /// server refused the bucket.
    #[inline]
    pub fn try_acquire(&self, tokens: f64) -> Result<bool, ClientError> {
        self.bucket.try_acquire(tokens)
    }

    /// Charges `consumption` to this bucket after the fact, as it is: its
    /// request units are the tokens (for an action bucket,
    /// `Consumption::from_request_units(n)` charges `n` actions). Never
    /// waits; may put the bucket in debt. Fails with
    /// [`ClientError::Refused`] once the server refused the bucket.
    pub fn charge_after(&self, consumption: Consumption) -> Result<(), ClientError> {
        self.bucket.charge_after(consumption)
    }

    /// Gives back up to `tokens` taken from this bucket for work that did
    /// not run. Only tokens not yet reported to the server can come back
    /// (the driver reports what was taken with its next request, at least
    /// every `report_interval`); returns how many did, which are usable
    /// again at once, by the next waiter first. Fails with
    /// [`ClientError::InvalidInput`] (field `tokens`) for an amount that is
    /// not finite and non-negative, and with [`ClientError::Refused`] once
    /// the server refused the bucket.
    pub fn give_back(&self, tokens: f64) -> Result<f64, ClientError> {
        self.bucket.give_back(tokens)
    }

    /// Records the counters (reads, writes, bytes) of work whose tokens
    /// were already acquired.
    fn record_counters(&self, consumption: &Consumption) -> Result<(), ClientError> {
        self.bucket.record_counters(consumption)
    }

    /// This bucket's local bucket as it is now.
    pub fn status(&self) -> LocalBucketStatus {
        self.bucket.status()
    }

    /// What the server last said a new pod of this bucket may use before
    /// its first answer (`None` until it answered): keep it to start the
    /// bucket's next life on it ([`Options::initial_allowances`]).
    pub fn initial_allowance(&self) -> Option<f64> {
        self.bucket.initial_allowance()
    }
}

/// What every handle of one controller shares: the connection, the
/// settings buckets start with, and the buckets themselves.
pub(crate) struct Pod {
    tenant: TenantId,
    instance: InstanceId,
    /// The one connection every bucket's requests travel on.
    transport: Arc<dyn Transport>,
    bucket_config: LocalBucketConfig,
    initial_allowances: HashMap<BucketName, f64>,
    cost_model: CostModel,
    request_timeout: Duration,
    shutdown_timeout: Duration,
    registry: Option<Registry>,
    partition_options: PartitionOptions,
    /// Started by the first use of partition limits.
    partitions: OnceLock<PartitionLimiter>,
    /// Where the drivers run, so that a bucket can start from any thread.
    runtime: tokio::runtime::Handle,
    /// Tells every driver to close and send its final report; dropped with
    /// the last handle, which tells them too.
    stop: watch::Sender<bool>,
    buckets: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    /// By name; `BTreeMap<String, _>` so a name is looked up as a `&str`
    /// with no allocation, and reports come out in name order.
    by_name: BTreeMap<String, Started>,
    /// Set by shutdown: no bucket starts after it.
    closed: bool,
}

struct Started {
    bucket: Arc<Bucket>,
    /// The driver, until shutdown takes it to wait for its final report.
    task: Option<JoinHandle<bool>>,
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl Pod {
    fn lock(&self) -> MutexGuard<'_, Buckets> {
        // Nothing panics while holding it in a way that leaves the map
        // inconsistent: an entry is inserted whole or not at all.
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The partition limiter, started (once) under the buckets' lock.
    fn partitions(&self) -> Result<&PartitionLimiter, ClientError> {
        if let Some(limiter) = self.partitions.get() {
            return Ok(limiter);
        }
        let buckets = self.lock();
        if buckets.closed {
            return Err(ClientError::Closed);
        }
        if self.partitions.get().is_none() {
            let _guard = self.runtime.enter();
            let limiter = PartitionLimiter::start(
                Arc::clone(&self.transport),
                &self.tenant,
                self.instance,
                self.partition_options.clone(),
                self.registry.as_ref(),
            )?;
            let _ = self.partitions.set(limiter);
        }
        drop(buckets);
        self.partitions.get().ok_or(ClientError::Closed)
    }

    /// The handle on bucket `name`, starting the bucket if it is new.
    fn bucket(self: &Arc<Self>, name: &str) -> Result<BucketHandle, ClientError> {
        let mut buckets = self.lock();
        if let Some(started) = buckets.by_name.get(name) {
            if let Some(refused) = started.bucket.gate.with_bucket(|inner, _| inner.refused()) {
                return Err(refused);
            }
            return Ok(BucketHandle::new(
                Arc::clone(&started.bucket),
                Arc::clone(self),
            ));
        }
        let name = BucketName::parse("bucket", name)?;
        if buckets.closed {
            return Err(ClientError::Closed);
        }
        let started = self.start(name.clone())?;
        let bucket = Arc::clone(&started.bucket);
        buckets.by_name.insert(name.as_str().to_owned(), started);
        Ok(BucketHandle::new(bucket, Arc::clone(self)))
    }

    /// A new local bucket for `name` and its driver.
    fn start(&self, name: BucketName) -> Result<Started, ClientError> {
        // A new lease per bucket per process start: the server keeps one
        // per instance and bucket, and tells this life of the instance from
        // the previous one by it (and refuses the previous).
        let lease = crate::lease::new_lease(None);
        let origin = Instant::now();
        let mut config = self.bucket_config.clone();
        if let Some(allowance) = self.initial_allowances.get(&name) {
            config.initial_tokens = *allowance;
        }
        let local = LocalBucket::new(
            config,
            self.instance,
            lease,
            tollgate_core::Timestamp::EPOCH,
        )?;
        let metrics = self
            .registry
            .as_ref()
            .map(|registry| Metrics::register(registry, &self.tenant, self.instance, &name))
            .transpose()?;
        let bucket = Arc::new(Bucket {
            name,
            gate: Gate::new(local, metrics, origin),
        });
        let task = self.runtime.spawn(crate::driver::drive(
            Arc::clone(&bucket),
            Arc::clone(&self.transport),
            self.request_timeout,
            self.stop.subscribe(),
            self.tenant.clone(),
            self.instance,
        ));
        Ok(Started {
            bucket,
            task: Some(task),
        })
    }

    /// Closes every bucket and waits, until one shared deadline, for each
    /// driver to deliver its final report. The drivers run on their own, so
    /// a slow bucket takes nothing from another's time.
    async fn shutdown(&self) -> Vec<BucketReport> {
        let drivers: Vec<(Arc<Bucket>, Option<JoinHandle<bool>>)> = {
            let mut buckets = self.lock();
            buckets.closed = true;
            self.stop.send_replace(true);
            buckets
                .by_name
                .values_mut()
                .map(|started| (Arc::clone(&started.bucket), started.task.take()))
                .collect()
        };
        for (bucket, _) in &drivers {
            bucket.gate.wake.notify_one();
        }
        let deadline = Instant::now() + self.shutdown_timeout;
        let mut reports = Vec::with_capacity(drivers.len());
        for (bucket, task) in drivers {
            let reported = match task {
                Some(task) => match tokio::time::timeout_at(deadline, task).await {
                    Ok(Ok(reported)) => reported,
                    Ok(Err(e)) => {
                        tracing::error!(bucket = bucket.name.as_str(), error = %e, "tollgate bucket task failed");
                        false
                    }
                    Err(_) => {
                        tracing::warn!(
                            bucket = bucket.name.as_str(),
                            timeout = ?self.shutdown_timeout,
                            "tollgate server did not take the final consumption report in time; it is lost"
                        );
                        false
                    }
                },
                // An earlier shutdown already waited for it.
                None => false,
            };
            let (status, refusal) = bucket
                .gate
                .with_bucket(|inner, now| (inner.bucket.status_at(now), inner.refusal.clone()));
            reports.push(BucketReport {
                bucket: bucket.name.clone(),
                consumption_reported: reported,
                status,
                refusal,
            });
        }
        reports
    }
}
