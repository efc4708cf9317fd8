//! `tollgate bench`: a load generator for the pod-facing `TokenBucket` RPC.
//!
//! It answers "how much does this deployment sustain, and how fast" before
//! real pods depend on it. Simulated pods (tenants × instances, each a fresh
//! lease) send token-bucket requests over real gRPC connections to one or
//! more servers, either closed loop (one request in flight per pod, for the
//! most throughput) or open loop at a fixed total rate, where latency counts
//! from the time a request was due so a server that falls behind cannot hide
//! its queueing (no coordinated omission).
//!
//! It also checks what can be checked from outside: a duplicate must get the
//! first answer back, and the consumption the pods reported is summed per
//! tenant, counting each request once however often it was sent, so that it
//! can be compared with the tenant's totals on the server.
//!
//! Pods run on their tenants' request-unit buckets, or spread over
//! `--buckets` named ones, which it creates first through `Admin`. With
//! `--restarts`, crashed pods' attempts still in flight are settled at the
//! end (see `pod.rs`).
//!
//! With `--checks` it loads the per-key `KeyLimits/Check` RPC instead
//! (see `checks.rs`); with `--local MODE`, a pod's local acquisitions: in
//! process, through `tollgate agent`, or by Envoy's API (see `local.rs`).
//!
//! - `mod.rs`: the options, their validation, the connections and the run.
//! - `checks.rs`: the callers of `--checks` and their report.
//! - `local.rs`: the callers of `--local` and their report.
//! - `pacer.rs`: the thread that releases open-loop `--local` calls at
//!   their due times.
//! - `pod.rs`: one pod's request stream, retries, duplicates and restarts.
//! - `report.rs`: the counts merged over pods, as a table or JSON.

mod checks;
mod local;
mod pacer;
mod pod;
mod report;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_core::validate::{MAX_TOKENS, TenantId};
use tonic::transport::{Channel, Endpoint};

