//! `tollgate`: runs the server and administers tenants.
//!
//! - `tollgate serve`: the gRPC server on the embedded store or PostgreSQL,
//!   configured by defaults, a TOML file, `TOLLGATE_*` variables and flags.
//! - `tollgate agent`: a tenant's local buckets beside its pods (a sidecar,
//!   or one per node), served on a Unix socket to pods in any language.
//! - `tollgate migrate`: brings a store's schema up to date.
//! - `tollgate tenant …`: set limits, show, list and delete tenants on a
//!   running server through its `Admin` service; onboard them on a tier,
//!   move them between tiers, override a bucket's limits.
//! - `tollgate tier …`: create, update, list, show and delete tiers, or
//!   apply a TOML file of them.
//! - `tollgate check`: one exact per-key check; the exit status is the
//!   verdict (0 allowed, 3 refused).
//! - `tollgate pod request`: one token-bucket request, as a pod would send it.
//! - `tollgate bench`: a load generator: many simulated pods against one or
//!   more servers, with throughput, latency and per-tenant consumption sums.
//! - `tollgate completions SHELL` and `tollgate man`: shell completions and
//!   the manual page, generated from the same definitions as `--help`.
//!
//! Every command that prints a result takes `--json` (see `output`). A
//! command whose reader closes stdout early (`tollgate … | head`) stops
//! quietly with status 141, as a process ended by SIGPIPE.
//!
//! Logs go to stderr, filtered by `RUST_LOG`: text, or one JSON object per
//! line for `serve --log-format json`. `serve` resolves its configuration
//! before logging starts, since the log format is part of it.

mod agent;
mod bench;
mod budget;
mod check;
mod closing;
mod image;
mod org;
mod pod;
mod preview;
mod remote;
mod serve;
mod tenant;
mod tier;

use tollgate::{config, output, store};

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, ServeConfig};

