//! Answers no retry changes are errors, not outages: pods against the real
//! server (`tollgate_server::run` over an in-memory embedded store) on
//! `127.0.0.1:0`, through `Controller::connect`, in real time.
//!
//! - A bucket the tenant lacks: the server's first answer, `NOT_FOUND`,
//!   makes `acquire` fail with the refusal, naming tenant and bucket; the
//!   pod admits no more than its initial allowance, and nothing on the
//!   fallback rate.
//! - A tenant the server does not know (with unconfigured tenants
//!   refused): every entry point of the request-unit bucket fails the same
//!   way, and `shutdown` reports the refusal.
//! - A pod whose token does not name its tenant, or that sends none, to a
//!   server that binds pods to tenants: `PERMISSION_DENIED` and
//!   `UNAUTHENTICATED` are refusals too.
//! - An unreachable server is still an outage: the pod runs on its
//!   fallback rate, and the metrics say so.
//!
//! The refusal's effect on `shutdown`'s time is measured in virtual time
//! in `server_virtual_time`.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_client::{
    BucketHandle, ClientError, Consumption, Controller, LocalBucketConfig, Options, PodToken,
    Refusal, Registry, Request,
};
use tollgate_server::GrpcOptions;
use tollgate_server::service::PodTokens;
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store, UnconfiguredTenants};
use tollgate_server::telemetry::Telemetry;

/// The initial allowance of the pods here: all a pod may admit before the
/// server's first answer.
const INITIAL_TOKENS: f64 = 20.0;

/// How long a test waits for what it expects before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A real server on `127.0.0.1:0` over an in-memory store.
struct Server {
    url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tollgate_server::ServeError>>,
}

impl Server {
    async fn start(settings: BucketSettings) -> Server {
        Server::start_with(settings, GrpcOptions::default()).await
    }

    async fn start_with(settings: BucketSettings, options: GrpcOptions) -> Server {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory(settings).expect("store"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = oneshot::channel::<()>();
        let telemetry = Telemetry::new().expect("telemetry");
        let task = tokio::spawn(tollgate_server::run_with_options(
            listener,
            store,
            telemetry,
            options,
            async {
                let _ = stopped.await;
            },
        ));
        Server {
            url,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("server task").expect("server ran");
    }
}

fn options(registry: &Registry) -> Options {
    Options {
        bucket: LocalBucketConfig {
            initial_tokens: INITIAL_TOKENS,
            ..LocalBucketConfig::default()
        },
        registry: Some(registry.clone()),
        ..Options::default()
    }
}

/// The value of client metric `name` for `bucket`.
fn metric(registry: &Registry, name: &str, bucket: &str) -> f64 {
    let family = registry
        .gather()
        .into_iter()
        .find(|family| family.name() == name)
        .unwrap_or_else(|| panic!("no metric {name}"));
    let metric = family
        .get_metric()
        .iter()
        .find(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "bucket" && l.value() == bucket)
        })
        .unwrap_or_else(|| panic!("no {name} for bucket {bucket:?}"))
        .clone();
    if name.ends_with("_total") {
        metric.get_counter().get_value()
    } else {
        metric.get_gauge().get_value()
    }
}

/// Acquires one token at a time until an acquisition fails; returns how
/// many were admitted and the error. Fails the test if none fails in
/// [`PATIENCE`].
async fn acquire_until_refused(bucket: &BucketHandle) -> (u64, ClientError) {
    let deadline = Instant::now() + PATIENCE;
    let mut admitted = 0;
    loop {
        match tokio::time::timeout_at(deadline, bucket.acquire(1.0)).await {
            Ok(Ok(())) => admitted += 1,
            Ok(Err(e)) => return (admitted, e),
            Err(_) => panic!(
                "bucket {:?}: no error in {PATIENCE:?}, {admitted} acquisitions admitted, {} tokens on fallback",
                bucket.name(),
                bucket.status().fallback_tokens
            ),
        }
    }
}

