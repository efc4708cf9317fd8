//! What only the PostgreSQL store has: migrations, conflicts between
//! replicas under SERIALIZABLE isolation (as on CockroachDB), and errors for
//! a database that cannot be reached. Migration V3 is tested on a database
//! a schema 2 server filled: each tenant becomes its request-unit bucket
//! and serves on.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use tollgate_core::{
    BucketKey, BucketName, Consumption, Limits, LimitsMask, LimitsUpdate, TenantId,
    TokenBucketRequest,
};
use tollgate_server::store::postgres::{PostgresTls, migrate, migrate_to};
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
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_however_often_they_run() {
    let db = TestDatabase::create().await.expect("test database");
    // Eight replicas starting at once, then one more later.
    let plain = PostgresTls::default();
    let results = join_all((0..8).map(|_| migrate(db.url(), &plain))).await;
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
    // Head rows are rewritten by every transaction: their pages keep room
    // for the new versions (V14).
    let options: Vec<String> = client
        .query_one(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = 'tenant_usage'",
            &[],
        )
        .await
        .expect("table options")
        .get(0);
    assert!(
        options.contains(&"fillfactor=70".to_string()),
        "{options:?}"
    );
}

/// Two replicas hammer one tenant on a database whose transactions are
/// SERIALIZABLE, as CockroachDB's are: conflicts abort transactions with
/// 40001, the stores retry them, and every request is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialization_failures_between_replicas_are_retried() {
    let db = TestDatabase::create().await.expect("test database");
    support::make_serializable(&db).await;
    let open = || async {
        let mut options = PostgresOptions::new(db.url());
        options.pool_size = 2;
        options.max_batch = 4;
        PostgresStore::connect(options, BucketSettings::default())
            .await
            .expect("connect")
    };
    let (a, b) = (open().await, open().await);
    let tenant = BucketKey::request_units(TenantId::parse("tenant_id", "contended").expect("id"));
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
            mask: LimitsMask::ALL,
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
    let stored = a.get_bucket(&tenant).await.expect("get").head;
    assert_eq!(stored.totals.consumption.request_unit_micros, expected);
    assert_eq!(stored.totals.consumption.read_batches, calls.len() as u64);
    assert_eq!(stored.members.live_instances, 8);
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

/// Migration V2 turns floating-point totals into exact micro-units, rounded
/// to the nearest and kept within the BIGINT range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_v2_converts_totals_to_micro_units() {
    let db = TestDatabase::create().await.expect("test database");
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    let migrations = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sql/migrations");
    let v1 = std::fs::read_to_string(format!("{migrations}/V1__tenant_usage.sql")).expect("V1");
    let v2 = std::fs::read_to_string(format!("{migrations}/V2__exact_totals.sql")).expect("V2");
    client.batch_execute(&v1).await.expect("V1 applies");
    for (tenant, request_units, cpu_seconds) in [
        ("fractions", 199.99999999999292, 0.25),
        ("huge", 1e300, 0.0),
    ] {
        client
            .execute(
                "INSERT INTO tenant_usage (tenant_id, instance_id, next_instance_id, refill_rate, \
                 burst_limit, configured, tokens, tokens_avg, last_refill, share_sum, \
                 live_instances, granted_tokens, committed_tokens, committed_rate, \
                 total_request_units, total_read_batches, total_read_requests, total_read_bytes, \
                 total_write_batches, total_write_requests, total_write_bytes, total_cpu_seconds, \
                 total_egress_bytes, created_at, updated_at) VALUES ($1, 0, 0, 1, 1, true, 0, 0, \
                 now(), 0, 0, 0, 0, 0, $2, 0, 0, 7, 0, 0, 0, $3, 0, now(), now())",
                &[&tenant, &request_units, &cpu_seconds],
            )
            .await
            .expect("a version 1 row");
    }
    client.batch_execute(&v2).await.expect("V2 applies");
    let rows = client
        .query(
            "SELECT tenant_id, total_request_unit_micros, total_cpu_micros, total_read_bytes \
             FROM tenant_usage ORDER BY tenant_id",
            &[],
        )
        .await
        .expect("read");
    let totals: Vec<(String, i64, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        totals,
        vec![
            ("fractions".to_owned(), 200_000_000, 250_000, 7),
            ("huge".to_owned(), i64::MAX, 0, 7),
        ]
    );
}

