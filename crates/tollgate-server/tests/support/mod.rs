//! The stores the shared tests run against: every behaviour test runs once
//! on the embedded store and once on PostgreSQL (a fresh database per test,
//! from `tollgate-testdb`). [`Backend`] names the store, [`Backing`] holds
//! a test's store file or database, and `for_each_store!` writes a test
//! once for both; `server.rs` starts a real server on `127.0.0.1:0`.
#![allow(dead_code)] // each test binary uses part of it

pub mod raw;
pub mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tempfile::TempDir;
use tollgate_core::tier::{BucketDefinition, BucketKind};
use tollgate_core::{BucketName, Limits, TenantId, TierName, Timestamp};
use tollgate_server::store::{
    BucketSettings, Clock, EmbeddedStore, PostgresOptions, PostgresStore, Store,
};
use tollgate_testdb::TestDatabase;

/// A clock the test sets by hand, for stores opened with
/// [`ManualClock::as_clock`].
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn set_secs(&self, secs: f64) {
        self.0.store(
            Timestamp::from_secs_f64(secs).unix_micros(),
            Ordering::SeqCst,
        );
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let micros = i64::try_from(by.as_micros()).expect("a short step");
        self.0.fetch_add(micros, Ordering::SeqCst);
    }

    pub fn now(&self) -> Timestamp {
        Timestamp::from_unix_micros(self.0.load(Ordering::SeqCst))
    }

    /// The store's clock, reading this one.
    pub fn as_clock(&self) -> Clock {
        let clock = self.clone();
        Arc::new(move || clock.now())
    }
}

/// Tenant id `id`, valid by the test's choice.
pub fn tenant_id(id: &str) -> TenantId {
    TenantId::parse("tenant_id", id).expect("valid id")
}

pub fn bucket_name(name: &str) -> BucketName {
    BucketName::parse("bucket", name).expect("valid name")
}

pub fn tier_name(name: &str) -> TierName {
    TierName::parse("tier", name).expect("valid name")
}

/// A bucket definition of `kind` starting full.
pub fn definition(refill_rate: f64, burst_limit: f64, kind: BucketKind) -> BucketDefinition {
    BucketDefinition {
        quota: None,
        limits: Limits {
            refill_rate,
            burst_limit,
        },
        initial_tokens: None,
        kind,
        enforce: true,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Postgres,
}

/// Where a test's state lives; stores opened on it share that state.
pub struct Backing {
    backend: Backend,
    dir: TempDir,
    db: Option<TestDatabase>,
}

impl Backing {
    pub async fn new(backend: Backend) -> Backing {
        let db = match backend {
            Backend::Embedded => None,
            Backend::Postgres => Some(TestDatabase::create().await.expect("a test database")),
        };
        Backing {
            backend,
            dir: tempfile::tempdir().expect("tempdir"),
            db,
        }
    }

    /// The database URL, for PostgreSQL backings.
    pub fn url(&self) -> Option<&str> {
        self.db.as_ref().map(TestDatabase::url)
    }

    /// A store on this backing that keeps its state across reopening (the
    /// embedded store in a file).
    pub async fn open(&self, settings: BucketSettings) -> Arc<dyn Store> {
        match &self.db {
            None => Arc::new(
                EmbeddedStore::open(self.dir.path().join("tollgate.redb"), settings)
                    .expect("open the embedded store"),
            ),
            Some(db) => Arc::new(
                PostgresStore::connect(PostgresOptions::new(db.url()), settings)
                    .await
                    .expect("connect the PostgreSQL store"),
            ),
        }
    }

    /// A store on this backing whose time comes from `clock` (the embedded
    /// store in memory).
    pub async fn open_with_clock(&self, settings: BucketSettings, clock: Clock) -> Arc<dyn Store> {
        match &self.db {
            None => Arc::new(
                EmbeddedStore::in_memory_with_clock(settings, clock)
                    .expect("open the embedded store"),
            ),
            Some(db) => Arc::new(
                PostgresStore::connect_with_clock(PostgresOptions::new(db.url()), settings, clock)
                    .await
                    .expect("connect the PostgreSQL store"),
            ),
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }
}

/// Generates, for each named `async fn(Backend)`, one `#[tokio::test]` per
/// store: `embedded_store::name` and `postgres_store::name`.
#[macro_export]
macro_rules! for_each_store {
    ($($name:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::support::Backend::Embedded).await;
                }
            )*
        }
        mod postgres_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::support::Backend::Postgres).await;
                }
            )*
        }
    };
}

/// Makes SERIALIZABLE the default isolation of new sessions on `db` (as
/// an operator may set, or CockroachDB has).
pub async fn make_serializable(db: &TestDatabase) {
    let admin = tollgate_testdb::connect(db.url()).await.expect("connect");
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = 'serializable'",
            db.name()
        ))
        .await
        .expect("make the database serializable");
}

/// Samples every bucket into the usage history, page by page of `page`
/// buckets, as a server's sampling round does; answers the rows written.
pub async fn sample_all(store: &dyn tollgate_server::store::Store, page: usize) -> u64 {
    let mut after = None;
    let mut written = 0;
    loop {
        let p = store
            .sample_history(after.as_ref(), page)
            .await
            .expect("sample");
        written += p.rows_written;
        match p.last {
            Some(last) => after = Some(last),
            None => return written,
        }
    }
}

/// `t` as the wire carries it.
pub fn proto_time(t: Timestamp) -> prost_types::Timestamp {
    let micros = t.unix_micros();
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: i32::try_from(micros.rem_euclid(1_000_000) * 1_000).expect("nanos"),
    }
}

/// A wire duration in seconds; 0 when unset.
pub fn secs(d: Option<prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}
