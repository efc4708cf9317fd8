//! One fresh database per test.
//!
//! Tests that share a database see each other's rows and fail, or pass, in
//! ways that depend on which ran first. A [`TestDatabase`] is created empty
//! for one test and dropped with it, so tests can run in parallel against the
//! same server without knowing about each other.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::HarnessError;
use crate::server::{Server, connect_with_timeout, redact};

/// Every test database name starts with this, so leftovers of killed test
/// processes are easy to find and drop.
pub(crate) const NAME_PREFIX: &str = "tollgate_test_";

/// A fresh, empty database for one test; dropped (`DROP DATABASE … WITH
/// (FORCE)`) when the value is dropped.
///
/// The server is chosen once per test process: `DATABASE_URL`, else a local
/// server, else a temporary cluster (see [`TestDatabase::create`]).
/// Dropping works inside and outside a tokio runtime; connections still open
/// to the database are closed by the server.
pub struct TestDatabase {
    /// The database name, `tollgate_test_…`.
    name: String,
    /// Its URL, handed to the test.
    url: String,
    /// The URL of an existing database on the same server, to drop it from.
    maintenance_url: String,
}

impl TestDatabase {
    /// Creates a database named `tollgate_test_<pid>_<counter>_<microseconds>`
    /// from `template0` (empty, whatever was added to `template1`).
    ///
    /// Where the server comes from, in order: `DATABASE_URL` if set (and
    /// nothing else if it is unreachable); the local server as `postgres` on
    /// 127.0.0.1:5432, or as the current user on the unix socket in
    /// `/var/run/postgresql` or `/tmp`; a temporary cluster started for the
    /// test process. If none works, the error says how to provide one.
    pub async fn create() -> Result<TestDatabase, HarnessError> {
        let server = Server::for_process().await?;
        Self::create_on(server).await
    }

    /// Creates a database on `server` (tests choose the server themselves).
    pub(crate) async fn create_on(server: &Server) -> Result<TestDatabase, HarnessError> {
        let name = unique_name();
        let url = server.database_url(&name)?;
        let client = connect_with_timeout(&server.maintenance_url)
            .await
            .map_err(|error| HarnessError::Connect {
                url: redact(&server.maintenance_url),
                error,
            })?;
        client
            .batch_execute(&format!(
                "CREATE DATABASE {} TEMPLATE template0",
                quote_identifier(&name)
            ))
            .await
            .map_err(|e| {
                HarnessError::statement(
                    format!(
                        "create database {name} on {}",
                        redact(&server.maintenance_url)
                    ),
                    e,
                )
            })?;
        Ok(TestDatabase {
            name,
            url,
            maintenance_url: server.maintenance_url.clone(),
        })
    }

    /// The connection URL of the database, `postgres://user@host:port/name`
    /// (plus any password and parameters of `DATABASE_URL`), usable by
    /// `tokio_postgres::Config::from_str`, [`connect`](crate::connect) and
    /// deadpool-postgres's `Config::url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .field("url", &redact(&self.url))
            .finish()
    }
}

impl Drop for TestDatabase {
    /// Drops the database from a thread of its own with its own runtime: the
    /// value may be dropped inside a runtime (where blocking on another
    /// future is not allowed) or outside any (where there is nothing to
    /// run one on). Waits for it, so the database is gone when `drop` returns.
    fn drop(&mut self) {
        let name = self.name.clone();
        let maintenance_url = self.maintenance_url.clone();
        let dropper = std::thread::Builder::new()
            .name("tollgate-testdb-drop".to_owned())
            .spawn(move || drop_database(&maintenance_url, &name));
        let outcome = match dropper {
            Ok(thread) => thread.join().unwrap_or_else(|_| {
                Err(HarnessError::io(
                    "drop the test database",
                    std::io::Error::other("the dropping thread panicked"),
                ))
            }),
            Err(e) => Err(HarnessError::io(
                "start a thread to drop the test database",
                e,
            )),
        };
        if let Err(error) = outcome {
            tracing::warn!(%error, database = %self.name, "could not drop a test database");
        }
    }
}

/// Connects to the maintenance database and drops `name`, closing any
/// connection still open to it.
fn drop_database(maintenance_url: &str, name: &str) -> Result<(), HarnessError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HarnessError::io("build a runtime to drop the test database", e))?;
    runtime.block_on(async {
        let client = connect_with_timeout(maintenance_url)
            .await
            .map_err(|error| HarnessError::Connect {
                url: redact(maintenance_url),
                error,
            })?;
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_identifier(name)
            ))
            .await
            .map_err(|e| HarnessError::statement(format!("drop database {name}"), e))
    })
}

/// A name no other test database has: the process id and a counter separate
/// the databases of concurrent processes and tests; the time separates
/// processes that got the same id (another run, another CI machine on the
/// same server).
fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_micros())
        .unwrap_or(0);
    format!("{NAME_PREFIX}{}_{count}_{micros}", std::process::id())
}

/// `name` as a quoted SQL identifier.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_fit_in_an_identifier() {
        let first = unique_name();
        let second = unique_name();
        assert_ne!(first, second);
        assert!(first.starts_with(NAME_PREFIX));
        // PostgreSQL truncates identifiers to 63 bytes.
        assert!(first.len() <= 63, "{first}");
    }

    #[test]
    fn quoted_identifiers_escape_quotes() {
        assert_eq!(quote_identifier(r#"a"b"#), r#""a""b""#);
    }
}
