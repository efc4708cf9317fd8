//! `tollgate bench --checks`: load on the `KeyLimits/Check` RPC.
//!
//! Each simulated pod is a caller (a gateway worker, say) checking one
//! token of one key per call, closed loop or on the open-loop schedule the
//! token-bucket bench uses. Keys are drawn from `--keys` distinct keys per
//! tenant, a `--hot-fraction` of the calls going to the first `--hot-keys`
//! of them: most of the table is cold (each key seen now and then, its row
//! soon idle), a few keys are hot (refused once they run dry). The bench
//! first puts a tier with one per-key bucket (`per-key`, `--key-rate`,
//! `--key-burst`) and its tenants on it.
//!
//! Every answer is counted: allowed, refused, errors by gRPC code. The
//! keys the store still holds once the load stops are read from the
//! server's `tollgate_stored_keys` metric (not through this command).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::task::JoinSet;
use tollgate_proto::v1::{self, admin_client::AdminClient, key_limits_client::KeyLimitsClient};
use tonic::transport::Channel;

use super::report::{Latency, codes, plural};
use super::{Plan, RunContext};
use crate::output::{Table, field};

/// The per-key bucket the bench defines and checks.
pub(super) const BUCKET: &str = "per-key";

/// What the callers ask for; validated.
#[derive(Debug, Clone, Copy)]
pub(super) struct CheckMix {
    pub keys: u64,
    pub hot_keys: u64,
    pub hot_fraction: f64,
    pub key_rate: f64,
    pub key_burst: f64,
    /// Tokens per key per month, if keys have a quota.
    pub key_quota: Option<f64>,
    pub request_ids: bool,
}

impl CheckMix {
    pub fn new(
        keys: u64,
        hot_keys: u64,
        hot_fraction: f64,
        key_rate: f64,
        key_burst: f64,
        key_quota: Option<f64>,
        request_ids: bool,
    ) -> anyhow::Result<CheckMix> {
        if keys == 0 {
            bail!("--keys: must be at least 1");
        }
        if hot_keys == 0 || hot_keys > keys {
            bail!("--hot-keys: must be between 1 and --keys ({keys}), got {hot_keys}");
        }
        let hot_fraction = super::fraction("--hot-fraction", hot_fraction)?;
        let limits = tollgate_core::Limits {
            refill_rate: key_rate,
            burst_limit: key_burst,
        };
        limits
            .validate()
            .map_err(|e| anyhow::anyhow!("--key-rate / --key-burst: {e}"))?;
        if let Some(amount) = key_quota {
            monthly_quota(amount)
                .validate()
                .map_err(|e| anyhow::anyhow!("--key-quota: {}", e.reason))?;
        }
        Ok(CheckMix {
            keys,
            hot_keys,
            hot_fraction,
            key_rate,
            key_burst,
            key_quota,
            request_ids,
        })
    }
}

/// `amount` tokens a month, from the 1st, UTC.
fn monthly_quota(amount: f64) -> tollgate_core::budget::Quota {
    tollgate_core::budget::Quota {
        amount,
        cycle: tollgate_core::budget::CycleRule::utc(tollgate_core::budget::Period::Monthly {
            anchor_day: 1,
        }),
    }
}

/// One caller's counts.
#[derive(Debug, Default)]
struct CallerReport {
    measured_allowed: u64,
    measured_refused: u64,
    allowed: u64,
    refused: u64,
    errors: super::Errors,
}

