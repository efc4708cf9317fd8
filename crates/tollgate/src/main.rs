//! `tollgate`: runs the server and administers tenants.
//!
//! - `tollgate serve`: the gRPC server on the embedded store or PostgreSQL.
//! - `tollgate migrate`: brings a store's schema up to date.
//! - `tollgate tenant …`: set limits, show, list and delete tenants on a
//!   running server through its `Admin` service.
//! - `tollgate pod request`: one token-bucket request, as a pod would send it.
//! - `tollgate bench`: a load generator: many simulated pods against one or
//!   more servers, with throughput, latency and per-tenant consumption sums.

mod bench;
mod pod;
mod remote;
mod serve;
mod store;
mod tenant;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Tollgate: hierarchical multi-tenant cost control.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(serve::ServeArgs),
    /// Bring a store's schema up to date (the server also does it at start).
    Migrate(store::MigrateArgs),
    /// Configure and inspect tenants on a running server.
    Tenant(tenant::TenantArgs),
    /// Act as a pod against a running server (for trying things out).
    Pod(pod::PodArgs),
    /// Load a running server with simulated pods and measure it.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,tokio_postgres=warn,refinery_core=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::serve(args).await,
            Command::Migrate(args) => store::migrate(args).await,
            Command::Tenant(args) => tenant::run(args).await,
            Command::Pod(args) => pod::run(args).await,
            Command::Bench(args) => bench::run(args).await,
        }
    })
}
