//! The retry hint an overloaded server sends with a refusal, written and
//! read in one place.
//!
//! A server past its bound on pending requests answers UNAVAILABLE with
//! `grpc-retry-pushback-ms` (gRPC's trailer for a server's pushback) set to
//! the milliseconds a client should wait before it retries.

use std::time::Duration;

use tonic::Status;
use tonic::metadata::{MetadataMap, MetadataValue};

/// The trailer carrying the retry hint, in milliseconds.
pub const PUSHBACK_TRAILER: &str = "grpc-retry-pushback-ms";

/// An UNAVAILABLE status with `message`, asking the client to wait `after`.
pub fn unavailable_with_pushback(message: String, after: Duration) -> Status {
    let mut metadata = MetadataMap::new();
    if let Ok(value) = MetadataValue::try_from(after.as_millis().to_string()) {
        metadata.insert(PUSHBACK_TRAILER, value);
    }
    Status::with_metadata(tonic::Code::Unavailable, message, metadata)
}

/// The retry hint of `status`, if it carries a valid one.
pub fn pushback(status: &Status) -> Option<Duration> {
    let value = status.metadata().get(PUSHBACK_TRAILER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_written_is_read_back() {
        let status = unavailable_with_pushback("busy".into(), Duration::from_millis(250));
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(pushback(&status), Some(Duration::from_millis(250)));
    }

    #[test]
    fn a_status_without_a_valid_hint_has_none() {
        assert_eq!(pushback(&Status::unavailable("down")), None);
        let mut metadata = MetadataMap::new();
        metadata.insert(PUSHBACK_TRAILER, MetadataValue::from_static("soon"));
        let status = Status::with_metadata(tonic::Code::Unavailable, "x", metadata);
        assert_eq!(pushback(&status), None);
    }
}
