//! Reaching a running server: the `--server` option the client commands
//! share, and how gRPC errors read on a terminal.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tonic::transport::Channel;

#[derive(Debug, Args)]
pub struct ServerArg {
    /// The server's gRPC endpoint.
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
}

impl ServerArg {
    pub async fn connect(&self) -> anyhow::Result<Channel> {
        Channel::from_shared(self.server.clone())
            .with_context(|| format!("invalid --server URL {:?}", self.server))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("connect to {}", self.server))
    }
}

/// Turns a gRPC status into an error that reads well on a terminal.
pub fn rpc_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}
