//! `tollgate check`: one exact per-key check, for scripts and for trying
//! per-key limits out by hand.
//!
//! The exit status is the verdict, so a script can gate on it:
//! 0 allowed (the tokens were taken), [`EXIT_REFUSED`] refused (nothing
//! taken), 1 an error (nothing taken, or, if the server could not be
//! reached to the end, unknown: run again with the same `--request-id`),
//! 2 a usage error.

use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use tollgate_client::{ClientError, KeyCheck, KeyLimiter, KeyLimiterOptions, Verdict};

use crate::output::{self, Table, field, rfc3339};
use crate::remote::{PodTokenArg, ServerArg, rpc_error};

/// The exit status of a refused check.
pub const EXIT_REFUSED: u8 = 3;

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    server: ServerArg,

    #[command(flatten)]
    pod_token: PodTokenArg,

    #[arg(long)]
    tenant: String,
    /// A per-key bucket of the tenant's tier (or an override).
    #[arg(long)]
    bucket: String,
    /// The key: a user id, an API key hash, an IP address.
    #[arg(long)]
    key: String,
    /// Tokens to take; 0 reads the key without taking.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    tokens: f64,
    /// Names this check: running again with the same id (within 10
    /// minutes) prints the first answer and takes nothing again
    /// [default: a random id].
    #[arg(long, value_name = "ID")]
    request_id: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A check's answer, as `--json` prints it.
#[derive(Debug, Serialize)]
struct CheckJson {
    tenant_id: String,
    bucket: String,
    key: String,
    tokens: f64,
    allowed: bool,
    remaining_tokens: f64,
    /// `null`: never (more than the burst, or no refill).
    retry_after_seconds: Option<f64>,
    /// `null`: never (no refill).
    reset_after_seconds: Option<f64>,
    refill_rate: f64,
    burst_limit: f64,
    replayed: bool,
    /// Left of the key's calendar quota in its cycle; `null` without one.
    quota_remaining: Option<f64>,
    /// When the quota's cycle ends (RFC 3339); `null` without one.
    quota_resets_at: Option<String>,
}

impl CheckJson {
    fn new(args: &CheckArgs, verdict: &Verdict) -> anyhow::Result<CheckJson> {
        let item = verdict
            .items
            .first()
            .ok_or_else(|| anyhow::anyhow!("the server answered a check without an item"))?;
        Ok(CheckJson {
            tenant_id: args.tenant.clone(),
            bucket: args.bucket.clone(),
            key: args.key.clone(),
            tokens: args.tokens,
            allowed: verdict.allowed,
            remaining_tokens: item.remaining,
            retry_after_seconds: item.retry_after.map(|d| d.as_secs_f64()),
            reset_after_seconds: item.reset_after.map(|d| d.as_secs_f64()),
            refill_rate: item.refill_rate,
            burst_limit: item.burst_limit,
            replayed: item.replayed,
            quota_remaining: item.quota_remaining,
            quota_resets_at: rfc3339(item.quota_resets_at),
        })
    }

    fn text(&self) -> Table {
        let when = |d: Option<f64>| d.map_or_else(|| "never".to_owned(), |s| format!("{s:.3}s"));
        let mut rows = vec![
            field(
                "allowed",
                if self.allowed {
                    "yes"
                } else {
                    "no: throttled, nothing taken"
                }
                .to_owned(),
            ),
            field("remaining tokens", format!("{:.3}", self.remaining_tokens)),
            field("retry after", when(self.retry_after_seconds)),
            field("full again after", when(self.reset_after_seconds)),
            field(
                "limits",
                format!(
                    "{:.3} tokens/s, burst {:.3}",
                    self.refill_rate, self.burst_limit
                ),
            ),
        ];
        if let (Some(left), Some(at)) = (self.quota_remaining, &self.quota_resets_at) {
            rows.push(field(
                "quota",
                format!("{left:.3} tokens left in the cycle, whole again at {at}"),
            ));
        }
        if self.replayed {
            rows.push(field(
                "replayed",
                "yes: the first answer to this request id".to_owned(),
            ));
        }
        Table::new(rows)
    }
}

pub async fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let options = KeyLimiterOptions {
        pod_token: args.pod_token.token()?,
        ..KeyLimiterOptions::default()
    };
    let limiter = KeyLimiter::from_channel(args.server.connect().await?, options);
    let item = [KeyCheck::new(
        &args.tenant,
        &args.bucket,
        &args.key,
        args.tokens,
    )];
    let verdict = match &args.request_id {
        Some(id) => limiter.check_as(id, &item).await,
        None => limiter.check(&item).await,
    }
    .map_err(|e| match e {
        ClientError::Server { code, message } => rpc_error(tonic::Status::new(code, message)),
        other => anyhow::Error::new(other),
    })?;
    output::print(
        args.json,
        &CheckJson::new(&args, &verdict)?,
        CheckJson::text,
    )?;
    Ok(if verdict.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    })
}
