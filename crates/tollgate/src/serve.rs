//! `tollgate serve`: the server on the embedded store or PostgreSQL, as its
//! [`ServeConfig`] says.

use std::sync::Arc;

use anyhow::Context;
use tollgate_server::store::Store;

use crate::config::ServeConfig;
use crate::store as location;

pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    config.log_effective();
    let store: Arc<dyn Store> =
        location::open(&config.store, &config.postgres, config.settings.clone()).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listen on {}", config.listen))?;
    tollgate_server::run(listener, Arc::clone(&store), shutdown_signal())
        .await
        .context("serve gRPC")?;
    store.close().await.context("close the store")?;
    Ok(())
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