use self::pod::{Pod, PodIdentity, PodReport};
use self::report::Report;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A server's gRPC endpoint. Repeat it (or separate URLs with commas) for
    /// several replicas: pod i talks to server i mod n, and moves to the
    /// next when a request fails, retrying it there. Every server must be
    /// reachable when the run starts.
    #[arg(
        long = "server",
        value_name = "URL",
        env = "TOLLGATE_SERVER",
        default_value = "http://127.0.0.1:50051",
        value_delimiter = ','
    )]
    servers: Vec<String>,

    #[command(flatten)]
    tls: crate::remote::ClientTlsArgs,

    #[command(flatten)]
    pod_token: crate::remote::PodTokenArg,

    /// HTTP/2 connections per server; the server's pods are spread over them
    /// (one connection can be the bottleneck).
    #[arg(long, value_name = "N", default_value_t = 1)]
    connections: u32,

    /// Number of tenants.
    #[arg(long, value_name = "N", default_value_t = 4)]
    tenants: u32,

    /// Pods per tenant, instance ids 1 to N.
    #[arg(long, value_name = "N", default_value_t = 16)]
    instances_per_tenant: u32,

    /// Buckets per tenant. 1: every pod uses its tenant's request-unit
    /// bucket. N > 1: a tenant's pods are spread over N named buckets,
    /// `b0` to `b{N-1}`, which the bench creates first through the Admin
    /// service with the default limits (1000 tokens/s, burst 10000).
    #[arg(long, value_name = "N", default_value_t = 1)]
    buckets: u32,

    /// The bearer token the server's Admin service requires, if it does
    /// (to create the buckets of --buckets).
    #[arg(
        long,
        env = "TOLLGATE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,

    /// Tenants are named PREFIX-0 to PREFIX-{N-1}.
    #[arg(long, value_name = "PREFIX", default_value = "bench")]
    tenant_prefix: String,

    /// How long to measure, after the warmup.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,

    /// How long to send requests before measuring; their answers count in
    /// the consumption sums but not in throughput or latency.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,

    /// Open loop: send this many requests per second in total, on a fixed
    /// schedule spread evenly over the pods, and measure latency from when
    /// each request was due [default: closed loop, each pod sends its next
    /// request as soon as the answer arrives].
    #[arg(long, value_name = "R", allow_negative_numbers = true)]
    rate: Option<f64>,

    /// Open loop: every pod sends its first request the moment the run
    /// starts, as a fleet does when it comes back after an outage; later
    /// requests follow the schedule of --rate.
    #[arg(long, requires = "rate")]
    herd: bool,

    /// Requested tokens are drawn uniformly from the integers 0 to 2 × T.
    #[arg(long, value_name = "T", default_value_t = 100)]
    tokens: u64,

    /// Fraction of requests that ask for no tokens and only report
    /// consumption.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.1,
        allow_negative_numbers = true
    )]
    report_only: f64,

    /// Fraction of answered requests a pod sends again unchanged (same seq),
    /// as a pod retrying a lost answer would; the second answer must equal
    /// the first.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    duplicates: f64,

    /// Fraction of new requests after which a pod crashes and restarts, as a
    /// pod killed mid-request would: it gives up on the request a moment
    /// after sending it (half the time after a retry on the next server was
    /// answered), and comes back with a new, greater lease on the next
    /// server while the first attempt may still be in flight. The bench
    /// still learns what became of every attempt, so its sums stay exact.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    restarts: f64,

    /// Deadline of one RPC attempt (also the connect timeout); an attempt
    /// that misses it is retried.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// Benchmark per-key checks (`KeyLimits/Check`, one token of one key
    /// per call) instead of token-bucket requests: each pod is a caller.
    /// The bench defines tier `PREFIX-checks` with per-key bucket
    /// `per-key` and puts the tenants on it.
    #[arg(long)]
    checks: bool,

    /// With --checks: distinct keys per tenant.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    keys: u64,

    /// With --checks: the hot keys, the first N of --keys.
    #[arg(long, value_name = "N", default_value_t = 1_000)]
    hot_keys: u64,

    /// With --checks: the fraction of checks on the hot keys.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.9,
        allow_negative_numbers = true
    )]
    hot_fraction: f64,

    /// With --checks: each key's refill rate, tokens/s.
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    key_rate: f64,

    /// With --checks: each key's burst limit.
    #[arg(long, value_name = "B", default_value_t = 10.0)]
    key_burst: f64,

    /// With --checks: give each key a calendar quota of this many tokens a
    /// month (UTC) on top of its rate [default: none].
    #[arg(long, value_name = "N")]
    key_quota: Option<f64>,

    /// With --checks: give every check a request id (each is then recorded
    /// for its retries, one more row written per check).
    #[arg(long)]
    request_ids: bool,

    /// Benchmark a pod's local acquisitions (one token per call) instead:
    /// `in-process` (tollgate-client in this process), `agent` (tollgate
    /// agent's Acquire over --agent-socket), `envoy` (Envoy's
    /// ShouldRateLimit on a shared bucket, to --envoy: an agent's Envoy
    /// listener), `envoy-per-key` (the same with a per-key descriptor, to
    /// --envoy: a server). Each pod is a caller; the bench gives the
    /// buckets it uses a refill no caller reaches.
    #[arg(long, value_name = "MODE", conflicts_with = "checks")]
    local: Option<local::LocalMode>,

    /// With --local agent: the agent's Unix socket.
    #[arg(long, value_name = "PATH")]
    agent_socket: Option<std::path::PathBuf>,

    /// With --local envoy or envoy-per-key: where Envoy's rate limit
    /// service is (http://host:port).
    #[arg(long, value_name = "URL")]
    envoy: Option<String>,

    /// Print one JSON object instead of tables (and no progress bar).
    #[arg(long)]
    json: bool,

    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The most pods one run simulates; each is a task with its own state.
const MAX_PODS: u64 = 1_000_000;

/// The most connections per server; more than its pods would sit idle anyway.
const MAX_CONNECTIONS: u32 = 1024;
/// The most buckets per tenant.
const MAX_BUCKETS: u32 = 1000;

/// How often the progress bar is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// Latency histograms are sharded so pods seldom wait on each other's lock,
/// without holding one (tens of kilobytes) per pod.
const LATENCY_SHARDS: usize = 16;

/// Closed loop or open loop.
#[derive(Debug, Clone, Copy)]
enum Load {
    Closed,
    Open { rate: f64 },
}