/// Migration V17 sets each head row's `held_reported` to the sum of what
/// its instance rows hold, and the rows stay consistent as pods report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_v17_sums_what_each_buckets_pods_hold() {
    let db = TestDatabase::create().await.expect("test database");
    migrate_to(db.url(), &PostgresTls::default(), 16)
        .await
        .expect("schema 16");
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    // What a schema-16 server left: bucket acme/"" with pods 3 and 7
    // holding 12.5 and 30, bucket beta/"" with none.
    client
        .batch_execute(
            "INSERT INTO tenant_usage (tenant_id, bucket, instance_id, next_instance_id, \
             refill_rate, burst_limit, configured, tokens, tokens_avg, last_refill, share_sum, \
             live_instances, granted_tokens, committed_tokens, committed_rate, \
             total_request_unit_micros, total_read_batches, total_read_requests, \
             total_read_bytes, total_write_batches, total_write_requests, total_write_bytes, \
             total_cpu_micros, total_egress_bytes, created_at, updated_at, held_tokens, \
             held_use_rate) VALUES \
             ('acme', '', 0, 3, 10, 100, true, 50, 50, now(), 3, 2, 400, 0, 0, 0, 0, 0, 0, 0, \
              0, 0, 0, 0, now(), now(), 40, 3), \
             ('beta', '', 0, 0, 1, 1, false, 1, 1, now(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
              0, 0, now(), now(), 0, 0); \
             INSERT INTO tenant_usage (tenant_id, bucket, instance_id, next_instance_id, lease, \
             seq, shares, last_update, committed_rate, committed_until, last_grant_tokens, \
             last_grant_trickle_nanos, last_grant_max_burst, last_grant_fallback_rate, \
             held_tokens, held_use_rate) VALUES \
             ('acme', '', 3, 7, 'lease', 5, 1, now(), 0, now(), 12.5, 0, 0, 5, 12.5, 1), \
             ('acme', '', 7, 0, 'lease', 2, 2, now(), 0, now(), 3, 0, 0, 5, 30, 2);",
        )
        .await
        .expect("schema 16 rows");

    let store = PostgresStore::connect(PostgresOptions::new(db.url()), BucketSettings::default())
        .await
        .expect("the server migrates to the latest schema");
    let acme = BucketKey::request_units(TenantId::parse("tenant_id", "acme").expect("id"));
    let bucket = store.get_bucket(&acme).await.expect("acme");
    assert_eq!(bucket.head.state.held_reported, 42.5);
    assert_eq!(bucket.head.state.held_tokens, 40.0, "the rest as it was");
    let beta = BucketKey::request_units(TenantId::parse("tenant_id", "beta").expect("id"));
    let bucket = store.get_bucket(&beta).await.expect("beta");
    assert_eq!(bucket.head.state.held_reported, 0.0);
    // Pod 3 reports holding 2: the sum follows exactly.
    let report = TokenBucketRequest {
        held_tokens: 2.0,
        requested_tokens: 0.0,
        ..request(3, 6, 0.0)
    };
    store.token_bucket(&acme, &report).await.expect("report");
    let bucket = store.get_bucket(&acme).await.expect("acme");
    assert_eq!(bucket.head.state.held_reported, 32.0);
}

