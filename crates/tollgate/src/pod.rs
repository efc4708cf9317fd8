//! `tollgate pod request`: sends one token-bucket request as a pod would.
//!
//! Meant for checking a deployment end to end and for trying limits out by
//! hand; real pods embed the client library instead. Each run is a new pod
//! incarnation: a fresh lease with sequence number 1.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, Subcommand};
use tollgate_proto::v1::{self, token_bucket_service_client::TokenBucketServiceClient};

use crate::remote::{ServerArg, rpc_error};

#[derive(Debug, Args)]
pub struct PodArgs {
    #[command(flatten)]
    server: ServerArg,

    #[command(subcommand)]
    command: PodCommand,
}

#[derive(Debug, Subcommand)]
enum PodCommand {
    /// Request tokens and report consumption once, then print the grant.
    Request(RequestArgs),
}

#[derive(Debug, Args)]
struct RequestArgs {
    #[arg(long)]
    tenant: String,
    /// The pod's instance id (>= 1).
    #[arg(long, default_value_t = 1)]
    instance: u32,
    /// Tokens to request.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    tokens: f64,
    /// The pod's shares.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    shares: f64,
    /// Request units to report as consumed.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    report_ru: f64,
}

pub async fn run(args: PodArgs) -> anyhow::Result<()> {
    let PodCommand::Request(a) = args.command;
    let channel = args.server.connect().await?;
    let lease = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| format!("cli-{}-{}", std::process::id(), d.as_nanos()))
        .context("read the system clock")?;
    let grant = TokenBucketServiceClient::new(channel)
        .token_bucket(v1::TokenBucketRequest {
            tenant_id: a.tenant,
            bucket: String::new(),
            instance_id: a.instance,
            instance_lease: lease.into_bytes(),
            seq: 1,
            requested_tokens: a.tokens,
            shares: a.shares,
            target_request_period: None,
            consumption_since_last_request: Some(v1::Consumption {
                request_units: a.report_ru,
                ..v1::Consumption::default()
            }),
            next_live_instance_id: None,
            returned_tokens: 0.0,
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    let trickle = crate::output::seconds(grant.trickle_duration);
    println!("granted tokens    {:.3}", grant.granted_tokens);
    println!("trickle duration  {trickle:.3}s");
    println!("max burst tokens  {:.3}", grant.max_burst_tokens);
    println!("fallback rate     {:.3} tokens/s", grant.fallback_rate);
    Ok(())
}
