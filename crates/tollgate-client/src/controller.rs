//! The controller: the handle pods use, and the task that talks to the server.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_core::{
    Admission, Batch, Consumption, CostModel, Grant, InstanceId, InvalidInput, LocalBucket,
    LocalBucketConfig, LocalBucketStatus, TenantId, TokenBucketRequest, WaiterId,
};

use crate::error::{ClientError, TransportError};
use crate::gate::{self, Gate};
use crate::metrics::Metrics;
use crate::transport::{ClientTls, GrpcTransport, Transport};

/// How a controller behaves. `Options::default()` is what most pods want.
#[derive(Clone, Debug)]
pub struct Options {
    /// The local bucket's knobs (target period, initial allowance, …).
    pub bucket: LocalBucketConfig,
    /// What reads, writes, CPU and egress cost.
    pub cost_model: CostModel,
    /// Give up one attempt of a request after this long (it is retried).
    pub request_timeout: Duration,
    /// Give up connecting to the server after this long (and retry).
    pub connect_timeout: Duration,
    /// How long [`Controller::shutdown`] waits to deliver the final report.
    pub shutdown_timeout: Duration,
    /// Where to register the client's metrics; none if unset.
    pub registry: Option<Registry>,
    /// TLS for an `https://` endpoint (the system's roots if unset).
    pub tls: Option<ClientTls>,
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
}

impl Request {
    pub fn read(requests: u64) -> Self {
        Request {
            batch: Batch::Read { requests },
            exempt: false,
        }
    }

