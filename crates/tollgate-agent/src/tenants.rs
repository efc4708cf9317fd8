//! The tenants the agent serves: one `tollgate-client` controller each,
//! started on first use, and a handle on every bucket its callers used.
//!
//! Each controller is the agent's instance of the tenant at the server
//! (the same instance id for every tenant), with one local bucket per
//! bucket name, refilled by the client's own protocol. The agent adds
//! nothing to the algorithm: it only keeps the handles, so a call finds
//! its bucket with two map lookups under read locks.
//!
//! A controller starts its tenant's request-unit bucket at once (the
//! client always does), so a tenant used only through a named bucket also
//! appears at the server as an instance of its request-unit bucket; with a
//! server that refuses unconfigured tenants that bucket is refused (and
//! only that one).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tollgate_client::{
    BucketHandle, ClientError, Controller, Options, ShutdownReport, Transport, TransportError,
    connect_transport,
};
use tollgate_core::{BucketName, InstanceId, LocalBucketStatus, TenantId};

use crate::journal::{Journal, JournalTransport};
use crate::metrics::AgentMetrics;

/// One tenant's controller and the handles of the buckets used so far.
struct Held {
    controller: Controller,
    buckets: RwLock<HashMap<BucketName, BucketHandle>>,
}

/// Every tenant's controller, by tenant id.
pub struct Tenants {
    servers: String,
    instance_id: InstanceId,
    options: Options,
    metrics: AgentMetrics,
    held: RwLock<HashMap<TenantId, Arc<Held>>>,
    /// Every request to the server passes through it, if there is one.
    journal: Option<Arc<Journal>>,
    /// Set at shutdown: no controller starts after it.
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("servers", &self.servers)
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

/// What one tenant's shutdown achieved.
#[derive(Debug)]
pub struct TenantReport {
    pub tenant: TenantId,
    pub report: ShutdownReport,
}

impl Tenants {
    /// Tenants served by `servers` (one URL or several, separated by
    /// commas) as instance `instance_id`, each controller made with
    /// `options`.
    pub fn new(
        servers: String,
        instance_id: InstanceId,
        options: Options,
        metrics: AgentMetrics,
        journal: Option<Arc<Journal>>,
    ) -> Tenants {
        Tenants {
            servers,
            instance_id,
            options,
            metrics,
            journal,
            held: RwLock::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn instance_id(&self) -> InstanceId {
        self.instance_id
    }

    /// The way to the server for `tenant`'s requests, without the journal
    /// (the URLs were checked when the agent started).
    pub(crate) fn server_transport(&self, tenant: &TenantId) -> Arc<dyn Transport> {
        match connect_transport(&self.servers, tenant, self.instance_id, &self.options) {
            Ok(transport) => transport,
            Err(e) => {
                // The URLs were checked at start: only a change in what
                // the client accepts could get here.
                tracing::error!(error = %e, "cannot reach the server's URLs");
                Arc::new(Unreachable(e.to_string()))
            }
        }
    }

    /// The tenant's controller, started if it is new.
    pub fn controller(&self, tenant: &TenantId) -> Result<Controller, ClientError> {
        Ok(self.held(tenant)?.controller.clone())
    }

    /// A handle on `bucket` of `tenant`, started if it is new.
    pub fn bucket(
        &self,
        tenant: &TenantId,
        bucket: &BucketName,
    ) -> Result<BucketHandle, ClientError> {
        let held = self.held(tenant)?;
        if let Some(handle) = read(&held.buckets).get(bucket) {
            return Ok(handle.clone());
        }
        let mut buckets = write(&held.buckets);
        if let Some(handle) = buckets.get(bucket) {
            return Ok(handle.clone());
        }
        let handle = held.controller.bucket(bucket.as_str())?;
        buckets.insert(bucket.clone(), handle.clone());
        Ok(handle)
    }

    /// A handle on `bucket` of `tenant`, started if it is new, or the
    /// server's refusal of it if it refused it.
    pub fn checked_bucket(
        &self,
        tenant: &TenantId,
        bucket: &BucketName,
    ) -> Result<BucketHandle, ClientError> {
        let held = self.held(tenant)?;
        // The controller's lookup says whether the bucket was refused.
        let handle = held.controller.bucket(bucket.as_str())?;
        write(&held.buckets)
            .entry(bucket.clone())
            .or_insert_with(|| handle.clone());
        Ok(handle)
    }

    fn held(&self, tenant: &TenantId) -> Result<Arc<Held>, ClientError> {
        if let Some(held) = read(&self.held).get(tenant) {
            return Ok(Arc::clone(held));
        }
        let mut all = write(&self.held);
        if let Some(held) = all.get(tenant) {
            return Ok(Arc::clone(held));
        }
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ClientError::Closed);
        }
        let controller = match &self.journal {
            None => Controller::connect(
                &self.servers,
                tenant.as_str(),
                self.instance_id,
                self.options.clone(),
            )?,
            // Buckets start on what the server last said a new pod of
            // theirs may use, where the journal heard it (in an earlier
            // life too), rather than on the agent's `--initial-tokens`.
            Some(journal) => Controller::with_transport(
                JournalTransport::new(
                    Arc::clone(journal),
                    tenant.clone(),
                    self.server_transport(tenant),
                ),
                tenant,
                self.instance_id,
                Options {
                    initial_allowances: journal.allowances(tenant),
                    ..self.options.clone()
                },
            )?,
        };
        tracing::info!(
            tenant = tenant.as_str(),
            instance_id = self.instance_id,
            "serving a new tenant"
        );
        let held = Arc::new(Held {
            controller,
            buckets: RwLock::new(HashMap::new()),
        });
        all.insert(tenant.clone(), Arc::clone(&held));
        self.metrics
            .tenants
            .set(i64::try_from(all.len()).unwrap_or(i64::MAX));
        Ok(held)
    }

