//! Serving the gRPC services on a listener.
//!
//! [`run`], [`run_with_telemetry`] and [`run_with_options`] (TLS, mutual
//! TLS, admin and pod tokens, tenants from client certificates, the bound
//! on pending requests: [`GrpcOptions`]) serve every service, gRPC health
//! and reflection (v1, and v1alpha for older tools) on an already-bound
//! listener, so the binary and the tests share them. Every service sits
//! behind the edge layer and the RPC metrics; the pod-facing ones behind
//! pod authentication too. HTTP/2 is set for many pods per connection
//! (1 024 streams, a 1 MiB connection window, keepalive pings). When
//! `shutdown` completes, health turns NOT_SERVING, the server stops
//! accepting and drains the requests in flight. The store is not closed
//! here: its owner closes it once the server has returned.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tollgate_proto::v1::admin_server::AdminServer;
use tollgate_proto::v1::key_limits_server::KeyLimitsServer;
use tollgate_proto::v1::partition_limits_server::PartitionLimitsServer;
use tollgate_proto::v1::token_bucket_service_server::TokenBucketServiceServer;
use tonic::transport::server::{ServerTlsConfig, TcpIncoming};
use tonic::transport::{Certificate, Identity};

use crate::service::admission;
use crate::service::edge::EdgeLayer;
use crate::service::{
    AdminAuth, AdminService, AdminTokens, Admission, EnvoyRateLimitService, KeyLimitsService, Live,
    PartitionLimitsService, PodAuth, PodGate, PodTokens, TokenBucketService,
};
use crate::store::{self, Store};
use crate::telemetry::health::PROBE_INTERVAL;
use crate::telemetry::rpc::RpcMetricsLayer;
use crate::telemetry::{MetricsError, Telemetry, check_history};
use crate::webhooks::WebhookOptions;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    #[error("set up gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("set up TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("pod tenants from client certificates need mutual TLS (a client CA)")]
    CertificatesWithoutMutualTls,
}

/// TLS on the gRPC port.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The server's certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// The server's private key, PEM.
    pub key_pem: Vec<u8>,
    /// For mutual TLS: the certificate authorities (PEM) that must have
    /// signed the certificate every client presents.
    pub client_ca_pem: Option<Vec<u8>>,
}

/// Serves the pod-facing and operator-facing services, gRPC health and
/// reflection on `listener` until `shutdown` completes, then stops
/// accepting connections and waits for in-flight requests to finish.
///
/// Takes an already-bound listener so tests can bind `127.0.0.1:0`. The store
/// is not closed; its owner does that once `run` returns.
pub async fn run(
    listener: TcpListener,
    store: Arc<dyn Store>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    run_with_telemetry(listener, store, Telemetry::new()?, shutdown).await
}

/// [`run`], counting into `telemetry`, whose metrics and readiness the
/// caller also serves over HTTP ([`crate::telemetry::serve_http`]).
///
/// When `shutdown` completes, health turns NOT_SERVING first, then the
/// server stops accepting and drains.
pub async fn run_with_telemetry(
    listener: TcpListener,
    store: Arc<dyn Store>,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    run_with_options(listener, store, telemetry, GrpcOptions::default(), shutdown).await
}

/// How the gRPC port is secured and how much pod-facing work it admits.
#[derive(Clone, Debug)]
pub struct GrpcOptions {
    /// TLS, or plain gRPC.
    pub tls: Option<ServerTls>,
    /// Tokens the `Admin` service requires, or none (open `Admin`); a
    /// reload replaces what they hold.
    pub admin_tokens: Option<Live<AdminTokens>>,
    /// Tokens pods present, each naming the tenants it may act for; none:
    /// pods are not asked for one ([`crate::service::pod_auth`]).
    pub pod_tokens: Option<Live<PodTokens>>,
    /// Pods may act for the tenants their client certificate names
    /// (`tollgate://tenant/<id>` URIs); needs mutual TLS.
    pub pod_tenants_from_certificates: bool,
    /// Pod-facing requests pending at once; beyond them a request is
    /// refused at once ([`crate::service::admission`]).
    pub max_pending_requests: usize,
    /// Where this server posts budget events, or none (the events wait in
    /// the store for a server that has webhooks).
    pub webhooks: Option<WebhookOptions>,
    /// How often this server samples every bucket's totals into the usage
    /// history ([`store::keep_history`]), or never (other servers of the
    /// store do).
    pub history_interval: Option<Duration>,
}

