//! The configuration of `tollgate serve`, from four layers, each later one
//! winning: built-in defaults, an optional TOML file (`--config`,
//! `TOLLGATE_CONFIG`), `TOLLGATE_*` environment variables, and flags.
//!
//! Every option is declared once, as a field of [`ServeOptions`]: its flag
//! is the field's name in kebab case (`--pg-pool-size`), its key in the file
//! is the same name (`pg-pool-size = 16`), its environment variable is that
//! name in upper snake case after `TOLLGATE_` (`TOLLGATE_PG_POOL_SIZE`), and
//! its default is the flag's `default_value`. Each layer is a `ServeOptions`
//! in which only what that layer sets is `Some`. [`ServeConfig::resolve`]
//! lays them over each other, remembering which layer set what, and
//! validates the result into a [`ServeConfig`]; an error names the option
//! and where its value came from.
//!
//! The layers meet as TOML tables: the file is one already, and a layer of
//! flags or environment variables becomes one through `Serialize` (a `None`
//! field is simply absent). That is what lets one generic merge serve every
//! option.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::builder::BoolishValueParser;
use clap::{Arg, ArgAction, Args, Command, FromArgMatches, ValueEnum};
use serde::{Deserialize, Serialize};
use tollgate_core::global_bucket::GlobalBucketConfig;
use tollgate_core::history::{HistoryConfig, HistoryConfigError};
use tollgate_core::validate::{self, MAX_REFILL_RATE, MAX_TOKENS};
use tollgate_core::{GrantPolicy, Limits};
use tollgate_server::store::{BucketSettings, DefaultLimits, PostgresOptions, UnconfiguredTenants};

use crate::store::{Creation, PostgresPool, StoreLocation};

/// The prefix of every option's environment variable.
const ENV_PREFIX: &str = "TOLLGATE_";
/// The environment variable naming the config file, if `--config` does not.
const CONFIG_ENV: &str = "TOLLGATE_CONFIG";
/// Where the store is when no layer sets `store`.
const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// Reads an environment variable; the process's own is `std::env::var`,
/// tests pass a map.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// `tollgate serve`'s command line: `--config` and every option's flag.
///
/// The flags have no defaults here (a flag not given is `None`, so a file
/// or an environment variable can set it); their help shows the default
/// and the environment variable instead.
#[derive(Debug, Clone, Default, Args)]
#[command(mut_args = document_layers)]
pub struct ServeArgs {
    /// A TOML file of options, each written under its flag's name, e.g.
    /// `listen = "0.0.0.0:50051"` or `pg-pool-size = 32`. Environment
    /// variables and flags override it [default: none].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub options: ServeOptions,
}

