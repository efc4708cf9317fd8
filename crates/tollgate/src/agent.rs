//! `tollgate agent`: a tenant's local buckets beside the pods that use
//! them (a sidecar, or one per node), for pods in any language.
//!
//! The command line sets up what the `tollgate-agent` library serves: it
//! locks the state directory first (so a second agent on it stops before
//! touching anything), derives the instance id from the node name unless
//! one is given, reads the access file and the pod token once (they are
//! not reloaded: a SIGHUP is only logged; restart the agent to apply a
//! change), binds the Unix socket and the loopback TCP port, logs where
//! it is, and serves until SIGTERM or SIGINT, then reports every bucket's
//! consumption before it exits 0.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tollgate_agent::instance::{self, HOSTNAME_FILE};
use tollgate_agent::journal::{Journal, JournalOptions};
use tollgate_agent::listen::{self, BoundSocket, StateDir};
use tollgate_agent::{AccessRules, Agent, AgentOptions, Listeners};
use tollgate_client::PodToken;

/// The longest `--max-wait`: what an Acquire may ask for itself.
const MAX_WAIT_LIMIT: Duration = tollgate_agent::calls::MAX_WAIT_LIMIT;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The tollgate server's gRPC endpoint (`https://…` for TLS); several
    /// replicas separated by commas.
    #[arg(long, env = "TOLLGATE_AGENT_SERVER", value_name = "URL[,URL…]")]
    server: String,

    /// The Unix socket callers use. Its directory is made if needed; a
    /// stale socket file is replaced only if nothing answers on it. `''`
    /// disables it (then --listen is required).
    #[arg(
        long,
        env = "TOLLGATE_AGENT_SOCKET",
        value_name = "PATH",
        default_value = "/run/tollgate/agent.sock",
        // Not a PathBuf: its parser refuses the empty value that disables
        // the socket.
        value_parser = clap::value_parser!(std::ffi::OsString)
    )]
    socket: std::ffi::OsString,

    /// No Unix socket (as `--socket ''`); needs --listen.
    #[arg(long, env = "TOLLGATE_AGENT_NO_SOCKET")]
    no_socket: bool,

    /// The socket file's mode, octal: who may call the agent through it.
    #[arg(
        long,
        env = "TOLLGATE_AGENT_SOCKET_MODE",
        value_name = "MODE",
        default_value = "0660",
        value_parser = parse_mode
    )]
    socket_mode: u32,

    /// Also listen on this loopback TCP address (127.0.0.1:PORT or
    /// [::1]:PORT). TCP callers need --access with their tenant's token.
    #[arg(long, env = "TOLLGATE_AGENT_LISTEN", value_name = "127.0.0.1:PORT")]
    listen: Option<SocketAddr>,

    /// Who may use which tenant (TOML: `[tenants.<id>]` with `token` or
    /// `token_file` for TCP callers) [default: socket callers any tenant,
    /// TCP callers none].
    #[arg(long, env = "TOLLGATE_AGENT_ACCESS", value_name = "FILE")]
    access: Option<PathBuf>,

    /// A file holding the pod token the agent presents to the server
    /// (for servers with --pod-tokens-file). Read at start only.
    #[arg(long, env = "TOLLGATE_AGENT_POD_TOKEN_FILE", value_name = "FILE")]
    pod_token_file: Option<PathBuf>,

    /// The node the agent runs on, which its instance id is derived from
    /// [default: $TOLLGATE_NODE_NAME, else the host name].
    #[arg(long, env = "TOLLGATE_AGENT_NODE_NAME", value_name = "NAME")]
    node_name: Option<String>,

    /// The agent's instance id at the server, 1 to 4294967295 [default:
    /// 2^31 + xxh3_64("tollgate-agent/" + node name) mod (2^31 − 1)].
    #[arg(long, env = "TOLLGATE_AGENT_INSTANCE_ID", value_name = "N")]
    instance_id: Option<u64>,

    /// How long an Acquire that does not say waits at most (and at most
    /// its own deadline), up to 1h.
    #[arg(
        long,
        env = "TOLLGATE_AGENT_MAX_WAIT",
        value_name = "DURATION",
        default_value = "30s",
        value_parser = humantime::parse_duration
    )]
    max_wait: Duration,

    /// The tokens a bucket may admit before the server's first answer
    /// where the journal holds nothing better (what it used is charged to
    /// the tenant once the server answers). Also what a bucket runs on per target period
    /// when the server is out of reach until it answers once. Every answer
    /// says what a new pod of the bucket may start on; the journal keeps
    /// it, and a restarted agent starts the buckets it knows on that.
    #[arg(
        long,
        env = "TOLLGATE_AGENT_INITIAL_TOKENS",
        value_name = "TOKENS",
        default_value_t = tollgate_client::LocalBucketConfig::default().initial_tokens
    )]
    initial_tokens: f64,

    /// The shortest wait for the server's answer before an attempt is
    /// given up and sent again. The agent waits twice its usual answer
    /// time (more when answers vary), at least this, at most 5 s. Raise it
    /// when the server's store answers slower than this under normal load.
    #[arg(
        long,
        env = "TOLLGATE_AGENT_MIN_ATTEMPT_TIMEOUT",
        value_name = "DURATION",
        default_value_t = tollgate_client::LocalBucketConfig::default().min_attempt_timeout.into()
    )]
    min_attempt_timeout: humantime::Duration,

    /// Also serve Envoy's rate limit service (envoy.service.ratelimit.v3)
    /// on this TCP address: a lone generic_key descriptor is answered from
    /// the tenant's shared bucket of that name, locally; other descriptors
    /// go to the server. Envoy sends its tenant's token from --access.
    #[arg(long, env = "TOLLGATE_AGENT_ENVOY_LISTEN", value_name = "ADDR")]
    envoy_listen: Option<SocketAddr>,

    /// The agent's own directory, locked for its life (one agent per
    /// directory).
    #[arg(
        long,
        env = "TOLLGATE_AGENT_STATE_DIR",
        value_name = "DIR",
        default_value = "/var/lib/tollgate-agent"
    )]
    state_dir: PathBuf,

    /// Threads answering calls. One answers tens of thousands of calls a
    /// second from memory, and answers each soonest (no hand-offs between
    /// threads); more add throughput for many callers, at some latency.
    #[arg(
        long,
        env = "TOLLGATE_AGENT_THREADS",
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=256)
    )]
    pub threads: u16,
}

