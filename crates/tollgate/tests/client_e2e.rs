//! Pods embedding `tollgate-client` against a real `tollgate serve` process
//! (embedded store in a file, gRPC over sockets, real time), briefly: grants
//! and reports cross the wire, and the consumption the server stores is
//! what the pods charged, to the last token.
//!
//! Accuracy over a minute and an outage with recovery run in tokio's paused
//! time against the server's services in-process (`tollgate-client`'s
//! `server_virtual_time` test): a minute takes a fraction of a second there,
//! and how busy the machine is cannot change the outcome. The smoke test
//! runs for `TOLLGATE_E2E_SECS` (2.5 s unless set) and prints how much the
//! pods admitted against what the bucket allows: with 60 it gives the
//! real-time accuracy figure (`TOLLGATE_E2E_SECS=60 cargo test --release -p
//! tollgate --test client_e2e -- --nocapture`).

#[path = "../../tollgate-client/tests/common/load.rs"]
mod load;
mod support;

use std::time::Duration;

use load::{assert_same_consumption, saturate, shutdown};
use support::Server;
use tokio::time::Instant;
use tollgate_client::{Controller, LocalBucketConfig, Options};

/// What each pod may admit before its first grant.
const INITIAL_TOKENS: f64 = 100.0;

fn stored_request_units(server: &Server, tenant: &str) -> f64 {
    server.json(&[
        "tenant", "show", "--tenant", tenant, "--bucket", "", "--json",
    ])["consumption"]["request_units"]
        .as_f64()
        .unwrap_or(0.0)
}

fn pods(url: &str, tenant: &str, n: u32) -> Vec<Controller> {
    (1..=n)
        .map(|instance| {
            let options = Options {
                bucket: LocalBucketConfig {
                    initial_tokens: INITIAL_TOKENS,
                    ..LocalBucketConfig::default()
                },
                ..Options::default()
            };
            Controller::connect(url, tenant, instance, options).expect("valid options")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_store_keeps_exactly_what_pods_charged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = tokio::task::block_in_place(|| Server::start(&dir.path().join("t.redb")));
    // An empty bucket: past their initial allowances, the pods admit only
    // what the server grants them.
    let refill = 1000.0;
    tokio::task::block_in_place(|| server.set_limits("smoke", 0.0, refill, refill));
    let pods = pods(&server.url, "smoke", 3);

    let secs = std::env::var("TOLLGATE_E2E_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(2.5);
    let admitted = saturate(&pods, 2, Instant::now() + Duration::from_secs_f64(secs)).await;
    let allowances = 3.0 * INITIAL_TOKENS;
    // The bucket starts empty and pays for the allowances too: it allows
    // its refill over the run.
    let allowed = refill * secs;
    eprintln!(
        "3 pods, refill {refill}/s, {secs} s: admitted {admitted}, the refill {allowed} \
         ({:+.2} %; {allowances} of it usable before any grant)",
        100.0 * (admitted - allowed) / allowed
    );
    let floor = allowances + 0.5 * refill * secs;
    assert!(
        admitted >= floor,
        "admitted {admitted}, at least {floor} expected: grants reach the pods"
    );

    let charged = shutdown(pods).await;
    let stored = tokio::task::block_in_place(|| stored_request_units(&server, "smoke"));
    assert_same_consumption(stored, charged);
    tokio::task::block_in_place(|| server.stop());
}