/// Every option of `tollgate serve`, each `None` unless the layer at hand
/// sets it.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeOptions {
    /// Address to serve gRPC on (`TokenBucketService` and `Admin`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    pub listen: Option<SocketAddr>,

    /// Where state is kept: a PostgreSQL URL (`postgres://user@host/db`,
    /// migrated at start) or an embedded store file (which must exist,
    /// unless --create) [default: $DATABASE_URL, else tollgate.redb, made
    /// on the first run].
    #[arg(long, value_name = "PATH|URL")]
    pub store: Option<String>,

    /// Make the embedded store file --store names if it does not exist
    /// (a new, empty store). Without it a missing file is an error, so
    /// that a mistyped path or another working directory never serves an
    /// empty store.
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = BoolishValueParser::new()
    )]
    pub create: Option<bool>,

    /// Keep all state in memory (lost when the server stops). Not with
    /// --store.
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = BoolishValueParser::new()
    )]
    pub in_memory: Option<bool>,

    /// Refill rate (tokens/s) of tenants nobody has configured.
    #[arg(long, value_name = "TOKENS")]
    pub default_refill_rate: Option<f64>,

    /// Burst limit (tokens) of tenants nobody has configured.
    #[arg(long, value_name = "TOKENS")]
    pub default_burst_limit: Option<f64>,

    /// Tokens a tenant nobody has configured starts with [default: the
    /// default burst limit].
    #[arg(long, value_name = "TOKENS")]
    pub default_initial_tokens: Option<f64>,

    /// Refuse pod requests (NOT_FOUND) for tenants nobody has configured,
    /// instead of serving them with the default limits.
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = BoolishValueParser::new()
    )]
    pub require_configured_tenants: Option<bool>,

    /// How tokens are handed out when a bucket cannot grant at once.
    #[arg(long, value_name = "POLICY", value_enum)]
    pub grant_policy: Option<Policy>,

    /// Instances silent longer than this are removed and their shares
    /// dropped; more than zero.
    #[arg(long, value_name = "DURATION")]
    pub inactivity_timeout: Option<HumanDuration>,

    /// Instances a live pod reports dead are removed once silent this long.
    #[arg(long, value_name = "DURATION")]
    pub reported_dead_timeout: Option<HumanDuration>,

    /// How often a bucket of an organisation's member draws its refill
    /// from the organisation's bucket (docs/organisations.md): the
    /// organisation's row is written once per member bucket per period.
    /// `0s` draws on every request (every pod request then waits on the
    /// organisation's row; for measuring that only).
    #[arg(long, value_name = "DURATION")]
    pub draw_period: Option<HumanDuration>,

    /// Pod-facing requests (token buckets, checks, partition exchanges)
    /// pending in the store at once; beyond them a request is refused at
    /// once with UNAVAILABLE and a retry hint, so an overloaded server
    /// keeps answering in time. At least 1.
    #[arg(long, value_name = "N")]
    pub max_pending_requests: Option<usize>,

    /// PostgreSQL: connections in the pool (transactions in flight at once).
    #[arg(long, value_name = "N")]
    pub pg_pool_size: Option<usize>,

    /// PostgreSQL: the most token-bucket requests served by one transaction
    /// (and four times as many per-key checks).
    #[arg(long, value_name = "N")]
    pub pg_max_batch: Option<usize>,

    /// PostgreSQL: how long to wait for a new or a free connection.
    #[arg(long, value_name = "DURATION")]
    pub pg_connect_timeout: Option<HumanDuration>,

    /// PostgreSQL: a PEM file of certificate authorities to trust besides
    /// the system's. Turns TLS on, as `sslmode=require` in the URL does; with
    /// TLS the server's certificate and host name are always verified
    /// [default: none].
    #[arg(long, value_name = "FILE")]
    pub pg_ca_file: Option<PathBuf>,

    /// Log lines on stderr as text, or as one JSON object per line.
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "text")]
    pub log_format: Option<LogFormat>,

    /// Address to serve Prometheus metrics on over HTTP, or `off`.
    #[arg(long, value_name = "ADDR|off", default_value = "127.0.0.1:9464")]
    pub metrics_listen: Option<MetricsListen>,

    /// How old the per-tenant metrics (read from the store) may be: the
    /// store is read for them at most once per interval, whatever the
    /// number of scrapes; `0s` reads it at every scrape.
    #[arg(long, value_name = "DURATION")]
    pub metrics_store_read_interval: Option<HumanDuration>,

    /// TLS on the gRPC port: the server's certificate chain, PEM (with
    /// --tls-key) [default: none, plain gRPC].
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// TLS on the gRPC port: the server's private key, PEM (with
    /// --tls-cert) [default: none].
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: clients must present a certificate signed by one of the
    /// authorities in this PEM file (needs --tls-cert) [default: none].
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// The `Admin` service requires a bearer token from this file: one
    /// `NAME TOKEN [operator|read-only]` line per operator (tokens of 16
    /// characters or more; a read-only token may only get and list); the
    /// operator's name goes into the audit log. Reloaded on SIGHUP and when
    /// it changes [default: none, `Admin` open to whoever reaches the
    /// port].
    #[arg(long, value_name = "FILE")]
    pub admin_tokens_file: Option<PathBuf>,

    /// Pods must present a bearer token from this file, whose line names
    /// the tenants it may act for: `NAME TOKEN TENANT[,TENANT...]`, or `*`
    /// for every tenant. A call for another tenant is refused
    /// (PERMISSION_DENIED). Reloaded on SIGHUP and when it changes
    /// [default: none].
    #[arg(long, value_name = "FILE")]
    pub pod_tokens_file: Option<PathBuf>,

    /// Pods may act for the tenants their client certificate names as URI
    /// subject alternative names, `tollgate://tenant/<id>` (or
    /// `tollgate://tenant/*`); a call for another tenant is refused
    /// (PERMISSION_DENIED). Needs --tls-client-ca.
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = BoolishValueParser::new()
    )]
    pub tls_client_tenants: Option<bool>,

    /// How often the credentials files are checked for changes (SIGHUP
    /// reloads them at once).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub credentials_reload_interval: Option<HumanDuration>,

    /// How long a closed budget cycle's billing record is kept after the
    /// cycle ended (13 months); each server prunes older ones every hour.
    #[arg(long, value_name = "DURATION")]
    pub budget_record_retention: Option<HumanDuration>,

    /// How often this server samples every bucket's totals into the usage
    /// history (`tollgate tenant history`, the console's charts), and
    /// writes the per-key checks it answered; `0s` leaves the sampling to
    /// the other servers of the store (its own checks are still written,
    /// every 10 s). A bucket whose totals did not change costs no row.
    #[arg(long, value_name = "DURATION")]
    pub history_interval: Option<HumanDuration>,

    /// How long the usage history keeps a row per minute (14 days).
    #[arg(long, value_name = "DURATION")]
    pub history_minute_retention: Option<HumanDuration>,

    /// How long the usage history keeps a row per hour (13 months).
    #[arg(long, value_name = "DURATION")]
    pub history_hour_retention: Option<HumanDuration>,

    /// Post budget events (a budget crossing a threshold) to this URL,
    /// `http://` or `https://`; give it again, or a comma-separated list,
    /// for several. Each event is posted to each until it answers 2xx,
    /// with backoff, by any server of the store. Needs
    /// --webhook-secret-file [default: none, events wait in the store].
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    pub webhook_url: Option<Vec<String>>,

    /// The shared secret budget events are signed with
    /// (`Tollgate-Signature`, HMAC-SHA256): the file's contents, 16 bytes
    /// or more, a final newline ignored [default: none].
    #[arg(long, value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,

    /// The longest a post to a webhook may take.
    #[arg(long, value_name = "DURATION")]
    pub webhook_timeout: Option<HumanDuration>,

    /// How long a server holds the events it is posting: another server
    /// takes up the events of one that died mid-delivery once this is
    /// over. At least the timeout times the webhooks, a batch at once.
    #[arg(long, value_name = "DURATION")]
    pub webhook_lease: Option<HumanDuration>,

    /// The longest wait before a failed post is tried again (the wait
    /// starts at 1s and doubles).
    #[arg(long, value_name = "DURATION")]
    pub webhook_retry_max: Option<HumanDuration>,
}

