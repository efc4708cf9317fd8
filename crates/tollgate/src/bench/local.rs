//! `tollgate bench --local MODE`: what one acquisition costs a caller, by
//! the way it is made.
//!
//! A pod gates its work on a local bucket; how far away that bucket is
//! decides what each acquisition costs. Each simulated pod is a caller
//! taking one token per call, closed loop or on the open-loop schedule the
//! other benches use, from:
//!
//! - `in-process`: a `tollgate-client` controller in this process (one per
//!   tenant), as a Rust pod embeds it: the floor.
//! - `agent`: `tollgate agent`'s `Acquire`, over its Unix socket
//!   (`--agent-socket`), as a pod in any other language calls it.
//! - `envoy`: Envoy's `ShouldRateLimit` with one lone `generic_key`
//!   descriptor, naming a shared bucket, sent to `--envoy`: an agent's
//!   Envoy listener answers it from its local bucket.
//! - `envoy-per-key`: the same call with a per-key descriptor (bucket
//!   `per-key`, a key per caller), sent to `--envoy`: a server answers it
//!   with one store transaction, as Envoy's global rate limiting works
//!   without an agent.
//!
//! In open loop the calls are released by a pacing thread to the tens of
//! microseconds (`pacer.rs`), not on tokio's millisecond timer, and their
//! latency is measured from the moment each is made; the report gives the
//! pacing lag beside it.
//!
//! Tokens are plentiful (the bench gives the shared bucket `bench-local`
//! and the request-unit bucket a refill of a billion a second, and the
//! per-key bucket as much), so what is measured is the path, not waiting.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, bail};
use clap::ValueEnum;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as EnvoyCode;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_client::{BucketHandle, Controller, Options};
use tollgate_proto::agent::v1::AcquireRequest;
use tollgate_proto::agent::v1::agent_client::AgentClient;
use tollgate_proto::v1::{self, admin_client::AdminClient};
use tonic::transport::{Channel, Endpoint};

use super::report::{Latency, codes, plural};
use super::{Plan, RunContext};
use crate::output::{Table, field};

/// The shared bucket the local modes acquire from (the request-unit
/// bucket for `agent` and `in-process`, named for `envoy`).
pub(super) const SHARED_BUCKET: &str = "bench-local";
/// Refill and burst the bench gives the buckets it loads: never the limit.
const PLENTY: f64 = 1e9;

/// How the callers acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalMode {
    /// A tollgate-client controller in this process.
    InProcess,
    /// `tollgate agent`'s Acquire over its Unix socket (--agent-socket).
    Agent,
    /// Envoy's ShouldRateLimit, a lone generic_key naming a shared bucket,
    /// to --envoy (an agent's Envoy listener).
    Envoy,
    /// Envoy's ShouldRateLimit with a per-key descriptor, to --envoy (a
    /// server).
    EnvoyPerKey,
}

/// Where the callers' calls go.
#[derive(Debug)]
pub(super) struct LocalTarget {
    pub mode: LocalMode,
    pub agent_socket: Option<PathBuf>,
    pub envoy: Option<String>,
}

impl LocalTarget {
    pub fn new(
        mode: LocalMode,
        agent_socket: Option<PathBuf>,
        envoy: Option<String>,
    ) -> anyhow::Result<Self> {
        match mode {
            LocalMode::Agent if agent_socket.is_none() => {
                bail!("--local agent: --agent-socket PATH is needed")
            }
            LocalMode::Envoy | LocalMode::EnvoyPerKey if envoy.is_none() => {
                bail!("--local {mode:?}: --envoy URL is needed")
            }
            _ => {}
        }
        Ok(LocalTarget {
            mode,
            agent_socket,
            envoy,
        })
    }
}

/// Gives the buckets the callers use plenty of tokens.
pub(super) async fn prepare(
    plan: &Plan,
    target: &LocalTarget,
    channel: &Channel,
    token: Option<&str>,
) -> anyhow::Result<()> {
    let mut admin =
        AdminClient::with_interceptor(channel.clone(), crate::remote::BearerToken::new(token)?);
    if target.mode == LocalMode::EnvoyPerKey {
        let mix = super::checks::CheckMix::new(1, 1, 1.0, PLENTY, PLENTY, None, false)?;
        return super::checks::prepare(plan, &mix, channel, token).await;
    }
    let bucket = match target.mode {
        LocalMode::Envoy => SHARED_BUCKET,
        _ => "",
    };
    for tenant in &plan.tenants {
        admin
            .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
                tenant_id: tenant.clone(),
                bucket: bucket.into(),
                available_tokens: PLENTY,
                refill_rate: PLENTY,
                burst_limit: PLENTY,
                as_of: None,
                as_of_consumed_tokens: 0.0,
                update_mask: None,
            })
            .await
            .map_err(crate::remote::rpc_error)
            .with_context(|| format!("set the limits of bucket {bucket:?} of {tenant:?}"))?;
    }
    Ok(())
}

