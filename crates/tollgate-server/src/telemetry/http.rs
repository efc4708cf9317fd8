//! The HTTP side: `/metrics` for Prometheus, `/healthz` (the process is
//! alive), `/readyz` (it can reach its store) and the web console
//! (`/console`, its data at `/console/api/buckets`), on a port of their own.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::Telemetry;
use crate::service::AdminAuth;
use crate::store::Store;

/// The console page: one static file, its script inline.
const CONSOLE_PAGE: &str = include_str!("console.html");

#[derive(Clone)]
struct AppState {
    telemetry: Telemetry,
    store: Arc<dyn Store>,
    admin: AdminAuth,
}

/// Serves `/metrics`, `/healthz`, `/readyz` and the console on `listener`
/// until `shutdown` completes. The console's data needs what `admin`
/// requires of a call of `ListTenants` (an admin token of any role, where
/// tokens are configured).
pub async fn serve_http(
    listener: TcpListener,
    store: Arc<dyn Store>,
    telemetry: Telemetry,
    admin: AdminAuth,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    tracing::info!(address = %local, "metrics and health listening over HTTP");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(|| async { Html(CONSOLE_PAGE) }))
        .route("/console/api/buckets", get(console_buckets))
        .with_state(AppState {
            telemetry,
            store,
            admin,
        });
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

async fn console_buckets(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(status) = state.admin.check_reader(&headers) {
        let code = match status.code() {
            tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        };
        return (code, format!("{}\n", status.message())).into_response();
    }
    match state
        .telemetry
        .console
        .view(state.store.as_ref(), &state.telemetry.metrics)
        .await
    {
        Ok(view) => ([(header::CACHE_CONTROL, "no-store")], axum::Json(view)).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "console: cannot read the store");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the store: {e}\n"),
            )
                .into_response()
        }
    }
}
