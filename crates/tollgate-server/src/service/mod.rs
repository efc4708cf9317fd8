//! The gRPC services.
//!
//! Every input is validated here, at the edge, before any store transaction
//! starts: a refused request changes nothing and names the offending field.
//! Store errors are mapped to gRPC status codes in one place, [`status`],
//! which is also where they are logged.
//!
//! The mapping: NOT_FOUND for a missing tenant, bucket, tier, override or
//! table limits, and for a deleted tenant; INVALID_ARGUMENT naming the
//! field (a check of a shared bucket too); FAILED_PRECONDITION for a stale
//! sequence number, a superseded lease, a tier in use, a suspended tenant
//! and an import into a store that is not empty; ALREADY_EXISTS for a
//! tenant `CreateTenant` finds; UNAVAILABLE when the store cannot be
//! reached (logged through `log_throttle`); INTERNAL for the store's own
//! failures and an inconsistent instance list (logged as errors).

mod admin;
pub mod admin_auth;
pub mod admission;
mod audit;
mod convert;
pub mod credentials;
pub mod edge;
mod envoy;
mod key_limits;
mod log_throttle;
mod partition_limits;
pub mod pod_auth;
pub mod pod_gate;
mod token_bucket;

pub use admin::AdminService;
pub use admin_auth::{AdminAuth, AdminGuard, AdminTokens, Grant, Operator, Role, Scope};
pub use admission::Admission;
/// Budgets as the wire carries them, checked by the server's rules (the
/// CLI checks a tiers file's budgets with them before sending).
pub use convert::{budget_at, budget_to_proto, quota_from_proto, quota_to_proto};
pub use credentials::{CredentialsError, Live, Watched};
pub use envoy::EnvoyRateLimitService;
pub use key_limits::KeyLimitsService;
pub use partition_limits::PartitionLimitsService;
pub use pod_auth::{PodAuth, PodTokens};
pub use pod_gate::PodGate;
pub use token_bucket::TokenBucketService;

use std::time::Duration;

use tollgate_core::key_bucket::CheckError;
use tollgate_core::organisation::TreeError;
use tollgate_core::tier::TierError;
use tollgate_core::{InvalidInput, RequestError, TenantRefused};
use tonic::Status;

use self::log_throttle::LogThrottle;

use crate::store::StoreError;

fn invalid(e: InvalidInput) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The status of a call for a deleted tenant (NOT_FOUND: it does not
/// exist until created again) or a suspended one (FAILED_PRECONDITION:
/// it exists, and is refused until resumed).
fn refused(e: &TenantRefused) -> Status {
    match e {
        TenantRefused::Deleted { .. } => Status::not_found(e.to_string()),
        TenantRefused::Suspended { .. } | TenantRefused::Organisation { .. } => {
            Status::failed_precondition(e.to_string())
        }
    }
}

/// Maps a store error to the status a client sees, logging what the client
/// cannot act on.
fn status(operation: &'static str, err: StoreError) -> Status {
    match err {
        e @ (StoreError::TenantNotFound(_) | StoreError::BucketNotFound(_)) => {
            Status::not_found(e.to_string())
        }
        StoreError::Rejected(RequestError::InvalidInput(e)) => invalid(e),
        StoreError::Rejected(
            e @ (RequestError::StaleSequence { .. } | RequestError::SupersededLease { .. }),
        ) => Status::failed_precondition(e.to_string()),
        StoreError::Tier(TierError::InvalidInput(e)) => invalid(e),
        StoreError::Check(CheckError::InvalidInput(e)) => invalid(e),
        StoreError::Check(e @ CheckError::NotPerKey { .. }) => {
            Status::invalid_argument(e.to_string())
        }
        StoreError::Check(e @ CheckError::BucketNotFound { .. }) => {
            Status::not_found(e.to_string())
        }
        StoreError::Check(CheckError::TenantRefused(e)) | StoreError::TenantRefused(e) => {
            refused(&e)
        }
        StoreError::Tier(
            e @ (TierError::TierNotFound(_)
            | TierError::TenantNotFound(_)
            | TierError::OverrideNotFound { .. }
            | TierError::TableLimitsNotFound { .. }
            | TierError::BudgetNotFound { .. }),
        ) => Status::not_found(e.to_string()),
        StoreError::Tier(e @ TierError::NoBucketForBudget(_)) => {
            Status::failed_precondition(e.to_string())
        }
        StoreError::Tier(e @ TierError::TenantExists(_)) => Status::already_exists(e.to_string()),
        StoreError::Tier(e @ TierError::TierInUse { .. }) => {
            Status::failed_precondition(e.to_string())
        }
        e @ StoreError::NotEmpty(_) => Status::failed_precondition(e.to_string()),
        StoreError::Tree(TreeError::InvalidInput(e)) => invalid(e),
        StoreError::Tree(e @ (TreeError::NoSuchOrganisation(_) | TreeError::NotAMember(_))) => {
            Status::not_found(e.to_string())
        }
        StoreError::Tree(e @ TreeError::AlreadyAnOrganisation(_)) => {
            Status::already_exists(e.to_string())
        }
        StoreError::Tree(
            e @ (TreeError::TenantHasBuckets(_)
            | TreeError::MemberElsewhere { .. }
            | TreeError::Cycle { .. }
            | TreeError::TooDeep { .. }
            | TreeError::HasMembers { .. }
            | TreeError::MemberIdsExhausted(_)),
        ) => Status::failed_precondition(e.to_string()),
        StoreError::Rejected(e @ RequestError::Inconsistent(_)) => {
            tracing::error!(operation, error = %e, "store holds an inconsistent instance list");
            Status::internal(format!("{operation}: {e}"))
        }
        StoreError::Unavailable(msg) => {
            // A store that is down fails every pending request at once.
            static UNAVAILABLE: LogThrottle = LogThrottle::new(Duration::from_secs(1));
            if let Some(held_back) = UNAVAILABLE.allow() {
                tracing::warn!(operation, error = %msg, held_back, "store unavailable");
            }
            Status::unavailable(msg)
        }
        e @ StoreError::Internal { .. } => {
            tracing::error!(operation, error = %e, "store operation failed");
            Status::internal(format!("{operation}: {e}"))
        }
    }
}
