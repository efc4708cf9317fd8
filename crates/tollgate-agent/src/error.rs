//! Why a call to the agent failed, and how each failure reads on the wire.
//!
//! One error type for both faces of the agent: a gRPC status
//! ([`AgentError::to_status`]) and an HTTP status with a JSON body
//! ([`AgentError::http_status`]), so a caller learns the same code and
//! message whichever it speaks. Anything a caller can send that is wrong is
//! INVALID_ARGUMENT naming the field, never INTERNAL.

use tollgate_client::{ClientError, Refusal};
use tollgate_core::InvalidInput;
use tonic::Code;

/// A call the agent did not answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A field out of its documented range; nothing was taken.
    #[error("{0}")]
    InvalidArgument(#[from] InvalidInput),
    /// A TCP caller without the tenant's token, or with a wrong one.
    #[error("{0}")]
    Unauthenticated(String),
    /// The agent's access rules do not let this caller use the tenant.
    #[error("{0}")]
    PermissionDenied(String),
    /// The server refused the bucket for good: every call on it fails the
    /// same way until the agent restarts.
    #[error(
        "tenant \"{tenant}\", bucket \"{bucket}\": refused by the tollgate server ({code:?}): {message}; \
         every call on this bucket fails so until the agent restarts",
        tenant = .0.tenant.as_str(),
        bucket = .0.bucket.as_str(),
        code = .0.code,
        message = .0.message
    )]
    Refused(Refusal),
    /// A request id repeated while its first call is still being answered.
    #[error(
        "request_id: a call with this request id is still in progress; retry once it has been answered"
    )]
    InProgress,
    /// The agent is shutting down (or has): a caller retries, with the
    /// same request id, once it is back.
    #[error("agent shutting down")]
    ShuttingDown,
    /// The server's own answer to a call passed through to it (CheckKeys),
    /// kept as it is.
    #[error("{message}")]
    Server { code: Code, message: String },
    /// A failure of the agent itself, not of the call.
    #[error("{0}")]
    Internal(String),
}

impl AgentError {
    /// The gRPC code the error is answered with.
    pub fn code(&self) -> Code {
        match self {
            AgentError::InvalidArgument(_) => Code::InvalidArgument,
            AgentError::Unauthenticated(_) => Code::Unauthenticated,
            AgentError::PermissionDenied(_) => Code::PermissionDenied,
            AgentError::Refused(refusal) => refusal.code,
            AgentError::InProgress => Code::Aborted,
            AgentError::ShuttingDown => Code::Unavailable,
            AgentError::Server { code, .. } => *code,
            AgentError::Internal(_) => Code::Internal,
        }
    }

    pub fn to_status(&self) -> tonic::Status {
        tonic::Status::new(self.code(), self.to_string())
    }

    /// The HTTP status of the error's JSON answer.
    pub fn http_status(&self) -> http::StatusCode {
        http_status(self.code())
    }

    /// The JSON body of the error's HTTP answer:
    /// `{"error":{"code":"INVALID_ARGUMENT","message":"…"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "code": code_name(self.code()),
                "message": self.to_string(),
            }
        })
    }
}

impl From<ClientError> for AgentError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::InvalidInput(invalid) => AgentError::InvalidArgument(invalid),
            ClientError::Refused(refusal) => AgentError::Refused(refusal),
            ClientError::Closed => AgentError::ShuttingDown,
            ClientError::Server { code, message } => AgentError::Server { code, message },
            // Settings the agent checked at start, or a failure of its own:
            // nothing the caller sent.
            other @ (ClientError::Endpoint { .. }
            | ClientError::Metrics(_)
            | ClientError::PartitionRateLimited { .. }) => AgentError::Internal(other.to_string()),
        }
    }
}

/// The HTTP status an answer with gRPC `code` has: the usual mapping
/// (Google's API design guide), so HTTP callers branch on it as they would
/// on any JSON API.
pub fn http_status(code: Code) -> http::StatusCode {
    use http::StatusCode as S;
    match code {
        Code::Ok => S::OK,
        Code::InvalidArgument | Code::OutOfRange => S::BAD_REQUEST,
        Code::Unauthenticated => S::UNAUTHORIZED,
        Code::PermissionDenied => S::FORBIDDEN,
        Code::NotFound => S::NOT_FOUND,
        Code::Aborted | Code::AlreadyExists => S::CONFLICT,
        Code::FailedPrecondition => S::PRECONDITION_FAILED,
        Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
        Code::Unavailable => S::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
        Code::Unimplemented => S::NOT_IMPLEMENTED,
        Code::Cancelled | Code::Unknown | Code::Internal | Code::DataLoss => {
            S::INTERNAL_SERVER_ERROR
        }
    }
}

/// A gRPC code as the JSON answers spell it (`INVALID_ARGUMENT`), and as
/// the metrics label calls.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{BucketName, TenantId};

    #[test]
    fn a_refusal_keeps_the_servers_code_and_names_tenant_and_bucket() {
        let refusal = Refusal {
            tenant: TenantId::parse("tenant", "acme").expect("valid"),
            bucket: BucketName::parse("bucket", "send-sms").expect("valid"),
            code: Code::NotFound,
            message: "bucket acme/send-sms not found".into(),
        };
        let error = AgentError::from(ClientError::Refused(refusal));
        assert_eq!(error.code(), Code::NotFound);
        assert_eq!(error.http_status(), http::StatusCode::NOT_FOUND);
        let text = error.to_string();
        for part in [
            "tenant \"acme\"",
            "bucket \"send-sms\"",
            "acme/send-sms not found",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        assert_eq!(error.to_json()["error"]["code"], "NOT_FOUND");
    }

    #[test]
    fn a_callers_mistake_is_never_internal() {
        let invalid = AgentError::from(ClientError::InvalidInput(InvalidInput::new(
            "tokens",
            "must be finite",
        )));
        assert_eq!(invalid.code(), Code::InvalidArgument);
        assert_eq!(invalid.http_status(), http::StatusCode::BAD_REQUEST);
        assert_eq!(invalid.to_string(), "tokens: must be finite");
        assert_eq!(
            AgentError::from(ClientError::Closed).code(),
            Code::Unavailable
        );
        assert_eq!(AgentError::InProgress.http_status().as_u16(), 409);
    }
}
