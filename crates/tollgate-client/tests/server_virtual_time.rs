//! Pods embedding the client against the real server, in tokio's paused
//! time: the server's gRPC services (token buckets, partition limits,
//! `Admin`, behind its edge layer) over an in-memory embedded store, in the
//! test's process, reached through `GrpcTransport` with every call encoded
//! and decoded as on the wire but no socket in between. A minute of
//! saturation and a 10 s outage take well under a second of real time, and
//! their outcome does not depend on how busy the machine is:
//!
//! - three saturating pods admit refill · 60 s + burst, within 5 %, over a
//!   virtual minute;
//! - while the server is down every pod runs on its fallback rate and
//!   admits what that rate allows; once it is back they leave it;
//! - the consumption the server stores is what the pods charged, to the
//!   last token;
//! - a bucket the tenant lacks is refused at the server's first answer,
//!   and shutdown does not wait for it.
//!
//! Two things keep the server in virtual time. Its store reads tokio's
//! clock ([`tokio_clock`]), although the embedded store reads it on its
//! writer thread, outside the runtime. And tokio's paused clock skips ahead
//! whenever the runtime has nothing to run, which it would do while a call
//! waits for that writer thread; each call holds the clock still until it
//! is answered ([`held_still`]), so a call takes no virtual time, as a
//! store transaction takes next to none beside the seconds measured here.
//!
//! A real `tollgate serve` over sockets, in real time, is the `tollgate`
//! crate's `client_e2e` test.

#[path = "common/load.rs"]
mod load;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use load::{assert_same_consumption, saturate, shutdown};
use tokio::time::Instant;
use tollgate_client::{
    ClientError, Controller, GrpcTransport, LocalBucketConfig, Options, TenantId,
};
use tollgate_core::Timestamp;
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::admin_server::AdminServer;
use tollgate_proto::v1::partition_limits_server::PartitionLimitsServer;
use tollgate_proto::v1::token_bucket_service_server::TokenBucketServiceServer;
use tollgate_server::service::edge::{Edge, EdgeLayer};
use tollgate_server::service::{
    AdminAuth, AdminService, PartitionLimitsService, TokenBucketService,
};
use tollgate_server::store::{BucketSettings, Clock, EmbeddedStore, Store};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::service::Routes;
use tower::{Layer, Service};

/// The server's time when the test starts (2026-01-01T00:00:00Z): any
/// instant would do; a real one keeps the stored timestamps plausible.
const START_UNIX_MICROS: i64 = 1_767_225_600_000_000;

/// The store's clock, on tokio's clock (paused in these tests). The
/// embedded store reads it on its writer thread, where no runtime is
/// entered and tokio's clock would read the system's, so it enters the
/// test's runtime to read it.
fn tokio_clock() -> Clock {
    let runtime = tokio::runtime::Handle::current();
    let origin = Instant::now();
    Arc::new(move || {
        let _in_runtime = runtime.enter();
        let elapsed = i64::try_from(origin.elapsed().as_micros()).expect("a short test");
        Timestamp::from_unix_micros(START_UNIX_MICROS + elapsed)
    })
}

/// Runs `call` with tokio's paused clock held still until it is done.
///
/// The runtime skips ahead to its next timer whenever no task can run,
/// and a call waiting on the store's writer thread (work tokio cannot see)
/// leaves none: time would jump by however long the next timer is, and
/// the pods' timeouts and trickles would fire in the middle of a store
/// transaction. A blocking task stops the clock from skipping ahead while
/// it runs (tokio's documented way to keep time still across work it
/// cannot see); this one runs until `call` is done.
async fn held_still<F: Future>(call: F) -> F::Output {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let hold = tokio::task::spawn_blocking(move || {
        // Returns once `done` is dropped.
        let _ = wait.recv();
    });
    let output = call.await;
    drop(done);
    hold.await.expect("the hold ends");
    output
}

/// What `tollgate serve` answers pods and operators with, stacked as its
/// gRPC server stacks it (minus the metrics layer, health and reflection).
type Services = Edge<Routes>;

