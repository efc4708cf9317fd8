//! The ideal reference: the ideal token bucket of `tollgate_core::ideal`,
//! set up from a workload.
//!
//! An organisation's reference is [`tree::IdealTree`]: the organisation's
//! bucket split between its members instantly by the server's rule, each
//! tenant serving its own queue as the ideal bucket does.

pub use tollgate_core::ideal::{IdealBucket, IdealTick, Queue};

use crate::workload::{LimitsSpec, Workload};

pub mod delayed;
pub mod tree;

/// The ideal bucket of `limits`, whose demand gives up after the
/// workload's `max_wait`.
pub fn bucket(workload: &Workload, limits: &LimitsSpec) -> IdealBucket {
    IdealBucket::new(
        limits.refill_rate,
        limits.burst_limit,
        limits.initial(),
        workload.max_wait.as_secs_f64(),
    )
}
