//! The client's errors, and which of the server's answers are errors at
//! all: [`classify`] sorts every gRPC status code into an outage (retried,
//! the pod runs on its fallback rate meanwhile) or a refusal (final: the
//! bucket's calls fail with [`ClientError::Refused`]).

use std::time::Duration;

use tollgate_core::partition::Op;
use tollgate_core::{BucketName, InvalidInput, TableName, TenantId};
use tonic::Code;

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
    /// The server answered this bucket in a way no retry changes (the
    /// bucket or tenant does not exist, the pod may not use it, the tenant
    /// is suspended, a newer incarnation of this instance took over): the
    /// bucket admits nothing more, and every call on it fails with this
    /// error until the controller is built again. Nothing was charged.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// The server's final answer to one of the pod's buckets: which bucket of
/// which tenant, and the gRPC status it answered with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the tollgate server refused bucket \"{bucket}\" of tenant \"{tenant}\" ({code:?}: {message}); \
     it admits nothing more until the controller is built again"
)]
pub struct Refusal {
    pub tenant: TenantId,
    /// The bucket; empty for the request-unit bucket.
    pub bucket: BucketName,
    pub code: Code,
    pub message: String,
}

/// What a failed call to the server means for the bucket that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The server or the way to it is down or overloaded, or failed on its
    /// side: the call is retried, and the pod runs on its fallback rate
    /// meanwhile.
    Outage,
    /// The same call would get the same answer however often it is made:
    /// the bucket is misnamed, the pod's credentials or tenant are wrong,
    /// the tenant is suspended, or its lease was superseded. The bucket
    /// stops, and its calls fail with [`ClientError::Refused`].
    Refusal,
}

/// The meaning of gRPC status `code` in a server's answer to a pod.
///
/// | Code | Failure | Why |
/// |---|---|---|
/// | `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED` | outage | the server is down, slow or shedding load |
/// | `INTERNAL`, `UNKNOWN`, `DATA_LOSS` | outage | the server's store failed, or the connection broke (tonic reports broken HTTP/2 streams so) |
/// | `ABORTED`, `CANCELLED` | outage | the call was cut short (a server shutting down, a conflict); a retry may pass |
/// | `NOT_FOUND` | refusal | no such bucket or tenant: a misnamed or retired bucket, a deleted tenant |
/// | `PERMISSION_DENIED`, `UNAUTHENTICATED` | refusal | the pod's credential does not name its tenant |
/// | `INVALID_ARGUMENT`, `OUT_OF_RANGE` | refusal | the request itself is wrong; the same request stays wrong |
/// | `FAILED_PRECONDITION` | refusal | the tenant is suspended, or a newer incarnation of this instance took over |
/// | `UNIMPLEMENTED` | refusal | not a Tollgate server, or one without this service: a misconfiguration |
/// | `ALREADY_EXISTS`, `OK` | refusal | never a token-bucket answer: a server that sends them is not to be trusted with grants |
pub fn classify(code: Code) -> Failure {
    match code {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Internal
        | Code::Unknown
        | Code::DataLoss
        | Code::Aborted
        | Code::Cancelled => Failure::Outage,
        Code::NotFound
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::InvalidArgument
        | Code::OutOfRange
        | Code::FailedPrecondition
        | Code::Unimplemented
        | Code::AlreadyExists
        | Code::Ok => Failure::Refusal,
    }
}

/// Why one request to the server failed. An outage (no `code`, or a code
/// [`classify`] calls one) is retried, not before `retry_after` when the
/// server asked for a pause (an overloaded server's
/// `grpc-retry-pushback-ms`); a refusal stops the bucket.
#[derive(Debug, Clone)]
pub struct TransportError {
    pub message: String,
    pub retry_after: Option<Duration>,
    /// The gRPC status code the server answered with; `None` when no
    /// answer came (no connection, a timeout, an answer that made no
    /// sense), which is an outage.
    pub code: Option<Code>,
}

impl TransportError {
    /// A failure without an answer from the server (an outage), and
    /// without a retry hint.
    pub fn new(message: impl Into<String>) -> Self {
        TransportError {
            message: message.into(),
            retry_after: None,
            code: None,
        }
    }

    /// The failure a gRPC `status` describes, with its code, and its retry
    /// hint if it carries one.
    pub fn from_status(status: &tonic::Status) -> Self {
        TransportError {
            message: status.message().to_owned(),
            retry_after: tollgate_proto::pushback::pushback(status),
            code: Some(status.code()),
        }
    }

    /// What the failure means for the bucket: see [`classify`].
    pub fn failure(&self) -> Failure {
        self.code.map_or(Failure::Outage, classify)
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(code) => write!(f, "{code}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TransportError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_a_retry_could_change_are_outages() {
        let outages = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Internal,
            Code::Unknown,
            Code::DataLoss,
            Code::Aborted,
            Code::Cancelled,
        ];
        let refusals = [
            Code::NotFound,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::FailedPrecondition,
            Code::Unimplemented,
            Code::AlreadyExists,
            Code::Ok,
        ];
        assert_eq!(outages.len() + refusals.len(), 17, "every gRPC code");
        for code in outages {
            assert_eq!(classify(code), Failure::Outage, "{code:?}");
            let status = tonic::Status::new(code, "down");
            assert_eq!(
                TransportError::from_status(&status).failure(),
                Failure::Outage
            );
        }
        for code in refusals {
            assert_eq!(classify(code), Failure::Refusal, "{code:?}");
            let status = tonic::Status::new(code, "no");
            let error = TransportError::from_status(&status);
            assert_eq!(
                (error.failure(), error.code),
                (Failure::Refusal, Some(code))
            );
        }
        // No answer at all (a refused connection, a timeout) is an outage.
        assert_eq!(
            TransportError::new("connection refused").failure(),
            Failure::Outage
        );
    }

    #[test]
    fn a_refusal_names_the_tenant_the_bucket_and_the_status() {
        let refusal = Refusal {
            tenant: TenantId::parse("tenant", "acme").expect("valid"),
            bucket: BucketName::parse("bucket", "send-sms").expect("valid"),
            code: Code::NotFound,
            message: "bucket acme/send-sms not found".into(),
        };
        let text = ClientError::from(refusal).to_string();
        for part in [
            "\"send-sms\"",
            "\"acme\"",
            "NotFound",
            "acme/send-sms not found",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }
}
