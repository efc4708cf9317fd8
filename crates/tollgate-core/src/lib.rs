//! Tollgate's algorithms, as pure state machines.
//!
//! Nothing in this crate does IO or reads a clock: every function that depends
//! on time takes `now` as an argument. The server runs these state machines
//! inside store transactions, the client inside pods, and the simulator in
//! virtual time — the same code everywhere, which is what makes the simulator
//! honest and the tests exact.
//!
//! - [`global_bucket`]: a tenant's global bucket — refill, grants, shares,
//!   debt correction, the instance list, idempotency, reconfiguration.
//! - [`consumption`]: what pods report they used.
//! - [`validate`]: input checks shared by every edge (gRPC, CLI, stores).
//! - [`time`]: the timestamp type all state machines take.

pub mod consumption;
pub mod global_bucket;
pub mod time;
pub mod validate;

pub use consumption::Consumption;
pub use global_bucket::{
    BucketRows, GlobalBucketConfig, Grant, GrantPolicy, InstanceId, InstanceState, Limits,
    LimitsUpdate, RequestError, RequestOutcome, RowChanges, TenantState, TokenBucketRequest,
};
pub use time::Timestamp;
pub use validate::{InvalidInput, TenantId};