/// Where budget events are posted (`--webhook-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    pub urls: Vec<String>,
    pub secret_file: PathBuf,
    pub timeout: Duration,
    pub lease: Duration,
    pub retry_max: Duration,
}

/// The files of the gRPC port's TLS (`--tls-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// `--grant-policy`: a [`GrantPolicy`], by the name the core gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Policy(pub GrantPolicy);

/// Every policy, in the core's order.
const POLICIES: [Policy; 3] = [
    Policy(GrantPolicy::ALL[0]),
    Policy(GrantPolicy::ALL[1]),
    Policy(GrantPolicy::ALL[2]),
];

impl ValueEnum for Policy {
    fn value_variants<'a>() -> &'a [Self] {
        &POLICIES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self.0 {
            GrantPolicy::Shares => "each pod gets its shares' fraction of the refill rate",
            GrantPolicy::BucketLevelEma => {
                "the bucket level's moving average limits each grant (shares ignored)"
            }
            GrantPolicy::Greedy => {
                "first come, first served from what the bucket holds; a baseline, not for production"
            }
        };
        Some(clap::builder::PossibleValue::new(self.0.name()).help(help))
    }
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// A duration written for people (`500ms`, `90s`, `2m`), in flags, the
/// environment and the file alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = humantime::DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(HumanDuration)
    }
}

impl TryFrom<String> for HumanDuration {
    type Error = humantime::DurationError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<HumanDuration> for String {
    fn from(d: HumanDuration) -> String {
        humantime::format_duration(d.0).to_string()
    }
}

/// `--metrics-listen`: an address, or `off` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MetricsListen(pub Option<SocketAddr>);

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            return Ok(MetricsListen(None));
        }
        s.parse()
            .map(|addr| MetricsListen(Some(addr)))
            .map_err(|e| format!("{e}; expected an address such as 127.0.0.1:9464, or off"))
    }
}

impl TryFrom<String> for MetricsListen {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MetricsListen> for String {
    fn from(m: MetricsListen) -> String {
        m.0.map_or_else(|| "off".to_owned(), |addr| addr.to_string())
    }
}

/// Which layer set an option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    /// The variable's name.
    Env(String),
    Flag,
}

impl Source {
    /// The layer's short name; `None` for the defaults.
    fn layer(&self) -> Option<&'static str> {
        match self {
            Source::Default => None,
            Source::File(_) => Some("file"),
            Source::Env(_) => Some("env"),
            Source::Flag => Some("flags"),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("the default"),
            Source::File(path) => write!(f, "config file {}", path.display()),
            Source::Env(name) => write!(f, "environment variable {name}"),
            Source::Flag => f.write_str("the command line"),
        }
    }
}

/// A config file's path and contents.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub text: String,
}

impl ConfigFile {
    pub fn read(path: &Path) -> anyhow::Result<ConfigFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read config file {}", path.display()))?;
        Ok(ConfigFile {
            path: path.to_owned(),
            text,
        })
    }
}

