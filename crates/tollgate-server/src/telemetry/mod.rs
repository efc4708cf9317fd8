//! What operators watch: Prometheus metrics, gRPC health, `/readyz`.
//!
//! - [`metrics`]: the registry, per-bucket metrics read from the store (at
//!   most once per read interval, whatever the scrapes), and per-replica
//!   RPC and store counters.
//! - [`check_rates`]: this replica's checks and refusals of each per-key
//!   bucket per second, over the last seconds, in memory.
//! - [`check_history`]: writes the same checks, per slot, into the usage
//!   history.
//! - [`rpc`]: the tower layer that counts and times every RPC.
//! - [`health`]: readiness from a periodic store probe, published through
//!   the standard gRPC health service.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz` and the web console over
//!   HTTP.
//! - [`console`]: what the web console shows, sampled from the store while
//!   a console is open.

pub mod check_history;
pub mod check_rates;
pub mod console;
pub mod health;
pub mod http;
pub mod metrics;
pub mod rpc;

use std::sync::Arc;

use tonic_health::server::{HealthReporter, health_reporter};

pub use self::health::Health;
pub use self::http::serve_http;
pub use self::metrics::{Metrics, MetricsError};

/// The metrics and health one server process shares between its gRPC and
/// HTTP sides.
#[derive(Clone, Debug)]
pub struct Telemetry {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub console: Arc<console::Console>,
    reporter: HealthReporter,
}

impl Telemetry {
    pub fn new() -> Result<Telemetry, MetricsError> {
        let (reporter, _) = health_reporter();
        Ok(Telemetry {
            metrics: Arc::new(Metrics::new()?),
            health: Arc::new(Health::new(reporter.clone())),
            console: Arc::new(console::Console::new()),
            reporter,
        })
    }

    /// The gRPC health service, fed by [`Telemetry::health`].
    pub(crate) fn health_service(
        &self,
    ) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>
    {
        tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(self.reporter.clone()),
        )
    }
}