/// Defines the tier and puts the tenants on it (again, if they exist).
pub(super) async fn prepare(
    plan: &Plan,
    mix: &CheckMix,
    channel: &Channel,
    token: Option<&str>,
) -> anyhow::Result<()> {
    let mut admin =
        AdminClient::with_interceptor(channel.clone(), crate::remote::BearerToken::new(token)?);
    let tier = format!("{}-checks", plan.tenant_prefix);
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: tier.clone(),
                buckets: vec![v1::BucketDefinition {
                    bucket: BUCKET.into(),
                    refill_rate: mix.key_rate,
                    burst_limit: mix.key_burst,
                    initial_tokens: None,
                    kind: v1::BucketKind::PerKey as i32,
                    quota: mix.key_quota.map(|amount| {
                        tollgate_server::service::quota_to_proto(&monthly_quota(amount))
                    }),
                    enforce: None,
                }],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await
        .map_err(crate::remote::rpc_error)
        .with_context(|| format!("define tier {tier:?}"))?;
    for tenant in &plan.tenants {
        let created = admin
            .create_tenant(v1::CreateTenantRequest {
                tenant_id: tenant.clone(),
                tier: tier.clone(),
            })
            .await;
        match created {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                admin
                    .set_tenant_tier(v1::SetTenantTierRequest {
                        tenant_id: tenant.clone(),
                        tier: tier.clone(),
                        dry_run: false,
                    })
                    .await
                    .map_err(crate::remote::rpc_error)
                    .with_context(|| format!("put tenant {tenant:?} on tier {tier:?}"))?;
            }
            Err(status) => {
                return Err(crate::remote::rpc_error(status))
                    .with_context(|| format!("create tenant {tenant:?}"));
            }
        }
    }
    Ok(())
}

/// Runs the callers; answers the report.
pub(super) async fn run(
    plan: &Plan,
    mix: CheckMix,
    channels: &[Vec<Channel>],
    context: Arc<RunContext>,
    progress: &mut super::Progress,
) -> anyhow::Result<CheckReport> {
    let mut callers = JoinSet::new();
    let per_tenant = plan.instances_per_tenant as usize;
    for index in 0..plan.pods {
        let server = index % channels.len();
        let connection = (index / channels.len()) % plan.connections;
        let client = KeyLimitsClient::new(channels[server][connection].clone());
        let tenant = plan.tenants[index / per_tenant].clone();
        callers.spawn(caller(index, tenant, client, mix, Arc::clone(&context)));
    }
    let reports = super::join_all(callers, "caller", &context, progress).await?;
    let context = Arc::into_inner(context).context("callers still hold the run context")?;
    Ok(CheckReport::new(
        plan,
        &mix,
        reports,
        &context.latency.merged(),
    ))
}

async fn caller(
    index: usize,
    tenant: String,
    mut client: KeyLimitsClient<Channel>,
    mix: CheckMix,
    context: Arc<RunContext>,
) -> CallerReport {
    let mut rng = SmallRng::seed_from_u64(index as u64);
    let mut report = CallerReport::default();
    for k in 0u64.. {
        let Some(started) = context.start_of(index, k).await else {
            break;
        };
        let key = if rng.random_bool(mix.hot_fraction) {
            rng.random_range(0..mix.hot_keys)
        } else {
            rng.random_range(0..mix.keys)
        };
        let mut request = tonic::Request::new(v1::CheckRequest {
            items: vec![v1::CheckItem {
                tenant_id: tenant.clone(),
                bucket: BUCKET.into(),
                key: format!("key-{key}"),
                tokens: 1.0,
                request_id: if mix.request_ids {
                    format!("{index}-{k}")
                } else {
                    String::new()
                },
            }],
        });
        request.set_timeout(context.timeout);
        if let Some(token) = &context.pod_token {
            token.attach(&mut request);
        }
        let answer = client.check(request).await;
        let measured = context.measured(started);
        context.answers.fetch_add(1, Ordering::Relaxed);
        match answer {
            Ok(answer) => {
                if measured {
                    context.latency.record(index, started.elapsed());
                }
                let allowed = answer.into_inner().allowed;
                match (allowed, measured) {
                    (true, true) => report.measured_allowed += 1,
                    (false, true) => report.measured_refused += 1,
                    _ => {}
                }
                if allowed {
                    report.allowed += 1;
                } else {
                    report.refused += 1;
                }
            }
            Err(status) => report.errors.record(&status),
        }
    }
    report
}