/// The configuration `tollgate serve` runs with: every layer applied,
/// every value validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// The TOML file read, if any.
    pub config_file: Option<PathBuf>,
    pub listen: SocketAddr,
    pub store: StoreLocation,
    /// Whether a missing embedded store file is made: with `--create`, or
    /// when no layer named a store (the default file, on the first run).
    pub store_creation: Creation,
    pub postgres: PostgresPool,
    /// How buckets behave and what unconfigured tenants get.
    pub settings: BucketSettings,
    pub log_format: LogFormat,
    /// Where Prometheus metrics are served over HTTP; `None` when `off`.
    pub metrics_listen: Option<SocketAddr>,
    /// How old the per-tenant metrics may be.
    pub metrics_store_read_interval: Duration,
    /// TLS on the gRPC port; `None` for plain gRPC.
    pub tls: Option<TlsFiles>,
    /// The `Admin` service's tokens file, if any.
    pub admin_tokens_file: Option<PathBuf>,
    /// The pods' tokens file, if any.
    pub pod_tokens_file: Option<PathBuf>,
    /// Pods act for the tenants their client certificates name.
    pub tls_client_tenants: bool,
    /// How often the credentials files are checked for changes.
    pub credentials_reload_interval: Duration,
    /// Pod-facing requests pending at once.
    pub max_pending_requests: usize,
    /// Where budget events are posted; `None` without `--webhook-url`.
    pub webhooks: Option<WebhookConfig>,
    /// How often this server samples the usage history; `None` with
    /// `--history-interval 0s`.
    pub history_interval: Option<Duration>,
    /// The layer each option came from, by option name; options no layer
    /// set are absent.
    pub sources: BTreeMap<String, Source>,
}

impl ServeConfig {
    /// Reads the file `--config` (else `TOLLGATE_CONFIG`) names, if any,
    /// and resolves the configuration with it.
    pub fn load(args: &ServeArgs, env: EnvLookup<'_>) -> anyhow::Result<ServeConfig> {
        let path = match &args.config {
            Some(path) => Some(path.clone()),
            None => non_empty(env, CONFIG_ENV).map(PathBuf::from),
        };
        let file = path.as_deref().map(ConfigFile::read).transpose()?;
        ServeConfig::resolve(&args.options, env, file.as_ref())
    }

    /// Lays defaults, `file`, the `TOLLGATE_*` variables `env` finds and
    /// `flags` over each other, later winning, and validates the result.
    /// `store` set nowhere falls back to `DATABASE_URL`, then to
    /// `tollgate.redb`.
    pub fn resolve(
        flags: &ServeOptions,
        env: EnvLookup<'_>,
        file: Option<&ConfigFile>,
    ) -> anyhow::Result<ServeConfig> {
        let mut layers = Layers::default();
        layers.add(Source::Default, &defaults()?)?;
        if let Some(file) = file {
            layers.add_file(file)?;
        }
        for (name, options) in env_layers(env)? {
            layers.add(Source::Env(name), &options)?;
        }
        layers.add(Source::Flag, flags)?;
        layers.into_config(env, file.map(|f| f.path.clone()))
    }

    /// The layers that set options, in the order they apply, e.g.
    /// `file: listen; env: store; flags: log-format`.
    pub fn describe_sources(&self) -> String {
        let described: Vec<String> = ["file", "env", "flags"]
            .iter()
            .filter_map(|layer| {
                let options: Vec<String> = self
                    .sources
                    .iter()
                    .filter(|(_, source)| source.layer() == Some(layer))
                    .map(|(option, source)| match source {
                        Source::Env(name) if name == DATABASE_URL_ENV => {
                            format!("{option} ({DATABASE_URL_ENV})")
                        }
                        _ => option.clone(),
                    })
                    .collect();
                (!options.is_empty()).then(|| format!("{layer}: {}", options.join(", ")))
            })
            .collect();
        if described.is_empty() {
            "defaults only".to_owned()
        } else {
            described.join("; ")
        }
    }

    /// What pods of a tenant nobody has configured get, in a sentence for
    /// the log at start: the default limits, or a refusal.
    pub fn describe_unconfigured_tenants(&self) -> String {
        match &self.settings.unconfigured_tenants {
            UnconfiguredTenants::UseDefaults(d) => format!(
                "tenants nobody has configured are served with the default limits: refill rate {} tokens/s, burst limit {} tokens, starting with {} tokens (--require-configured-tenants refuses them instead)",
                d.limits.refill_rate, d.limits.burst_limit, d.initial_tokens
            ),
            UnconfiguredTenants::Reject => "tenants nobody has configured are refused (NOT_FOUND): --require-configured-tenants".to_owned(),
        }
    }

