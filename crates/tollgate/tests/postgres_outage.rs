//! The server survives its database: connections killed under it
//! (`pg_terminate_backend`), and the database server restarted, during
//! load, on a cluster of the test's own. It recovers without a restart of
//! its own, pods see `Unavailable` only while the database is down, and
//! nothing already committed is lost.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::usage::{check_consumption, read_tenant};
use support::{BIN, Server};
use tollgate_testdb::TempCluster;

fn start_bench(server: &Server, duration: &str) -> Child {
    Command::new(BIN)
        .args([
            "bench",
            "--server",
            &server.url,
            "--tenants",
            "2",
            "--instances-per-tenant",
            "4",
            "--duration",
            duration,
            "--warmup",
            "0s",
            "--timeout",
            "10s",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench")
}

fn finish_bench(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().expect("bench output");
    support::bench_report(&out)
}

async fn terminate_server_connections(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'tollgate' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("terminate the server's connections")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_survives_killed_connections_and_a_database_restart() {
    let cluster = TempCluster::start().expect("a PostgreSQL cluster of the test's own");
    {
        let admin = tollgate_testdb::connect(&cluster.url("postgres"))
            .await
            .expect("connect");
        admin
            .batch_execute("CREATE DATABASE tollgate")
            .await
            .expect("create the database");
    }
    let url = cluster.url("tollgate");
    let server = Server::start_with(Path::new(&url), &["--pg-connect-timeout", "1s"]);

    // Phase 1: connections killed twice under load. The store retries on
    // fresh connections; the pods see nothing.
    let bench = start_bench(&server, "8s");
    let mut killed = 0;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let admin = tollgate_testdb::connect(&cluster.url("postgres"))
            .await
            .expect("connect");
        killed += terminate_server_connections(&admin).await;
    }
    assert!(killed > 0, "the server had connections to kill");
    let calm = finish_bench(bench);
    let total = &calm["total"];
    assert_eq!(total["errors"], serde_json::json!({}), "{calm}");
    assert_eq!(total["retried"], serde_json::json!({}), "{calm}");
    assert_eq!(total["duplicate_mismatches"], 0, "{calm}");

    // Phase 2: the database server stops for 3 s, then comes back.
    let bench = start_bench(&server, "12s");
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.stop().expect("stop the database");
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.start_again().expect("start the database again");
    let stormy = finish_bench(bench);
    let total = &stormy["total"];
    assert_eq!(total["errors"], serde_json::json!({}), "{stormy}");
    assert_eq!(total["duplicate_mismatches"], 0, "{stormy}");
    let retried = total["retried"].as_object().expect("retried");
    assert!(
        retried
            .get("Unavailable")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
            > 0,
        "the pods noticed the database was down: {stormy}"
    );
    assert!(
        retried.keys().all(|code| code == "Unavailable"),
        "only Unavailable while the database was down: {stormy}"
    );
    // The pods were served again after the restart, by the same process.
    assert!(
        stormy["measured"]["answers"].as_u64().unwrap_or(0)
            > calm["measured"]["answers"].as_u64().unwrap_or(0) / 8,
        "{stormy}"
    );
    server.ok(&["tenant", "list"]);

    // Everything the pods heard back about is in the database.
    let client = tollgate_testdb::connect(&url).await.expect("connect");
    for t in 0..2 {
        let tenant = format!("bench-{t}");
        let stored = read_tenant(&client, &tenant).await;
        check_consumption(&tenant, &stored, &[&calm, &stormy]);
    }
    server.stop();
}
