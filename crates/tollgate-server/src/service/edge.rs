//! What happens to a call before and around our handlers, held to the gRPC
//! contract.
//!
//! tonic decodes a request before a handler sees it, and answers what it
//! cannot decode itself, with codes meant for a server's own failures:
//! INTERNAL for bytes that are not the message (invalid UTF-8, a truncated
//! varint, a wrong wire type, a missing message) and OUT_OF_RANGE for a
//! message over the size limit. Those are the client's doing, and INTERNAL
//! is what alerts treat as our bug, so [`EdgeLayer`] turns them into
//! INVALID_ARGUMENT and RESOURCE_EXHAUSTED (gRPC's code for a message too
//! large). It tells tonic's answers from our handlers' by a flag each
//! handler raises when it starts ([`enter`]): an INTERNAL from a handler
//! is ours and stays INTERNAL.
//!
//! tonic also enforces the caller's deadline (`grpc-timeout`) by dropping
//! the handler and answering CANCELLED. [`EdgeLayer`] enforces the same
//! deadline a moment earlier and answers DEADLINE_EXCEEDED, the code gRPC
//! defines for it. The handler's future is dropped either way; the stores
//! do not start an operation whose caller has gone, so a request whose
//! deadline passed before a store took it up is never applied.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::{Code, Status};
use tower::{Layer, Service};

/// Raised by a handler when it starts: the request was decoded.
#[derive(Clone, Debug, Default)]
pub struct Reached(Arc<AtomicBool>);

/// When the caller stops waiting, from its `grpc-timeout`.
#[derive(Clone, Copy, Debug)]
struct Deadline(tokio::time::Instant);

/// What every handler of ours calls first. It marks `request` as having
/// reached its handler (decoded), and refuses it if the caller's deadline
/// has already passed, so that it is never started: the answer is
/// DEADLINE_EXCEEDED either way, and a request not started is certainly
/// not applied.
pub fn enter<T>(request: &tonic::Request<T>) -> Result<(), Status> {
    if let Some(Reached(flag)) = request.extensions().get::<Reached>() {
        flag.store(true, Ordering::Relaxed);
    }
    match request.extensions().get::<Deadline>() {
        Some(Deadline(at)) if *at <= tokio::time::Instant::now() => Err(deadline_exceeded()),
        _ => Ok(()),
    }
}

/// Wraps the gRPC services; see the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct EdgeLayer;

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Edge { inner }
    }
}

/// The service [`EdgeLayer`] makes.
#[derive(Clone, Debug)]
pub struct Edge<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Edge<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let reached = Reached::default();
        request.extensions_mut().insert(reached.clone());
        // Started before tonic starts its own timer for the same deadline,
        // and polled before it (tonic polls the service first), so this
        // one answers.
        let timeout = grpc_timeout(request.headers());
        let deadline = timeout.map(tokio::time::sleep);
        if let Some(deadline) = &deadline {
            request
                .extensions_mut()
                .insert(Deadline(deadline.deadline()));
        }
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = match deadline {
                None => response.await,
                Some(deadline) => {
                    tokio::select! {
                        biased;
                        result = response => result,
                        () = deadline => return Ok(deadline_exceeded().into_http()),
                    }
                }
            };
            Ok(correct(result?, reached.0.load(Ordering::Relaxed)))
        })
    }
}

fn deadline_exceeded() -> Status {
    Status::deadline_exceeded(
        "the call's deadline passed before it was answered; the request may or may not have \
         been applied: retry it with the same identity to learn its answer",
    )
}

/// A trailers-only error answered before any handler ran, with the code
/// the gRPC contract gives it.
fn correct<B>(mut response: http::Response<B>, reached: bool) -> http::Response<B> {
    if reached {
        return response;
    }
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    let corrected = match status.code() {
        Code::Internal => Status::invalid_argument(format!(
            "the request is not a valid message of this method: {}",
            status.message()
        )),
        Code::OutOfRange => Status::resource_exhausted(status.message()),
        _ => return response,
    };
    if corrected.add_header(response.headers_mut()).is_err() {
        // The message could not be encoded as a header; keep tonic's answer.
        tracing::debug!(code = ?status.code(), "could not rewrite a decoding error");
    }
    response
}

/// The caller's deadline from `grpc-timeout`: at most 8 digits and a unit
/// (H, M, S, m, u, n), as gRPC over HTTP/2 defines it; `None` if absent or
/// malformed (as tonic, which then applies none either).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "grpc-timeout",
            http::HeaderValue::from_str(value).expect("header"),
        );
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_defines_them() {
        assert_eq!(timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "S", "123456789S", "5s", "-5S", "+5S", "5.0S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn decoding_errors_before_a_handler_get_the_clients_codes() {
        let internal = Status::internal("failed to decode Protobuf message").into_http::<()>();
        let corrected = correct(internal, false);
        let status = Status::from_header_map(corrected.headers()).expect("status");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("failed to decode"));

        let too_large = Status::out_of_range("decoded message length too large").into_http::<()>();
        let status = Status::from_header_map(correct(too_large, false).headers()).expect("status");
        assert_eq!(status.code(), Code::ResourceExhausted);

        // A handler's INTERNAL is ours and stays so.
        let ours = Status::internal("store failed").into_http::<()>();
        let status = Status::from_header_map(correct(ours, true).headers()).expect("status");
        assert_eq!(status.code(), Code::Internal);
    }
}
