//! A real server and a real agent for the wire tests: `tollgate-server`
//! in-process on an embedded store file in a temp dir, on `127.0.0.1:0`;
//! the agent served by `tollgate_agent::run` on a Unix socket (and, when
//! asked, loopback TCP); callers with the generated tonic client over a
//! Unix-socket channel, or raw HTTP/1.1 on the socket.
#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::oneshot;
use tollgate_agent::tenants::TenantReport;
use tollgate_agent::{Agent, AgentOptions, Listeners, SetupError};
use tollgate_client::LocalBucketConfig;
use tollgate_proto::agent::v1::agent_client::AgentClient;
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
use tonic::transport::{Channel, Endpoint};

/// How long a test waits for what it expects before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A tollgate server on an embedded store file.
pub struct Server {
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tollgate_server::ServeError>>,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

/// A server stopped by [`Server::pause`]: its store file and address, to
/// serve again.
pub struct Paused {
    dir: tempfile::TempDir,
    address: std::net::SocketAddr,
}

impl Paused {
    /// Serves the same store file on the same address again.
    pub async fn resume(self) -> Server {
        Server::serve(self.dir, &self.address.to_string()).await
    }
}

impl Server {
    pub async fn start() -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        Server::serve(dir, "127.0.0.1:0").await
    }

    async fn serve(dir: tempfile::TempDir, address: &str) -> Server {
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::open(dir.path().join("tollgate.redb"), BucketSettings::default())
                .expect("store"),
        );
        let listener = TcpListener::bind(address).await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::run(listener, Arc::clone(&store), async {
            let _ = stopped.await;
        }));
        Server {
            url,
            stop: Some(stop),
            task,
            store,
            _dir: dir,
        }
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.url.clone())
            .await
            .expect("connect to Admin")
    }

    /// Sets `bucket` of `tenant` ("" for the request-unit bucket): holding
    /// `tokens` now, refilled at `rate` per second up to `burst`.
    pub async fn set_bucket(&self, tenant: &str, bucket: &str, tokens: f64, rate: f64, burst: f64) {
        self.admin()
            .await
            .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
                tenant_id: tenant.to_owned(),
                bucket: bucket.to_owned(),
                available_tokens: tokens,
                refill_rate: rate,
                burst_limit: burst,
                ..Default::default()
            })
            .await
            .expect("set the bucket's limits");
    }

    /// The request units the server counted for `bucket` of `tenant`.
    pub async fn consumed(&self, tenant: &str, bucket: &str) -> f64 {
        let tenant = self
            .admin()
            .await
            .get_tenant(v1::GetTenantRequest {
                tenant_id: tenant.to_owned(),
                bucket: bucket.to_owned(),
            })
            .await
            .expect("GetTenant")
            .into_inner()
            .tenant
            .expect("a tenant");
        tenant.consumption.map_or(0.0, |c| c.request_units)
    }

    /// Stops serving and closes the store, keeping its file for
    /// [`Paused::resume`].
    pub async fn pause(mut self) -> Paused {
        let address = self
            .url
            .trim_start_matches("http://")
            .parse()
            .expect("the server's address");
        self.shut().await;
        Paused {
            dir: self._dir,
            address,
        }
    }

    pub async fn stop(mut self) {
        self.shut().await;
    }

    async fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("server task")
            .expect("server ran");
        self.store.close().await.expect("close the store");
    }
}

/// The client options of the agents here: no initial allowance, so every
/// token a test sees came from the server.
pub fn options(server: &Server) -> AgentOptions {
    let mut options = AgentOptions::new(server.url.clone(), 7);
    options.client.bucket = LocalBucketConfig {
        initial_tokens: 0.0,
        ..LocalBucketConfig::default()
    };
    options
}

