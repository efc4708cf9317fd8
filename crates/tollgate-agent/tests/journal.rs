//! The journal against a real server over a real socket: an agent killed
//! mid-run, its last request applied by the server but its answer lost,
//! restarted on the same state directory. What its callers were told they
//! got is counted exactly once: the lost request is replayed (a duplicate
//! the server recognises), what no request carried is sent, both before
//! the new incarnation's first request, and the old incarnation's late
//! retry, arriving after that, counts nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_agent::journal::{Journal, JournalOptions, JournalTransport};
use tollgate_client::{
    Controller, LocalBucketConfig, Options, Transport, TransportError, connect_transport,
};
use tollgate_core::partition::ExchangeAnswer;
use tollgate_core::{BucketName, Consumption, Grant, TenantId, TokenBucketRequest};
use tollgate_proto::partition::PartitionLoadCall;
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
use tollgate_server::telemetry::Telemetry;

const INSTANCE: u32 = 3_000_000_007;

struct Server {
    url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tollgate_server::ServeError>>,
}

impl Server {
    async fn start() -> Server {
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::in_memory(BucketSettings::default()).expect("an in-memory store"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::run_with_options(
            listener,
            store,
            Telemetry::new().expect("telemetry"),
            tollgate_server::GrpcOptions::default(),
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

    async fn admin(&self) -> AdminClient<tonic::transport::Channel> {
        AdminClient::connect(self.url.clone())
            .await
            .expect("admin connects")
    }

    async fn set_limits(&self, tenant: &str) {
        self.admin()
            .await
            .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
                tenant_id: tenant.into(),
                bucket: String::new(),
                available_tokens: 1_000_000.0,
                refill_rate: 10_000.0,
                burst_limit: 1_000_000.0,
                as_of: None,
                as_of_consumed_tokens: 0.0,
                update_mask: None,
            })
            .await
            .expect("limits set");
    }

    /// The tenant's request units as the server counts them, in micro-units.
    async fn request_unit_micros(&self, tenant: &str) -> u64 {
        let units = self
            .admin()
            .await
            .get_tenant(v1::GetTenantRequest {
                tenant_id: tenant.into(),
                bucket: String::new(),
            })
            .await
            .expect("the tenant")
            .into_inner()
            .tenant
            .and_then(|t| t.consumption)
            .map_or(0.0, |c| c.request_units);
        (units * 1e6).round() as u64
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("server task").expect("server ran");
    }
}

/// The way to the server, which can start losing answers: the server gets
/// and applies each request, the agent never hears back (a connection cut
/// after the request went out). Keeps the last request it lost.
struct LosingAnswers {
    inner: Arc<dyn Transport>,
    losing: AtomicBool,
    lost: Mutex<Option<(BucketName, TokenBucketRequest)>>,
}

#[async_trait]
impl Transport for LosingAnswers {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        let grant = self.inner.token_bucket(bucket, request.clone()).await?;
        if self.losing.load(Ordering::SeqCst) {
            *self.lost.lock().expect("lock") = Some((bucket.clone(), request));
            return Err(TransportError::new("connection reset after the request"));
        }
        Ok(grant)
    }

    async fn partition_load(
        &self,
        call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        self.inner.partition_load(call).await
    }
}

fn options() -> Options {
    Options {
        bucket: LocalBucketConfig {
            initial_tokens: 50.0,
            target_request_period: Duration::from_millis(100),
            ..LocalBucketConfig::default()
        },
        request_timeout: Duration::from_secs(2),
        ..Options::default()
    }
}