    /// Every bucket held now, with its status.
    pub fn statuses(&self) -> Vec<(TenantId, BucketName, LocalBucketStatus)> {
        let all: Vec<(TenantId, Arc<Held>)> = read(&self.held)
            .iter()
            .map(|(tenant, held)| (tenant.clone(), Arc::clone(held)))
            .collect();
        let mut statuses = Vec::new();
        for (tenant, held) in all {
            for (bucket, handle) in read(&held.buckets).iter() {
                statuses.push((tenant.clone(), bucket.clone(), handle.status()));
            }
        }
        statuses
    }

    /// Shuts every controller down, all at once (each reports its buckets'
    /// consumption and gives back what they hold, within its shutdown
    /// timeout), and starts no new one. Reports come in tenant order.
    pub async fn shutdown(&self) -> Vec<TenantReport> {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut all: Vec<(TenantId, Arc<Held>)> = read(&self.held)
            .iter()
            .map(|(tenant, held)| (tenant.clone(), Arc::clone(held)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let shutdowns = all.into_iter().map(|(tenant, held)| {
            tokio::spawn(async move {
                let report = held.controller.shutdown().await;
                TenantReport { tenant, report }
            })
        });
        let mut reports = Vec::new();
        for shutdown in shutdowns.collect::<Vec<_>>() {
            match shutdown.await {
                Ok(report) => reports.push(report),
                Err(e) => tracing::error!(error = %e, "a tenant's shutdown failed"),
            }
        }
        reports
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Maps only ever get whole entries inserted: a panic elsewhere leaves
    // them consistent.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A server that cannot be reached: every request is an outage.
struct Unreachable(String);

#[async_trait::async_trait]
impl Transport for Unreachable {
    async fn token_bucket(
        &self,
        _bucket: &BucketName,
        _request: tollgate_core::TokenBucketRequest,
    ) -> Result<tollgate_core::Grant, TransportError> {
        Err(TransportError::new(self.0.clone()))
    }
}
