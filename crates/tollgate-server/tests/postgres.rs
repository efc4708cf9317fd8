//! What only the PostgreSQL store has: migrations, conflicts between
//! replicas under SERIALIZABLE isolation (as on CockroachDB), and errors for
//! a database that cannot be reached.

use std::time::Duration;

use futures_util::future::join_all;
use tollgate_core::{Consumption, Limits, LimitsUpdate, TenantId, TokenBucketRequest};
use tollgate_server::store::postgres::{PostgresTls, migrate};
use tollgate_server::store::{BucketSettings, PostgresOptions, PostgresStore, Store, StoreError};
use tollgate_testdb::TestDatabase;

fn request(instance_id: u32, seq: u64, request_units: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id,
        lease: b"lease".to_vec(),
        seq,
        requested_tokens: 10.0,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption {
            read_batches: 1,
            ..Consumption::from_request_units(request_units)
        },
        next_live_instance_id: None,
        returned_tokens: 0.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_however_often_they_run() {
    let db = TestDatabase::create().await.expect("test database");
    // Three replicas starting at once, then one more later.
    let plain = PostgresTls::default();
    let results = join_all((0..3).map(|_| migrate(db.url(), &plain))).await;
    for result in results {
        result.expect("migrate");
    }
    migrate(db.url(), &PostgresTls::default())
        .await
        .expect("migrate again");
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    let applied: i64 = client
        .query_one("SELECT count(*) FROM refinery_schema_history", &[])
        .await
        .expect("history")
        .get(0);
    let migrations =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../sql/migrations"))
            .expect("sql/migrations")
            .filter(|entry| {
                entry
                    .as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".sql"))
            })
            .count();
    assert_eq!(applied, i64::try_from(migrations).expect("a few"));
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tenant_usage'",
            &[],
        )
        .await
        .expect("tables")
        .get(0);
    assert_eq!(tables, 1);
}

/// Two replicas hammer one tenant on a database whose transactions are
/// SERIALIZABLE, as CockroachDB's are: conflicts abort transactions with
/// 40001, the stores retry them, and every request is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialization_failures_between_replicas_are_retried() {
    let db = TestDatabase::create().await.expect("test database");
    let admin = tollgate_testdb::connect(db.url()).await.expect("connect");
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = 'serializable'",
            db.name()
        ))
        .await
        .expect("make the database serializable");
    let open = || async {
        let mut options = PostgresOptions::new(db.url());
        options.pool_size = 2;
        options.max_batch = 4;
        PostgresStore::connect(options, BucketSettings::default())
            .await
            .expect("connect")
    };
    let (a, b) = (open().await, open().await);
    let tenant = TenantId::parse("tenant_id", "contended").expect("id");
    a.update_limits(
        &tenant,
        &LimitsUpdate {
            available_tokens: 1e6,
            limits: Limits {
                refill_rate: 1000.0,
                burst_limit: 1e6,
            },
            as_of: None,
            as_of_consumed_tokens: 0.0,
        },
    )
    .await
    .expect("configure");
    let fresh = tollgate_testdb::connect(db.url()).await.expect("connect");
    let isolation: String = fresh
        .query_one("SHOW default_transaction_isolation", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(isolation, "serializable", "new sessions are serializable");

    let mut calls = Vec::new();
    for seq in 1..=25u64 {
        for instance in 1..=8u32 {
            let store = if instance % 2 == 0 { &a } else { &b };
            let units = f64::from(instance) + seq as f64;
            calls.push((store, request(instance, seq, units)));
        }
    }
    // Each instance's requests in seq order, all instances at once.
    let per_instance = (1..=8u32).map(|instance| {
        let mine: Vec<_> = calls
            .iter()
            .filter(|(_, r)| r.instance_id == instance)
            .collect();
        let tenant = &tenant;
        async move {
            for (store, r) in mine {
                store.token_bucket(tenant, r).await.expect("served");
            }
        }
    });
    join_all(per_instance).await;

    let expected: u64 = calls
        .iter()
        .map(|(_, r)| r.consumption.request_unit_micros)
        .sum();
    let stored = a.get_tenant(&tenant).await.expect("get").state;
    assert_eq!(stored.consumption.request_unit_micros, expected);
    assert_eq!(stored.consumption.read_batches, calls.len() as u64);
    assert_eq!(stored.live_instances, 8);
    let retries = a.stats().retries + b.stats().retries;
    assert!(
        retries > 0,
        "conflicting replicas under SERIALIZABLE retried ({:?}, {:?})",
        a.stats(),
        b.stats()
    );
    assert_eq!(a.stats().failures + b.stats().failures, 0);
    a.close().await.expect("close");
    b.close().await.expect("close");
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable_and_a_bad_url_is_refused() {
    // Nothing listens on port 1.
    let mut options = PostgresOptions::new("postgres://postgres@127.0.0.1:1/none");
    options.connect_timeout = Duration::from_secs(2);
    let error = PostgresStore::connect(options, BucketSettings::default())
        .await
        .expect_err("unreachable");
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert!(error.to_string().contains("connect"), "{error}");

    let error = PostgresStore::connect(
        PostgresOptions::new("postgres://host:notaport/db"),
        BucketSettings::default(),
    )
    .await
    .expect_err("bad URL");
    assert!(error.to_string().contains("URL"), "{error}");
}
