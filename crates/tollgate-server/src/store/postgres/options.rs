//! How to reach the database and how hard to work it.

use super::*;

/// How to reach the database and how hard to work it.
#[derive(Clone, Debug, PartialEq)]
pub struct PostgresOptions {
    /// A libpq-style URL or key/value string, e.g. `postgres://user@host:5432/db`.
    pub url: String,
    /// Connections in the pool; also the number of transactions in flight.
    pub pool_size: usize,
    /// The most token-bucket requests served by one transaction; a
    /// transaction of checks serves up to [`CHECKS_PER_REQUEST_BATCH`]
    /// times as many (a check's rows are fewer and smaller).
    pub max_batch: usize,
    /// How long to wait for a new connection or a free one from the pool.
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
    /// TLS: on with `sslmode=require` in the URL or a CA file.
    pub tls: PostgresTls,
}

impl PostgresOptions {
    /// Options with the defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            pool_size: 16,
            max_batch: 64,
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            tls: PostgresTls::default(),
        }
    }
}

pub(super) fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    url.parse()
        .map_err(|e| StoreError::internal("parse the PostgreSQL URL", e))
}
