//! `tollgate serve`: the server on the embedded store or PostgreSQL, as its
//! [`ServeConfig`] says.

use std::sync::Arc;

use anyhow::Context;
use tollgate_server::service::AdminTokens;
use tollgate_server::store::Store;
use tollgate_server::telemetry::{Telemetry, serve_http};
use tollgate_server::{GrpcOptions, ServerTls};

use crate::config::{ServeConfig, TlsFiles};
use crate::store as location;

pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    config.log_effective();
    let tls = config.tls.as_ref().map(read_tls).transpose()?;
    let admin_tokens = config
        .admin_tokens_file
        .as_deref()
        .map(read_admin_tokens)
        .transpose()?;
    if admin_tokens.is_none()
        && config.tls.as_ref().is_none_or(|t| t.client_ca.is_none())
        && !config.listen.ip().is_loopback()
    {
        tracing::warn!(
            listen = %config.listen,
            "the Admin service is open to anyone who reaches this address: set --admin-tokens-file or --tls-client-ca"
        );
    }
    let store: Arc<dyn Store> =
        location::open(&config.store, &config.postgres, config.settings.clone()).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listen on {}", config.listen))?;
    let telemetry = Telemetry::new().context("set up metrics")?;
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
            admin_tokens,
            max_pending_requests: config.max_pending_requests,
        },
        shutdown_signal(),
    )
    .await;
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

/// Reads and checks the `Admin` tokens file.
fn read_admin_tokens(path: &std::path::Path) -> anyhow::Result<AdminTokens> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--admin-tokens-file: read {}", path.display()))?;
    AdminTokens::parse(&text).with_context(|| format!("--admin-tokens-file: {}", path.display()))
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
async fn shutdown_signal() {
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