/// Acquires tokens `count` times, journaling each call as the agent does
/// before answering; adds the micro-units acknowledged to `acknowledged`,
/// and the calls to `calls`.
async fn answered_calls(
    controller: &Controller,
    journal: &Journal,
    tenant: &TenantId,
    count: usize,
    first_id: usize,
    (acknowledged, calls): (&mut u64, &mut usize),
) {
    for n in 0..count {
        let tokens = 1.0 + (n % 3) as f64;
        controller.acquire(tokens).await.expect("admitted");
        let took = Consumption::from_request_units(tokens);
        let id = format!("call-{}", first_id + n);
        journal
            .call(
                tenant,
                &BucketName::REQUEST_UNITS,
                &took,
                0,
                Some(&id),
                Some(&serde_json::json!({ "admitted": true })),
            )
            .expect("journaled");
        *acknowledged += took.request_unit_micros;
        *calls += 1;
        if n % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_loses_nothing_and_counts_nothing_twice() {
    let server = Server::start().await;
    server.set_limits("acme").await;
    let tenant = TenantId::parse("tenant", "acme").expect("tenant");
    let state = tempfile::tempdir().expect("state dir");

    // The first incarnation works, then its answers start getting lost,
    // and it is killed: its runtime goes down with every task in it, no
    // final report.
    let url = server.url.clone();
    let path = state.path().to_path_buf();
    let first = tenant.clone();
    let (mut acknowledged, mut calls, lost_bucket, lost_request, journal) =
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            let (result, controller) = runtime.block_on(async {
                let tenant = first;
                let opened = Journal::open(&path, JournalOptions::new(INSTANCE)).expect("journal");
                assert_eq!((opened.generation, opened.orphans), (1, 0));
                let journal = opened.journal;
                let losing = Arc::new(LosingAnswers {
                    inner: connect_transport(&url, &tenant, INSTANCE, &options())
                        .expect("transport"),
                    losing: AtomicBool::new(false),
                    lost: Mutex::new(None),
                });
                let controller = Controller::with_transport(
                    JournalTransport::new(Arc::clone(&journal), tenant.clone(), losing.clone()),
                    &tenant,
                    INSTANCE,
                    options(),
                )
                .expect("controller");
                let (mut acknowledged, mut calls) = (0, 0);
                let counts = (&mut acknowledged, &mut calls);
                answered_calls(&controller, &journal, &tenant, 300, 0, counts).await;
                losing.losing.store(true, Ordering::SeqCst);
                // Until a request is applied and its answer lost.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while losing.lost.lock().expect("lock").is_none() {
                    let first = 1_000_000 + calls;
                    let counts = (&mut acknowledged, &mut calls);
                    answered_calls(&controller, &journal, &tenant, 5, first, counts).await;
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "no request went out"
                    );
                }
                let counts = (&mut acknowledged, &mut calls);
                answered_calls(&controller, &journal, &tenant, 20, 2_000_000, counts).await;
                let (bucket, request) = losing.lost.lock().expect("lock").clone().expect("lost");
                ((acknowledged, calls, bucket, request, journal), controller)
            });
            runtime.shutdown_background();
            drop(controller);
            result
        })
        .join()
        .expect("the first incarnation ran");
    // The killed process's tasks are gone once nothing holds its journal.
    let gone = tokio::time::Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&journal) > 1 {
        assert!(tokio::time::Instant::now() < gone, "the old tasks stop");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(journal);
    assert!(
        server.request_unit_micros("acme").await < acknowledged,
        "the kill left consumption unreported (else this test shows nothing)"
    );

    // The restart: the orphan is found, the new incarnation waits for it.
    let opened = Journal::open(state.path(), JournalOptions::new(INSTANCE)).expect("reopen");
    assert_eq!(opened.generation, 2);
    assert_eq!(opened.orphans, 1, "the request-unit bucket owes");
    assert_eq!(
        opened.remembered.len(),
        calls,
        "every answer, for its request id"
    );
    assert!(
        opened
            .remembered
            .iter()
            .any(|r| r.request_id == "call-2000019")
    );
    let journal = opened.journal;
    let controller = Controller::with_transport(
        JournalTransport::new(
            Arc::clone(&journal),
            tenant.clone(),
            connect_transport(&server.url, &tenant, INSTANCE, &options()).expect("transport"),
        ),
        &tenant,
        INSTANCE,
        options(),
    )
    .expect("controller");
    let url = server.url.clone();
    let settle_tenant = tenant.clone();
    tokio::time::timeout(
        Duration::from_secs(20),
        Arc::clone(&journal).settle(move |_| {
            connect_transport(&url, &settle_tenant, INSTANCE, &options()).expect("transport")
        }),
    )
    .await
    .expect("settled");
    assert_eq!(journal.orphans_left(), 0);
    answered_calls(
        &controller,
        &journal,
        &tenant,
        100,
        3_000_000,
        (&mut acknowledged, &mut calls),
    )
    .await;
    let report = controller.shutdown().await;
    assert!(report.consumption_reported);

    // The first incarnation's late retry, after the second took over.
    let late = connect_transport(&server.url, &tenant, INSTANCE, &options())
        .expect("transport")
        .token_bucket(&lost_bucket, lost_request)
        .await;
    assert!(late.is_err(), "a superseded lease is refused: {late:?}");

    assert_eq!(server.request_unit_micros("acme").await, acknowledged);

    // A clean shutdown leaves nothing owed.
    drop(controller);
    let gone = tokio::time::Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&journal) > 1 {
        assert!(tokio::time::Instant::now() < gone, "the tasks stop");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(journal);
    let opened = Journal::open(state.path(), JournalOptions::new(INSTANCE)).expect("reopen");
    assert_eq!((opened.generation, opened.orphans), (3, 0));
    server.stop().await;
}