    /// Logs the configuration in effect, in one line, without passwords.
    pub fn log_effective(&self) {
        let (default_refill_rate, default_burst_limit, default_initial_tokens) =
            match &self.settings.unconfigured_tenants {
                UnconfiguredTenants::UseDefaults(d) => (
                    Some(d.limits.refill_rate),
                    Some(d.limits.burst_limit),
                    Some(d.initial_tokens),
                ),
                UnconfiguredTenants::Reject => (None, None, None),
            };
        let bucket = &self.settings.bucket;
        let postgres = matches!(self.store, StoreLocation::Postgres(_)).then_some(&self.postgres);
        tracing::info!(
            config_file = self.config_file.as_ref().map(|p| p.display().to_string()),
            listen = %self.listen,
            store = %self.store.describe(),
            max_pending_requests = self.max_pending_requests,
            pg_pool_size = postgres.map(|p| p.pool_size),
            pg_max_batch = postgres.map(|p| p.max_batch),
            pg_connect_timeout = postgres.map(|p| humantime::format_duration(p.connect_timeout).to_string()),
            pg_ca_file = postgres.and_then(|p| p.ca_file.as_ref()).map(|f| f.display().to_string()),
            require_configured_tenants = default_refill_rate.is_none(),
            default_refill_rate,
            default_burst_limit,
            default_initial_tokens,
            grant_policy = bucket.policy.name(),
            inactivity_timeout = %humantime::format_duration(bucket.inactivity_timeout),
            reported_dead_timeout = %humantime::format_duration(bucket.reported_dead_timeout),
            draw_period = %humantime::format_duration(bucket.draw_period),
            log_format = %self.log_format,
            metrics_listen = %self.metrics_listen.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            metrics_store_read_interval = %humantime::format_duration(self.metrics_store_read_interval),
            tls = self.tls.is_some(),
            mutual_tls = self.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
            admin_tokens_file = self.admin_tokens_file.as_ref().map(|f| f.display().to_string()),
            pod_tokens_file = self.pod_tokens_file.as_ref().map(|f| f.display().to_string()),
            tls_client_tenants = self.tls_client_tenants,
            budget_record_retention = %humantime::format_duration(self.settings.budget_record_retention),
            webhooks = ?self.webhooks.as_ref().map(|w| &w.urls),
            set_by = %self.describe_sources(),
            "effective configuration"
        );
    }
}

/// The options merged so far, as one TOML table, and who set each.
#[derive(Debug, Default)]
struct Layers {
    values: toml::Table,
    sources: BTreeMap<String, Source>,
}

impl Layers {
    /// Lays `options` over what is there.
    fn add(&mut self, source: Source, options: &ServeOptions) -> anyhow::Result<()> {
        let table = match toml::Value::try_from(options) {
            Ok(toml::Value::Table(table)) => table,
            Ok(other) => return Err(anyhow!("{source}: not a table: {other:?}")),
            Err(e) => return Err(anyhow!("{source}: {e}")),
        };
        self.set(source, table);
        Ok(())
    }

    /// Lays a config file over what is there. Each key is checked on its
    /// own, so an error names the key.
    fn add_file(&mut self, file: &ConfigFile) -> anyhow::Result<()> {
        let source = Source::File(file.path.clone());
        let table: toml::Table = file
            .text
            .parse()
            .map_err(|e: toml::de::Error| anyhow!("{source}: {e}"))?;
        for (key, value) in &table {
            let single = toml::Table::from_iter([(key.clone(), value.clone())]);
            toml::Value::Table(single)
                .try_into::<ServeOptions>()
                .map_err(|e| anyhow!("{source}: key `{key}`: {}", e.message()))?;
        }
        self.set(source, table);
        Ok(())
    }

    fn set(&mut self, source: Source, table: toml::Table) {
        for (key, value) in table {
            self.sources.insert(key.clone(), source.clone());
            self.values.insert(key, value);
        }
    }

    /// Where `option`'s value came from, for an error message.
    fn origin(&self, option: &str) -> String {
        self.sources
            .get(option)
            .map_or_else(String::new, |source| format!(" (from {source})"))
    }

