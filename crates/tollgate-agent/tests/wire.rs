//! The agent through the wire only: a real `tollgate-server` on an embedded
//! store file, the agent on a real Unix socket, callers with the generated
//! tonic client over a Unix-socket channel (and raw HTTP/1.1 for the JSON
//! face), in real time.
//!
//! - FIFO across callers on separate connections; a waiting acquire whose
//!   caller disconnects leaves the queue; `max_wait` (and the agent's
//!   `--max-wait`) end a wait with `admitted: false`, nothing taken.
//! - Every field out of range is INVALID_ARGUMENT naming it, and changes
//!   nothing; a bucket the tenant lacks is NOT_FOUND naming tenant and
//!   bucket, on every call.
//! - Request ids: a repeat gets the first answer without a second effect,
//!   other parameters are refused, a repeat while the first waits is
//!   ABORTED, a call abandoned leaves nothing.
//! - Return gives back only unreported tokens.
//! - HTTP/JSON acquire, charge, report, status and errors on the socket;
//!   metrics and health.
//! - CheckKeys passes through to the server's per-key buckets.
//! - Reflection lists the agent's service and health only; health serves.
//! - With the server away, acquires run on the fallback rate (and say
//!   so), and what they took is charged once the server is back.
//! - Graceful shutdown: a waiting acquire is answered UNAVAILABLE, and the
//!   server's totals equal what was acquired, charged and reported, less
//!   what was given back.

mod support;

use std::time::{Duration, Instant};

use support::{AgentUnderTest, PATIENCE, Server, eventually, options};
use tollgate_proto::agent::v1::agent_client::AgentClient;
use tollgate_proto::agent::v1::{
    AcquireRequest, ChargeRequest, ReportRequest, ReturnRequest, StatusRequest, StatusResponse,
    TryAcquireRequest,
};
use tollgate_proto::v1;
use tonic::Code;
use tonic::transport::Channel;

const TENANT: &str = "acme";

fn acquire(bucket: &str, tokens: f64, max_wait: Option<Duration>, id: &str) -> AcquireRequest {
    AcquireRequest {
        tenant: TENANT.to_owned(),
        bucket: bucket.to_owned(),
        tokens,
        max_wait: max_wait.map(tollgate_proto::duration),
        request_id: id.to_owned(),
    }
}

fn try_acquire(bucket: &str, tokens: f64, id: &str) -> TryAcquireRequest {
    TryAcquireRequest {
        tenant: TENANT.to_owned(),
        bucket: bucket.to_owned(),
        tokens,
        request_id: id.to_owned(),
    }
}

fn charge(bucket: &str, tokens: f64, id: &str) -> ChargeRequest {
    ChargeRequest {
        tenant: TENANT.to_owned(),
        bucket: bucket.to_owned(),
        tokens,
        request_id: id.to_owned(),
    }
}

fn give_back(bucket: &str, tokens: f64, id: &str) -> ReturnRequest {
    ReturnRequest {
        tenant: TENANT.to_owned(),
        bucket: bucket.to_owned(),
        tokens,
        request_id: id.to_owned(),
    }
}

async fn status(client: &mut AgentClient<Channel>, bucket: &str) -> StatusResponse {
    client
        .status(StatusRequest {
            tenant: TENANT.to_owned(),
            bucket: bucket.to_owned(),
        })
        .await
        .expect("status")
        .into_inner()
}

/// Waits until the agent's local `bucket` holds `tokens` (the server's
/// grant arrived), starting the bucket if it is new.
async fn holds(client: &AgentClient<Channel>, bucket: &str, tokens: f64) {
    eventually(&format!("bucket {bucket:?} holds {tokens}"), || {
        let mut client = client.clone();
        async move { (status(&mut client, bucket).await.tokens - tokens).abs() < 1e-6 }
    })
    .await;
}

fn waited(response: &tollgate_proto::agent::v1::AcquireResponse) -> Duration {
    let waited = response.waited.expect("waited is set");
    Duration::new(waited.seconds as u64, waited.nanos as u32)
}

