//! The HTTP side: `/metrics` for Prometheus, `/healthz` (the process is
//! alive) and `/readyz` (it can reach its store), on a port of their own.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::Telemetry;
use crate::store::Store;

#[derive(Clone)]
struct AppState {
    telemetry: Telemetry,
    store: Arc<dyn Store>,
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until
/// `shutdown` completes.
pub async fn serve_http(
    listener: TcpListener,
    store: Arc<dyn Store>,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    tracing::info!(address = %local, "metrics and health listening over HTTP");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { telemetry, store });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.telemetry.metrics.render(state.store.as_ref()).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

async fn ready(State(state): State<AppState>) -> Response {
    if state.telemetry.health.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the store is unreachable or the server is stopping\n",
        )
            .into_response()
    }
}
