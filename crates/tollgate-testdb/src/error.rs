//! The one error type of the harness.
//!
//! Every message says what was being attempted and, where the developer has to
//! act, what to do: a test that fails for want of a database should fail with
//! instructions, not with a bare "connection refused".

use std::fmt;
use std::path::PathBuf;

/// Why the harness could not provide a database or manage a cluster.
///
/// The message is complete in itself, causes included (tokio-postgres's own
/// messages leave out the cause, "error connecting to server", which is the
/// part a developer needs). `Debug` shows the same message, because tests
/// `expect()` these errors and the instructions must reach the developer
/// intact.
#[derive(thiserror::Error)]
pub enum HarnessError {
    /// `DATABASE_URL` is set but is not a `postgres://` URL the harness can use.
    #[error("DATABASE_URL ({url}) is not a usable PostgreSQL URL: {reason}")]
    InvalidDatabaseUrl {
        /// The URL, with any password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// `DATABASE_URL` is set but its server cannot be reached. The harness does
    /// not fall back to another server: whoever set the variable meant that one.
    #[error(
        "DATABASE_URL is set to {url}, but connecting to it failed: {}. \
         Start that server, fix DATABASE_URL, or unset it to use a local server",
        pg_error_text(error)
    )]
    DatabaseUrlUnreachable {
        /// The URL, with any password hidden.
        url: String,
        /// The connection error.
        error: tokio_postgres::Error,
    },

    /// `DATABASE_URL` is unset and no local server could be used or started.
    #[error(
        "no PostgreSQL server for the tests. Tried: {attempts}. Either set DATABASE_URL to a \
         server where the user may CREATE DATABASE (for example \
         DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres), or install PostgreSQL \
         (initdb and pg_ctl; set TOLLGATE_PG_BINDIR if they are somewhere unusual) and start \
         it on 127.0.0.1:5432"
    )]
    NoServer {
        /// Each source that was tried and why it was not usable.
        attempts: String,
    },

    /// A connection to a known server failed.
    #[error("connect to {url}: {}", pg_error_text(error))]
    Connect {
        /// The URL, with any password hidden.
        url: String,
        /// The connection error.
        error: tokio_postgres::Error,
    },

    /// A statement the harness itself runs (CREATE DATABASE, …) failed.
    #[error("{action}: {}", pg_error_text(error))]
    Statement {
        /// What the statement was for, as a verb phrase.
        action: String,
        /// The error from the server or the connection.
        error: tokio_postgres::Error,
    },

    /// The PostgreSQL server programs (initdb, pg_ctl) were not found.
    #[error(
        "PostgreSQL server programs (initdb, pg_ctl) not found; looked in: {searched}. \
         Install PostgreSQL, or set TOLLGATE_PG_BINDIR to the directory that holds initdb"
    )]
    BinariesNotFound {
        /// The directories that were searched, in order.
        searched: String,
    },

    /// `pg_autoctl` (pg_auto_failover) was not found.
    #[error(
        "pg_autoctl not found; looked in: {searched}. Install pg_auto_failover \
         (Debian: apt-get install postgresql-15-auto-failover)"
    )]
    AutoFailoverNotFound {
        /// The directories that were searched, in order.
        searched: String,
    },

    /// A command (initdb, pg_ctl, chown, …) exited unsuccessfully.
    #[error("{command} failed ({status}): {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its standard output and error.
        output: String,
    },

    /// The temporary cluster's server did not start.
    #[error(
        "start the PostgreSQL server of the temporary cluster in {data_dir}: {reason}; \
         server log:\n{log_tail}"
    )]
    ClusterStart {
        /// The cluster's data directory.
        data_dir: PathBuf,
        /// What pg_ctl reported.
        reason: String,
        /// The last lines of the server log.
        log_tail: String,
    },

    /// The high-availability cluster did not reach the state a test waits
    /// for (a primary and a standby, or a new primary) in time.
    #[error("the pg_auto_failover cluster in {dir}: {what}; monitor state:\n{state}")]
    HaTimeout {
        /// The cluster's directory (its logs are there).
        dir: PathBuf,
        /// What did not happen.
        what: String,
        /// `pg_autoctl show state` at the time.
        state: String,
    },

    /// An IO operation failed: creating the temporary directory, running a
    /// command, writing the configuration.
    #[error("{action}: {error}")]
    Io {
        /// What was being done, as a verb phrase.
        action: String,
        /// The underlying error.
        error: std::io::Error,
    },
}

impl HarnessError {
    /// An [`HarnessError::Io`] for `action`.
    pub(crate) fn io(action: impl Into<String>, error: std::io::Error) -> Self {
        Self::Io {
            action: action.into(),
            error,
        }
    }

    /// An [`HarnessError::Statement`] for `action`.
    pub(crate) fn statement(action: impl Into<String>, error: tokio_postgres::Error) -> Self {
        Self::Statement {
            action: action.into(),
            error,
        }
    }
}

impl fmt::Debug for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A tokio-postgres error with its causes: "error connecting to server:
/// Connection refused (os error 111)", "db error: ERROR: permission denied to
/// create database".
pub(crate) fn pg_error_text(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}
