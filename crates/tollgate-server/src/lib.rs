//! Tollgate's server: gRPC services over a transactional [`store::Store`].
//!
//! - [`store`]: the `Store` trait and its implementations.
//! - [`service`]: the pod-facing `TokenBucketService` and operator-facing
//!   `Admin` service, which validate every input at the edge and map store
//!   errors to gRPC status codes.
//! - [`run`]: serves both on an already-bound listener until a shutdown
//!   signal; the binary and the integration tests share it.

pub mod service;
pub mod store;

mod server;

pub use server::run;
