//! Health: the standard gRPC health service, and the readiness that
//! `/readyz` reports.
//!
//! The server is alive as long as it runs. It is *ready* while its store
//! answers: a probe reads one tenant every [`PROBE_INTERVAL`] (5 s), and
//! the gRPC health status of the server ("") and of each of its services
//! (token buckets, key limits, partition limits, `Admin`) follows it, so load
//! balancers and Kubernetes stop sending pods to a replica that cannot
//! reach its store. At shutdown the status turns NOT_SERVING before the
//! server stops accepting requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_proto::v1::admin_server::AdminServer;
use tollgate_proto::v1::key_limits_server::KeyLimitsServer;
use tollgate_proto::v1::partition_limits_server::PartitionLimitsServer;
use tollgate_proto::v1::token_bucket_service_server::TokenBucketServiceServer;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::service::{AdminService, KeyLimitsService, PartitionLimitsService, TokenBucketService};
use crate::store::Store;

/// How often the store is probed.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// Whether this replica can serve, shared by the gRPC health service and
/// `/readyz`.
#[derive(Debug)]
pub struct Health {
    reporter: HealthReporter,
    ready: AtomicBool,
    stopping: AtomicBool,
}

const SERVICES: [&str; 5] = [
    "",
    <TokenBucketServiceServer<TokenBucketService> as NamedService>::NAME,
    <KeyLimitsServer<KeyLimitsService> as NamedService>::NAME,
    <PartitionLimitsServer<PartitionLimitsService> as NamedService>::NAME,
    <AdminServer<AdminService> as NamedService>::NAME,
];

impl Health {
    pub fn new(reporter: HealthReporter) -> Self {
        Health {
            reporter,
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// True while the store answers and the server is not shutting down.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.stopping.load(Ordering::Relaxed)
    }

    async fn set(&self, ready: bool) {
        let was = self.ready.swap(ready, Ordering::Relaxed);
        let serving = ready && !self.stopping.load(Ordering::Relaxed);
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in SERVICES {
            self.reporter.set_service_status(service, status).await;
        }
        if was != ready {
            if ready {
                tracing::info!("store reachable: serving");
            } else {
                tracing::warn!("store unreachable: health is NOT_SERVING until it answers");
            }
        }
    }

    /// Marks the server as shutting down: NOT_SERVING from now on.
    pub async fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        for service in SERVICES {
            self.reporter
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
    }

    /// Lists every service with the current status (NOT_SERVING until a
    /// probe has reached the store), so a health check never meets an
    /// unknown service.
    pub async fn register(&self) {
        let status = if self.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in SERVICES {
            self.reporter.set_service_status(service, status).await;
        }
    }

    /// Probes `store` now and then every `interval`, forever.
    pub async fn probe(self: Arc<Self>, store: Arc<dyn Store>, interval: Duration) {
        loop {
            let ready = match store.list_buckets(None, 1).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(error = %e, "store probe failed");
                    false
                }
            };
            self.set(ready).await;
            tokio::time::sleep(interval).await;
        }
    }
}