/// The result of a checks run.
#[derive(Debug, Serialize)]
pub(super) struct CheckReport {
    /// `closed_loop` or `open_loop`.
    mode: &'static str,
    target_rate: Option<f64>,
    servers: Vec<String>,
    connections_per_server: usize,
    callers: usize,
    tenants: usize,
    keys_per_tenant: u64,
    hot_keys: u64,
    hot_fraction: f64,
    key_refill_rate: f64,
    key_burst_limit: f64,
    request_ids: bool,
    warmup_seconds: f64,
    measured_seconds: f64,
    /// Answered checks per second in the measured window.
    checks_per_second: f64,
    measured_allowed: u64,
    measured_refused: u64,
    /// Latency of the measured answers, in microseconds.
    latency_us: Latency,
    /// The whole run, warmup and drain included.
    allowed: u64,
    refused: u64,
    errors: BTreeMap<String, u64>,
    error_messages: BTreeMap<String, String>,
}

impl CheckReport {
    fn new(
        plan: &Plan,
        mix: &CheckMix,
        reports: Vec<CallerReport>,
        latency: &hdrhistogram::Histogram<u64>,
    ) -> CheckReport {
        let mut all = CallerReport::default();
        for r in reports {
            all.measured_allowed += r.measured_allowed;
            all.measured_refused += r.measured_refused;
            all.allowed += r.allowed;
            all.refused += r.refused;
            all.errors.merge(r.errors);
        }
        let measured_seconds = plan.duration.as_secs_f64();
        CheckReport {
            mode: plan.load.name(),
            target_rate: plan.load.target_rate(),
            servers: plan.servers.clone(),
            connections_per_server: plan.connections,
            callers: plan.pods,
            tenants: plan.tenants.len(),
            keys_per_tenant: mix.keys,
            hot_keys: mix.hot_keys,
            hot_fraction: mix.hot_fraction,
            key_refill_rate: mix.key_rate,
            key_burst_limit: mix.key_burst,
            request_ids: mix.request_ids,
            warmup_seconds: plan.warmup.as_secs_f64(),
            measured_seconds,
            checks_per_second: (all.measured_allowed + all.measured_refused) as f64
                / measured_seconds,
            measured_allowed: all.measured_allowed,
            measured_refused: all.measured_refused,
            latency_us: Latency::of(latency),
            allowed: all.allowed,
            refused: all.refused,
            errors: all.errors.counts,
            error_messages: all.errors.messages,
        }
    }

    pub(super) fn text(&self) -> String {
        let mode = match self.target_rate {
            None => "closed loop".to_owned(),
            Some(rate) => format!("open loop at {rate} checks/s"),
        };
        let mut text = Table::new([
            field(
                "load",
                format!(
                    "{mode}, {} callers on {} tenant{}, {} server{} × {} connection{}",
                    self.callers,
                    self.tenants,
                    plural(self.tenants),
                    self.servers.len(),
                    plural(self.servers.len()),
                    self.connections_per_server,
                    plural(self.connections_per_server),
                ),
            ),
            field(
                "keys",
                format!(
                    "{} per tenant, {:.0} % of checks on the {} hottest; {} tokens/s, burst {} each{}",
                    self.keys_per_tenant,
                    self.hot_fraction * 100.0,
                    self.hot_keys,
                    self.key_refill_rate,
                    self.key_burst_limit,
                    if self.request_ids { ", with request ids" } else { "" }
                ),
            ),
            field(
                "measured",
                format!(
                    "{:.1} s after a {:.1} s warmup",
                    self.measured_seconds, self.warmup_seconds
                ),
            ),
            field("checks/s", format!("{:.1}", self.checks_per_second)),
            field(
                "answers",
                format!(
                    "{} allowed, {} refused",
                    self.measured_allowed, self.measured_refused
                ),
            ),
            field("latency", self.latency_us.text()),
            field(
                "whole run",
                format!("{} allowed, {} refused", self.allowed, self.refused),
            ),
            field("errors", codes(&self.errors)),
        ])
        .to_string();
        for (code, message) in &self.error_messages {
            text.push_str(&format!("\n  {code}: {message}"));
        }
        text
    }
}
