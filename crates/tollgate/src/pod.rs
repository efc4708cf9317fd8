//! `tollgate pod request`: sends one token-bucket request as a pod would.
//!
//! Meant for checking a deployment end to end and for trying limits out by
//! hand; real pods embed the client library instead. Each run is a new pod
//! incarnation: a fresh lease with sequence number 1.
//!
//! It says whether the pod was throttled: granted fewer tokens than it asked
//! for, or given its tokens over a trickle rather than at once. The text
//! rounds amounts and shows the trickle's fields only for a trickle grant;
//! `--json` has every field, exact. The request goes to `--bucket NAME`,
//! else the request-unit bucket.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;
use tollgate_proto::v1::{self, token_bucket_service_client::TokenBucketServiceClient};

use crate::output::{self, Table, amount, field, seconds};
use crate::remote::{PodTokenArg, ServerArg, rpc_error};

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
    #[command(flatten)]
    pod_token: PodTokenArg,

    #[arg(long)]
    tenant: String,
    /// The tenant's bucket (a rate-limited action); empty for its
    /// request-unit bucket.
    #[arg(long, default_value = "")]
    bucket: String,
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
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A grant, with what was asked for, as `--json` prints it.
#[derive(Debug, Serialize)]
struct GrantJson {
    tenant_id: String,
    bucket: String,
    instance_id: u32,
    requested_tokens: f64,
    granted_tokens: f64,
    /// 0: the tokens may be used at once; otherwise they arrive evenly over
    /// this many seconds.
    trickle_duration_seconds: f64,
    max_burst_tokens: f64,
    /// Tokens per second the pod may use on its own while the server is
    /// unreachable.
    fallback_rate: f64,
    /// Fewer tokens granted than requested, or granted over a trickle.
    throttled: bool,
}

impl GrantJson {
    fn new(request: &RequestArgs, grant: &v1::TokenBucketResponse) -> Self {
        let trickle = seconds(grant.trickle_duration);
        GrantJson {
            tenant_id: request.tenant.clone(),
            bucket: request.bucket.clone(),
            instance_id: request.instance,
            requested_tokens: request.tokens,
            granted_tokens: grant.granted_tokens,
            trickle_duration_seconds: trickle,
            max_burst_tokens: grant.max_burst_tokens,
            fallback_rate: grant.fallback_rate,
            throttled: grant.granted_tokens < request.tokens || trickle > 0.0,
        }
    }

    /// `no`, or `yes:` and how.
    fn throttle_note(&self) -> String {
        if !self.throttled {
            return "no".to_owned();
        }
        let mut how = Vec::new();
        if self.granted_tokens < self.requested_tokens {
            how.push(format!(
                "granted {} of {} tokens",
                amount(self.granted_tokens),
                amount(self.requested_tokens)
            ));
        }
        if self.trickle_duration_seconds > 0.0 {
            how.push(format!(
                "tokens arrive over {} s",
                amount(self.trickle_duration_seconds)
            ));
        }
        format!("yes: {}", how.join(", "))
    }

    /// The grant for people: amounts rounded ([`amount`]), and the
    /// trickle's duration and burst cap only for a trickle grant (the
    /// server sends zeros otherwise).
    fn text(&self) -> Table {
        let mut rows = vec![
            field("throttled", self.throttle_note()),
            field("requested tokens", amount(self.requested_tokens)),
            field("granted tokens", amount(self.granted_tokens)),
        ];
        if self.trickle_duration_seconds > 0.0 {
            rows.push(field(
                "trickle duration",
                format!("{} s", amount(self.trickle_duration_seconds)),
            ));
            rows.push(field("max burst tokens", amount(self.max_burst_tokens)));
        }
        rows.push(field(
            "fallback rate",
            format!("{} tokens/s", amount(self.fallback_rate)),
        ));
        Table::new(rows)
    }
}

/// The lease of a run started `started` after the Unix epoch by process
/// `pid`. Leases are compared as byte strings and each run must hold a
/// greater one than the runs before it, so the start time leads, in a fixed
/// number of digits (20: enough until the year 5138); the process id only
/// tells apart runs started in the same nanosecond.
fn lease(started: Duration, pid: u32) -> String {
    format!("cli-{:020}-{pid}", started.as_nanos())
}

pub async fn run(args: PodArgs) -> anyhow::Result<()> {
    let PodCommand::Request(a) = args.command;
    let channel = args.server.connect().await?;
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("read the system clock")?;
    let lease = lease(started, std::process::id());
    let token = a.pod_token.token()?;
    let mut call = tonic::Request::new(v1::TokenBucketRequest {
        tenant_id: a.tenant.clone(),
        bucket: a.bucket.clone(),
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
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: None,
    });
    if let Some(token) = &token {
        token.attach(&mut call);
    }
    let grant = TokenBucketServiceClient::new(channel)
        .token_bucket(call)
        .await
        .map_err(rpc_error)?
        .into_inner();
    output::print(a.json, &GrantJson::new(&a, &grant), GrantJson::text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_run_holds_a_greater_lease_whatever_its_process_id() {
        let earlier = lease(Duration::from_secs(9), 32_767);
        let later = lease(Duration::from_secs(10), 300);
        assert!(
            later.as_bytes() > earlier.as_bytes(),
            "{later} vs {earlier}"
        );
        let now = Duration::from_nanos(1_767_322_045_678_000_000);
        assert!(lease(now + Duration::from_nanos(1), 1) > lease(now, 1_000_000));
    }
}