impl Load {
    /// `closed_loop` or `open_loop`, as reports name it.
    fn name(self) -> &'static str {
        match self {
            Load::Closed => "closed_loop",
            Load::Open { .. } => "open_loop",
        }
    }

    /// The total rate asked for in open loop; `None` in closed loop.
    fn target_rate(self) -> Option<f64> {
        match self {
            Load::Closed => None,
            Load::Open { rate } => Some(rate),
        }
    }
}

/// What the pods ask for; validated.
#[derive(Debug, Clone, Copy)]
struct Mix {
    tokens: u64,
    report_only: f64,
    duplicates: f64,
    restarts: f64,
}

/// The run the options describe, once validated.
#[derive(Debug)]
struct Plan {
    endpoints: Vec<Endpoint>,
    servers: Vec<String>,
    connections: usize,
    tenants: Vec<String>,
    /// The bucket names each tenant's pods are spread over.
    buckets: Vec<String>,
    instances_per_tenant: u32,
    pods: usize,
    warmup: Duration,
    duration: Duration,
    load: Load,
    herd: bool,
    mix: Mix,
    timeout: Duration,
    tenant_prefix: String,
    /// `--checks`: what the callers check.
    checks: Option<checks::CheckMix>,
    /// `--local`: where the callers acquire.
    local: Option<local::LocalTarget>,
}

fn fraction(option: &str, value: f64) -> anyhow::Result<f64> {
    if !(0.0..=1.0).contains(&value) {
        bail!("{option}: must be between 0 and 1, got {value}");
    }
    Ok(value)
}