/// Migration V3 keys every row by bucket too: a database filled under
/// schema 2 keeps its tenants, pods, totals and idempotency records as the
/// tenants' request-unit buckets, and serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_v3_turns_each_tenant_into_its_request_unit_bucket() {
    let db = TestDatabase::create().await.expect("test database");
    migrate_to(db.url(), &PostgresTls::default(), 2)
        .await
        .expect("schema 2");
    let client = tollgate_testdb::connect(db.url()).await.expect("connect");
    // What a schema-2 server left: tenant acme with pods 3 and 7 (pod 3's
    // last answer recorded for its lease and seq 5), tenant beta alone.
    client
        .batch_execute(
            "INSERT INTO tenant_usage (tenant_id, instance_id, next_instance_id, refill_rate, \
             burst_limit, configured, tokens, tokens_avg, last_refill, share_sum, live_instances, \
             granted_tokens, committed_tokens, committed_rate, total_request_unit_micros, \
             total_read_batches, total_read_requests, total_read_bytes, total_write_batches, \
             total_write_requests, total_write_bytes, total_cpu_micros, total_egress_bytes, \
             created_at, updated_at) VALUES \
             ('acme', 0, 3, 10, 100, true, 50, 50, now(), 3, 2, 400, 0, 0, 123456789, 11, 12, 13, \
              14, 15, 16, 17, 18, now(), now()), \
             ('beta', 0, 0, 1, 1, false, 1, 1, now(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
              now(), now()); \
             INSERT INTO tenant_usage (tenant_id, instance_id, next_instance_id, lease, seq, shares, \
             last_update, committed_rate, committed_until, last_grant_tokens, \
             last_grant_trickle_nanos, last_grant_max_burst, last_grant_fallback_rate) VALUES \
             ('acme', 3, 7, 'lease', 5, 1, now(), 0, now(), 12.5, 0, 0, 5), \
             ('acme', 7, 0, 'other', 2, 2, now(), 0, now(), 3, 0, 0, 5);",
        )
        .await
        .expect("schema 2 rows");

    let store = PostgresStore::connect(PostgresOptions::new(db.url()), BucketSettings::default())
        .await
        .expect("the server migrates to the latest schema");
    let acme = TenantId::parse("tenant_id", "acme").expect("id");
    let buckets = store.get_tenant(&acme).await.expect("acme");
    assert_eq!(buckets.len(), 1, "one bucket: the request-unit bucket");
    let bucket = &buckets[0];
    assert_eq!(bucket.key, BucketKey::request_units(acme.clone()));
    let totals = &bucket.head.totals.consumption;
    assert_eq!(totals.request_unit_micros, 123_456_789);
    assert_eq!(
        (
            totals.read_batches,
            totals.write_bytes,
            totals.cpu_micros,
            totals.egress_bytes
        ),
        (11, 16, 17, 18)
    );
    assert_eq!(bucket.head.members.live_instances, 2);
    assert_eq!(bucket.head.state.limits.burst_limit, 100.0);
    let ids: Vec<u32> = bucket.instances.iter().map(|i| i.instance_id).collect();
    assert_eq!(ids, vec![3, 7]);

    // Pod 3's retry of seq 5 gets its recorded answer and counts nothing.
    let key = BucketKey::request_units(acme.clone());
    let mut retry = request(3, 5, 1000.0);
    retry.lease = b"lease".to_vec();
    let grant = store.token_bucket(&key, &retry).await.expect("retry");
    assert_eq!(grant.granted_tokens, 12.5);
    assert_eq!(grant.fallback_rate, 5.0);
    assert_eq!(
        grant.fallback_charged, None,
        "a grant stored before V8 does not say what it charged"
    );
    let after = store.get_bucket(&key).await.expect("acme");
    assert_eq!(
        after.head.totals.consumption.request_unit_micros,
        123_456_789
    );
    // Its next request is served and counted.
    store
        .token_bucket(&key, &request(3, 6, 1.0))
        .await
        .expect("next request");
    let after = store.get_bucket(&key).await.expect("acme");
    assert_eq!(
        after.head.totals.consumption.request_unit_micros,
        124_456_789
    );

    // The tenant can now own named buckets beside it.
    let mail = BucketKey::new(
        acme.clone(),
        BucketName::parse("bucket", "mail").expect("name"),
    );
    store
        .update_limits(
            &mail,
            &LimitsUpdate {
                available_tokens: 5.0,
                limits: Limits {
                    refill_rate: 1.0,
                    burst_limit: 5.0,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: LimitsMask::ALL,
            },
        )
        .await
        .expect("a named bucket");
    let listed = store.list_buckets(None, 10).await.expect("list");
    let keys: Vec<String> = listed.iter().map(|b| b.key.to_string()).collect();
    assert_eq!(keys, vec!["acme", "acme/mail", "beta"]);
    store.close().await.expect("close");
}
