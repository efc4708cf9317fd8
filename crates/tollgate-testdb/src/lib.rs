//! Real PostgreSQL databases for Tollgate's tests.
//!
//! The PostgreSQL store's correctness lives in SQL: transactions, isolation,
//! constraints, what the server does when a connection drops. A mock would
//! test our idea of PostgreSQL instead, so tests here always run against a
//! real server, and fail (never skip) when there is none: a suite that skips
//! silently proves nothing.
//!
//! Each test gets a database of its own, so tests are isolated from each other
//! and can run in parallel:
//!
//! - [`TestDatabase`]: a fresh, empty database on a shared server, dropped
//!   with the value. The server is `DATABASE_URL` if set, else a local server,
//!   else a temporary cluster started for the test process.
//! - [`TempCluster`]: a server of the test's own, for tests that stop,
//!   restart or kill it.
//! - [`HaCluster`]: pg_auto_failover's monitor, a primary and a synchronous
//!   standby, for tests of failover.
//! - [`connect`]: a `tokio_postgres::Client` for a URL, its connection
//!   driven in the background.
//! - [`TestPki`]: a test CA and server and client certificates, for tests
//!   of TLS (to PostgreSQL and to Tollgate's own server).
//!
//! ```no_run
//! #[tokio::test]
//! async fn a_tenant_row_is_stored() {
//!     let database = tollgate_testdb::TestDatabase::create().await.expect("a test database");
//!     let client = tollgate_testdb::connect(database.url()).await.expect("connect");
//!     client
//!         .batch_execute("CREATE TABLE tenants (id text PRIMARY KEY)")
//!         .await
//!         .expect("create the table");
//!     // … the database is dropped at the end of the test.
//! }
//! ```
//!
//! Environment: `DATABASE_URL` (a `postgres://` URL of an existing database
//! on the server to create test databases on; its user needs `CREATEDB`),
//! `TOLLGATE_PG_BINDIR` (the directory of `initdb` and `pg_ctl`, when they
//! are not found in the usual places).

#![warn(missing_docs)]

mod binaries;
mod cluster;
mod database;
mod error;
mod ha;
mod os_user;
mod pki;
mod server;

pub use cluster::TempCluster;
pub use database::TestDatabase;
pub use error::HarnessError;
pub use ha::{HA_DATABASE, HaCluster};
pub use pki::TestPki;

/// Connects to `url` (`postgres://user@host:port/database`, or any form
/// `tokio_postgres::Config` accepts) without TLS, and drives the connection
/// in a task on the current tokio runtime; the client is usable as soon as
/// this returns. Gives up after 5 seconds unless the URL sets
/// `connect_timeout`.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, HarnessError> {
    server::connect_with_timeout(url)
        .await
        .map_err(|error| HarnessError::Connect {
            url: server::redact(url),
            error,
        })
}
