//! Which failures a transaction is retried on, and how long to wait.
//!
//! A transaction that PostgreSQL (or CockroachDB) aborted for a conflict
//! — a serialization failure (40001), a deadlock (40P01), or two
//! transactions creating the same row (23505) — changed nothing and
//! is run again. So is one whose connection broke before it committed. A
//! connection that broke *while* committing leaves the outcome unknown:
//! only operations that are safe to apply twice (token-bucket requests are,
//! by their lease and sequence number) are run again then.
//!
//! Waits grow exponentially with full jitter, so replicas that collided do
//! not collide again in step, and the number of attempts is bounded.

use std::time::Duration;

use rand::Rng;
use tokio_postgres::error::SqlState;

use crate::store::StoreError;

/// How often and how patiently a transaction is retried.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The wait before the first retry, doubled for each further one.
    pub base_delay: Duration,
    /// The longest wait between two attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 12,
            base_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(250),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first retry): a
    /// random duration up to `base × 2^(retry-1)`, capped at `max_delay`.
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.max_delay);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::rng().random_range(0..=micros))
    }
}

/// Why an attempt failed.
#[derive(Debug)]
pub(super) enum TxError {
    /// The database answered with an error (or the connection broke) before
    /// the transaction was committed: nothing was applied.
    Db(tokio_postgres::Error),
    /// The connection broke or the database failed while committing: the
    /// transaction may or may not have been applied.
    Commit(tokio_postgres::Error),
    /// No connection could be had from the pool.
    Pool(deadpool_postgres::PoolError),
    /// A failure no retry will fix (a row that does not decode, say).
    Store(StoreError),
}

impl From<tokio_postgres::Error> for TxError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxError::Db(e)
    }
}

impl From<deadpool_postgres::PoolError> for TxError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        TxError::Pool(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

/// What to do about a failed attempt.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The transaction lost a conflict; run it again.
    Conflict,
    /// The database could not be reached or went away; run it again (and,
    /// once attempts run out, answer `Unavailable`).
    Unreachable,
    /// Give up at once.
    Fatal,
}

impl TxError {
    /// Classifies the failure; `idempotent` operations may be run again even
    /// when a commit's outcome is unknown.
    pub(super) fn verdict(&self, idempotent: bool) -> Verdict {
        match self {
            TxError::Db(e) => classify(e),
            TxError::Commit(e) => match classify(e) {
                // The server refused the commit: nothing was applied.
                Verdict::Conflict => Verdict::Conflict,
                _ if idempotent => Verdict::Unreachable,
                _ => Verdict::Fatal,
            },
            TxError::Pool(_) => Verdict::Unreachable,
            TxError::Store(_) => Verdict::Fatal,
        }
    }

    /// The error the caller sees once the store gives up.
    pub(super) fn into_store_error(self, op: &'static str) -> StoreError {
        match self {
            TxError::Store(e) => e,
            TxError::Pool(e) => {
                StoreError::Unavailable(format!("{op}: no database connection: {}", chain(&e)))
            }
            TxError::Commit(e) if classify(&e) != Verdict::Conflict => {
                StoreError::Unavailable(format!(
                    "{op}: the connection failed while committing, so the change may or may not have been applied: {}",
                    describe(&e)
                ))
            }
            TxError::Db(e) | TxError::Commit(e) => match classify(&e) {
                Verdict::Fatal => StoreError::internal(op, describe(&e)),
                Verdict::Conflict => StoreError::Unavailable(format!(
                    "{op}: still conflicting with other transactions after retrying: {}",
                    describe(&e)
                )),
                Verdict::Unreachable => {
                    StoreError::Unavailable(format!("{op}: database unreachable: {}", describe(&e)))
                }
            },
        }
    }
}

/// An error with its causes: tokio-postgres's own message is only the
/// kind ("db error", "error connecting to server").
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A database error with its SQLSTATE, or the error with its causes.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => chain(e),
    }
}

fn classify(e: &tokio_postgres::Error) -> Verdict {
    if e.is_closed() {
        return Verdict::Unreachable;
    }
    match e.code() {
        Some(code)
            if *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::UNIQUE_VIOLATION =>
        {
            Verdict::Conflict
        }
        // Class 08 (connection exception) and 57P (operator intervention:
        // the backend was terminated, the server is shutting down or starting).
        Some(code) if code.code().starts_with("08") || code.code().starts_with("57P") => {
            Verdict::Unreachable
        }
        Some(_) => Verdict::Fatal,
        // No SQLSTATE: an IO error or a protocol failure on the connection.
        None => Verdict::Unreachable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_under_the_cap() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(4),
            max_delay: Duration::from_millis(50),
        };
        for retry in 1..40 {
            let ceiling = Duration::from_millis(4 << (retry - 1).min(20)).min(policy.max_delay);
            for _ in 0..50 {
                assert!(policy.delay(retry) <= ceiling, "retry {retry}");
            }
        }
    }
}
