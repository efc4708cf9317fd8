//! `tollgate serve`: the server on the embedded store or PostgreSQL, as its
//! [`ServeConfig`] says. At start it logs the configuration, what tenants
//! nobody has configured get, and which store it opened (a file by its
//! absolute path, and whether it was made just now).
//!
//! It binds the gRPC listener and, unless `--metrics-listen off`, the HTTP
//! one (metrics, health, console), serves gRPC with
//! `tollgate_server::run_with_options` until SIGINT or SIGTERM, keeps HTTP
//! up until gRPC has drained, then closes the store. SIGHUP reloads the
//! credentials files.

use std::sync::Arc;

use anyhow::Context;
use std::time::Duration;

use tollgate_server::service::credentials::CredentialsFile;
use tollgate_server::service::{AdminAuth, AdminTokens, PodTokens, Watched};
use tollgate_server::store::Store;
use tollgate_server::telemetry::{Telemetry, serve_http};
use tollgate_server::{GrpcOptions, ServerTls};

use tollgate_core::budget::delivery::Backoff;
use tollgate_server::webhooks::WebhookOptions;

use crate::config::{ServeConfig, TlsFiles, WebhookConfig};
use crate::store as location;

pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    config.log_effective();
    tracing::info!(
        require_configured_tenants = matches!(
            config.settings.unconfigured_tenants,
            tollgate_server::store::UnconfiguredTenants::Reject
        ),
        "{}",
        config.describe_unconfigured_tenants()
    );
    let tls = config.tls.as_ref().map(read_tls).transpose()?;
    let admin_tokens = config
        .admin_tokens_file
        .as_deref()
        .map(Watched::<AdminTokens>::load)
        .transpose()?;
    let pod_tokens = config
        .pod_tokens_file
        .as_deref()
        .map(Watched::<PodTokens>::load)
        .transpose()?;
    let mutual_tls = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    if !config.listen.ip().is_loopback() {
        if admin_tokens.is_none() && !mutual_tls {
            tracing::warn!(
                listen = %config.listen,
                "the Admin service is open to anyone who reaches this address: set --admin-tokens-file or --tls-client-ca"
            );
        }
        if pod_tokens.is_none() && !config.tls_client_tenants {
            tracing::warn!(
                listen = %config.listen,
                "pods may act for any tenant: set --pod-tokens-file or --tls-client-tenants to bind pods to their tenants"
            );
        }
    }
    let admin_live = admin_tokens.as_ref().map(Watched::live);
    // The web console's data goes over plain HTTP: it takes the admin
    // tokens; with client certificates guarding the Admin service and no
    // tokens, nothing could vouch for a reader, so it stays closed.
    let console_auth = match (&admin_live, mutual_tls) {
        (Some(live), _) => AdminAuth::new(Some(Arc::clone(live))),
        (None, true) => {
            tracing::info!(
                "the web console is closed: the Admin service takes client certificates, which plain HTTP cannot check; set --admin-tokens-file to open it"
            );
            AdminAuth::nobody()
        }
        (None, false) => AdminAuth::new(None),
    };
    let pod_live = pod_tokens.as_ref().map(Watched::live);
    let webhooks = config.webhooks.as_ref().map(webhook_options).transpose()?;
    let store: Arc<dyn Store> = location::open(
        &config.store,
        config.store_creation,
        &config.postgres,
        config.settings.clone(),
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listen on {}", config.listen))?;
    let telemetry = Telemetry::new().context("set up metrics")?;
    telemetry
        .metrics
        .set_store_read_interval(config.metrics_store_read_interval);
    // Listened for even without credentials files, so that a SIGHUP (a
    // habit, a config-management tool) never meets the default action,
    // which would end the server.
    let reloads = tokio::spawn(reload_credentials(
        admin_tokens,
        pod_tokens,
        Hangups::listen(),
        config.credentials_reload_interval,
        Arc::clone(&telemetry.metrics),
    ));
    // One signal, two servers: gRPC drains first; the HTTP side (metrics,
    // health) keeps answering until gRPC has stopped.
    let (grpc_done, grpc_stopped) = tokio::sync::watch::channel(false);
    let http = match config.metrics_listen {
        Some(address) => {
            let http_listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("listen for metrics on {address}"))?;
            let mut stopped = grpc_stopped;
            Some(tokio::spawn(serve_http(
                http_listener,
                Arc::clone(&store),
                telemetry.clone(),
                console_auth,
                async move {
                    let _ = stopped.wait_for(|done| *done).await;
                },
            )))
        }
        None => None,
    };
    let served = tollgate_server::run_with_options(
        listener,
        Arc::clone(&store),
        telemetry,
        GrpcOptions {
            tls,
            admin_tokens: admin_live,
            pod_tokens: pod_live,
            pod_tenants_from_certificates: config.tls_client_tenants,
            max_pending_requests: config.max_pending_requests,
            webhooks,
            history_interval: config.history_interval,
        },
        shutdown_signal(),
    )
    .await;
    reloads.abort();
    let _ = grpc_done.send(true);
    if let Some(http) = http {
        match http.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the metrics server failed"),
            Err(e) => tracing::error!(error = %e, "the metrics server panicked"),
        }
    }
    served.context("serve gRPC")?;
    store.close().await.context("close the store")?;
    tracing::info!("store closed; bye");
    Ok(())
}