    /// Validates the merged options into a [`ServeConfig`].
    fn into_config(
        mut self,
        env: EnvLookup<'_>,
        config_file: Option<PathBuf>,
    ) -> anyhow::Result<ServeConfig> {
        let mut options: ServeOptions = toml::Value::Table(self.values.clone())
            .try_into()
            .map_err(|e| anyhow!("merge the configuration layers: {}", e.message()))?;
        if options.store.is_none()
            && options.in_memory != Some(true)
            && let Some(url) = non_empty(env, DATABASE_URL_ENV)
        {
            options.store = Some(url);
            self.sources
                .insert("store".to_owned(), Source::Env(DATABASE_URL_ENV.to_owned()));
        }
        let bad = |option: &str, problem: &dyn fmt::Display| {
            anyhow!("--{option}: {problem}{}", self.origin(option))
        };

        let store = match (options.store.as_deref(), options.in_memory == Some(true)) {
            (Some(_), true) => {
                return Err(anyhow!(
                    "--in-memory{} and --store{}: choose one",
                    self.origin("in-memory"),
                    self.origin("store")
                ));
            }
            (Some(""), false) => return Err(bad("store", &"must not be empty")),
            (Some(location), false) => StoreLocation::parse(location),
            (None, true) => StoreLocation::Memory,
            (None, false) => StoreLocation::default_file(),
        };
        let store_creation = if required(options.create, "create")? {
            Creation::Allowed { why: "--create" }
        } else if options.store.is_none() {
            Creation::Allowed {
                why: "no --store given: the default file in the working directory, made on the first run",
            }
        } else {
            Creation::Refused {
                hint: "give --create to start a new, empty store there, or --store the path of the existing one",
            }
        };
        if let StoreLocation::Postgres(url) = &store {
            url.parse::<tokio_postgres::Config>()
                .map_err(|e| bad("store", &format!("not a valid PostgreSQL URL: {e}")))?;
        }

        let postgres = PostgresPool {
            pool_size: required(options.pg_pool_size, "pg-pool-size")?,
            max_batch: required(options.pg_max_batch, "pg-max-batch")?,
            connect_timeout: required(options.pg_connect_timeout, "pg-connect-timeout")?.0,
            ca_file: options.pg_ca_file.clone(),
        };
        if postgres.pool_size == 0 {
            return Err(bad("pg-pool-size", &"must be at least 1"));
        }
        if postgres.max_batch == 0 {
            return Err(bad("pg-max-batch", &"must be at least 1"));
        }
        if postgres.connect_timeout.is_zero() {
            return Err(bad("pg-connect-timeout", &"must be more than zero"));
        }

        let max_pending_requests = required(options.max_pending_requests, "max-pending-requests")?;
        if max_pending_requests == 0 {
            return Err(bad("max-pending-requests", &"must be at least 1"));
        }

        let refill_rate = required(options.default_refill_rate, "default-refill-rate")?;
        let burst_limit = required(options.default_burst_limit, "default-burst-limit")?;
        for (option, value, max) in [
            ("default-refill-rate", refill_rate, MAX_REFILL_RATE),
            ("default-burst-limit", burst_limit, MAX_TOKENS),
        ] {
            validate::non_negative("value", value, max).map_err(|e| bad(option, &e.reason))?;
        }
        let initial_tokens = options.default_initial_tokens.unwrap_or(burst_limit);
        validate::non_negative("value", initial_tokens, MAX_TOKENS)
            .map_err(|e| bad("default-initial-tokens", &e.reason))?;
        let unconfigured_tenants = if required(
            options.require_configured_tenants,
            "require-configured-tenants",
        )? {
            UnconfiguredTenants::Reject
        } else {
            UnconfiguredTenants::UseDefaults(DefaultLimits {
                limits: Limits {
                    refill_rate,
                    burst_limit,
                },
                initial_tokens,
            })
        };

        let inactivity_timeout = required(options.inactivity_timeout, "inactivity-timeout")?.0;
        if inactivity_timeout.is_zero() {
            return Err(bad("inactivity-timeout", &"must be more than zero"));
        }
        let settings = BucketSettings {
            bucket: GlobalBucketConfig {
                policy: required(options.grant_policy, "grant-policy")?.0,
                inactivity_timeout,
                reported_dead_timeout: required(
                    options.reported_dead_timeout,
                    "reported-dead-timeout",
                )?
                .0,
                draw_period: required(options.draw_period, "draw-period")?.0,
                ..GlobalBucketConfig::default()
            },
            unconfigured_tenants,
            budget_record_retention: required(
                options.budget_record_retention,
                "budget-record-retention",
            )?
            .0,
            history: history_config(&options, &bad)?,
        };
        let history_interval = Some(required(options.history_interval, "history-interval")?.0)
            .filter(|i| !i.is_zero());
        if settings.budget_record_retention.is_zero() {
            return Err(bad(
                "budget-record-retention",
                &"must be more than zero: billing records would be removed as soon as their cycle closes",
            ));
        }

        let tls = match (&options.tls_cert, &options.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: options.tls_client_ca.clone(),
            }),
            (None, None) => {
                if options.tls_client_ca.is_some() {
                    return Err(bad(
                        "tls-client-ca",
                        &"needs --tls-cert and --tls-key (mutual TLS is TLS first)",
                    ));
                }
                None
            }
            (Some(_), None) => return Err(bad("tls-cert", &"needs --tls-key too")),
            (None, Some(_)) => return Err(bad("tls-key", &"needs --tls-cert too")),
        };

        let tls_client_tenants = required(options.tls_client_tenants, "tls-client-tenants")?;
        if tls_client_tenants && tls.as_ref().is_none_or(|t| t.client_ca.is_none()) {
            return Err(bad(
                "tls-client-tenants",
                &"needs --tls-client-ca (tenants come from verified client certificates)",
            ));
        }
        let credentials_reload_interval = required(
            options.credentials_reload_interval,
            "credentials-reload-interval",
        )?
        .0;
        if credentials_reload_interval.is_zero() {
            return Err(bad(
                "credentials-reload-interval",
                &"must be more than zero",
            ));
        }

        let webhooks = match (options.webhook_url.as_deref(), &options.webhook_secret_file) {
            (None | Some([]), _) => None,
            (Some(_), None) => {
                return Err(bad(
                    "webhook-url",
                    &"needs --webhook-secret-file: budget events are always signed",
                ));
            }
            (Some(urls), Some(secret_file)) => {
                let timeout = required(options.webhook_timeout, "webhook-timeout")?.0;
                let lease = required(options.webhook_lease, "webhook-lease")?.0;
                let retry_max = required(options.webhook_retry_max, "webhook-retry-max")?.0;
                for (option, value) in [
                    ("webhook-timeout", timeout),
                    ("webhook-lease", lease),
                    ("webhook-retry-max", retry_max),
                ] {
                    if value.is_zero() {
                        return Err(bad(option, &"must be more than zero"));
                    }
                }
                let urls: Vec<String> = urls.iter().map(|u| u.trim().to_owned()).collect();
                // The secret is read, and checked, when the server starts.
                tollgate_server::webhooks::check_urls(&urls).map_err(|e| bad("webhook-url", &e))?;
                Some(WebhookConfig {
                    urls,
                    secret_file: secret_file.clone(),
                    timeout,
                    lease,
                    retry_max,
                })
            }
        };

        Ok(ServeConfig {
            config_file,
            webhooks,
            history_interval,
            tls,
            admin_tokens_file: options.admin_tokens_file.clone(),
            pod_tokens_file: options.pod_tokens_file.clone(),
            tls_client_tenants,
            credentials_reload_interval,
            max_pending_requests,
            listen: required(options.listen, "listen")?,
            store,
            store_creation,
            postgres,
            settings,
            log_format: required(options.log_format, "log-format")?,
            metrics_listen: required(options.metrics_listen, "metrics-listen")?.0,
            metrics_store_read_interval: required(
                options.metrics_store_read_interval,
                "metrics-store-read-interval",
            )?
            .0,
            sources: self.sources,
        })
    }
}

