//! TLS to PostgreSQL, against a cluster of the test's own with a
//! certificate from a test CA: with `sslmode=require` and the CA the
//! store connects encrypted; without the CA it refuses the server (it always
//! verifies); without TLS asked for, it connects in plain text.

use std::time::Duration;

use tollgate_core::{Consumption, TenantId, TokenBucketRequest};
use tollgate_server::store::postgres::PostgresTls;
use tollgate_server::store::{BucketSettings, PostgresOptions, PostgresStore, Store, StoreError};
use tollgate_testdb::{TempCluster, TestPki};

fn options(url: String, ca_file: Option<std::path::PathBuf>) -> PostgresOptions {
    let mut options = PostgresOptions::new(url);
    options.pool_size = 2;
    options.connect_timeout = Duration::from_secs(5);
    options.tls = PostgresTls { ca_file };
    options
}

async fn serve_one(store: &PostgresStore) {
    let request = TokenBucketRequest {
        instance_id: 1,
        lease: b"lease".to_vec(),
        seq: 1,
        requested_tokens: 10.0,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::from_request_units(3.0),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    };
    let tenant =
        tollgate_core::BucketKey::request_units(TenantId::parse("t", "secure").expect("id"));
    store.token_bucket(&tenant, &request).await.expect("served");
}

/// Whether the store's connections to the cluster are encrypted.
async fn store_connections_encrypted(admin: &tokio_postgres::Client) -> Vec<bool> {
    admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'tollgate'",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_and_used_when_asked_for() {
    let pki = TestPki::generate().expect("test certificates");
    let cluster = TempCluster::start().expect("a cluster of the test's own");
    cluster
        .write_data_file("server.crt", pki.server_cert_pem.as_bytes(), false)
        .expect("certificate");
    cluster
        .write_data_file("server.key", pki.server_key_pem.as_bytes(), true)
        .expect("key");
    cluster.configure("ssl = on").expect("configure");
    cluster.restart().expect("restart with TLS");
    let admin = tollgate_testdb::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    admin
        .batch_execute("CREATE DATABASE tollgate")
        .await
        .expect("create the database");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).expect("CA file");
    let url = cluster.url("tollgate");

    // sslmode=require and the CA: encrypted, and it works.
    let store = PostgresStore::connect(
        options(format!("{url}?sslmode=require"), Some(ca_file.clone())),
        BucketSettings::default(),
    )
    .await
    .expect("TLS with the test CA");
    serve_one(&store).await;
    let encrypted = store_connections_encrypted(&admin).await;
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|e| *e),
        "{encrypted:?}"
    );
    store.close().await.expect("close");

    // The CA alone turns TLS on too.
    let store = PostgresStore::connect(
        options(url.clone(), Some(ca_file)),
        BucketSettings::default(),
    )
    .await
    .expect("TLS with the CA file alone");
    serve_one(&store).await;
    let encrypted = store_connections_encrypted(&admin).await;
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|e| *e),
        "{encrypted:?}"
    );
    store.close().await.expect("close");

    // sslmode=require without the CA: the server's certificate is not
    // trusted, so the store does not connect.
    let refused = PostgresStore::connect(
        options(format!("{url}?sslmode=require"), None),
        BucketSettings::default(),
    )
    .await
    .expect_err("an unknown CA is refused");
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused}");
    assert!(refused.to_string().contains("certificate"), "{refused}");

    // Not asked for: plain connections.
    let store = PostgresStore::connect(options(url, None), BucketSettings::default())
        .await
        .expect("plain");
    serve_one(&store).await;
    let encrypted = store_connections_encrypted(&admin).await;
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|e| !*e),
        "{encrypted:?}"
    );
    store.close().await.expect("close");
}

#[tokio::test]
async fn a_bad_ca_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").expect("write");
    for (ca_file, expected) in [
        (dir.path().join("missing.pem"), "missing.pem"),
        (not_pem, "holds no PEM certificate"),
    ] {
        let error = PostgresStore::connect(
            options("postgres://postgres@127.0.0.1:1/x".into(), Some(ca_file)),
            BucketSettings::default(),
        )
        .await
        .expect_err("bad CA file");
        assert!(error.to_string().contains(expected), "{error}");
    }
}
