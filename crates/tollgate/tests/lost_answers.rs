//! A pod whose answer does not come, over real sockets: a `tollgate serve`
//! on the embedded store behind two TCP relays, and a pod that knows the
//! server by both (`http://a,http://b`). Relay A holds back the server's
//! answers while the pod's request goes through and is applied. The pod
//! gives the attempt up when its answer is overdue by its own measure of
//! answer times (a fraction of a second, not its 30 s `request_timeout`),
//! retries through relay B with the same sequence number, and is answered
//! with the grant the server stored. When relay A lets the held answer
//! through, it is for a call the pod cancelled and changes nothing: the
//! server's bucket ends holding exactly what it started with less what the
//! pod charged, so no grant was applied twice and none was lost.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tollgate_client::{Controller, LocalBucketConfig, Options};

/// A TCP relay to a server that can hold back what the server sends.
struct Relay {
    url: String,
    hold_answers: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(server: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let hold_answers = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let (hold, count) = (Arc::clone(&hold_answers), Arc::clone(&connections));
        tokio::spawn(async move {
            while let Ok((pod, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(server).await else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let (pod_read, pod_write) = pod.into_split();
                let (server_read, server_write) = upstream.into_split();
                tokio::spawn(pipe(pod_read, server_write, None));
                tokio::spawn(pipe(server_read, pod_write, Some(Arc::clone(&hold))));
            }
        });
        Relay {
            url,
            hold_answers,
            connections,
        }
    }
}

/// Copies `from` to `to`, holding each chunk while `hold` is set.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, hold: Option<Arc<AtomicBool>>) {
    let mut chunk = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while hold.as_ref().is_some_and(|h| h.load(Ordering::Relaxed)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&chunk[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

fn bucket_view(server: &Server, tenant: &str) -> serde_json::Value {
    server.json(&[
        "tenant", "show", "--tenant", tenant, "--bucket", "", "--json",
    ])
}

fn number(value: &serde_json::Value) -> f64 {
    value.as_f64().unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_held_back_is_given_up_soon_retried_elsewhere_and_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = tokio::task::block_in_place(|| Server::start(&dir.path().join("t.redb")));
    const AVAILABLE: f64 = 10_000.0;
    const REFILL: f64 = 0.001;
    tokio::task::block_in_place(|| server.set_limits("acme", AVAILABLE, REFILL, AVAILABLE));
    let address: SocketAddr = format!("127.0.0.1:{}", server.port)
        .parse()
        .expect("address");
    let (a, b) = (Relay::start(address).await, Relay::start(address).await);
    let options = Options {
        bucket: LocalBucketConfig {
            initial_tokens: 0.0,
            ..LocalBucketConfig::default()
        },
        request_timeout: Duration::from_secs(30),
        ..Options::default()
    };
    // Pod 2 of two endpoints starts on the first: relay A.
    let pod = Controller::connect(&format!("{},{}", a.url, b.url), "acme", 2, options)
        .expect("valid options");
    // A first grant through A: the pod measures how long answers take.
    tokio::time::timeout(Duration::from_secs(10), pod.acquire(1.0))
        .await
        .expect("answered through relay A")
        .expect("admitted");
    assert_eq!(b.connections.load(Ordering::Relaxed), 0, "all through A");

    // Answers through A held back: the next request reaches the server,
    // which applies it, and its answer stays in relay A.
    a.hold_answers.store(true, Ordering::Relaxed);
    let asked = Instant::now();
    let more = AVAILABLE / 4.0;
    tokio::time::timeout(Duration::from_secs(10), pod.acquire(more))
        .await
        .expect("admitted well before the 30 s request timeout")
        .expect("admitted");
    let waited = asked.elapsed();
    eprintln!("an attempt whose answer was held back: admitted {waited:?} after asking");
    assert!(
        b.connections.load(Ordering::Relaxed) >= 1,
        "the retry went through relay B"
    );

    // The held answer now reaches the pod, for a call it cancelled.
    a.hold_answers.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    pod.acquire(1.0).await.expect("the pod works on");
    let report = pod.shutdown().await;
    assert!(report.consumption_reported, "the final report stored");
    let charged = report.status.charged_tokens;
    assert!((charged - (2.0 + more)).abs() < 1e-6, "charged {charged}");

    let view = tokio::task::block_in_place(|| bucket_view(&server, "acme"));
    let stored = number(&view["consumption"]["request_units"]);
    assert!((stored - charged).abs() < 1e-6, "stored {stored}: {view}");
    // The pod gave back what it held: the bucket holds what it started
    // with, less what was charged (plus a few thousandths of refill).
    let level = number(&view["current_tokens"]);
    let expected = AVAILABLE - charged;
    assert!(
        level >= expected - 1e-6 && level <= expected + 0.1,
        "level {level}, expected {expected}: a grant counted twice or lost: {view}"
    );
    // What the server granted is what the pod received: the held attempt
    // and its retry (the same request, seq 2) were granted once; the final
    // report is seq 3.
    let granted = number(&view["granted_tokens"]);
    assert!(
        (granted - report.status.granted_tokens).abs() < 1e-6,
        "the server granted {granted}, the pod received {}",
        report.status.granted_tokens
    );
    assert_eq!(view["instances"][0]["seq"], 3, "{view}");
    tokio::task::block_in_place(|| server.stop());
}