impl Default for GrpcOptions {
    fn default() -> Self {
        GrpcOptions {
            tls: None,
            admin_tokens: None,
            pod_tokens: None,
            pod_tenants_from_certificates: false,
            max_pending_requests: admission::DEFAULT_MAX_PENDING,
            webhooks: None,
            history_interval: Some(
                tollgate_core::history::HistoryConfig::default().sample_interval,
            ),
        }
    }
}

/// Streams one HTTP/2 connection may carry at once (hyper's default is
/// 200). Pods share connections (a process runs many, a proxy multiplexes
/// more), and a stream waiting at the client for a free slot is a request
/// whose wait the server cannot see or bound; admission bounds the work.
const MAX_CONCURRENT_STREAMS: u32 = 1024;
/// The connection's flow-control window. h2 also bounds the small DATA
/// frames a connection may hold unread to half of it, and closes the
/// connection (GOAWAY, ENHANCE_YOUR_CALM) beyond: a request is one small
/// frame, so the window must cover every stream's (1024 × 256 bytes, twice)
/// or a burst of pods on one connection loses them all.
const CONNECTION_WINDOW: u32 = 1 << 20;
/// Streams a client may reset before the server has taken them up: pods
/// cancel requests that missed their deadline, and under overload many do
/// so at once, which must not cost the connection (h2 answers too many
/// with GOAWAY).
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1024;
/// How often an idle connection is pinged, and how long the answer may
/// take before the connection is dropped: a pod that vanished without
/// closing its connection frees its resources.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// [`run_with_telemetry`], secured as `options` say.
pub async fn run_with_options(
    listener: TcpListener,
    store: Arc<dyn Store>,
    telemetry: Telemetry,
    options: GrpcOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let GrpcOptions {
        tls,
        admin_tokens,
        pod_tokens,
        pod_tenants_from_certificates,
        max_pending_requests,
        webhooks,
        history_interval,
    } = options;
    if pod_tenants_from_certificates && tls.as_ref().is_none_or(|t| t.client_ca_pem.is_none()) {
        return Err(ServeError::CertificatesWithoutMutualTls);
    }
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    if let Some(tls) = &tls {
        let mut config =
            ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
        if let Some(ca) = &tls.client_ca_pem {
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        builder = builder.tls_config(config).map_err(ServeError::Tls)?;
    }
    // For the logs: the address, or why it is not known.
    let local = listener
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    // Envoy's rate limit service is left out: envoy-types ships no
    // descriptor set for it.
    // Both versions of reflection: v1, and v1alpha for the tools that
    // speak nothing else (grpcurl before 1.8.8, grpcui, evans, older
    // Postman).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tollgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    telemetry.health.register().await;
    let probe =
        tokio::spawn(Arc::clone(&telemetry.health).probe(Arc::clone(&store), PROBE_INTERVAL));
    let sweeper = tokio::spawn(store::sweep_idle_keys(
        Arc::clone(&store),
        store::SWEEP_INTERVAL,
        store::SWEEP_BATCH,
    ));
    let pruner = tokio::spawn(store::prune_budget_records(
        Arc::clone(&store),
        store::PRUNE_INTERVAL,
    ));
    let historian = history_interval
        .map(|interval| tokio::spawn(store::keep_history(Arc::clone(&store), interval)));
    // Every server writes the per-key checks it answered: no other knows
    // of them.
    let history_config = store.history_config();
    telemetry
        .metrics
        .count_checks_for_history(history_config.resolutions);
    let check_writer = tokio::spawn(check_history::keep(
        Arc::clone(&store),
        Arc::clone(&telemetry.metrics),
        history_interval.unwrap_or(history_config.sample_interval),
    ));
    let history_store = Arc::clone(&store);
    let deliverer = webhooks.map(|options| {
        tokio::spawn(crate::webhooks::deliver_budget_events(
            Arc::clone(&store),
            options,
            Some(Arc::clone(&telemetry.metrics)),
        ))
    });
    let health = Arc::clone(&telemetry.health);
    let shutdown = async move {
        shutdown.await;
        health.stopping().await;
    };
    tracing::info!(
        address = %local,
        tls = tls.is_some(),
        mutual_tls = tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some()),
        admin_operators = admin_tokens.as_ref().map(|t| t.load().len()),
        pod_tokens = pod_tokens.as_ref().map(|t| t.load().len()),
        pod_tenants_from_certificates,
        max_pending_requests,
        "tollgate server listening"
    );
    // One bound for every pod-facing service: they share the store.
    let admission = Admission::new(max_pending_requests, Some(Arc::clone(&telemetry.metrics)));
    // One check of pod credentials for every pod-facing service.
    let pod_auth = PodAuth::new(pod_tokens, pod_tenants_from_certificates)
        .with_metrics(Arc::clone(&telemetry.metrics));
    // One gate for every pod-facing service: the same store, metrics,
    // bound on pending requests and check of credentials.
    let gate = PodGate::new(Arc::clone(&store))
        .with_metrics(Arc::clone(&telemetry.metrics))
        .with_admission(admission)
        .with_auth(pod_auth.clone());
    // One service for the checks of both APIs.
    let checks = KeyLimitsService::new(gate.clone());
    let served = builder
        .layer(RpcMetricsLayer::new(Arc::clone(&telemetry.metrics)))
        // Inside the metrics layer, so RPCs are counted with the codes the
        // edge corrects.
        .layer(EdgeLayer)
        // Each pod-facing service behind the guard that authenticates its
        // callers before their requests are decoded.
        .add_service(pod_auth.clone().guard(TokenBucketServiceServer::new(
            TokenBucketService::new(gate.clone()),
        )))
        .add_service(pod_auth.clone().guard(KeyLimitsServer::new(checks.clone())))
        .add_service(pod_auth.clone().guard(PartitionLimitsServer::new(
            PartitionLimitsService::new(gate),
        )))
        .add_service(
            pod_auth.guard(RateLimitServiceServer::new(EnvoyRateLimitService::new(
                checks,
            ))),
        )
        .add_service(
            AdminAuth::new(admin_tokens)
                .with_metrics(Arc::clone(&telemetry.metrics))
                .guard(AdminServer::new(
                    AdminService::new(store).with_metrics(Arc::clone(&telemetry.metrics)),
                )),
        )
        .add_service(telemetry.health_service())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        // No Nagle delay: answers are small and latency is what pods wait on.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await;
    // The probe, the sweeper, the pruners and the deliverer hold the store:
    // make sure they are gone before the owner closes or reopens the store.
    // (A delivery cut short leaves its claim to lapse.)
    probe.abort();
    let _ = probe.await;
    sweeper.abort();
    let _ = sweeper.await;
    pruner.abort();
    let _ = pruner.await;
    if let Some(historian) = historian {
        historian.abort();
        let _ = historian.await;
    }
    check_writer.abort();
    let _ = check_writer.await;
    check_history::flush(history_store.as_ref(), &telemetry.metrics).await;
    if let Some(deliverer) = deliverer {
        deliverer.abort();
        let _ = deliverer.await;
    }
    served?;
    tracing::info!(address = %local, "tollgate server stopped");
    Ok(())
}