    pub fn write(requests: u64, bytes: u64) -> Self {
        Request {
            batch: Batch::Write { requests, bytes },
            exempt: false,
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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShutdownReport {
    /// True if every charge reached the server.
    pub consumption_reported: bool,
    /// The bucket as it was left.
    pub status: LocalBucketStatus,
}

/// A pod's handle on its tenant's tokens. Cheap to clone; every clone gates
/// on the same local bucket. Dropping the last clone stops the background
/// task (use [`Controller::shutdown`] to report the final consumption first).
#[derive(Clone, Debug)]
pub struct Controller {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    gate: Arc<Gate>,
    cost_model: CostModel,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<bool>>>,
    shutdown_timeout: Duration,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Controller {
    /// Starts the controller of pod `instance` of `tenant`, talking gRPC to
    /// `endpoint` (`http://host:port`). Returns at once: the pod can work on
    /// its initial allowance while the first request is under way, and on
    /// the fallback rate if the server cannot be reached.
    ///
    /// Must be called within a tokio runtime.
    pub fn connect(
        endpoint: &str,
        tenant: &str,
        instance: InstanceId,
        options: Options,
    ) -> Result<Self, ClientError> {
        let tenant = TenantId::parse("tenant", tenant)?;
        let transport = GrpcTransport::new(
            endpoint,
            tenant.clone(),
            options.connect_timeout,
            options.tls.as_ref(),
        )?;
        Self::with_transport(transport, &tenant, instance, options)
    }

    /// Starts a controller that reaches the server through `transport`.
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
        // A new lease per process start: the server tells this life of the
        // instance from the previous one by it (and refuses the previous).
        let lease = crate::lease::new_lease(None);
        let origin = Instant::now();
        let bucket = LocalBucket::new(
            options.bucket.clone(),
            instance,
            lease,
            tollgate_core::Timestamp::EPOCH,
        )?;
        let metrics = options
            .registry
            .as_ref()
            .map(|registry| Metrics::register(registry, tenant, instance))
            .transpose()?;
        let gate = Arc::new(Gate::new(bucket, metrics, origin));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(drive(
            Arc::clone(&gate),
            Arc::new(transport),
            options.request_timeout,
            stopped,
            format!("{tenant}/{instance}"),
        ));
        Ok(Controller {
            shared: Arc::new(Shared {
                gate,
                cost_model: options.cost_model,
                stop,
                task: Mutex::new(Some(task)),
                shutdown_timeout: options.shutdown_timeout,
            }),
        })
    }

    /// Waits until `tokens` are available and takes them. Waiters are served
    /// first come, first served. Cancellation-safe: dropping the future
    /// before it completes gives its claim back.
    pub async fn acquire(&self, tokens: f64) -> Result<(), ClientError> {
        let gate = &self.shared.gate;
        if let Some(micros) = fast_micros(tokens)
            && gate.fast_take(micros)
        {
            return Ok(());
        }
        let waiting =
            gate.with_bucket(|inner, now| match inner.bucket.acquire(tokens, now)? {
                Admission::Admitted => Ok(None),
                Admission::Closed => Err(ClientError::Closed),
                Admission::Queued(id) => {
                    let (tx, rx) = oneshot::channel();
                    inner.waiters.insert(id, (tx, tokens));
                    Ok(Some((id, rx)))
                }
            })?;
        let Some((id, rx)) = waiting else {
            return Ok(());
        };
        gate.wake.notify_one();
        let started = Instant::now();
        let mut wait = Wait {
            gate,
            id,
            tokens,
            rx: Some(rx),
        };
        let admitted = wait.wait().await;
        let waited = started.elapsed().as_secs_f64();
        gate.with_bucket(|inner, _| {
            if let Some(metrics) = &inner.metrics {
                metrics.wait_seconds.observe(waited);
            }
        });
        if admitted {
            Ok(())
        } else {
            Err(ClientError::Closed)
        }
    }

    /// Takes `tokens` if they are available now; never waits, never queues.
    pub fn try_acquire(&self, tokens: f64) -> Result<bool, ClientError> {
        let gate = &self.shared.gate;
        if let Some(micros) = fast_micros(tokens)
            && gate.fast_take(micros)
        {
            return Ok(true);
        }
        let admitted = gate.with_bucket(|inner, now| inner.bucket.try_acquire(tokens, now))?;
        Ok(admitted)
    }

    /// Gates a batch before it is sent: waits for what it costs up front
    /// (writes in full; for reads, all but the bytes they will return).
    pub async fn on_request(&self, request: &Request) -> Result<(), ClientError> {
        if request.exempt {
            return Ok(());
        }
        let cost = self.shared.cost_model.before(request.batch);
        self.acquire(cost.request_units()).await?;
        self.shared
            .gate
            .with_bucket(|inner, _| inner.bucket.record_counters(&cost))?;
        Ok(())
    }

    /// Charges what a batch's response cost once it has arrived: the bytes
    /// it read. Never waits; may put the bucket in debt.
    pub fn on_response(&self, request: &Request, read_bytes: u64) -> Result<(), ClientError> {
        if request.exempt || read_bytes == 0 {
            return Ok(());
        }
        self.charge_after(self.shared.cost_model.after_read(read_bytes))
    }

    /// Charges CPU time the pod used (measured by the caller, e.g. every
    /// second). Never waits; may put the bucket in debt.
    pub fn record_cpu(&self, seconds: f64) -> Result<(), ClientError> {
        tollgate_core::validate::non_negative(
            "seconds",
            seconds,
            tollgate_core::validate::MAX_CPU_SECONDS,
        )?;
        self.charge_after(self.shared.cost_model.cpu(seconds))
    }

    /// Charges bytes the pod sent to its users. Never waits.
    pub fn record_egress(&self, bytes: u64) -> Result<(), ClientError> {
        self.charge_after(self.shared.cost_model.egress(bytes))
    }

    /// Charges `consumption` after the fact, as it is.
    pub fn charge_after(&self, consumption: Consumption) -> Result<(), ClientError> {
        self.shared
            .gate
            .with_bucket(|inner, now| inner.bucket.charge_after(&consumption, now))?;
        Ok(())
    }

    /// The local bucket as it is now.
    pub fn status(&self) -> LocalBucketStatus {
        self.shared
            .gate
            .with_bucket(|inner, _| inner.bucket.status())
    }

    /// Stops admitting (waiting acquisitions fail with
    /// [`ClientError::Closed`]), then reports the consumption not yet
    /// reported, waiting at most the shutdown timeout for the server.
    pub async fn shutdown(&self) -> ShutdownReport {
        let _ = self.shared.stop.send(true);
        self.shared.gate.wake.notify_one();
        let task = self
            .shared
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let reported = match task {
            Some(task) => match tokio::time::timeout(self.shared.shutdown_timeout, task).await {
                Ok(Ok(reported)) => reported,
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "tollgate controller task failed");
                    false
                }
                Err(_) => {
                    tracing::warn!(
                        timeout = ?self.shared.shutdown_timeout,
                        "tollgate server did not take the final consumption report in time; it is lost"
                    );
                    false
                }
            },
            None => false,
        };
        ShutdownReport {
            consumption_reported: reported,
            status: self.status(),
        }
    }
}

fn fast_micros(tokens: f64) -> Option<i64> {
    if tokens.is_finite() && tokens >= 0.0 {
        gate::micros(tokens)
    } else {
        None
    }
}

/// A queued acquisition. Dropped before it learns the outcome, it takes
/// itself out of the queue — or, if it was admitted meanwhile, gives the
/// tokens back.
struct Wait<'a> {
    gate: &'a Gate,
    id: WaiterId,
    tokens: f64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Wait<'_> {
    /// True if admitted, false if the controller shut down.
    async fn wait(&mut self) -> bool {
        let Some(rx) = self.rx.as_mut() else {
            return false;
        };
        let admitted = rx.await.is_ok();
        self.rx = None;
        admitted
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return; // finished
        };
        let (id, tokens) = (self.id, self.tokens);
        self.gate.with_bucket(|inner, _| {
            inner.waiters.remove(&id);
            if !inner.bucket.cancel(id) && rx.try_recv().is_ok() {
                // Admitted, but the work will never run.
                inner.bucket.refund(tokens);
            }
        });
        // Tokens may have become usable for the next waiter.
        self.gate.wake.notify_one();
    }
}

