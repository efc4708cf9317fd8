//! A tower layer that counts and times every gRPC request by method and
//! status code.
//!
//! Tollgate's RPCs are unary: a failed one answers with a trailers-only
//! response whose headers carry `grpc-status`, and a successful one has no
//! status in its headers (it follows in the trailers, always 0). So the
//! headers tell the code, and the time to the headers is the latency.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::Code;
use tower::{Layer, Service};

use super::metrics::Metrics;

/// Wraps a service so that its RPCs are counted in [`Metrics`].
#[derive(Clone, Debug)]
pub struct RpcMetricsLayer {
    metrics: Arc<Metrics>,
}

impl RpcMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        RpcMetricsLayer { metrics }
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// The service [`RpcMetricsLayer`] makes.
#[derive(Clone, Debug)]
pub struct RpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RpcMetrics<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // "/tollgate.v1.Admin/GetTenant" → "GetTenant".
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let started = Instant::now();
        let metrics = Arc::clone(&self.metrics);
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(Code::Ok, Code::from),
                Err(_) => Code::Unknown,
            };
            metrics.observe_rpc(&method, code, started.elapsed());
            result
        })
    }
}