fn refusal(error: ClientError) -> Refusal {
    match error {
        ClientError::Refused(refusal) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn assert_refused(result: Result<impl std::fmt::Debug, ClientError>, bucket: &str, what: &str) {
    match result {
        Err(ClientError::Refused(refusal)) => assert_eq!(refusal.bucket.as_str(), bucket, "{what}"),
        other => panic!("{what}: expected the refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_pod_gating_on_a_bucket_its_tenant_lacks_gets_an_error_after_one_round_trip() {
    let server = Server::start(BucketSettings::default()).await;
    let registry = Registry::new();
    let controller = Controller::connect(&server.url, "acme", 1, options(&registry)).expect("pod");
    let sms = controller.bucket("send-sms").expect("a valid name");

    let (admitted, error) = acquire_until_refused(&sms).await;
    let text = error.to_string();
    let refusal = refusal(error);
    eprintln!("admitted {admitted} acquisitions of 1 token before: {text}");
    assert_eq!(refusal.bucket.as_str(), "send-sms");
    assert_eq!(refusal.tenant.as_str(), "acme");
    assert_eq!(refusal.code, tonic::Code::NotFound);
    assert!(text.contains("send-sms") && text.contains("acme"), "{text}");
    // The first answer stopped it: one request, nothing beyond the
    // initial allowance, nothing on the fallback rate.
    assert!(admitted as f64 <= INITIAL_TOKENS, "admitted {admitted}");
    assert_eq!(
        metric(
            &registry,
            "tollgate_client_server_requests_total",
            "send-sms"
        ),
        1.0,
        "one round trip"
    );
    let status = sms.status();
    assert!(!status.fallback_active);
    assert_eq!(status.fallback_tokens, 0.0);
    assert_eq!(
        metric(
            &registry,
            "tollgate_client_fallback_entries_total",
            "send-sms"
        ),
        0.0
    );
    assert_eq!(
        metric(&registry, "tollgate_client_refused", "send-sms"),
        1.0
    );

    // Every later call on the bucket fails the same way…
    assert_refused(sms.acquire(1.0).await, "send-sms", "acquire");
    assert_refused(sms.try_acquire(1.0), "send-sms", "try_acquire");
    assert_refused(sms.try_acquire(0.0), "send-sms", "try_acquire(0)");
    assert_refused(
        sms.charge_after(Consumption::from_request_units(1.0)),
        "send-sms",
        "charge_after",
    );
    assert_refused(controller.bucket("send-sms"), "send-sms", "bucket");
    // …while the tenant's other buckets work.
    controller
        .acquire(1.0)
        .await
        .expect("the request-unit bucket");
    let report = controller.shutdown().await;
    let sms_report = report
        .buckets
        .iter()
        .find(|b| b.bucket.as_str() == "send-sms")
        .expect("reported");
    assert_eq!(sms_report.refusal.as_ref(), Some(&refusal));
    assert!(!sms_report.consumption_reported);
    assert!(
        report
            .buckets
            .iter()
            .any(|b| b.bucket.as_str() == "" && b.consumption_reported)
    );
    server.stop().await;
}

#[tokio::test]
async fn every_entry_point_of_a_refused_bucket_fails_with_the_refusal() {
    let server = Server::start(BucketSettings {
        unconfigured_tenants: UnconfiguredTenants::Reject,
        ..BucketSettings::default()
    })
    .await;
    let registry = Registry::new();
    let controller = Controller::connect(&server.url, "ghost", 1, options(&registry)).expect("pod");

    // try_acquire never waits: it admits the initial allowance, then says
    // no, until the server's answer makes it fail.
    let deadline = Instant::now() + PATIENCE;
    let mut admitted = 0u64;
    let error = loop {
        match controller.try_acquire(1.0) {
            Ok(true) => admitted += 1,
            Ok(false) => {
                assert!(
                    Instant::now() < deadline,
                    "no error in {PATIENCE:?}; admitted {admitted}"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => break e,
        }
    };
    let refusal = refusal(error);
    assert_eq!(
        (refusal.tenant.as_str(), refusal.bucket.as_str()),
        ("ghost", "")
    );
    assert_eq!(refusal.code, tonic::Code::NotFound);
    assert!(admitted as f64 <= INITIAL_TOKENS, "admitted {admitted}");
    assert_eq!(
        metric(&registry, "tollgate_client_server_requests_total", ""),
        1.0
    );
    assert_eq!(controller.status().fallback_tokens, 0.0);

    let read = Request::read(1);
    let write = Request::write(1, 100);
    assert_refused(controller.acquire(1.0).await, "", "acquire");
    assert_refused(controller.try_acquire(1.0), "", "try_acquire");
    assert_refused(controller.on_request(&read).await, "", "on_request (read)");
    assert_refused(
        controller.on_request(&write).await,
        "",
        "on_request (write)",
    );
    assert_refused(controller.on_response(&read, 4096), "", "on_response");
    assert_refused(controller.record_cpu(0.5), "", "record_cpu");
    assert_refused(controller.record_egress(1024), "", "record_egress");
    assert_refused(
        controller.charge_after(Consumption::from_request_units(2.0)),
        "",
        "charge_after",
    );
    assert_refused(controller.bucket(""), "", "bucket(\"\")");
    // Exempt work is neither gated nor charged, refused or not.
    controller
        .on_request(&read.exempt())
        .await
        .expect("exempt work");

    let report = controller.shutdown().await;
    assert_eq!(report.buckets[0].refusal.as_ref(), Some(&refusal));
    assert!(!report.consumption_reported);
    server.stop().await;
}

#[tokio::test]
async fn a_pod_without_a_credential_for_its_tenant_is_refused_not_failed_open() {
    let tokens = PodTokens::parse("acme-pods acme-pods-0123456789abcdef acme\n").expect("tokens");
    let server = Server::start_with(
        BucketSettings::default(),
        GrpcOptions {
            pod_tokens: Some(Arc::new(arc_swap::ArcSwap::from_pointee(tokens))),
            ..GrpcOptions::default()
        },
    )
    .await;
    let acme_token = PodToken::new("acme-pods-0123456789abcdef").expect("a valid token");
    let cases = [
        (
            "globex",
            Some(acme_token.clone()),
            tonic::Code::PermissionDenied,
        ),
        ("acme", None, tonic::Code::Unauthenticated),
    ];
    for (tenant, token, code) in cases {
        let registry = Registry::new();
        let options = Options {
            pod_token: token,
            ..options(&registry)
        };
        let controller = Controller::connect(&server.url, tenant, 1, options).expect("pod");
        let handle = controller.bucket("").expect("the request-unit bucket");
        let (admitted, error) = acquire_until_refused(&handle).await;
        let refusal = refusal(error);
        assert_eq!((refusal.tenant.as_str(), refusal.code), (tenant, code));
        assert!(
            admitted as f64 <= INITIAL_TOKENS,
            "{tenant}: admitted {admitted}"
        );
        assert_eq!(controller.status().fallback_tokens, 0.0, "{tenant}");
        assert_eq!(metric(&registry, "tollgate_client_refused", ""), 1.0);
        controller.shutdown().await;
    }
    // The pod the token names is served.
    let registry = Registry::new();
    let options = Options {
        pod_token: Some(acme_token),
        ..options(&registry)
    };
    let acme = Controller::connect(&server.url, "acme", 2, options).expect("pod");
    acme.acquire(5.0).await.expect("served");
    assert!(acme.shutdown().await.consumption_reported);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_an_outage_the_metrics_show() {
    // An address nothing listens on.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    drop(listener);
    let registry = Registry::new();
    let options = Options {
        bucket: LocalBucketConfig {
            initial_tokens: INITIAL_TOKENS,
            fallback_after: Duration::from_millis(100),
            ..LocalBucketConfig::default()
        },
        registry: Some(registry.clone()),
        ..Options::default()
    };
    let controller = Controller::connect(&url, "acme", 1, options).expect("pod");
    let sms = controller.bucket("send-sms").expect("a valid name");

    // The pod keeps working: its allowance, then the fallback rate.
    let deadline = Instant::now() + PATIENCE;
    while sms.status().fallback_tokens <= 0.0 {
        assert!(
            Instant::now() < deadline,
            "not on fallback: {:?}",
            sms.status()
        );
        sms.try_acquire(1.0).expect("an outage is no error");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sms.acquire(0.5)
        .await
        .expect("admitted on the fallback rate");
    assert!(sms.status().fallback_active);
    assert_eq!(
        metric(&registry, "tollgate_client_fallback_active", "send-sms"),
        1.0
    );
    assert_eq!(
        metric(
            &registry,
            "tollgate_client_fallback_entries_total",
            "send-sms"
        ),
        1.0
    );
    assert!(
        metric(
            &registry,
            "tollgate_client_fallback_tokens_total",
            "send-sms"
        ) > 0.0
    );
    assert_eq!(
        metric(&registry, "tollgate_client_refused", "send-sms"),
        0.0
    );
    assert!(metric(&registry, "tollgate_client_server_errors_total", "send-sms") >= 1.0);
}