/// An option the defaults layer sets; missing only if its declaration lost
/// its `default_value`.
fn required<T>(value: Option<T>, option: &str) -> anyhow::Result<T> {
    value.ok_or_else(|| anyhow!("--{option}: no value and no default"))
}

fn non_empty(env: EnvLookup<'_>, name: &str) -> Option<String> {
    env(name).filter(|value| !value.is_empty())
}

/// An option's environment variable: `pg-pool-size` → `TOLLGATE_PG_POOL_SIZE`.
pub fn env_var(option: &str) -> String {
    format!("{ENV_PREFIX}{}", option.to_uppercase().replace('-', "_"))
}

/// The options' flags as declared, defaults included.
fn declared() -> Command {
    with_component_defaults(ServeOptions::augment_args(
        Command::new("serve").no_binary_name(true),
    ))
}

/// Sets the defaults of the flags that configure a component from that
/// component's own defaults ([`component_default`]).
fn with_component_defaults(command: Command) -> Command {
    command.mut_args(|arg| match component_default(arg.get_id().as_str()) {
        Some(value) => arg.default_value(value),
        None => arg,
    })
}

/// The default of a flag that configures a component, as the component's
/// own options type declares it: each default is written once, by the
/// type that owns it.
fn component_default(id: &str) -> Option<String> {
    let limits = DefaultLimits::default();
    let bucket = GlobalBucketConfig::default();
    let postgres = PostgresOptions::new("");
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    Some(match id {
        "default_refill_rate" => limits.limits.refill_rate.to_string(),
        "default_burst_limit" => limits.limits.burst_limit.to_string(),
        "grant_policy" => bucket.policy.name().to_owned(),
        "inactivity_timeout" => duration(bucket.inactivity_timeout),
        "reported_dead_timeout" => duration(bucket.reported_dead_timeout),
        "draw_period" => duration(bucket.draw_period),
        "max_pending_requests" => {
            tollgate_server::service::admission::DEFAULT_MAX_PENDING.to_string()
        }
        "metrics_store_read_interval" => {
            duration(tollgate_server::telemetry::metrics::DEFAULT_STORE_READ_INTERVAL)
        }
        "pg_pool_size" => postgres.pool_size.to_string(),
        "pg_max_batch" => postgres.max_batch.to_string(),
        "pg_connect_timeout" => duration(postgres.connect_timeout),
        "budget_record_retention" => duration(tollgate_core::budget::DEFAULT_RECORD_RETENTION),
        "history_interval" | "history_minute_retention" | "history_hour_retention" => {
            let h = tollgate_core::history::HistoryConfig::default();
            duration(match id {
                "history_interval" => h.sample_interval,
                "history_minute_retention" => h.resolutions[0].retention,
                _ => h.resolutions[1].retention,
            })
        }
        "webhook_timeout" | "webhook_lease" | "webhook_retry_max" => {
            let w = tollgate_server::webhooks::WebhookOptions::default_timing();
            duration(match id {
                "webhook_timeout" => w.timeout,
                "webhook_lease" => w.lease,
                _ => w.backoff.max,
            })
        }
        _ => return None,
    })
}

