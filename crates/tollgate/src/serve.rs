//! `tollgate serve`: the server on the embedded store or PostgreSQL.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tollgate_core::global_bucket::GlobalBucketConfig;
use tollgate_core::validate::{self, MAX_TOKENS};
use tollgate_core::{GrantPolicy, Limits};
use tollgate_server::store::{
    BucketSettings, DefaultLimits, EmbeddedStore, Store, UnconfiguredTenants,
};

use crate::store::{self as location, PostgresArgs, StoreLocation};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve gRPC on.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,

    /// Where state is kept: a PostgreSQL URL (`postgres://user@host/db`,
    /// migrated at start) or an embedded store file (created if missing)
    /// [default: $DATABASE_URL, else tollgate.redb].
    #[arg(long, env = "TOLLGATE_STORE", conflicts_with = "in_memory")]
    store: Option<String>,

    #[command(flatten)]
    postgres: PostgresArgs,

    /// Keep all state in memory (lost when the server stops).
    #[arg(long)]
    in_memory: bool,

    /// Refill rate (tokens/s) of tenants nobody has configured.
    #[arg(long, default_value_t = 1000.0)]
    default_refill_rate: f64,

    /// Burst limit (tokens) of tenants nobody has configured.
    #[arg(long, default_value_t = 10000.0)]
    default_burst_limit: f64,

    /// Tokens a tenant nobody has configured starts with [default: the default burst limit].
    #[arg(long)]
    default_initial_tokens: Option<f64>,

    /// Refuse pod requests (NOT_FOUND) for tenants nobody has configured,
    /// instead of serving them with the default limits.
    #[arg(long)]
    require_configured_tenants: bool,

    /// How tokens are handed out when a bucket cannot grant at once.
    #[arg(long, value_enum, default_value_t = Policy::Shares)]
    grant_policy: Policy,

    /// Instances silent longer than this are removed and their shares dropped.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    inactivity_timeout: Duration,

    /// Instances a live pod reports dead are removed once silent this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    reported_dead_timeout: Duration,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Policy {
    /// Each pod gets its shares' fraction of the refill rate.
    Shares,
    /// The bucket level's moving average limits each grant (shares ignored).
    BucketLevelEma,
    /// First come, first served from what the bucket holds; a baseline for
    /// comparison, not for production.
    Greedy,
}

impl ServeArgs {
    fn settings(&self) -> anyhow::Result<BucketSettings> {
        let limits = Limits {
            refill_rate: self.default_refill_rate,
            burst_limit: self.default_burst_limit,
        };
        limits
            .validate()
            .map_err(|e| anyhow::anyhow!("--default-{}", e.to_string().replace('_', "-")))?;
        let initial_tokens = self.default_initial_tokens.unwrap_or(limits.burst_limit);
        validate::non_negative("--default-initial-tokens", initial_tokens, MAX_TOKENS)?;
        if self.inactivity_timeout.is_zero() {
            anyhow::bail!("--inactivity-timeout: must be more than zero");
        }
        let unconfigured_tenants = if self.require_configured_tenants {
            UnconfiguredTenants::Reject
        } else {
            UnconfiguredTenants::UseDefaults(DefaultLimits {
                limits,
                initial_tokens,
            })
        };
        Ok(BucketSettings {
            bucket: GlobalBucketConfig {
                policy: match self.grant_policy {
                    Policy::Shares => GrantPolicy::Shares,
                    Policy::BucketLevelEma => GrantPolicy::BucketLevelEma,
                    Policy::Greedy => GrantPolicy::Greedy,
                },
                inactivity_timeout: self.inactivity_timeout,
                reported_dead_timeout: self.reported_dead_timeout,
                ..GlobalBucketConfig::default()
            },
            unconfigured_tenants,
        })
    }
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let store: Arc<dyn Store> = if args.in_memory {
        tracing::warn!("in-memory store: all state is lost when the server stops");
        Arc::new(EmbeddedStore::in_memory(settings)?)
    } else {
        let store = StoreLocation::resolve(args.store.as_deref());
        location::open(&store, &args.postgres, settings).await?
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
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