fn services(store: &Arc<dyn Store>) -> Services {
    let routes = Routes::new(TokenBucketServiceServer::new(TokenBucketService::new(
        Arc::clone(store),
    )))
    .add_service(PartitionLimitsServer::new(PartitionLimitsService::new(
        Arc::clone(store),
    )))
    .add_service(
        AdminAuth::new(None).guard(AdminServer::new(AdminService::new(Arc::clone(store)))),
    );
    EdgeLayer.layer(routes)
}

/// A Tollgate server in the test's process and virtual time, over an
/// in-memory store on tokio's clock. Killing it makes every call fail as
/// calls to a dead server do; restarting it serves the same store again,
/// as `tollgate serve` restarted on the same file would.
struct Server {
    store: Arc<dyn Store>,
    /// What calls reach; `None` while the server is down.
    serving: Arc<Mutex<Option<Services>>>,
}

impl Server {
    fn start() -> Server {
        let store = EmbeddedStore::in_memory_with_clock(BucketSettings::default(), tokio_clock())
            .expect("an in-memory store");
        let server = Server {
            store: Arc::new(store),
            serving: Arc::default(),
        };
        server.restart();
        server
    }

    /// The server dies without a goodbye.
    fn kill(&self) {
        *self.serving.lock().expect("lock") = None;
    }

    /// A new server on the same store.
    fn restart(&self) {
        *self.serving.lock().expect("lock") = Some(services(&self.store));
    }

    /// A connection for a pod or an operator.
    fn connect(&self) -> Connection {
        Connection(Arc::clone(&self.serving))
    }

    fn admin(&self) -> AdminClient<Connection> {
        AdminClient::new(self.connect())
    }

    async fn stop(self) {
        self.kill();
        held_still(self.store.close()).await.expect("store closes");
    }
}

/// A connection to a [`Server`]: each call is served by the server's
/// services, held still in virtual time, or refused if the server is down.
#[derive(Clone)]
struct Connection(Arc<Mutex<Option<Services>>>);

impl Service<http::Request<Body>> for Connection {
    type Response = http::Response<Body>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Status>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let serving = self.0.lock().expect("lock").clone();
        Box::pin(async move {
            let Some(mut services) = serving else {
                // What tonic reports when nothing listens at the address.
                return Err(Status::unavailable("tcp connect error: connection refused"));
            };
            let answer = held_still(async move {
                std::future::poll_fn(|cx| {
                    Service::<http::Request<Body>>::poll_ready(&mut services, cx)
                })
                .await?;
                services.call(request).await
            })
            .await;
            answer.map_err(|never: Infallible| match never {})
        })
    }
}

async fn set_limits(server: &Server, tenant: &str, available: f64, refill: f64, burst: f64) {
    server
        .admin()
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: tenant.into(),
            bucket: String::new(),
            available_tokens: available,
            refill_rate: refill,
            burst_limit: burst,
            as_of: None,
            as_of_consumed_tokens: 0.0,
            update_mask: None,
        })
        .await
        .expect("limits set");
}

async fn stored_request_units(server: &Server, tenant: &str) -> f64 {
    server
        .admin()
        .get_tenant(v1::GetTenantRequest {
            tenant_id: tenant.into(),
            bucket: String::new(),
        })
        .await
        .expect("the tenant")
        .into_inner()
        .tenant
        .and_then(|tenant| tenant.consumption)
        .map_or(0.0, |consumption| consumption.request_units)
}

