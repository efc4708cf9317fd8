//! Budget webhooks as an operator sets them up, from the docs: `tollgate
//! serve --webhook-url --webhook-secret-file` on one PostgreSQL database,
//! pods on two replicas (`tollgate pod request`) taking a budget across its
//! thresholds, a real HTTP receiver that fails for a while and then hangs
//! while the delivering replica is SIGKILLed; a replica started after
//! takes its events up. The receiver checks each post's signature as the
//! docs say to, and acknowledges each event exactly once. Bad webhook
//! flags are refused at start, naming the flag.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use support::{Server, command};
use tollgate_testdb::TestDatabase;

const SECRET: &str = "s3cret-of-the-billing-team-0123456789";
const FAIL: u8 = 0;
const HANG: u8 = 1;
const OK: u8 = 2;

#[derive(Default)]
struct Receiver {
    mode: AtomicU8,
    /// (idempotency key, answered 2xx) of every post answered.
    posts: Mutex<Vec<(String, bool)>>,
    hanging: Mutex<usize>,
    release: tokio::sync::Notify,
}

impl Receiver {
    fn acknowledged(&self) -> BTreeMap<String, usize> {
        let mut acks = BTreeMap::new();
        for (key, ok) in self.posts.lock().expect("posts").iter() {
            if *ok {
                *acks.entry(key.clone()).or_insert(0) += 1;
            }
        }
        acks
    }

    fn keys(&self) -> usize {
        let posts = self.posts.lock().expect("posts");
        let keys: std::collections::BTreeSet<&String> = posts.iter().map(|(k, _)| k).collect();
        keys.len()
    }
}

/// Checks the signature as docs/budgets.md tells a receiver to.
fn signed(headers: &HeaderMap, body: &[u8]) -> bool {
    let Some(header) = headers
        .get("tollgate-signature")
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((t, v1)) = header
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
    else {
        return false;
    };
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).expect("any key");
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    hex == v1
}

async fn receive(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    assert!(signed(&headers, &body), "an unsigned or badly signed post");
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .expect("an idempotency key")
        .to_owned();
    let event: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(event["id"], key.as_str());
    match receiver.mode.load(Ordering::SeqCst) {
        HANG => {
            *receiver.hanging.lock().expect("hanging") += 1;
            receiver.release.notified().await;
            *receiver.hanging.lock().expect("hanging") -= 1;
            StatusCode::SERVICE_UNAVAILABLE
        }
        mode => {
            let ok = mode == OK;
            receiver.posts.lock().expect("posts").push((key, ok));
            if ok {
                StatusCode::NO_CONTENT
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_leaves_its_events_to_another_and_each_is_acknowledged_once() {
    let db = TestDatabase::create().await.expect("test database");
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("webhook-secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("write the secret");
    let receiver = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(receive))
        .with_state(Arc::clone(&receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hooks", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let secret = secret.display().to_string();
    let webhooks = [
        "--webhook-url",
        url.as_str(),
        "--webhook-secret-file",
        secret.as_str(),
        "--webhook-lease",
        "3s",
        "--webhook-retry-max",
        "1s",
    ];

    // Replica A delivers; replica B serves pods only.
    let store = Path::new(db.url());
    let a = Server::start_with(store, &webhooks);
    let b = Server::start_with(store, &[]);
    a.set_limits("acme", 400_000.0, 1_000_000.0, 400_000.0);
    a.ok(&[
        "budget",
        "set",
        "--tenant",
        "acme",
        "--amount",
        "1000000",
        "--cycle",
        "monthly",
        "--at-limit",
        "stop",
    ]);
    for (i, replica) in [&a, &b, &a, &b, &a].into_iter().enumerate() {
        let instance = (i + 1).to_string();
        replica.ok(&[
            "pod",
            "request",
            "--tenant",
            "acme",
            "--instance",
            &instance,
            "--tokens",
            "300000",
        ]);
    }
    let show = a.json(&["budget", "show", "--tenant", "acme", "--json"]);
    assert_eq!(
        show["fired"],
        serde_json::json!(["50", "75", "90", "100"]),
        "{show}"
    );

    // The receiver fails: the events are tried, and tried again.
    assert_eq!(receiver.mode.load(Ordering::SeqCst), FAIL);
    wait_until("each event is posted", || receiver.keys() == 4);
    assert!(receiver.acknowledged().is_empty());
    // It hangs: replica A is killed while its posts wait.
    receiver.mode.store(HANG, Ordering::SeqCst);
    wait_until("a post hangs", || *receiver.hanging.lock().expect("h") > 0);
    a.kill();
    receiver.mode.store(OK, Ordering::SeqCst);
    receiver.release.notify_waiters();

    // A replica started after the crash (B has no webhooks) takes the
    // events up once the killed one's claims lapse.
    let c = Server::start_with(store, &webhooks);
    wait_until("every event is acknowledged", || {
        receiver.acknowledged().len() == 4
    });
    std::thread::sleep(Duration::from_secs(2));
    let acked = receiver.acknowledged();
    assert!(acked.values().all(|n| *n == 1), "{acked:?}");
    c.stop();
    b.stop();
}

#[test]
fn bad_webhook_flags_are_refused_at_start_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tollgate.redb").display().to_string();
    let short = dir.path().join("short");
    std::fs::write(&short, "tiny\n").expect("write");
    let short = short.display().to_string();
    let cases: [(&[&str], &str); 4] = [
        (&["--webhook-url", "http://127.0.0.1:9/h"], "--webhook-url"),
        (
            &["--webhook-url", "ftp://x/", "--webhook-secret-file", &short],
            "--webhook-url",
        ),
        (
            &[
                "--webhook-url",
                "http://127.0.0.1:9/h",
                "--webhook-secret-file",
                &short,
            ],
            "--webhook-secret-file",
        ),
        (
            &[
                "--webhook-url",
                "http://127.0.0.1:9/h",
                "--webhook-secret-file",
                "/nonexistent/secret",
            ],
            "--webhook-secret-file",
        ),
    ];
    for (flags, named) in cases {
        let out = command()
            .args([
                "serve",
                "--create",
                "--store",
                &store,
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--metrics-listen", "off"])
            .args(flags)
            .output()
            .expect("run serve");
        assert!(!out.status.success(), "{flags:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
}
