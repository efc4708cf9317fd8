//! A real server on `127.0.0.1:0` over a store, with real gRPC clients.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_server::store::{BucketSettings, Store};
use tonic::transport::Channel;

use super::{Backend, Backing};

pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tollgate_server::ServeError>>,
    pub store: Arc<dyn Store>,
    /// Keeps the test's database (or directory) until the server is gone.
    backing: Option<Backing>,
}

impl TestServer {
    pub async fn start(store: Arc<dyn Store>) -> TestServer {
        let telemetry = tollgate_server::telemetry::Telemetry::new().expect("telemetry");
        TestServer::start_with(store, telemetry, tollgate_server::GrpcOptions::default()).await
    }

    /// A server over `store` with `options`, counting into `telemetry`.
    pub async fn start_with(
        store: Arc<dyn Store>,
        telemetry: tollgate_server::telemetry::Telemetry,
        options: tollgate_server::GrpcOptions,
    ) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (shutdown, signal) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::run_with_options(
            listener,
            Arc::clone(&store),
            telemetry,
            options,
            async {
                let _ = signal.await;
            },
        ));
        TestServer {
            addr,
            shutdown,
            task,
            store,
            backing: None,
        }
    }

    /// A server on a fresh store of `backend`.
    pub async fn new(backend: Backend, settings: BucketSettings) -> TestServer {
        let backing = Backing::new(backend).await;
        let mut server = TestServer::start(backing.open(settings).await).await;
        server.backing = Some(backing);
        server
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel().await)
    }

    pub async fn pods(&self) -> TokenBucketServiceClient<Channel> {
        TokenBucketServiceClient::new(self.channel().await)
    }

    /// Stops serving, waits for in-flight requests, and closes the store.
    pub async fn stop(self) {
        let store = Arc::clone(&self.store);
        let backing = self.stop_serving().await;
        store.close().await.expect("store closes");
        drop(backing);
    }

    /// Stops serving and waits for in-flight requests, leaving the store
    /// open (other servers of the test use it); answers the backing to
    /// keep.
    pub async fn stop_serving(self) -> Option<Backing> {
        let _ = self.shutdown.send(());
        self.task.await.expect("server task").expect("server ran");
        self.backing
    }
}

/// `GetTenant` for `tenant`'s request-unit bucket: the tenant, or the status.
pub async fn get_tenant(
    admin: &mut AdminClient<Channel>,
    tenant: &str,
) -> Result<tollgate_proto::v1::Tenant, tonic::Status> {
    let response = admin
        .get_tenant(tollgate_proto::v1::GetTenantRequest {
            tenant_id: tenant.into(),
            bucket: String::new(),
        })
        .await?;
    Ok(response.into_inner().tenant.expect("tenant in response"))
}