/// What `RUST_LOG` falls back to.
const DEFAULT_LOG_FILTER: &str = "info,tokio_postgres=warn,refinery_core=warn";

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
    Serve(Box<config::ServeArgs>),
    /// Run an agent beside pods: their tenants' local buckets, served on a
    /// Unix socket (gRPC and HTTP/JSON) to pods in any language.
    Agent(agent::AgentArgs),
    /// Bring a store's schema up to date (the server also does it at start).
    Migrate(store::MigrateArgs),
    /// Write a consistent snapshot of a store as JSON lines (a backup, or
    /// the first half of a move to another store)
    ///
    /// A server on an embedded store file must be stopped first; a
    /// PostgreSQL store exports while servers run.
    Export(image::ExportArgs),
    /// Load an export into a store, in one transaction (a restore, or the
    /// second half of a move)
    ///
    /// The whole file is checked first: one cut short or inconsistent is
    /// refused and the store left untouched. A store that holds anything is
    /// refused unless --replace.
    Import(image::ImportArgs),
    /// Configure and inspect tenants on a running server.
    Tenant(tenant::TenantArgs),
    /// Define tiers (named sets of bucket limits) on a running server.
    Tier(tier::TierArgs),
    /// Organisations: tenants whose buckets share an organisation's
    /// limits, with guarantees and borrowing, on a running server.
    Org(org::OrgArgs),
    /// Set, show and clear budgets per billing cycle of tenants' buckets
    /// on a running server.
    Budget(budget::BudgetArgs),
    /// Print a bucket's billing record per cycle: the current cycle and
    /// the closed ones, with the tokens granted and every consumption
    /// counter, exactly.
    Usage(budget::UsageArgs),
    /// Check a key of a per-key bucket (take tokens if it holds them).
    ///
    /// Exit status: 0 allowed (tokens taken), 3 refused (nothing taken),
    /// 1 error, 2 usage error.
    Check(check::CheckArgs),
    /// Act as a pod against a running server (for trying things out).
    Pod(pod::PodArgs),
    /// Load a running server with simulated pods and measure it.
    Bench(bench::BenchArgs),
    /// Print shell completions for bash, zsh, fish, elvish or PowerShell
    ///
    /// bash: `tollgate completions bash > /etc/bash_completion.d/tollgate`;
    /// zsh: `tollgate completions zsh > "${fpath[1]}/_tollgate"`;
    /// fish: `tollgate completions fish > ~/.config/fish/completions/tollgate.fish`.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), for `man`
    ///
    /// `tollgate man | man -l -`, or `tollgate man --out-dir
    /// /usr/local/share/man/man1` for a page per command (`man
    /// tollgate-tenant-set-limits`).
    Man {
        /// Write tollgate.1 and a page for every subcommand into this
        /// directory instead of printing the top page.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (result, log_format) = match cli.command {
        Command::Serve(args) => {
            // The log format is part of the configuration, so logging
            // starts only once the configuration is known; until then
            // errors go to stderr as plain text.
            match ServeConfig::load(&args, &|name| std::env::var(name).ok()) {
                Ok(config) => {
                    let log_format = config.log_format;
                    init_logging(log_format);
                    (block_on(serve::serve(config)), log_format)
                }
                Err(e) => (Err(e), LogFormat::Text),
            }
        }
        Command::Agent(args) => {
            let threads = usize::from(args.threads);
            with_text_logs_on(Some(threads), agent::run(args))
        }
        Command::Migrate(args) => with_text_logs(store::migrate(args)),
        Command::Export(args) => with_text_logs(image::export(args)),
        Command::Import(args) => with_text_logs(image::import(args)),
        Command::Tenant(args) => with_text_logs(tenant::run(args)),
        Command::Tier(args) => with_text_logs(tier::run(args)),
        Command::Org(args) => with_text_logs(org::run(args)),
        Command::Budget(args) => with_text_logs(budget::run(args)),
        Command::Usage(args) => with_text_logs(budget::usage(args)),
        Command::Check(args) => match with_text_logs(check::run(args)) {
            (Ok(verdict), _) => return verdict,
            (Err(e), format) => (Err(e), format),
        },
        Command::Pod(args) => with_text_logs(pod::run(args)),
        Command::Bench(args) => with_text_logs(bench::run(args)),
        Command::Completions { shell } => (completions(shell), LogFormat::Text),
        Command::Man { out_dir } => (man(out_dir.as_deref()), LogFormat::Text),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`tollgate … | head`): nothing is wrong
        // with the command, and there is nobody to tell.
        Err(e) if closed_stdout(&e) => ExitCode::from(EXIT_CLOSED_STDOUT),
        Err(e) => {
            let error = said_once(&e);
            match log_format {
                // Keep stderr one JSON object per line.
                LogFormat::Json => tracing::error!(%error, "tollgate failed"),
                LogFormat::Text => eprintln!("error: {error}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a command whose stdout was closed before it
/// finished writing: 128 + SIGPIPE, what a shell reports for `cat` or
/// `grep` in the same place, so `set -o pipefail` sees the same.
const EXIT_CLOSED_STDOUT: u8 = 128 + 13;

/// Whether `e` comes from writing to a pipe nobody reads any more.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Shell completions on stdout. Generated in memory first: clap_complete
/// panics when it cannot write, and a closed stdout is no reason to panic.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .context("write the completions to stdout")
}

/// An error and its causes, joined with `: `, each said once: a cause
/// whose message the text so far already ends with (an error that prints
/// its source as well as returning it) is left out.
fn said_once(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let message = cause.to_string();
        if text.ends_with(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

/// The manual: the top page on stdout, or every page into `out_dir`.
fn man(out_dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context;
    match out_dir {
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout().lock())
            .context("write the manual page to stdout"),
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--out-dir: create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), dir)
                .with_context(|| format!("--out-dir: write the pages into {}", dir.display()))
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default [`DEFAULT_LOG_FILTER`]).
fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

/// Runs `work` to completion on a multi-threaded runtime.
fn block_on<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    block_on_threads(None, work)
}

/// Runs `work` to completion on a runtime of `threads` worker threads
/// (`None`: one per core).
fn block_on_threads<T>(
    threads: Option<usize>,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        runtime.worker_threads(threads);
    }
    runtime.enable_all().build()?.block_on(work)
}

/// Runs a command other than `serve`: its logs are always text.
fn with_text_logs<T>(
    work: impl Future<Output = anyhow::Result<T>>,
) -> (anyhow::Result<T>, LogFormat) {
    with_text_logs_on(None, work)
}

/// [`with_text_logs`] on a runtime of `threads` worker threads (`None`:
/// one per core).
fn with_text_logs_on<T>(
    threads: Option<usize>,
    work: impl Future<Output = anyhow::Result<T>>,
) -> (anyhow::Result<T>, LogFormat) {
    init_logging(LogFormat::Text);
    (block_on_threads(threads, work), LogFormat::Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its source and also returns it, as store
    /// errors do.
    #[derive(Debug)]
    struct Opening(std::io::Error);

    impl std::fmt::Display for Opening {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "open the store file: {}", self.0)
        }
    }

    impl std::error::Error for Opening {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let cause = std::io::Error::other("Database already open");
        let e = anyhow::Error::new(Opening(cause)).context("export file a.redb");
        assert_eq!(
            said_once(&e),
            "export file a.redb: open the store file: Database already open"
        );
        let plain = anyhow::anyhow!("refused").context("import a.jsonl");
        assert_eq!(said_once(&plain), "import a.jsonl: refused");
    }
}
