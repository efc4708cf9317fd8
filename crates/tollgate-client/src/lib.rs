//! The Tollgate client: the library every pod embeds to gate its work on its
//! tenant's tokens.
//!
//! A [`Controller`] keeps a local token bucket (the core
//! [`LocalBucket`](tollgate_core::LocalBucket)) and refills it from the
//! tenant's global bucket on a Tollgate server, in the background. The pod's
//! work waits on the local bucket only — never on the network: the pod
//! starts on an initial allowance, and runs on a fallback rate while the
//! server cannot be reached.
//!
//! # Example
//!
//! ```no_run
//! use tollgate_client::{Controller, Options, Request};
//!
//! # async fn example() -> Result<(), tollgate_client::ClientError> {
//! let registry = tollgate_client::Registry::new();
//! let controller = Controller::connect(
//!     "http://127.0.0.1:50051",
//!     "acme",
//!     1, // this pod's instance id within the tenant
//!     Options { registry: Some(registry.clone()), ..Options::default() },
//! )?;
//!
//! // Gate any work on tokens…
//! controller.acquire(10.0).await?;
//! // …or a key-value batch on what it costs (writes before, reads after).
//! let batch = Request::read(4);
//! controller.on_request(&batch).await?;
//! let read_bytes = 64 * 1024; // whatever the response held
//! controller.on_response(&batch, read_bytes)?;
//! controller.record_cpu(0.25)?;
//!
//! // On the way out, report what was used.
//! let report = controller.shutdown().await;
//! assert!(report.consumption_reported);
//! # Ok(())
//! # }
//! ```
//!
//! - [`controller`]: the handle and its background task.
//! - `gate`: the lock-free admission fast path in front of the bucket.
//! - [`transport`]: gRPC to the server, or your own [`Transport`].
//! - [`lease`]: the ordered leases that tell a pod's incarnations apart.

pub mod controller;
mod error;
mod gate;
pub mod lease;
mod metrics;
pub mod transport;

pub use controller::{Controller, Options, Request, ShutdownReport};
pub use error::{ClientError, TransportError};
pub use transport::{ClientTls, GrpcTransport, Transport, endpoint};

pub use prometheus::Registry;
pub use tollgate_core::{
    Batch, Consumption, CostModel, Grant, InstanceId, InvalidInput, LocalBucketConfig,
    LocalBucketStatus, TenantId, TokenBucketRequest,
};