/// The webhooks' options, their secret read from its file.
fn webhook_options(config: &WebhookConfig) -> anyhow::Result<WebhookOptions> {
    let mut secret = std::fs::read(&config.secret_file).with_context(|| {
        format!(
            "--webhook-secret-file: read {}",
            config.secret_file.display()
        )
    })?;
    while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        secret.pop();
    }
    let options = WebhookOptions::new(config.urls.clone(), secret)
        .with_context(|| format!("--webhook-secret-file {}", config.secret_file.display()))?;
    Ok(WebhookOptions {
        timeout: config.timeout,
        lease: config.lease,
        backoff: Backoff {
            max: config.retry_max,
            ..Backoff::default()
        },
        ..options
    })
}

/// SIGHUP, listened for from the moment this is made: once the server is
/// up, a signal never meets the default action (which ends the process).
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn listen() -> Hangups {
        #[cfg(unix)]
        let signal = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; credentials reload only when their files change");
                None
            }
        };
        Hangups {
            #[cfg(unix)]
            signal,
        }
    }

    /// Completes at the next SIGHUP; never, where there is none.
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = self.signal.as_mut()
            && signal.recv().await.is_some()
        {
            return;
        }
        std::future::pending::<()>().await;
    }
}

/// Reloads the credentials files on SIGHUP, and whenever one has changed
/// (checked every `interval`), until aborted. A file that fails to load
/// leaves its credentials as they were ([`Watched::reload`] logs why).
/// Without files, a SIGHUP is only logged.
async fn reload_credentials(
    admin: Option<Watched<AdminTokens>>,
    pods: Option<Watched<PodTokens>>,
    mut hangups: Hangups,
    interval: Duration,
    metrics: Arc<tollgate_server::telemetry::Metrics>,
) {
    let mut poll = tokio::time::interval(interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    poll.tick().await;
    loop {
        let force = tokio::select! {
            _ = poll.tick() => false,
            () = hangups.recv() => {
                if admin.is_none() && pods.is_none() {
                    tracing::info!("SIGHUP: no credentials files to reload (--admin-tokens-file, --pod-tokens-file); nothing to do");
                } else {
                    tracing::info!("SIGHUP: reloading the credentials files");
                }
                true
            }
        };
        if let Some(admin) = &admin {
            count_reload::<AdminTokens>(&metrics, admin.reload(force));
        }
        if let Some(pods) = &pods {
            count_reload::<PodTokens>(&metrics, pods.reload(force));
        }
    }
}

fn count_reload<T: CredentialsFile>(
    metrics: &tollgate_server::telemetry::Metrics,
    outcome: tollgate_server::service::credentials::Reload,
) {
    use tollgate_server::service::credentials::Reload;
    match outcome {
        Reload::Unchanged => {}
        Reload::Replaced(_) => metrics.observe_credentials_reload(T::OPTION, true),
        Reload::Failed(_) => metrics.observe_credentials_reload(T::OPTION, false),
    }
}

/// Reads the gRPC port's TLS files.
fn read_tls(files: &TlsFiles) -> anyhow::Result<ServerTls> {
    let read = |path: &std::path::Path, option: &str| {
        std::fs::read(path).with_context(|| format!("--{option}: read {}", path.display()))
    };
    Ok(ServerTls {
        cert_pem: read(&files.cert, "tls-cert")?,
        key_pem: read(&files.key, "tls-key")?,
        client_ca_pem: files
            .client_ca
            .as_deref()
            .map(|path| read(path, "tls-client-ca"))
            .transpose()?,
    })
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested; draining in-flight requests");
}
