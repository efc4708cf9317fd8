//! Serving an agent: gRPC and HTTP/JSON on each listener, and the
//! graceful shutdown that leaves nothing unreported.
//!
//! Each listener (the Unix socket, the loopback TCP port) serves one axum
//! router: the `Agent` gRPC service, gRPC health and reflection (listing
//! only the agent's own service and health), and the JSON routes, metrics
//! and health of [`crate::http`]. HTTP/1.1 and HTTP/2 (gRPC's prior
//! knowledge) share the port. Every request is marked with the
//! [`Listener`] it came through, which decides the caller's access rules.
//! The Envoy listener, if any, serves Envoy's rate limit service (and
//! health) alone; its callers are TCP callers.
//!
//! When `shutdown` completes:
//!
//! 1. `/readyz` and gRPC health turn not serving, the listeners stop
//!    accepting (HTTP/2 connections get a GOAWAY), and every call still
//!    waiting, or arriving on an open connection, is answered UNAVAILABLE
//!    ("agent shutting down"), its tokens left in the bucket;
//! 2. once the connections are done (or after [`DRAIN_TIMEOUT`]), every
//!    tenant's controller shuts down: each bucket's final report carries
//!    its consumption and gives back the tokens it holds;
//! 3. one line per tenant says whether everything was reported.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tollgate_proto::agent::v1::agent_server::AgentServer;

use crate::access::Listener;
use crate::envoy::EnvoyService;
use crate::grpc::AgentService;
use crate::tenants::TenantReport;
use crate::{Agent, SetupError};

/// How long connections may take to finish their calls once shutdown has
/// begun; past it they are cut, and the buckets are shut down anyway.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the time buckets spend on their fallback rate is sampled.
const FALLBACK_SAMPLE: Duration = Duration::from_secs(1);

/// The listeners an agent serves, already bound.
#[derive(Debug, Default)]
pub struct Listeners {
    pub socket: Option<UnixListener>,
    /// Loopback only (checked by the caller, [`crate::listen::check_loopback`]).
    pub tcp: Option<TcpListener>,
    /// Envoy's rate limit service ([`crate::envoy`]); its callers are TCP
    /// callers.
    pub envoy: Option<TcpListener>,
}

/// The router of one listener: gRPC, JSON, metrics and health, every
/// request marked with `listener`.
pub fn router(
    agent: &Agent,
    listener: Listener,
    ready: watch::Receiver<bool>,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Result<Router, SetupError> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tollgate_proto::AGENT_FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(tollgate_proto::agent::v1::agent_server::SERVICE_NAME)
            .with_service_name("grpc.health.v1.Health")
    };
    let grpc = tonic::service::Routes::new(AgentServer::new(AgentService::new(agent.clone())))
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .into_axum_router();
    Ok(grpc
        .merge(crate::http::routes(agent.clone(), ready))
        .fallback(not_found)
        .layer(axum::Extension(listener)))
}

