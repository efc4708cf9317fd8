//! The client's errors.

use std::time::Duration;

use tollgate_core::partition::Op;
use tollgate_core::{InvalidInput, TableName};

/// What can go wrong using a [`Controller`](crate::Controller).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An argument was refused; nothing was charged.
    #[error("invalid argument: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// The server address could not be used.
    #[error("invalid server endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// The metrics could not be registered (usually: the same tenant and
    /// instance registered twice in one registry).
    #[error("registering client metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The server answered a check with an error: `INVALID_ARGUMENT` or
    /// `NOT_FOUND` (nothing was taken), or, after the last attempt,
    /// `UNAVAILABLE` or `DEADLINE_EXCEEDED` (the check may or may not have
    /// been applied: call again with the same request id to learn which).
    #[error("check refused: {code:?}: {message}")]
    Server { code: tonic::Code, message: String },
    /// The operation's partition is over its rate limit for `op` (the
    /// tenant's table limits): the operation must not go ahead, and must
    /// **not be retried** — a retry is one more operation on a partition
    /// already over its limit. Tell the caller to slow down on that key
    /// (HTTP 429, say). Nothing was charged to the tenant's buckets.
    #[error("partition of table \"{table}\" is over its {op} rate limit; do not retry")]
    PartitionRateLimited { table: TableName, op: Op },
    /// The controller is shut down; nothing was charged.
    #[error("the tollgate controller is shut down")]
    Closed,
}

/// Why one request to the server failed. The controller retries it, not
/// before `retry_after` when the server asked for a pause (an overloaded
/// server's `grpc-retry-pushback-ms`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl TransportError {
    /// A failure without a retry hint.
    pub fn new(message: impl Into<String>) -> Self {
        TransportError {
            message: message.into(),
            retry_after: None,
        }
    }

    /// The failure a gRPC `status` describes, with its retry hint if it
    /// carries one.
    pub fn from_status(status: &tonic::Status) -> Self {
        TransportError {
            message: format!("{}: {}", status.code(), status.message()),
            retry_after: tollgate_proto::pushback::pushback(status),
        }
    }
}