/// The value of the agent's metric line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_are_served_first_come_first_served_across_callers() {
    let server = Server::start().await;
    // 20 tokens a second, none to start with.
    server.set_bucket(TENANT, "emails", 0.0, 20.0, 20.0).await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let started = Instant::now();
    let mut callers = Vec::new();
    // A wants 20 (a second of refill); B and C want one each, which they
    // would get at once if they could go past A. Each on its connection.
    for (name, tokens) in [("A", 20.0), ("B", 1.0), ("C", 1.0)] {
        let mut client = agent.client().await;
        callers.push(tokio::spawn(async move {
            let answer = client
                .acquire(acquire("emails", tokens, Some(PATIENCE), ""))
                .await
                .expect("acquire")
                .into_inner();
            assert!(answer.admitted, "{name} admitted");
            (name, started.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut done = Vec::new();
    for caller in callers {
        done.push(caller.await.expect("caller"));
    }
    let (a, b, c) = (done[0].1, done[1].1, done[2].1);
    assert!(a < b && b < c, "served in arrival order: {done:?}");
    assert!(
        a >= Duration::from_millis(700),
        "A waited for its refill: {a:?}"
    );
    agent.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_whose_caller_goes_away_leaves_the_queue() {
    let server = Server::start().await;
    // 10 tokens and never more.
    server.set_bucket(TENANT, "sms", 10.0, 0.0, 10.0).await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut watcher = agent.client().await;
    holds(&watcher, "sms", 10.0).await;

    // A asks for 50, which never come, and waits; then its caller dies
    // (its connection goes with the task).
    let mut gone = agent.client().await;
    let waiting = tokio::spawn(async move {
        gone.acquire(acquire("sms", 50.0, Some(Duration::from_secs(60)), "a-1"))
            .await
    });
    eventually("A waits", || {
        let mut client = watcher.clone();
        async move { status(&mut client, "sms").await.waiters == 1 }
    })
    .await;
    waiting.abort();
    eventually("A left the queue", || {
        let mut client = watcher.clone();
        async move { status(&mut client, "sms").await.waiters == 0 }
    })
    .await;

    // B gets the 10 it would have waited behind A for, at once.
    let mut later = agent.client().await;
    let answer = later
        .acquire(acquire("sms", 10.0, Some(Duration::from_secs(1)), ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(answer.admitted);
    assert!(waited(&answer) < Duration::from_millis(500), "{answer:?}");
    assert_eq!(status(&mut watcher, "sms").await.tokens, 0.0);
    // A's request id left nothing behind: a retry is a new call.
    let retry = later
        .acquire(acquire("sms", 50.0, Some(Duration::ZERO), "a-1"))
        .await
        .expect("a new call")
        .into_inner();
    assert!(!retry.admitted);

    let (code, text) = agent.http("GET", "/metrics", None).await;
    assert_eq!(code, 200);
    let cancelled =
        r#"tollgate_agent_acquisitions_total{bucket="sms",result="cancelled",tenant="acme"}"#;
    assert_eq!(metric(&text, cancelled), Some(1.0), "{text}");
    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "sms").await, 10.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_max_wait_is_not_admitted_and_takes_nothing() {
    let server = Server::start().await;
    server.set_bucket(TENANT, "reports", 10.0, 0.0, 10.0).await;
    let mut config = options(&server);
    config.max_wait = Duration::from_millis(300);
    let agent = AgentUnderTest::start(config).await;
    let mut client = agent.client().await;
    holds(&client, "reports", 10.0).await;

    let answer = client
        .acquire(acquire(
            "reports",
            50.0,
            Some(Duration::from_millis(200)),
            "",
        ))
        .await
        .expect("acquire")
        .into_inner();
    assert!(!answer.admitted);
    assert!(waited(&answer) >= Duration::from_millis(200), "{answer:?}");
    // No max_wait: the agent's --max-wait (300 ms here).
    let started = Instant::now();
    let answer = client
        .acquire(acquire("reports", 50.0, None, ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(!answer.admitted);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(started.elapsed() < Duration::from_secs(5));
    // Nothing was taken: all 10 are still there.
    assert_eq!(status(&mut client, "reports").await.tokens, 10.0);
    let taken = client
        .try_acquire(try_acquire("reports", 10.0, ""))
        .await
        .expect("try")
        .into_inner();
    assert!(taken.admitted);
    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "reports").await, 10.0);
    server.stop().await;
}

/// Asserts `result` is INVALID_ARGUMENT naming `field`.
fn names_field<T: std::fmt::Debug>(result: Result<T, tonic::Status>, field: &str) {
    let status = result.expect_err(field);
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert!(
        status.message().starts_with(&format!("{field}: ")),
        "{field}: {}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_out_of_range_is_refused_by_name_and_changes_nothing() {
    let server = Server::start().await;
    server.set_bucket(TENANT, "emails", 100.0, 0.0, 100.0).await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    holds(&c, "emails", 100.0).await;
    let before = status(&mut c, "emails").await;
    let long_id = "r".repeat(129);
    let with = |f: &dyn Fn(&mut AcquireRequest)| {
        let mut request = acquire("emails", 1.0, None, "");
        f(&mut request);
        request
    };

    // Acquire.
    for (field, request) in [
        ("tenant", with(&|r| r.tenant = String::new())),
        ("tenant", with(&|r| r.tenant = "bad tenant".into())),
        ("bucket", with(&|r| r.bucket = "bad/bucket".into())),
        ("bucket", with(&|r| r.bucket = "b".repeat(65))),
        ("tokens", with(&|r| r.tokens = f64::NAN)),
        ("tokens", with(&|r| r.tokens = -1.0)),
        ("tokens", with(&|r| r.tokens = f64::INFINITY)),
        ("tokens", with(&|r| r.tokens = 1e16)),
        (
            "max_wait",
            with(&|r| {
                r.max_wait = Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                })
            }),
        ),
        (
            "max_wait",
            with(&|r| {
                r.max_wait = Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 2_000_000_000,
                })
            }),
        ),
        (
            "max_wait",
            with(&|r| r.max_wait = Some(tollgate_proto::duration(Duration::from_secs(3601)))),
        ),
        ("request_id", with(&|r| r.request_id = long_id.clone())),
    ] {
        names_field(c.acquire(request).await, field);
    }
    // TryAcquire, Charge and Return.
    for (field, tenant, bucket, tokens, id) in [
        ("tenant", "", "emails", 1.0, ""),
        ("bucket", TENANT, "bad bucket", 1.0, ""),
        ("tokens", TENANT, "emails", f64::NAN, ""),
        ("tokens", TENANT, "emails", -5.0, ""),
        ("request_id", TENANT, "emails", 1.0, long_id.as_str()),
    ] {
        let mut t = try_acquire(bucket, tokens, id);
        t.tenant = tenant.into();
        names_field(c.try_acquire(t).await, field);
        let mut ch = charge(bucket, tokens, id);
        ch.tenant = tenant.into();
        names_field(c.charge(ch).await, field);
        let mut back = give_back(bucket, tokens, id);
        back.tenant = tenant.into();
        names_field(c.r#return(back).await, field);
    }
    // A charge is at most what one report to the server carries.
    names_field(c.charge(charge("emails", 2e12, "")).await, "tokens");
    // Report.
    let report = |f: &dyn Fn(&mut ReportRequest)| {
        let mut request = ReportRequest {
            tenant: TENANT.into(),
            read_requests: 1,
            ..Default::default()
        };
        f(&mut request);
        request
    };
    for (field, request) in [
        ("tenant", report(&|r| r.tenant = "x".repeat(129))),
        ("cpu_seconds", report(&|r| r.cpu_seconds = f64::NAN)),
        ("cpu_seconds", report(&|r| r.cpu_seconds = -1.0)),
        ("cpu_seconds", report(&|r| r.cpu_seconds = 1e10)),
        (
            "read_requests",
            report(&|r| r.read_requests = (1 << 53) + 1),
        ),
        ("read_bytes", report(&|r| r.read_bytes = u64::MAX)),
        ("write_requests", report(&|r| r.write_requests = u64::MAX)),
        ("egress_bytes", report(&|r| r.egress_bytes = u64::MAX)),
        ("request_units", report(&|r| r.write_bytes = 1 << 52)),
        ("request_id", report(&|r| r.request_id = long_id.clone())),
    ] {
        names_field(c.report(request).await, field);
    }
    // Status.
    for (field, tenant, bucket) in [("tenant", "", ""), ("bucket", TENANT, "no spaces")] {
        let request = StatusRequest {
            tenant: tenant.into(),
            bucket: bucket.into(),
        };
        names_field(c.status(request).await, field);
    }
    // CheckKeys: the agent reads the tenants; the server the rest.
    let item = |tenant: &str, key: &str| v1::CheckItem {
        tenant_id: tenant.into(),
        bucket: "per-user".into(),
        key: key.into(),
        tokens: 1.0,
        request_id: String::new(),
    };
    names_field(
        c.check_keys(v1::CheckRequest {
            items: vec![item(TENANT, "a"), item("bad tenant", "b")],
        })
        .await,
        "items[1].tenant_id",
    );
    names_field(
        c.check_keys(v1::CheckRequest {
            items: vec![item(TENANT, "")],
        })
        .await,
        "items[0].key",
    );

    // Nothing changed: the bucket holds what it held, owes nothing, and no
    // tenant was started for a refused name.
    let after = status(&mut c, "emails").await;
    assert_eq!((after.tokens, after.debt), (before.tokens, before.debt));
    let (_, metrics) = agent.http("GET", "/metrics", None).await;
    assert_eq!(metric(&metrics, "tollgate_agent_tenants "), Some(1.0));
    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "emails").await, 0.0);
    assert_eq!(server.consumed(TENANT, "").await, 0.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_the_tenant_lacks_is_not_found_naming_tenant_and_bucket() {
    let server = Server::start().await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    let names = |status: &tonic::Status| {
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().contains("tenant \"acme\""), "{status:?}");
        assert!(status.message().contains("bucket \"nope\""), "{status:?}");
    };
    // The acquire waits for the server's first answer, which refuses it.
    let refused = c
        .acquire(acquire("nope", 1.0, Some(PATIENCE), ""))
        .await
        .expect_err("refused");
    names(&refused);
    names(
        &c.try_acquire(try_acquire("nope", 1.0, ""))
            .await
            .expect_err("refused"),
    );
    names(
        &c.charge(charge("nope", 1.0, ""))
            .await
            .expect_err("refused"),
    );
    names(
        &c.status(StatusRequest {
            tenant: TENANT.into(),
            bucket: "nope".into(),
        })
        .await
        .expect_err("refused"),
    );
    let (code, body) = agent
        .http(
            "POST",
            "/v1/acquire",
            Some(r#"{"tenant":"acme","bucket":"nope","tokens":1}"#),
        )
        .await;
    assert_eq!(code, 404, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body["error"]["code"], "NOT_FOUND");
    agent.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_is_answered_once_and_its_repeats_get_that_answer() {
    let server = Server::start().await;
    server.set_bucket(TENANT, "emails", 100.0, 0.0, 100.0).await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    holds(&c, "emails", 100.0).await;

    // A repeat: the same answer, no second effect.
    for _ in 0..3 {
        let answer = c
            .try_acquire(try_acquire("emails", 5.0, "t-1"))
            .await
            .expect("try")
            .into_inner();
        assert!(answer.admitted);
        assert_eq!(status(&mut c, "emails").await.tokens, 95.0);
    }
    c.charge(charge("emails", 7.0, "c-1"))
        .await
        .expect("charge");
    c.charge(charge("emails", 7.0, "c-1"))
        .await
        .expect("repeat");
    assert!((status(&mut c, "emails").await.debt - 7.0).abs() < 1.0);
    // The same id with other parameters, or for another method: refused.
    names_field(
        c.try_acquire(try_acquire("emails", 6.0, "t-1")).await,
        "request_id",
    );
    names_field(c.charge(charge("emails", 5.0, "t-1")).await, "request_id");
    names_field(
        c.try_acquire(try_acquire("sms", 5.0, "t-1")).await,
        "request_id",
    );

    // A repeat while the first still waits: ABORTED.
    let mut first = agent.client().await;
    let waiting = tokio::spawn(async move {
        first
            .acquire(acquire(
                "emails",
                500.0,
                Some(Duration::from_millis(1500)),
                "a-1",
            ))
            .await
    });
    eventually("the first waits", || {
        let mut c = c.clone();
        async move { status(&mut c, "emails").await.waiters == 1 }
    })
    .await;
    let repeat = c
        .acquire(acquire(
            "emails",
            500.0,
            Some(Duration::from_millis(1500)),
            "a-1",
        ))
        .await
        .expect_err("in progress");
    assert_eq!(repeat.code(), Code::Aborted, "{repeat:?}");
    assert!(repeat.message().contains("request_id"), "{repeat:?}");
    let first = waiting.await.expect("task").expect("answered").into_inner();
    assert!(!first.admitted);
    // Answered now: its repeat gets that answer at once.
    let started = Instant::now();
    let again = c
        .acquire(acquire(
            "emails",
            500.0,
            Some(Duration::from_millis(1500)),
            "a-1",
        ))
        .await
        .expect("replayed")
        .into_inner();
    assert_eq!(again, first);
    assert!(started.elapsed() < Duration::from_millis(500));
    // Request ids are per tenant.
    let mut other = acquire("emails", 1.0, Some(PATIENCE), "t-1");
    other.tenant = "globex".into();
    let other = c.acquire(other).await.expect_err("globex has no emails");
    assert_eq!(other.code(), Code::NotFound, "{other:?}");

    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "emails").await, 12.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_gives_back_only_tokens_not_yet_reported() {
    let server = Server::start().await;
    server.set_bucket(TENANT, "emails", 100.0, 0.0, 100.0).await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    holds(&c, "emails", 100.0).await;
    let taken = c
        .acquire(acquire("emails", 30.0, Some(PATIENCE), ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(taken.admitted);
    let back = c
        .r#return(give_back("emails", 10.0, "r-1"))
        .await
        .expect("return")
        .into_inner();
    assert_eq!(back.returned, 10.0);
    assert_eq!(status(&mut c, "emails").await.tokens, 80.0);
    // A repeat gives back nothing more.
    let again = c
        .r#return(give_back("emails", 10.0, "r-1"))
        .await
        .expect("repeat")
        .into_inner();
    assert_eq!(again.returned, 10.0);
    assert_eq!(status(&mut c, "emails").await.tokens, 80.0);
    // More than was taken: only the 20 still unreported come back.
    let rest = c
        .r#return(give_back("emails", 1000.0, ""))
        .await
        .expect("return")
        .into_inner();
    assert_eq!(rest.returned, 20.0);
    assert_eq!(status(&mut c, "emails").await.tokens, 100.0);
    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "emails").await, 0.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_json_acquires_charges_and_reports_on_the_socket() {
    let server = Server::start().await;
    server.set_bucket(TENANT, "emails", 100.0, 0.0, 100.0).await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let json = |body: &str| serde_json::from_str::<serde_json::Value>(body).expect("JSON");

    let (code, body) = agent
        .http(
            "POST",
            "/v1/acquire",
            Some(r#"{"tenant":"acme","bucket":"emails","tokens":30,"max_wait_ms":5000}"#),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let answer = json(&body);
    assert_eq!(answer["admitted"], true);
    assert!(answer["waited_ms"].as_f64().expect("waited_ms") >= 0.0);
    assert_eq!(answer["fallback"], false);

    let (code, body) = agent
        .http(
            "POST",
            "/v1/charge",
            Some(r#"{"tenant":"acme","bucket":"emails","tokens":4.5,"request_id":"h-1"}"#),
        )
        .await;
    assert_eq!((code, body.as_str()), (200, "{}"));
    let (code, body) = agent
        .http(
            "POST",
            "/v1/try-acquire",
            Some(r#"{"tenant":"acme","bucket":"emails","tokens":1000}"#),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["admitted"], false);
    let (code, body) = agent
        .http(
            "POST",
            "/v1/report",
            Some(r#"{"tenant":"acme","read_requests":4,"cpu_seconds":0.003}"#),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let units = json(&body)["request_units"]
        .as_f64()
        .expect("request_units");
    assert!(
        (units - (0.5 + 4.0 * 0.125 + 333.3 * 0.003)).abs() < 1e-6,
        "{units}"
    );
    let (code, body) = agent
        .http("GET", "/v1/status?tenant=acme&bucket=emails", None)
        .await;
    assert_eq!(code, 200, "{body}");
    let status = json(&body);
    // 100 less the 30 acquired; the 4.5 charged is debt, paid over time.
    let level = status["tokens"].as_f64().expect("tokens") - status["debt"].as_f64().expect("debt");
    assert!((level - 65.5).abs() < 1e-6, "{status}");
    assert_eq!(status["instance_id"], 7);

    // Errors: JSON, with the HTTP status of their code, naming the field.
    for (body, field) in [
        (
            r#"{"tenant":"acme","bucket":"emails","tokens":"5"}"#,
            "tokens",
        ),
        (
            r#"{"tenant":"acme","bucket":"emails","tokens":-5}"#,
            "tokens",
        ),
        (
            r#"{"tenant":"acme","bucket":"emails","tokenz":5}"#,
            "tokenz",
        ),
        (r#"{"tenant":"acme","max_wait_ms":4000000}"#, "max_wait_ms"),
        (r#"[]"#, "body"),
        ("not json", "body"),
    ] {
        let (code, answer) = agent.http("POST", "/v1/acquire", Some(body)).await;
        assert_eq!(code, 400, "{body}: {answer}");
        let error = &json(&answer)["error"];
        assert_eq!(error["code"], "INVALID_ARGUMENT", "{answer}");
        let message = error["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
    }
    let (code, answer) = agent.http("GET", "/v1/nothing", None).await;
    assert_eq!(code, 404, "{answer}");
    let (code, _) = agent.http("GET", "/healthz", None).await;
    assert_eq!(code, 200);
    let (code, _) = agent.http("GET", "/readyz", None).await;
    assert_eq!(code, 200);
    let (_, metrics) = agent.http("GET", "/metrics", None).await;
    let admitted =
        r#"tollgate_agent_acquisitions_total{bucket="emails",result="admitted",tenant="acme"}"#;
    assert_eq!(metric(&metrics, admitted), Some(1.0), "{metrics}");
    let calls = r#"tollgate_agent_calls_total{code="INVALID_ARGUMENT",method="Acquire"}"#;
    assert_eq!(metric(&metrics, calls), Some(6.0), "{metrics}");
    assert!(
        metrics.contains(r#"tollgate_client_tokens{bucket="emails",instance="7",tenant="acme"}"#),
        "the client's own metrics share the registry: {metrics}"
    );

    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "emails").await, 34.5);
    assert!((server.consumed(TENANT, "").await - units).abs() < 1e-6);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_keys_passes_through_to_the_servers_per_key_buckets() {
    let server = Server::start().await;
    server
        .admin()
        .await
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: TENANT.into(),
            bucket: Some(v1::BucketDefinition {
                quota: None,
                bucket: "per-user".into(),
                refill_rate: 0.0,
                burst_limit: 2.0,
                initial_tokens: None,
                kind: v1::BucketKind::PerKey as i32,
                enforce: None,
            }),
        })
        .await
        .expect("a per-key bucket");
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    let check = || v1::CheckRequest {
        items: vec![v1::CheckItem {
            tenant_id: TENANT.into(),
            bucket: "per-user".into(),
            key: "alice".into(),
            tokens: 1.0,
            request_id: String::new(),
        }],
    };
    let verdicts: Vec<bool> = {
        let mut verdicts = Vec::new();
        for _ in 0..3 {
            let answer = c.check_keys(check()).await.expect("check").into_inner();
            verdicts.push(answer.allowed);
        }
        verdicts
    };
    assert_eq!(verdicts, [true, true, false]);
    let mut missing = check();
    missing.items[0].bucket = "per-team".into();
    let refused = c.check_keys(missing).await.expect_err("no such bucket");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    agent.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_graceful_shutdown_the_servers_totals_are_what_was_used() {
    let server = Server::start().await;
    server
        .set_bucket(TENANT, "emails", 1000.0, 0.0, 1000.0)
        .await;
    server.set_bucket(TENANT, "sms", 0.0, 0.0, 0.0).await;
    server.set_bucket(TENANT, "", 1000.0, 0.0, 1000.0).await;
    let mut agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    // The first grant: the client's buffer of 100 tokens.
    holds(&c, "emails", 100.0).await;
    let mut expected_emails = 0.0;
    for i in 0..20 {
        let tokens = 1.0 + f64::from(i);
        let answer = c
            .acquire(acquire("emails", tokens, Some(PATIENCE), &format!("e-{i}")))
            .await
            .expect("acquire")
            .into_inner();
        assert!(answer.admitted);
        expected_emails += tokens;
    }
    c.charge(charge("emails", 12.25, "")).await.expect("charge");
    expected_emails += 12.25;
    let back = c
        .r#return(give_back("emails", 5.0, ""))
        .await
        .expect("return")
        .into_inner();
    expected_emails -= back.returned;
    let report = c
        .report(ReportRequest {
            tenant: TENANT.into(),
            write_requests: 3,
            write_bytes: 2048,
            egress_bytes: 1 << 20,
            ..Default::default()
        })
        .await
        .expect("report")
        .into_inner();
    let taken = c
        .try_acquire(try_acquire("", 50.0, ""))
        .await
        .expect("try")
        .into_inner();
    // The server's first grant may still be on its way; either is fine.
    let expected_units = report.request_units + if taken.admitted { 50.0 } else { 0.0 };

    // An acquire that can never be served is waiting when the agent stops.
    let mut waiter = agent.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(acquire("sms", 5.0, Some(PATIENCE), ""))
            .await
    });
    eventually("the sms acquire waits", || {
        let mut c = c.clone();
        async move { status(&mut c, "sms").await.waiters == 1 }
    })
    .await;
    agent.begin_stop();
    let refused = waiting.await.expect("task").expect_err("shutting down");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("agent shutting down"),
        "{refused:?}"
    );
    let reports = agent.finish_stop().await;
    assert_eq!(reports.len(), 1);
    assert!(reports[0].report.consumption_reported, "{reports:?}");

    assert_eq!(server.consumed(TENANT, "emails").await, expected_emails);
    assert_eq!(server.consumed(TENANT, "sms").await, 0.0);
    assert!((server.consumed(TENANT, "").await - expected_units).abs() < 1e-6);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_only_the_agents_service_and_health_serves() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = Server::start().await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let channel = support::socket_channel(&agent.socket).await;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tonic::codegen::tokio_stream::once(request))
        .await
        .expect("reflection")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("an answer")
        .expect("a message");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a list of services: {answer:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        ["grpc.health.v1.Health", "tollgate.agent.v1.Agent"],
        "not the server's services, whose file the agent's proto imports"
    );
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "tollgate.agent.v1.Agent".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);
    agent.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_server_acquires_run_on_the_fallback_rate_and_are_charged_once() {
    let server = Server::start().await;
    // 10 tokens a second (the agent's only instance would get all of
    // them), and enough in the bucket that the first grant comes at once,
    // not as a trickle that would outlast the server.
    server
        .set_bucket(TENANT, "jobs", 1000.0, 10.0, 1000.0)
        .await;
    let agent = AgentUnderTest::start(options(&server)).await;
    let mut c = agent.client().await;
    holds(&c, "jobs", 100.0).await;
    let paused = server.pause().await;

    // The 100 on hand, then the fallback rate once requests go unanswered.
    let mut admitted = 0.0;
    let mut on_fallback = 0.0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let answer = c
            .acquire(acquire("jobs", 2.0, Some(Duration::from_secs(1)), ""))
            .await
            .expect("acquire")
            .into_inner();
        if answer.admitted {
            admitted += 2.0;
            if answer.fallback {
                on_fallback += 2.0;
            }
        }
    }
    assert!(
        on_fallback > 0.0,
        "{admitted} admitted, none on the fallback rate"
    );
    assert!(status(&mut c, "jobs").await.fallback_active);

    // The server is back: the fallback's tokens are charged, once.
    let server = paused.resume().await;
    eventually("the bucket leaves its fallback rate", || {
        let mut c = c.clone();
        async move { !status(&mut c, "jobs").await.fallback_active }
    })
    .await;
    let (_, metrics) = agent.http("GET", "/metrics", None).await;
    let seconds = metric(
        &metrics,
        r#"tollgate_agent_fallback_seconds_total{bucket="jobs",tenant="acme"}"#,
    );
    assert!(seconds.is_some_and(|s| s >= 1.0), "{metrics}");
    agent.stop().await;
    assert_eq!(server.consumed(TENANT, "jobs").await, admitted);
    server.stop().await;
}

/// Starts `jobs` (by asking its status) and says what the local bucket holds.
async fn started_with(agent: &AgentUnderTest) -> f64 {
    let mut c = agent.client().await;
    status(&mut c, "jobs").await.tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_starts_a_bucket_on_the_allowance_the_server_last_said() {
    use tollgate_agent::journal::{Journal, JournalOptions};
    let server = Server::start().await;
    // A bucket of 40 with its only pod (the agent): a new pod may start on
    // all 40 of them; the agent's own setting says nothing (0).
    server.set_bucket(TENANT, "jobs", 40.0, 1.0, 40.0).await;
    let state = tempfile::tempdir().expect("state dir");
    let with_journal = |server: &Server| {
        let mut o = options(server);
        o.journal = Some(Journal::open(state.path(), JournalOptions::new(7)).expect("journal"));
        o
    };

    let first = AgentUnderTest::start(with_journal(&server)).await;
    assert_eq!(started_with(&first).await, 0.0, "no allowance known yet");
    let c = first.client().await;
    eventually("the server's first answer", || {
        let mut c = c.clone();
        async move { status(&mut c, "jobs").await.tokens > 0.0 }
    })
    .await;
    first.stop().await;

    // Restarted while the server is down: the bucket starts on the 40 the
    // server said, charged when the server is back.
    let reopened = with_journal(&server);
    let paused = server.pause().await;
    let second = AgentUnderTest::start(reopened).await;
    assert_eq!(started_with(&second).await, 40.0);
    let mut c = second.client().await;
    let answer = c
        .try_acquire(try_acquire("jobs", 40.0, ""))
        .await
        .expect("try acquire")
        .into_inner();
    assert!(answer.admitted, "the allowance is usable before any answer");
    let server = paused.resume().await;
    second.stop().await;
    assert_eq!(server.consumed(TENANT, "jobs").await, 40.0);

    // Without a journal the agent knows nothing and starts on its setting.
    let forgetful = AgentUnderTest::start(options(&server)).await;
    assert_eq!(started_with(&forgetful).await, 0.0);
    forgetful.stop().await;
    server.stop().await;
}
