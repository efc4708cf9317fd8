//! The Tollgate client: the library every pod embeds to gate its work on its
//! tenant's tokens.
//!
//! A tenant owns several buckets: its request-unit bucket (the empty name),
//! which prices key-value work, and one bucket per rate-limited action
//! (`schedule-email`, `invoke-doc-summary-ai`). A pod holds one
//! [`Controller`], with one connection to the server, for all of them. For
//! each bucket the pod uses it keeps a local token bucket (the core
//! [`LocalBucket`](tollgate_core::LocalBucket)) and refills it from the
//! tenant's global bucket of that name, in the background. The pod's work
//! waits on the local bucket only — never on the network: each bucket starts
//! on an initial allowance, and runs on a fallback rate while the server
//! cannot be reached. Buckets are independent: one out of tokens, or with a
//! slow request, never holds up another.
//!
//! Unreachable is not refused. Only an outage (no connection, a timeout,
//! `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, the server's
//! own failures) leads to the fallback rate. An answer no retry changes
//! (`NOT_FOUND` for a misspelt or retired bucket, `PERMISSION_DENIED`,
//! `UNAUTHENTICATED`, `FAILED_PRECONDITION` for a suspended tenant or a
//! superseded incarnation, …: see [`classify`]) refuses the bucket for
//! good: every call on it fails with [`ClientError::Refused`], naming the
//! tenant, the bucket and the status, from the first answer on. Before
//! that answer a bucket admits at most its initial allowance
//! ([`LocalBucketConfig::initial_tokens`]). The refusal stays until the
//! controller is built again: the same request would get the same
//! answer, and a bucket that reopened on its own could run a superseded
//! incarnation beside its successor, or undo a suspension unnoticed.
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
//! // Gate any work on request units…
//! controller.acquire(10.0).await?;
//! // …or a key-value batch on what it costs (writes before, reads after).
//! let batch = Request::read(4);
//! controller.on_request(&batch).await?;
//! let read_bytes = 64 * 1024; // whatever the response held
//! controller.on_response(&batch, read_bytes)?;
//! controller.record_cpu(0.25)?;
//!
//! // Gate an action on its own bucket: 50 emails, claimed at once.
//! controller.bucket("schedule-email")?.acquire(50.0).await?;
//! // A worker that sends often keeps the handle (cheap to clone).
//! let summaries = controller.bucket("invoke-doc-summary-ai")?;
//! if summaries.try_acquire(1.0)? {
//!     // …summarize now, or queue the document for later.
//! }
//!
//! // On the way out, report what every bucket used.
//! let report = controller.shutdown().await;
//! assert!(report.consumption_reported);
//! # Ok(())
//! # }
//! ```
//!
//! - [`controller`]: the controller, its buckets' handles
//!   ([`BucketHandle`]) and their shutdown.
//! - `driver`: each bucket's background task, talking to the server.
//! - `bucket`: one bucket's state, where acquiring and charging live.
//! - `error`: [`ClientError`], [`TransportError`], and [`classify`], the
//!   table of which answers are outages and which refuse a bucket.
//! - `gate`: the lock-free admission fast path in front of a bucket.
//! - [`transport`]: gRPC to the server, or your own [`Transport`].
//! - [`key_limits`]: [`KeyLimiter`], exact per-key checks (a user, an API
//!   key, an IP address), one round trip each.
//! - [`partition`]: [`PartitionLimiter`], hot-partition limits per
//!   (table, partition, read|write), enforced locally and coordinated with
//!   the tenant's other pods through the server.
//! - [`lease`]: the ordered leases that tell a pod's incarnations apart.

mod bucket;
pub mod controller;
mod driver;
mod error;
mod gate;
pub mod key_limits;
pub mod lease;
mod metrics;
pub mod partition;
pub mod transport;

pub use bucket::Acquire;
pub use controller::{
    BucketHandle, BucketReport, Controller, Options, Request, ShutdownReport, connect_transport,
};
pub use error::{ClientError, Failure, Refusal, TransportError, classify};
pub use key_limits::{KeyAnswer, KeyCheck, KeyLimiter, KeyLimiterOptions, Verdict};
pub use partition::{Partition, PartitionClock, PartitionLimiter, PartitionOptions};
pub use tollgate_core::partition::Op;
pub use transport::{
    ClientTls, FailoverTransport, GrpcTransport, PodToken, Transport, endpoint, endpoint_list,
};

pub use prometheus::Registry;
pub use tollgate_core::{
    Batch, BucketName, Consumption, CostModel, Grant, InstanceId, InvalidInput, LocalBucketConfig,
    LocalBucketStatus, TenantId, TokenBucketRequest,
};