/// A socket mode in octal (`0660`, `660`, `0o660`), at most 0777.
fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!("{text:?} is not an octal file mode from 0 to 0777")),
    }
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    if args.max_wait > MAX_WAIT_LIMIT {
        anyhow::bail!("--max-wait: must be at most 1h, got {:?}", args.max_wait);
    }
    let socket = (!args.no_socket && !args.socket.is_empty()).then(|| PathBuf::from(&args.socket));
    if socket.is_none() && args.listen.is_none() {
        anyhow::bail!(
            "--socket '' (or --no-socket) needs --listen: the agent would listen nowhere"
        );
    }
    if let Some(address) = args.listen {
        listen::check_loopback(address)?;
    }
    // First, so a second agent on this directory stops before it touches
    // anything else.
    let state = StateDir::lock(&args.state_dir)?;
    let node_name = instance::node_name(
        args.node_name.as_deref(),
        &|name| std::env::var(name).ok(),
        Path::new(HOSTNAME_FILE),
    );
    let instance_id = match (args.instance_id, &node_name) {
        (Some(id), _) => instance::given_instance_id(id)
            .map_err(|e| anyhow::anyhow!("--instance-id: {}", e.reason))?,
        (None, Ok(name)) => instance::derived_instance_id(name),
        (None, Err(e)) => anyhow::bail!("--node-name: {}", e.reason),
    };
    let access = match &args.access {
        Some(path) => AccessRules::load(path)?,
        None => AccessRules::socket_only(),
    };
    let pod_token = args
        .pod_token_file
        .as_deref()
        .map(read_pod_token)
        .transpose()?;
    let served_tenants: Vec<String> = access.tenants().map(str::to_owned).collect();

    // Before any bucket starts: the journal's leases for what a killed
    // predecessor owes must be older than this incarnation's.
    let journal = Journal::open(state.path(), JournalOptions::new(instance_id))
        .context("--state-dir: the journal")?;
    if journal.orphans > 0 {
        tracing::warn!(
            orphans = journal.orphans,
            generation = journal.generation,
            "the previous agent on this state directory stopped without reporting everything: settling it with the server first"
        );
    }
    let mut options = AgentOptions::new(args.server.clone(), instance_id);
    options.max_wait = args.max_wait;
    options.client.bucket.initial_tokens = args.initial_tokens;
    options.client.bucket.min_attempt_timeout = args.min_attempt_timeout.into();
    options.client.bucket.validate().map_err(|e| {
        // The flags that set the bucket's settings; any other setting is
        // named as it is.
        let flag = match e.field.as_str() {
            "min_attempt_timeout" => "--min-attempt-timeout",
            "initial_tokens" => "--initial-tokens",
            other => other,
        };
        anyhow::anyhow!("{flag}: {}", e.reason)
    })?;
    options.access = access;
    options.pod_token = pod_token;
    options.journal = Some(journal);
    let agent = Agent::new(options)?;

    let mut bound: Option<BoundSocket> = None;
    let mut listeners = Listeners::default();
    if let Some(path) = socket {
        let (listener, socket) = listen::bind_socket(&path, args.socket_mode)?;
        listeners.socket = Some(listener);
        bound = Some(socket);
    }
    let mut tcp_address = None;
    if let Some(address) = args.listen {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("--listen {address}"))?;
        tcp_address = Some(listener.local_addr().unwrap_or(address));
        listeners.tcp = Some(listener);
    }
    let mut envoy_address = None;
    if let Some(address) = args.envoy_listen {
        if !address.ip().is_loopback() {
            tracing::warn!(
                envoy_listen = %address,
                "Envoy's rate limit service listens beyond this host: only callers with a tenant's token from --access are served"
            );
        }
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("--envoy-listen {address}"))?;
        envoy_address = Some(listener.local_addr().unwrap_or(address));
        listeners.envoy = Some(listener);
    }
    tracing::info!(
        socket = bound.as_ref().map(|b| b.path().display().to_string()).as_deref(),
        socket_mode = format!("{:04o}", args.socket_mode),
        tcp = tcp_address.map(|a| a.to_string()).as_deref(),
        envoy = envoy_address.map(|a| a.to_string()).as_deref(),
        state_dir = %state.path().display(),
        instance_id,
        instance_id_from = if args.instance_id.is_some() { "--instance-id" } else { "the node name" },
        node_name = node_name.as_deref().unwrap_or("unknown"),
        server = %args.server,
        pod_token = args.pod_token_file.is_some(),
        tenants = %if served_tenants.is_empty() {
            "any (socket callers only)".to_owned()
        } else {
            served_tenants.join(",")
        },
        max_wait = ?args.max_wait,
        initial_tokens = args.initial_tokens,
        "tollgate agent listening"
    );
    let hangups = tokio::spawn(log_hangups());
    let reports = tollgate_agent::run(agent, listeners, crate::serve::shutdown_signal()).await?;
    hangups.abort();
    drop(bound);
    tracing::info!(
        tenants = reports.len(),
        all_reported = reports.iter().all(|r| r.report.consumption_reported),
        "tollgate agent stopped"
    );
    drop(state);
    Ok(())
}

/// The pod token in `path` (surrounding white space dropped).
fn read_pod_token(path: &Path) -> anyhow::Result<PodToken> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--pod-token-file: read {}", path.display()))?;
    PodToken::new(text.trim())
        .map_err(|e| anyhow::anyhow!("--pod-token-file {}: {}", path.display(), e.reason))
}

/// Says, at each SIGHUP, that nothing is reloaded (and keeps the signal's
/// default action, which would end the agent, away).
async fn log_hangups() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangups) => {
                while hangups.recv().await.is_some() {
                    tracing::info!(
                        "SIGHUP: the agent reads its access file and pod token only at start; restart it to apply a change"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_modes_are_octal() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0o644"), Ok(0o644));
        for bad in ["0999", "1777", "rw", ""] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }
}