/// One way to make a call: answers whether the token was taken.
enum Caller {
    InProcess(BucketHandle),
    Agent {
        client: AgentClient<Channel>,
        tenant: String,
    },
    Envoy {
        client: RateLimitServiceClient<Channel>,
        tenant: String,
        entries: Vec<Entry>,
    },
}

impl Caller {
    async fn call(&mut self, context: &RunContext) -> Result<bool, tonic::Status> {
        match self {
            Caller::InProcess(bucket) => bucket
                .acquire(1.0)
                .await
                .map(|()| true)
                .map_err(|e| tonic::Status::unavailable(e.to_string())),
            Caller::Agent { client, tenant } => {
                let mut request = tonic::Request::new(AcquireRequest {
                    tenant: tenant.clone(),
                    bucket: String::new(),
                    tokens: 1.0,
                    max_wait: None,
                    request_id: String::new(),
                });
                request.set_timeout(context.timeout);
                Ok(client.acquire(request).await?.into_inner().admitted)
            }
            Caller::Envoy {
                client,
                tenant,
                entries,
            } => {
                let mut request = tonic::Request::new(RateLimitRequest {
                    domain: tenant.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: entries.clone(),
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 1,
                });
                request.set_timeout(context.timeout);
                // An agent's Envoy listener takes its callers as TCP
                // callers: they show the tenant's token (--pod-token).
                if let Some(token) = &context.pod_token {
                    token.attach(&mut request);
                }
                let answer = client.should_rate_limit(request).await?.into_inner();
                Ok(answer.overall_code == EnvoyCode::Ok as i32)
            }
        }
    }
}

