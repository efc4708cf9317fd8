//! Tollgate's server: gRPC services over a transactional [`store::Store`].
//!
//! - [`store`]: the `Store` trait and its implementations.
//! - [`service`]: the pod-facing `TokenBucketService`, the per-key
//!   `KeyLimits` checks (also served as Envoy's rate limit service API),
//!   `PartitionLimits`, and the operator-facing `Admin` service, which
//!   validate every input at the edge and map store errors to gRPC status
//!   codes.
//! - [`telemetry`]: Prometheus metrics, gRPC health and `/readyz`.
//! - [`webhooks`]: posting budget events to the webhooks configured.
//! - [`run`]: serves every service, gRPC health and reflection on an
//!   already-bound listener until a shutdown signal; the binary and the
//!   integration tests share it.
//!
//! # Example
//!
//! A server in-process on an in-memory store, stopped on a signal:
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory(BucketSettings::default())?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(tollgate_server::run(listener, Arc::clone(&store), async {
//!     let _ = stopped.await;
//! }));
//! // … pods and operators talk gRPC to the listener's address …
//! let _ = stop.send(());
//! server.await??; // waits for in-flight requests
//! store.close().await?;
//! # Ok(())
//! # }
//! # tokio::runtime::Runtime::new()?.block_on(example())
//! # .map_err(|e| std::io::Error::other(e.to_string()))?;
//! # Ok::<(), std::io::Error>(())
//! ```

pub mod preview;
pub mod service;
pub mod store;
pub mod telemetry;
pub mod webhooks;

mod client_tls;
mod server;

pub use server::{GrpcOptions, ServeError, ServerTls, run, run_with_options, run_with_telemetry};
