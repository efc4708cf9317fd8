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
//! - [`local_bucket`]: a pod's local bucket — the FIFO gate, when and how
//!   much to ask the server for, trickle delivery, debt, shares, fallback.
//! - [`cost_model`]: what reads, writes, CPU and egress cost in tokens.
//! - [`consumption`]: what pods report they used.
//! - [`validate`]: input checks shared by every edge (gRPC, CLI, stores).
//! - [`time`]: the timestamp type all state machines take.

pub mod consumption;
pub mod cost_model;
pub mod global_bucket;
pub mod local_bucket;
pub mod tier;
pub mod time;
pub mod transaction;
pub mod validate;

pub use consumption::Consumption;
pub use cost_model::{Batch, CostModel};
pub use global_bucket::{
    BucketRow, BucketRows, BucketState, GlobalBucketConfig, Grant, GrantPolicy, InstanceId,
    InstanceState, Limits, LimitsUpdate, Membership, RequestError, RequestOutcome, RowChanges,
    TokenBucketRequest, Totals,
};
pub use local_bucket::{
    Admission, LocalBucket, LocalBucketConfig, LocalBucketStatus, PollOutcome, WaiterId,
};
pub use time::Timestamp;
pub use validate::{BucketKey, BucketName, InvalidInput, TenantId, TierName};