impl BenchArgs {
    fn plan(&self) -> anyhow::Result<Plan> {
        if self.servers.is_empty() {
            bail!("--server: at least one server is needed");
        }
        let tls = self.tls.load()?;
        let endpoints = self
            .servers
            .iter()
            .map(|url| {
                tollgate_client::endpoint(url, Duration::from_secs(5), tls.as_ref())
                    .with_context(|| format!("--server {url:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if !(1..=MAX_CONNECTIONS).contains(&self.connections) {
            bail!(
                "--connections: must be between 1 and {MAX_CONNECTIONS}, got {}",
                self.connections
            );
        }
        if self.tenants == 0 {
            bail!("--tenants: must be at least 1");
        }
        if self.instances_per_tenant == 0 {
            bail!("--instances-per-tenant: must be at least 1");
        }
        let pods = u64::from(self.tenants) * u64::from(self.instances_per_tenant);
        if pods > MAX_PODS {
            bail!("--tenants × --instances-per-tenant: at most {MAX_PODS} pods, got {pods}");
        }
        let tenants = (0..self.tenants)
            .map(|i| {
                let id = format!("{}-{i}", self.tenant_prefix);
                TenantId::parse(&format!("--tenant-prefix (tenant id {id:?})"), &id)
                    .map(String::from)
                    .map_err(anyhow::Error::from)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if !(1..=MAX_BUCKETS).contains(&self.buckets) {
            bail!(
                "--buckets: must be between 1 and {MAX_BUCKETS}, got {}",
                self.buckets
            );
        }
        let buckets = if self.buckets == 1 {
            vec![String::new()]
        } else {
            (0..self.buckets).map(|b| format!("b{b}")).collect()
        };
        if self.duration.is_zero() {
            bail!("--duration: must be more than zero");
        }
        if self.timeout.is_zero() {
            bail!("--timeout: must be more than zero");
        }
        let load = match self.rate {
            None => Load::Closed,
            Some(rate) if rate.is_finite() && rate > 0.0 => Load::Open { rate },
            Some(rate) => bail!("--rate: must be a number above zero, got {rate}"),
        };
        if self.tokens as f64 * 2.0 > MAX_TOKENS {
            bail!(
                "--tokens: at most {}, got {}",
                MAX_TOKENS / 2.0,
                self.tokens
            );
        }
        let mix = Mix {
            tokens: self.tokens,
            report_only: fraction("--report-only", self.report_only)?,
            duplicates: fraction("--duplicates", self.duplicates)?,
            restarts: fraction("--restarts", self.restarts)?,
        };
        Ok(Plan {
            endpoints,
            servers: self.servers.clone(),
            connections: self.connections as usize,
            tenants,
            buckets,
            instances_per_tenant: self.instances_per_tenant,
            // At most MAX_PODS, so it fits.
            pods: pods as usize,
            warmup: self.warmup,
            duration: self.duration,
            load,
            herd: self.herd,
            mix,
            timeout: self.timeout,
            tenant_prefix: self.tenant_prefix.clone(),
            checks: if self.checks {
                Some(checks::CheckMix::new(
                    self.keys,
                    self.hot_keys,
                    self.hot_fraction,
                    self.key_rate,
                    self.key_burst,
                    self.key_quota,
                    self.request_ids,
                )?)
            } else {
                None
            },
            local: self
                .local
                .map(|mode| {
                    local::LocalTarget::new(mode, self.agent_socket.clone(), self.envoy.clone())
                })
                .transpose()?,
        })
    }
}

/// What every pod of a run shares.
#[derive(Debug)]
struct RunContext {
    /// When the pods start.
    start: Instant,
    /// When measuring starts: requests started from here on are measured.
    window_start: Instant,
    /// When the pods stop starting requests.
    end: Instant,
    load: Load,
    /// Every pod's first request is due at `start`.
    herd: bool,
    pods: usize,
    mix: Mix,
    timeout: Duration,
    /// Sent with every pod call, for servers that bind pods to tenants
    /// (one token naming every tenant of the run, or `*`).
    pod_token: Option<tollgate_client::PodToken>,
    latency: Latencies,
    /// Latency of the attempts answered, from when each was sent.
    attempt_latency: Latencies,
    /// Answers so far, for the progress bar.
    answers: AtomicU64,
    /// New requests answered while the window was open, whenever they were
    /// due: the goodput. (Under overload, requests due in the window are
    /// answered late or not at all, while older ones are answered in it.)
    answered_in_window: AtomicU64,
    /// Releases open-loop calls to the microsecond rather than on tokio's
    /// millisecond timer (`--local` only: see `pacer.rs`).
    pacer: Option<pacer::Pacer>,
}

impl RunContext {
    /// When pod `index` is due to send its `k`-th request in open loop, or
    /// `None` if that is past the end of the run. Pods are offset by one
    /// interval of the total rate, so the requests are evenly spread
    /// (except the first ones of a herd, all due at the start).
    fn due(&self, index: usize, k: u64) -> Option<Instant> {
        let Load::Open { rate } = self.load else {
            return None;
        };
        if self.herd && k == 0 {
            return Some(self.start);
        }
        let seconds = (index as f64 + k as f64 * self.pods as f64) / rate;
        let due = self
            .start
            .checked_add(Duration::try_from_secs_f64(seconds).ok()?)?;
        (due < self.end).then_some(due)
    }

    /// When caller `index`'s `k`-th call starts: now in closed loop; in
    /// open loop its due time, once slept until; `None` once the run is
    /// over.
    async fn start_of(&self, index: usize, k: u64) -> Option<Instant> {
        let started = match self.load {
            Load::Closed => Instant::now(),
            Load::Open { .. } => {
                let due = self.due(index, k)?;
                match &self.pacer {
                    Some(pacer) => {
                        if !pacer.wait(index).await {
                            return None;
                        }
                    }
                    None => tokio::time::sleep_until(due).await,
                }
                due
            }
        };
        (started < self.end).then_some(started)
    }

    fn measured(&self, started: Instant) -> bool {
        started >= self.window_start && started < self.end
    }

    /// Counts a new request answered now, if now is in the window.
    fn count_goodput(&self) {
        if self.measured(Instant::now()) {
            self.answered_in_window.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Latency histograms in microseconds, one per shard.
#[derive(Debug)]
struct Latencies {
    shards: Vec<Mutex<Histogram<u64>>>,
}

impl Latencies {
    fn new() -> Self {
        Latencies {
            // Auto-resizing: grows to the largest latency seen.
            shards: (0..LATENCY_SHARDS)
                .map(|_| Mutex::new(new_histogram()))
                .collect(),
        }
    }

    fn record(&self, shard: usize, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let mut histogram = self.shards[shard % self.shards.len()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if histogram.record(micros).is_err() {
            histogram.saturating_record(micros);
        }
    }

    fn merged(self) -> Histogram<u64> {
        let mut all = new_histogram();
        for shard in self.shards {
            let shard = shard.into_inner().unwrap_or_else(PoisonError::into_inner);
            // An auto-resizing histogram takes any other's values.
            let _ = all.add(&shard);
        }
        all
    }
}

/// An auto-resizing histogram with 3 significant figures (0.1 %).
fn new_histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures are within 0..=5")
}

/// Waits for every task of `tasks` (`what` names them in an error),
/// redrawing the progress bar meanwhile; their results, in the order they
/// ended.
async fn join_all<T: 'static>(
    mut tasks: JoinSet<T>,
    what: &str,
    context: &RunContext,
    progress: &mut Progress,
) -> anyhow::Result<Vec<T>> {
    let mut results = Vec::with_capacity(tasks.len());
    let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => break,
                Some(result) => {
                    results.push(result.with_context(|| format!("a {what} task failed"))?);
                }
            },
            _ = tick.tick() => progress.update(context),
        }
    }
    progress.finish();
    Ok(results)
}

/// A caller's errors: how many of each gRPC code, and the first message
/// of each.
#[derive(Debug, Default)]
struct Errors {
    counts: BTreeMap<String, u64>,
    messages: BTreeMap<String, String>,
}

impl Errors {
    fn record(&mut self, status: &tonic::Status) {
        let code = format!("{:?}", status.code());
        self.messages
            .entry(code.clone())
            .or_insert_with(|| status.message().to_owned());
        *self.counts.entry(code).or_default() += 1;
    }

    fn merge(&mut self, other: Errors) {
        for (code, n) in other.counts {
            *self.counts.entry(code).or_default() += n;
        }
        for (code, message) in other.messages {
            self.messages.entry(code).or_insert(message);
        }
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let plan = args.plan()?;
    let channels = connect(&plan).await?;
    match (&plan.checks, &plan.local) {
        (Some(mix), _) => {
            checks::prepare(&plan, mix, &channels[0][0], args.token.as_deref()).await?;
        }
        (None, Some(target)) => {
            local::prepare(&plan, target, &channels[0][0], args.token.as_deref()).await?;
        }
        (None, None) => create_buckets(&plan, &channels[0][0], args.token.as_deref()).await?,
    }
    let mut progress = Progress::new(&plan, args.json || args.quiet);

    let start = Instant::now();
    let window_start = start
        .checked_add(plan.warmup)
        .context("--warmup: too long")?;
    let end = window_start
        .checked_add(plan.duration)
        .context("--duration: too long")?;
    let context = Arc::new(RunContext {
        start,
        window_start,
        end,
        load: plan.load,
        herd: plan.herd,
        pods: plan.pods,
        mix: plan.mix,
        timeout: plan.timeout,
        pod_token: args.pod_token.token()?,
        latency: Latencies::new(),
        attempt_latency: Latencies::new(),
        answers: AtomicU64::new(0),
        answered_in_window: AtomicU64::new(0),
        pacer: match (&plan.local, plan.load) {
            (Some(_), Load::Open { rate }) => Some(
                pacer::Pacer::start(pacer::Schedule {
                    start,
                    end,
                    rate,
                    callers: plan.pods,
                    herd: plan.herd,
                })
                .context("start the pacing thread")?,
            ),
            _ => None,
        },
    });

    if let Some(target) = &plan.local {
        let report = local::run(&plan, target, context, &mut progress).await?;
        return crate::output::print(args.json, &report, local::LocalReport::text);
    }
    if let Some(mix) = plan.checks {
        let report = checks::run(&plan, mix, &channels, context, &mut progress).await?;
        return crate::output::print(args.json, &report, checks::CheckReport::text);
    }

    let mut pods = JoinSet::new();
    let per_tenant = plan.instances_per_tenant as usize;
    for index in 0..plan.pods {
        let server = index % channels.len();
        let connection = (index / channels.len()) % plan.connections;
        let pod = Pod::new(
            index,
            PodIdentity {
                tenant: index / per_tenant,
                tenant_id: plan.tenants[index / per_tenant].clone(),
                bucket: plan.buckets[(index % per_tenant) % plan.buckets.len()].clone(),
                // At most instances_per_tenant, a u32.
                instance_id: (index % per_tenant) as u32 + 1,
            },
            channels
                .iter()
                .map(|server| server[connection].clone())
                .collect(),
            server,
            Arc::clone(&context),
        );
        pods.spawn(pod.run());
    }

    let reports: Vec<PodReport> = join_all(pods, "pod", &context, &mut progress).await?;

    let context = Arc::into_inner(context).context("pods still hold the run context")?;
    let goodput = context.answered_in_window.load(Ordering::Relaxed);
    let report = Report::new(
        &plan,
        reports,
        goodput,
        context.latency.merged(),
        context.attempt_latency.merged(),
    );
    crate::output::print(args.json, &report, Report::text)
}

/// Creates the named buckets of `--buckets` with the default limits; the
/// request-unit bucket needs no creating.
async fn create_buckets(plan: &Plan, channel: &Channel, token: Option<&str>) -> anyhow::Result<()> {
    if plan.buckets.iter().all(String::is_empty) {
        return Ok(());
    }
    let mut admin = tollgate_proto::v1::admin_client::AdminClient::with_interceptor(
        channel.clone(),
        crate::remote::BearerToken::new(token)?,
    );
    let defaults = tollgate_core::transaction::DefaultLimits::default();
    for tenant in &plan.tenants {
        for bucket in &plan.buckets {
            admin
                .update_tenant_resource_limits(
                    tollgate_proto::v1::UpdateTenantResourceLimitsRequest {
                        tenant_id: tenant.clone(),
                        bucket: bucket.clone(),
                        available_tokens: defaults.initial_tokens,
                        refill_rate: defaults.limits.refill_rate,
                        burst_limit: defaults.limits.burst_limit,
                        as_of: None,
                        as_of_consumed_tokens: 0.0,
                        update_mask: None,
                    },
                )
                .await
                .map_err(crate::remote::rpc_error)
                .with_context(|| format!("create bucket {bucket:?} of tenant {tenant:?}"))?;
        }
    }
    Ok(())
}

/// Opens `--connections` HTTP/2 connections to every server, so an
/// unreachable server is reported before the run starts.
async fn connect(plan: &Plan) -> anyhow::Result<Vec<Vec<Channel>>> {
    let mut channels = Vec::with_capacity(plan.endpoints.len());
    for (endpoint, url) in plan.endpoints.iter().zip(&plan.servers) {
        let endpoint = endpoint.clone().connect_timeout(plan.timeout);
        let mut connections = Vec::with_capacity(plan.connections);
        for _ in 0..plan.connections {
            connections.push(
                endpoint
                    .connect()
                    .await
                    .with_context(|| format!("cannot reach server {url}"))?,
            );
        }
        channels.push(connections);
    }
    Ok(channels)
}

/// The progress bar on stderr: elapsed time and the current answer rate.
#[derive(Debug)]
struct Progress {
    bar: ProgressBar,
    /// When the rate was last computed, and the answers then.
    last: (Instant, u64),
}

impl Progress {
    fn new(plan: &Plan, hidden: bool) -> Self {
        let total = plan.warmup + plan.duration;
        let bar = if hidden || !std::io::stderr().is_terminal() {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(u64::try_from(total.as_millis()).unwrap_or(u64::MAX));
            if let Ok(style) =
                ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {percent:>3}% {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        };
        Progress {
            bar,
            last: (Instant::now(), 0),
        }
    }

    fn update(&mut self, context: &RunContext) {
        let now = Instant::now();
        let answers = context.answers.load(Ordering::Relaxed);
        let seconds = now.duration_since(self.last.0).as_secs_f64();
        let rate = if seconds > 0.0 {
            answers.saturating_sub(self.last.1) as f64 / seconds
        } else {
            0.0
        };
        self.last = (now, answers);
        let elapsed = now.duration_since(context.start);
        self.bar
            .set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        let phase = if now < context.window_start {
            "warming up, "
        } else if now >= context.end {
            "draining, "
        } else {
            ""
        };
        self.bar.set_message(format!("{phase}{rate:.0} answers/s"));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