/// The usage history's configuration from `options`; an interval of 0
/// (this server samples nothing) still configures the resolutions, which
/// reads and pruning use.
fn history_config(
    options: &ServeOptions,
    bad: &dyn Fn(&str, &dyn fmt::Display) -> anyhow::Error,
) -> anyhow::Result<HistoryConfig> {
    let interval = required(options.history_interval, "history-interval")?.0;
    let mut config = HistoryConfig::default();
    if !interval.is_zero() {
        config.sample_interval = interval;
    }
    let retentions = [
        ("history-minute-retention", options.history_minute_retention),
        ("history-hour-retention", options.history_hour_retention),
    ];
    for (resolution, (option, retention)) in config.resolutions.iter_mut().zip(retentions) {
        resolution.retention = required(retention, option)?.0;
        if resolution.retention < resolution.step {
            return Err(bad(
                option,
                &format!(
                    "must be at least {}: a row covers that much",
                    humantime::format_duration(resolution.step)
                ),
            ));
        }
    }
    config.validate().map_err(|e| match e {
        HistoryConfigError::SampleInterval | HistoryConfigError::FinerThanSamples(_) => {
            bad("history-interval", &"must be 0s, or from 1s to 1m")
        }
        e => anyhow!("{e}"),
    })?;
    Ok(config)
}

/// The declared flags without their defaults: parses one layer.
fn layer_parser() -> Command {
    declared().mut_args(|arg| arg.default_value(None))
}

fn parse_layer(args: &[String]) -> Result<ServeOptions, clap::Error> {
    let matches = layer_parser().try_get_matches_from(args)?;
    ServeOptions::from_arg_matches(&matches)
}

/// The defaults layer: every `default_value`, parsed as if given as a flag.
fn defaults() -> anyhow::Result<ServeOptions> {
    let args: Vec<String> = declared()
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            let default = arg.get_default_values().first()?;
            Some(format!("--{long}={}", default.to_string_lossy()))
        })
        .collect();
    parse_layer(&args).map_err(|e| anyhow!("built-in defaults: {}", clap_message(&e)))
}

/// One layer per `TOLLGATE_*` variable that is set (and not empty), parsed
/// as its flag would be.
fn env_layers(env: EnvLookup<'_>) -> anyhow::Result<Vec<(String, ServeOptions)>> {
    let mut layers = Vec::new();
    for arg in declared().get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let name = env_var(long);
        let Some(value) = non_empty(env, &name) else {
            continue;
        };
        let options = parse_layer(&[format!("--{long}={value}")])
            .map_err(|e| anyhow!("environment variable {name}: {}", clap_message(&e)))?;
        layers.push((name, options));
    }
    Ok(layers)
}

/// A clap error on one line, without clap's `error: ` and its hints.
fn clap_message(e: &clap::Error) -> String {
    let rendered = e.to_string();
    let lines: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|line| {
            !line.is_empty()
                && !line.starts_with("For more information")
                && !line.starts_with("tip:")
        })
        .collect();
    let message = lines.join(" ");
    message
        .strip_prefix("error: ")
        .map_or(message.clone(), str::to_owned)
}

/// Completes each flag's help with its default (if it has a plain one) and
/// its environment variable, then drops the default, so that a flag not
/// given stays `None`.
fn document_layers(arg: Arg) -> Arg {
    let Some(long) = arg.get_long() else {
        return arg;
    };
    let mut defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if defaults.is_empty() {
        defaults.extend(component_default(arg.get_id().as_str()));
    }
    let mut tags = String::new();
    if !defaults.is_empty() {
        tags.push_str(&format!(" [default: {}]", defaults.join(",")));
    }
    tags.push_str(&format!(" [env: {}]", env_var(long)));
    let help = arg.get_help().map(|h| format!("{h}{tags}"));
    let long_help = arg.get_long_help().map(|h| format!("{h}{tags}"));
    let mut arg = arg.default_value(None);
    if let Some(help) = help {
        arg = arg.help(help);
    }
    if let Some(long_help) = long_help {
        arg = arg.long_help(long_help);
    }
    arg
}

#[cfg(test)]
mod tests;
