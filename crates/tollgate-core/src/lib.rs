//! Tollgate's algorithms, as pure state machines.
//!
//! Nothing in this crate does IO or reads a clock: every function that depends
//! on time takes `now` as an argument. (The one side effect is a log line:
//! [`transaction::Batch::report_removed`] logs each silent instance a
//! committed transaction removed, through `tracing`, so that every store
//! logs removals the same way.) The server runs these state machines
//! inside store transactions, the client inside pods, and the simulator in
//! virtual time — the same code everywhere, which is what makes the simulator
//! honest and the tests exact.
//!
//! - [`global_bucket`]: a global bucket (one per tenant and bucket name) —
//!   refill, grants, shares, debt correction, the instance list and its
//!   window, idempotency, reconfiguration.
//! - [`transaction`]: the script every store and the simulator run for
//!   token-bucket requests: what to lock and load, the unconfigured-bucket
//!   rule, what to write back, removals reported.
//! - [`budget`]: spend budgets per billing cycle — calendar cycles in a
//!   time zone, the cap on grants, throttle and stop at the limit,
//!   thresholds fired once, the forecast, the cycle's record.
//! - [`tenant_state`]: tombstones of deleted tenants and suspensions: which
//!   tenants' pods are refused, and what delete, suspend, resume and an
//!   operator's re-creation write.
//! - [`tier`]: tiers and tenant records, and the rules of onboarding, tier
//!   switches and overrides.
//! - [`local_bucket`]: a pod's local bucket — the FIFO gate, when and how
//!   much to ask the server for, trickle delivery, debt, shares, fallback.
//! - [`partition`]: hot-partition limits — a pod's per-partition counters,
//!   the rejection rule, and the shares that hold a partition to its limit
//!   across pods.
//! - [`recovery`]: what a crashed agent's journal says it still owes the
//!   server, and the requests that settle it without counting twice.
//! - [`ideal`]: the ideal token bucket, instantly synchronised: the
//!   simulator's reference and the impact preview's replay.
//! - [`impact`]: what proposed limits would have done to recorded usage.
//! - [`rate_window`]: events per second over the last seconds (a
//!   replica's checks of a per-key bucket).
//! - [`cost_model`]: what reads, writes, CPU and egress cost in tokens.
//! - [`consumption`]: what pods report they used.
//! - [`validate`]: input checks shared by every edge (gRPC, CLI, stores),
//!   and the names (tenants, buckets, tiers).
//! - [`time`]: the timestamp type all state machines take.

pub mod budget;
pub mod consumption;
pub mod cost_model;
pub mod global_bucket;
pub mod history;
pub mod ideal;
pub mod impact;
pub mod key_bucket;
pub mod local_bucket;
pub mod organisation;
pub mod partition;
pub mod pushback;
pub mod rate_window;
pub mod recovery;
pub mod tenant_state;
pub mod tier;
pub mod time;
pub mod transaction;
pub mod validate;

pub use consumption::Consumption;
pub use cost_model::{Batch, CostModel};
pub use global_bucket::{
    BucketRow, BucketRows, BucketState, GlobalBucketConfig, Grant, GrantPolicy, InstanceId,
    InstanceState, Limits, LimitsMask, LimitsUpdate, Membership, RequestError, RequestOutcome,
    RowChanges, TokenBucketRequest, Totals, live_instances,
};
pub use local_bucket::{
    Admission, LocalBucket, LocalBucketConfig, LocalBucketStatus, PollOutcome, WaiterId,
};
pub use tenant_state::{TenantRefused, TenantState, TenantStateKind};
pub use time::Timestamp;
pub use validate::{BucketKey, BucketName, InvalidInput, TableName, TenantId, TierName};
