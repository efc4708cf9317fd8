//! `TempCluster`: a server a test may stop, restart and kill, keeping its
//! data across all three.

use std::time::Instant;

use tollgate_testdb::{TempCluster, connect};

async fn count_rows(url: &str) -> Result<i64, String> {
    let client = connect(url).await.map_err(|e| e.to_string())?;
    let row = client
        .query_one("SELECT count(*) FROM tenants", &[])
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[tokio::test]
async fn data_survives_restart_stop_and_kill_and_connections_follow_the_server() {
    let started = Instant::now();
    let cluster = TempCluster::start().expect("start a temporary cluster");
    eprintln!("initdb and start: {:?}", started.elapsed());
    let url = cluster.url("postgres");
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port())
    );
    let client = connect(&url).await.expect("connect");
    client
        .batch_execute(
            "CREATE TABLE tenants (id text PRIMARY KEY); INSERT INTO tenants VALUES ('acme')",
        )
        .await
        .expect("create a table and insert a row");

    cluster.restart().expect("restart");
    assert_eq!(count_rows(&url).await, Ok(1), "after restart");
    assert!(
        client.simple_query("SELECT 1").await.is_err(),
        "a connection from before the restart still works"
    );

    cluster.stop().expect("stop");
    assert!(
        connect(&url).await.is_err(),
        "connecting to a stopped server succeeded"
    );

    // Another process takes the port while the server is down: starting
    // fails, and the error quotes the server log.
    let squatter =
        std::net::TcpListener::bind(("127.0.0.1", cluster.port())).expect("take the port");
    let error = cluster.start_again().expect_err("start on a taken port");
    assert!(
        error.to_string().contains("Address already in use"),
        "{error}"
    );
    drop(squatter);

    cluster.start_again().expect("start again");
    assert_eq!(count_rows(&url).await, Ok(1), "after stop and start");

    cluster.kill().expect("kill");
    assert!(
        connect(&url).await.is_err(),
        "connecting to a killed server succeeded"
    );
    cluster.start_again().expect("start again after a kill");
    assert_eq!(count_rows(&url).await, Ok(1), "after crash recovery");

    let port = cluster.port();
    drop(cluster);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server outlived the cluster"
    );
    eprintln!("whole test: {:?}", started.elapsed());
}

#[tokio::test]
async fn two_clusters_run_side_by_side_on_different_ports() {
    let (first, second) = tokio::task::spawn_blocking(|| {
        (
            TempCluster::start().expect("first cluster"),
            TempCluster::start().expect("second cluster"),
        )
    })
    .await
    .expect("start the clusters");
    assert_ne!(first.port(), second.port());
    for cluster in [&first, &second] {
        let client = connect(&cluster.url("postgres")).await.expect("connect");
        let row = client
            .query_one("SELECT current_setting('port')::int", &[])
            .await
            .expect("query the port");
        assert_eq!(row.get::<_, i32>(0), i32::from(cluster.port()));
    }
}