type InFlight = Pin<Box<dyn Future<Output = (u64, Result<Grant, TransportError>)> + Send>>;

/// The controller's task: polls the bucket, sends its requests one at a
/// time, and hands the answers back. Returns whether the final report made it.
async fn drive(
    gate: Arc<Gate>,
    transport: Arc<dyn Transport>,
    request_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
    name: String,
) -> bool {
    let mut in_flight: Option<InFlight> = None;
    let mut closing = false;
    let mut failing = false;
    loop {
        let (request, wake_at, finished) = gate.with_bucket(|inner, now| {
            let outcome = inner.bucket.poll(now);
            for id in outcome.admitted {
                if let Some((tx, tokens)) = inner.waiters.remove(&id)
                    && tx.send(()).is_err()
                {
                    // Its acquirer is gone without running its work.
                    inner.bucket.refund(tokens);
                }
            }
            (outcome.request, outcome.wake_at, inner.bucket.is_finished())
        });
        if closing && finished {
            return true;
        }
        if let Some(request) = request {
            if let Some(metrics) = metrics_of(&gate) {
                metrics.server_requests.inc();
            }
            in_flight = Some(send(Arc::clone(&transport), request, request_timeout));
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
                            tracing::info!(controller = %name, "tollgate server answers again");
                            failing = false;
                        }
                        gate.with_bucket(|inner, now| inner.bucket.on_response(seq, &grant, now));
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(controller = %name, error = %e, "tollgate server request failed; retrying, fallback rate after 1 s");
                            failing = true;
                        } else {
                            tracing::debug!(controller = %name, error = %e, "tollgate server request failed again");
                        }
                        if let Some(metrics) = metrics_of(&gate) {
                            metrics.server_errors.inc();
                        }
                        let jitter: f64 = rand::random();
                        gate.with_bucket(|inner, now| inner.bucket.on_failure(seq, now, jitter));
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

fn metrics_of(gate: &Gate) -> Option<Metrics> {
    gate.with_bucket(|inner, _| inner.metrics.clone())
}

fn send(transport: Arc<dyn Transport>, request: TokenBucketRequest, timeout: Duration) -> InFlight {
    let seq = request.seq;
    Box::pin(async move {
        let result = match tokio::time::timeout(timeout, transport.token_bucket(request)).await {
            Ok(result) => result,
            Err(_) => Err(TransportError(format!("no answer within {timeout:?}"))),
        };
        (seq, result)
    })
}