/// The router of the Envoy listener: `ShouldRateLimit` and gRPC health.
pub fn envoy_router(
    agent: &Agent,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Router {
    tonic::service::Routes::new(RateLimitServiceServer::new(EnvoyService::new(
        agent.clone(),
    )))
    .add_service(health)
    .into_axum_router()
    .layer(axum::Extension(Listener::Tcp))
}

/// A path nobody serves: a gRPC caller gets UNIMPLEMENTED, anyone else a
/// JSON 404.
async fn not_found(request: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        let status = tonic::Status::unimplemented(format!("no method {}", request.uri().path()));
        return status.into_http::<axum::body::Body>().into_response();
    }
    let body = serde_json::json!({
        "error": {
            "code": "NOT_FOUND",
            "message": format!("no such path: {} {}", request.method(), request.uri().path()),
        }
    });
    (http::StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// Serves `agent` on `listeners` until `shutdown` completes, then shuts
/// down as the module docs say. Returns what each tenant's shutdown
/// achieved.
pub async fn run(
    agent: Agent,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Vec<TenantReport>, SetupError> {
    let (ready_tx, ready) = watch::channel(false);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgentServer<AgentService>>()
        .await;
    let (stop_tx, stop) = watch::channel(false);
    let stopped = |mut stop: watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let mut servers = JoinSet::new();
    if let Some(socket) = listeners.socket {
        let app = router(&agent, Listener::Socket, ready.clone(), health.clone())?;
        let serve = axum::serve(socket, app).with_graceful_shutdown(stopped(stop.clone()));
        servers.spawn(async move { ("socket", serve.await) });
    }
    if let Some(tcp) = listeners.tcp {
        let app = router(&agent, Listener::Tcp, ready.clone(), health.clone())?;
        let serve = axum::serve(tcp, app).with_graceful_shutdown(stopped(stop.clone()));
        servers.spawn(async move { ("tcp", serve.await) });
    }
    if let Some(envoy) = listeners.envoy {
        let app = envoy_router(&agent, health.clone());
        let serve = axum::serve(envoy, app).with_graceful_shutdown(stopped(stop.clone()));
        servers.spawn(async move { ("envoy", serve.await) });
    }
    ready_tx.send_replace(true);
    let sampler = tokio::spawn(sample_fallback(agent.clone()));
    // What a killed predecessor owed the server, paid before this
    // incarnation's requests for the same buckets go out.
    let settling = {
        let agent = agent.clone();
        tokio::spawn(async move { agent.settle_orphans().await })
    };

    // Until asked to stop, or until a listener fails.
    let failed = tokio::select! {
        () = shutdown => None,
        Some(ended) = servers.join_next() => Some(ended),
    };
    match failed {
        None => tracing::info!("shutting down: answering waiting calls UNAVAILABLE"),
        Some(Ok((listener, Ok(())))) => {
            tracing::error!(listener, "a listener stopped on its own; shutting down");
        }
        Some(Ok((listener, Err(e)))) => {
            tracing::error!(listener, error = %e, "a listener failed; shutting down");
        }
        Some(Err(e)) => tracing::error!(error = %e, "a listener's task failed; shutting down"),
    }
    ready_tx.send_replace(false);
    health_reporter
        .set_not_serving::<AgentServer<AgentService>>()
        .await;
    agent.begin_shutdown();
    stop_tx.send_replace(true);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(ended) = servers.join_next().await {
            if let Ok((listener, Err(e))) = ended {
                tracing::error!(listener, error = %e, "a listener failed while draining");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            timeout = ?DRAIN_TIMEOUT,
            "connections still open after the drain timeout: cutting them"
        );
        servers.abort_all();
    }
    sampler.abort();
    if !settling.is_finished() {
        settling.abort();
        if let Some(journal) = agent.journal() {
            tracing::warn!(
                orphans = journal.orphans_left(),
                "reports an earlier incarnation owed are not settled yet: the journal keeps them for the next start"
            );
        }
    }

    let reports = agent.tenants().shutdown().await;
    for TenantReport { tenant, report } in &reports {
        let buckets: Vec<&str> = report.buckets.iter().map(|b| b.bucket.as_str()).collect();
        let charged: f64 = report.buckets.iter().map(|b| b.status.charged_tokens).sum();
        let unreported: Vec<&str> = report
            .buckets
            .iter()
            .filter(|b| !b.consumption_reported)
            .map(|b| b.bucket.as_str())
            .collect();
        if report.consumption_reported {
            tracing::info!(
                tenant = tenant.as_str(),
                buckets = ?buckets,
                charged_tokens = charged,
                "tenant shut down: every bucket's consumption reported"
            );
        } else {
            tracing::warn!(
                tenant = tenant.as_str(),
                buckets = ?buckets,
                not_reported = ?unreported,
                charged_tokens = charged,
                "tenant shut down: some buckets' final reports did not reach the server"
            );
        }
    }
    Ok(reports)
}

/// Adds the time each bucket spends on its fallback rate to its metric,
/// sampled every [`FALLBACK_SAMPLE`], until aborted.
async fn sample_fallback(agent: Agent) {
    let mut ticks = tokio::time::interval(FALLBACK_SAMPLE);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = tokio::time::Instant::now();
    loop {
        ticks.tick().await;
        let now = tokio::time::Instant::now();
        let elapsed = now.duration_since(last).as_secs_f64();
        last = now;
        for (tenant, bucket, status) in agent.tenants().statuses() {
            if status.fallback_active {
                agent
                    .metrics()
                    .on_fallback(tenant.as_str(), bucket.as_str(), elapsed);
            }
        }
    }
}