/// A channel over the agent's Unix socket.
async fn agent_channel(path: &std::path::Path) -> anyhow::Result<Channel> {
    let path = path.to_path_buf();
    // The URI is not used: every connection goes to the socket.
    Endpoint::from_static("http://agent.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .context("cannot reach the agent's socket")
}

/// Runs the callers; answers the report.
pub(super) async fn run(
    plan: &Plan,
    target: &LocalTarget,
    context: Arc<RunContext>,
    progress: &mut super::Progress,
) -> anyhow::Result<LocalReport> {
    let per_tenant = plan.instances_per_tenant as usize;
    let mut connections = Vec::with_capacity(plan.connections);
    let mut controllers = Vec::new();
    match target.mode {
        LocalMode::InProcess => {
            for (i, tenant) in plan.tenants.iter().enumerate() {
                let options = Options {
                    pod_token: context.pod_token.clone(),
                    ..Options::default()
                };
                let instance = 1 + u32::try_from(i).unwrap_or(0);
                controllers.push(
                    Controller::connect(&plan.servers.join(","), tenant, instance, options)
                        .with_context(|| format!("a controller for {tenant:?}"))?,
                );
            }
        }
        LocalMode::Agent => {
            let path = target.agent_socket.as_deref().context("--agent-socket")?;
            for _ in 0..plan.connections {
                connections.push(agent_channel(path).await?);
            }
        }
        LocalMode::Envoy | LocalMode::EnvoyPerKey => {
            let url = target.envoy.as_deref().context("--envoy")?;
            for _ in 0..plan.connections {
                connections.push(
                    Endpoint::from_shared(url.to_owned())
                        .with_context(|| format!("--envoy {url:?}"))?
                        .connect()
                        .await
                        .with_context(|| format!("cannot reach {url}"))?,
                );
            }
        }
    }
    let mut callers = JoinSet::new();
    for index in 0..plan.pods {
        let tenant = plan.tenants[index / per_tenant].clone();
        let caller = match target.mode {
            LocalMode::InProcess => Caller::InProcess(controllers[index / per_tenant].bucket("")?),
            LocalMode::Agent => Caller::Agent {
                client: AgentClient::new(connections[index % connections.len()].clone()),
                tenant,
            },
            LocalMode::Envoy => Caller::Envoy {
                client: RateLimitServiceClient::new(connections[index % connections.len()].clone()),
                tenant,
                entries: vec![entry("generic_key", SHARED_BUCKET)],
            },
            LocalMode::EnvoyPerKey => Caller::Envoy {
                client: RateLimitServiceClient::new(connections[index % connections.len()].clone()),
                tenant,
                entries: vec![
                    entry("generic_key", super::checks::BUCKET),
                    entry("caller", &format!("caller-{index}")),
                ],
            },
        };
        callers.spawn(call_loop(index, caller, Arc::clone(&context)));
    }
    let reports = super::join_all(callers, "caller", &context, progress).await?;
    for controller in controllers {
        controller.shutdown().await;
    }
    let context = Arc::into_inner(context).context("callers still hold the run context")?;
    let pacing_lag = context
        .pacer
        .as_ref()
        .map(|pacer| Latency::of(&pacer.lag()));
    Ok(LocalReport::new(
        plan,
        target,
        reports,
        &context.latency.merged(),
        pacing_lag,
    ))
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

/// One caller's counts.
#[derive(Debug, Default)]
struct CallerReport {
    measured_admitted: u64,
    measured_refused: u64,
    errors: super::Errors,
}

async fn call_loop(index: usize, mut caller: Caller, context: Arc<RunContext>) -> CallerReport {
    let mut report = CallerReport::default();
    for k in 0u64.. {
        let Some(started) = context.start_of(index, k).await else {
            break;
        };
        // Latency counts from the call; how late the pacer released it is
        // reported apart (the pacing lag).
        let sent = Instant::now();
        let answer = caller.call(&context).await;
        let took = sent.elapsed();
        // An acquisition served at once never yields to the runtime:
        // without this, callers in process would starve the buckets'
        // own tasks.
        tokio::task::consume_budget().await;
        let measured = context.measured(started);
        context.answers.fetch_add(1, Ordering::Relaxed);
        match answer {
            Ok(admitted) => {
                if measured {
                    context.latency.record(index, took);
                    if admitted {
                        report.measured_admitted += 1;
                    } else {
                        report.measured_refused += 1;
                    }
                }
            }
            Err(status) => report.errors.record(&status),
        }
    }
    report
}

/// The result of a `--local` run.
#[derive(Debug, Serialize)]
pub(super) struct LocalReport {
    local: LocalMode,
    /// `closed_loop` or `open_loop`.
    mode: &'static str,
    target_rate: Option<f64>,
    callers: usize,
    tenants: usize,
    connections: usize,
    warmup_seconds: f64,
    measured_seconds: f64,
    /// Answered calls per second in the measured window.
    calls_per_second: f64,
    measured_admitted: u64,
    measured_refused: u64,
    /// Latency of the measured answers, in microseconds.
    latency_us: Latency,
    /// Open loop: how late the pacing thread released the calls after
    /// their due times, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pacing_lag_us: Option<Latency>,
    errors: BTreeMap<String, u64>,
    error_messages: BTreeMap<String, String>,
}

impl LocalReport {
    fn new(
        plan: &Plan,
        target: &LocalTarget,
        reports: Vec<CallerReport>,
        latency: &hdrhistogram::Histogram<u64>,
        pacing_lag_us: Option<Latency>,
    ) -> LocalReport {
        let mut all = CallerReport::default();
        for r in reports {
            all.measured_admitted += r.measured_admitted;
            all.measured_refused += r.measured_refused;
            all.errors.merge(r.errors);
        }
        let measured_seconds = plan.duration.as_secs_f64();
        LocalReport {
            local: target.mode,
            mode: plan.load.name(),
            target_rate: plan.load.target_rate(),
            callers: plan.pods,
            tenants: plan.tenants.len(),
            connections: plan.connections,
            warmup_seconds: plan.warmup.as_secs_f64(),
            measured_seconds,
            calls_per_second: (all.measured_admitted + all.measured_refused) as f64
                / measured_seconds,
            measured_admitted: all.measured_admitted,
            measured_refused: all.measured_refused,
            latency_us: Latency::of(latency),
            pacing_lag_us,
            errors: all.errors.counts,
            error_messages: all.errors.messages,
        }
    }

    pub(super) fn text(&self) -> String {
        let mode = match self.target_rate {
            None => "closed loop".to_owned(),
            Some(rate) => format!("open loop at {rate} calls/s"),
        };
        let mut text = Table::new([
            field(
                "load",
                format!(
                    "{mode}, {} callers on {} tenant{}, {} connection{}, acquiring {}",
                    self.callers,
                    self.tenants,
                    plural(self.tenants),
                    self.connections,
                    plural(self.connections),
                    match self.local {
                        LocalMode::InProcess => "in process",
                        LocalMode::Agent => "through the agent",
                        LocalMode::Envoy => "by Envoy's API, shared bucket",
                        LocalMode::EnvoyPerKey => "by Envoy's API, per key",
                    }
                ),
            ),
            field(
                "measured",
                format!(
                    "{:.1} s after a {:.1} s warmup",
                    self.measured_seconds, self.warmup_seconds
                ),
            ),
            field("calls/s", format!("{:.1}", self.calls_per_second)),
            field(
                "answers",
                format!(
                    "{} admitted, {} refused",
                    self.measured_admitted, self.measured_refused
                ),
            ),
            field("latency", self.latency_us.text()),
            field(
                "pacing lag",
                self.pacing_lag_us
                    .as_ref()
                    .map_or_else(|| "closed loop".to_owned(), Latency::text),
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