/// An agent served on a Unix socket in a temp dir (and on loopback TCP
/// with `tcp`).
pub struct AgentUnderTest {
    pub socket: PathBuf,
    pub tcp: Option<std::net::SocketAddr>,
    /// Envoy's rate limit service, when asked for.
    pub envoy: Option<std::net::SocketAddr>,
    pub agent: Agent,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<Vec<TenantReport>, SetupError>>,
    _bound: tollgate_agent::listen::BoundSocket,
    _dir: tempfile::TempDir,
}

impl AgentUnderTest {
    pub async fn start(options: AgentOptions) -> AgentUnderTest {
        AgentUnderTest::start_with(options, 0o660, false).await
    }

    pub async fn start_with(options: AgentOptions, mode: u32, tcp: bool) -> AgentUnderTest {
        AgentUnderTest::spawn(options, mode, tcp, false).await
    }

    /// An agent that also serves Envoy's rate limit service on TCP.
    pub async fn start_with_envoy(options: AgentOptions) -> AgentUnderTest {
        AgentUnderTest::spawn(options, 0o660, false, true).await
    }

    async fn spawn(options: AgentOptions, mode: u32, tcp: bool, envoy: bool) -> AgentUnderTest {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("run/agent.sock");
        let (listener, bound) =
            tollgate_agent::listen::bind_socket(&socket, mode).expect("bind the socket");
        let tcp_listener = if tcp {
            Some(TcpListener::bind("127.0.0.1:0").await.expect("bind TCP"))
        } else {
            None
        };
        let tcp = tcp_listener
            .as_ref()
            .map(|l| l.local_addr().expect("address"));
        let envoy_listener = if envoy {
            Some(
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind Envoy's"),
            )
        } else {
            None
        };
        let envoy = envoy_listener
            .as_ref()
            .map(|l| l.local_addr().expect("address"));
        let agent = Agent::new(options).expect("agent");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_agent::run(
            agent.clone(),
            Listeners {
                socket: Some(listener),
                tcp: tcp_listener,
                envoy: envoy_listener,
            },
            async {
                let _ = stopped.await;
            },
        ));
        AgentUnderTest {
            socket,
            tcp,
            envoy,
            agent,
            stop: Some(stop),
            task,
            _bound: bound,
            _dir: dir,
        }
    }

    /// A new connection to the agent's socket.
    pub async fn client(&self) -> AgentClient<Channel> {
        AgentClient::new(socket_channel(&self.socket).await)
    }

    /// A new connection to the agent's TCP port.
    pub async fn tcp_client(&self) -> AgentClient<Channel> {
        let address = self.tcp.expect("an agent on TCP");
        AgentClient::connect(format!("http://{address}"))
            .await
            .expect("connect over TCP")
    }

    /// An HTTP/1.1 call on the socket: the status and the body.
    pub async fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let stream = UnixStream::connect(&self.socket).await.expect("connect");
        http_call(stream, method, path, body, None).await
    }

    /// An HTTP/1.1 call on the TCP port, with `bearer` as its token.
    pub async fn tcp_http(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        bearer: Option<&str>,
    ) -> (u16, String) {
        let address = self.tcp.expect("an agent on TCP");
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        http_call(stream, method, path, body, bearer).await
    }

    /// Stops the agent (SIGTERM's path) and returns its tenants' reports.
    pub async fn stop(mut self) -> Vec<TenantReport> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("the agent stops")
            .expect("agent task")
            .expect("agent ran")
    }

    /// Starts the agent's shutdown without waiting for it.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub async fn finish_stop(mut self) -> Vec<TenantReport> {
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("the agent stops")
            .expect("agent task")
            .expect("agent ran")
    }
}

/// A gRPC channel over the Unix socket at `path`.
pub async fn socket_channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::try_from("http://agent.invalid")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .expect("connect to the agent's socket")
}

async fn http_call<S>(
    mut stream: S,
    method: &str,
    path: &str,
    body: Option<&str>,
    bearer: Option<&str>,
) -> (u16, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let body = body.unwrap_or("");
    let auth = bearer
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .expect("read the answer");
    let response = String::from_utf8(response).expect("UTF-8 answer");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}

/// Waits until `check` holds, polling; fails the test after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