fn pods(server: &Server, tenant: &str, n: u32) -> Vec<Controller> {
    let tenant = TenantId::parse("tenant", tenant).expect("valid tenant");
    (1..=n)
        .map(|instance| {
            let options = Options {
                bucket: LocalBucketConfig {
                    initial_tokens: 100.0,
                    ..LocalBucketConfig::default()
                },
                ..Options::default()
            };
            let transport = GrpcTransport::with_service(server.connect(), tenant.clone());
            Controller::with_transport(transport, &tenant, instance, options)
                .expect("valid options")
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn three_pods_admit_refill_times_a_minute_plus_burst() {
    let server = Server::start();
    let (refill, burst) = (1000.0, 5000.0);
    set_limits(&server, "acme", burst, refill, burst).await;

    let pods = pods(&server, "acme", 3);
    let secs = 60.0;
    let start = Instant::now();
    let admitted = saturate(&pods, 4, start + Duration::from_secs_f64(secs)).await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs_f64(secs),
        "a virtual minute, to the microsecond"
    );
    let ideal = refill * secs + burst;
    let error = (admitted - ideal) / ideal;
    eprintln!(
        "3 pods, refill {refill}/s, burst {burst}, {secs} s: admitted {admitted}, ideal {ideal}, error {:+.2}%",
        error * 100.0
    );
    assert!(error.abs() <= 0.05, "error {:+.2}%", error * 100.0);

    let charged = shutdown(pods).await;
    assert_same_consumption(stored_request_units(&server, "acme").await, charged);
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn pods_keep_working_through_a_server_outage_and_resume() {
    let server = Server::start();
    let refill = 300.0;
    set_limits(&server, "outage", 0.0, refill, 1000.0).await;
    let pods = pods(&server, "outage", 3);

    let before = saturate(&pods, 2, Instant::now() + Duration::from_secs(8)).await;
    assert!(before > 0.0);

    server.kill();
    let outage = Duration::from_secs(10);
    let during = saturate(&pods, 2, Instant::now() + outage).await;
    assert!(
        pods.iter().all(|pod| pod.status().fallback_active),
        "every pod runs on its fallback rate"
    );
    // Each pod may use at least an even split of the refill rate on its own,
    // starting a second after its request went unanswered.
    let floor = 0.5 * refill * (outage.as_secs_f64() - 2.0);
    let ceiling = 2.0 * refill * outage.as_secs_f64() + 1000.0;
    eprintln!("outage of {outage:?} at refill {refill}/s: pods admitted {during} on their own");
    assert!(
        during >= floor,
        "admitted {during} in the outage, at least {floor} expected"
    );
    assert!(
        during <= ceiling,
        "admitted {during} in the outage, at most {ceiling} expected"
    );

    // Back on the same store: the pods reach it again and leave fallback.
    server.restart();
    let after = saturate(&pods, 2, Instant::now() + Duration::from_secs(8)).await;
    assert!(after > 0.0, "pods admit work after the server is back");
    assert!(
        pods.iter().all(|pod| !pod.status().fallback_active),
        "every pod is back on grants from the server"
    );

    let charged = shutdown(pods).await;
    assert_same_consumption(stored_request_units(&server, "outage").await, charged);
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_after_a_refusal_takes_no_time() {
    let server = Server::start();
    set_limits(&server, "acme", 1000.0, 100.0, 1000.0).await;
    let pod = pods(&server, "acme", 1).remove(0);
    let sms = pod.bucket("send-sms").expect("a valid name");
    let mut admitted = 0u32;
    let error = loop {
        match tokio::time::timeout(Duration::from_secs(30), sms.acquire(1.0)).await {
            Ok(Ok(())) => admitted += 1,
            Ok(Err(e)) => break e,
            Err(_) => panic!("no refusal in 30 s; {admitted} admitted"),
        }
    };
    assert!(
        matches!(&error, ClientError::Refused(r) if r.bucket.as_str() == "send-sms"),
        "{error}"
    );
    // The pods here start on 100 tokens: the refusal came before more.
    assert!(admitted <= 100, "admitted {admitted}");
    pod.acquire(10.0)
        .await
        .expect("the request-unit bucket works");

    // Nothing to report for the refused bucket: shutdown waits only for
    // the request-unit bucket's report, not its timeout (5 s).
    let started = Instant::now();
    let report = pod.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "shutdown took {:?}",
        started.elapsed()
    );
    let reported: Vec<(&str, bool, bool)> = report
        .buckets
        .iter()
        .map(|b| {
            (
                b.bucket.as_str(),
                b.consumption_reported,
                b.refusal.is_some(),
            )
        })
        .collect();
    assert_eq!(reported, [("", true, false), ("send-sms", false, true)]);
    server.stop().await;
}
