//! Reaching a running server: the `--server` option the client commands
//! share, the `--actor` that changes carry, and how gRPC errors read on a
//! terminal.
//!
//! [`ServerArg`] is `--server` and the TLS options (`TOLLGATE_SERVER`, …),
//! under their own `Connection` heading in `--help`; a connection failure
//! is said once, with a hint. `AdminServerArg` adds the `Admin` service's
//! `--token`, for the `tenant` and `tier` commands only. [`ActorArg`] is
//! `--actor` (`TOLLGATE_ACTOR`, else `USER`), sent as `x-tollgate-actor`
//! by the commands that change something. A status that shows the other
//! end is not a Tollgate gRPC port comes with a hint saying so.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tollgate_client::{ClientTls, PodToken};
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::{ACTOR_METADATA, MAX_ACTOR_LEN};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A connection to the `Admin` service that sends the bearer token.
pub type AdminConnection = AdminClient<InterceptedService<Channel, BearerToken>>;

/// Where the server is and how to reach it, for every command that talks
/// to one: shown apart from each command's own options in `--help`.
#[derive(Debug, Args)]
#[command(next_help_heading = "Connection")]
pub struct ServerArg {
    /// The server's gRPC endpoint (`https://…` for TLS).
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,

    #[command(flatten)]
    tls: ClientTlsArgs,
}

/// The server, for commands of its `Admin` service: with the bearer token
/// it requires, if it does.
#[derive(Debug, Args)]
pub struct AdminServerArg {
    #[command(flatten)]
    server: ServerArg,

    /// The bearer token the server's `Admin` service requires, if it does
    /// (`--admin-tokens-file` on the server).
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        help_heading = "Connection"
    )]
    token: Option<String>,
}

/// Adds the `Admin` bearer token to every call.
#[derive(Clone, Debug)]
pub struct BearerToken(Option<AsciiMetadataValue>);

impl BearerToken {
    /// Sends `token` (from `--token`), if given.
    pub fn new(token: Option<&str>) -> anyhow::Result<BearerToken> {
        token
            .map(|token| {
                format!("Bearer {token}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| anyhow::anyhow!("--token: must be printable ASCII"))
            })
            .transpose()
            .map(BearerToken)
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

impl AdminServerArg {
    /// The interceptor that sends `--token`, if given.
    pub fn bearer(&self) -> anyhow::Result<BearerToken> {
        BearerToken::new(self.token.as_deref())
    }

    /// A client of the server's `Admin` service, sending `--token`.
    pub async fn admin(&self) -> anyhow::Result<AdminConnection> {
        Ok(AdminClient::with_interceptor(
            self.server.connect().await?,
            self.bearer()?,
        ))
    }
}

impl ServerArg {
    pub async fn connect(&self) -> anyhow::Result<Channel> {
        let tls = self.tls.load()?;
        tollgate_client::endpoint(&self.server, Duration::from_secs(5), tls.as_ref())
            .with_context(|| format!("--server {:?}", self.server))?
            .connect()
            .await
            .map_err(|e| unreachable_server(&self.server, &e))
    }
}

/// What to check when no Tollgate server answers at `--server`.
const NOT_RUNNING_HINT: &str = "(is `tollgate serve` running and listening there? Set the address with --server or TOLLGATE_SERVER.)";

/// A failed connection, said once (tonic's transport error repeats its
/// cause in its own message) and with what to check.
fn unreachable_server(server: &str, error: &tonic::transport::Error) -> anyhow::Error {
    let mut causes = Vec::<String>::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        let said = e.to_string();
        // A message that repeats an earlier one (or is the start of one)
        // adds nothing.
        if !causes.iter().any(|c| c.contains(&said)) {
            causes.retain(|c| !said.contains(c.as_str()));
            causes.push(said);
        }
        next = e.source();
    }
    anyhow::anyhow!(
        "cannot connect to {server}: {}\n{NOT_RUNNING_HINT}",
        causes.join(": ")
    )
}

/// The token a pod-facing command sends, for servers that bind pods to
/// tenants (`--pod-tokens-file`).
#[derive(Debug, Args)]
pub struct PodTokenArg {
    /// The pod token to send, for servers that bind pods to tenants
    /// (`--pod-tokens-file` on the server) [default: none].
    #[arg(
        long,
        env = "TOLLGATE_POD_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pod_token: Option<String>,
}

impl PodTokenArg {
    pub fn token(&self) -> anyhow::Result<Option<PodToken>> {
        self.pod_token
            .as_deref()
            .map(|t| PodToken::new(t).map_err(|e| anyhow::anyhow!("--pod-token: {}", e.reason)))
            .transpose()
    }
}

/// TLS to the server, for `https://` endpoints.
#[derive(Debug, Args)]
pub struct ClientTlsArgs {
    /// Certificate authorities (PEM) to trust for an https:// server
    /// [default: the system's].
    #[arg(long, global = true, env = "TOLLGATE_CA_FILE", value_name = "FILE")]
    ca_file: Option<PathBuf>,

    /// A client certificate (PEM), for servers that require mutual TLS
    /// (with --client-key).
    #[arg(long, global = true, env = "TOLLGATE_CLIENT_CERT", value_name = "FILE")]
    client_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "TOLLGATE_CLIENT_KEY", value_name = "FILE")]
    client_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// The files read, or `None` when no TLS option is given.
    pub fn load(&self) -> anyhow::Result<Option<ClientTls>> {
        let read = |path: &PathBuf, option: &str| {
            std::fs::read(path).with_context(|| format!("--{option}: read {}", path.display()))
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((read(cert, "client-cert")?, read(key, "client-key")?)),
            (None, None) => None,
            _ => anyhow::bail!("--client-cert and --client-key go together"),
        };
        let ca_pem = self
            .ca_file
            .as_ref()
            .map(|f| read(f, "ca-file"))
            .transpose()?;
        if ca_pem.is_none() && identity.is_none() {
            return Ok(None);
        }
        Ok(Some(ClientTls { ca_pem, identity }))
    }
}

/// Who makes a change, sent with it as `x-tollgate-actor` metadata for the
/// server's log. The server authenticates nothing; the name only says who
/// an operator claims to be.
#[derive(Debug, Args)]
pub struct ActorArg {
    /// Who makes the change, for the server's log: printable ASCII, at most
    /// 128 characters [default: $USER]
    #[arg(long, env = "TOLLGATE_ACTOR", value_name = "NAME")]
    actor: Option<String>,
}

impl ActorArg {
    /// `--actor` (or `TOLLGATE_ACTOR`), else `USER`, else nobody.
    fn name(&self) -> Option<String> {
        self.actor
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .filter(|name| !name.is_empty())
    }

    /// `message` as a request carrying the actor. A name the server will
    /// not log is sent all the same (the server notes that it ignored it),
    /// unless it cannot travel as metadata at all; either way a warning
    /// says so and the change goes ahead.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let Some(name) = self.name() else {
            return request;
        };
        let printable = name.bytes().all(|b| (b' '..=b'~').contains(&b));
        if !printable || name.len() > MAX_ACTOR_LEN {
            eprintln!(
                "warning: actor {name:?} is not printable ASCII of at most {MAX_ACTOR_LEN} \
                 characters; the server will leave it out of its log"
            );
        }
        match AsciiMetadataValue::try_from(name.as_bytes()) {
            Ok(value) => {
                request.metadata_mut().insert(ACTOR_METADATA, value);
            }
            Err(_) => eprintln!("warning: actor {name:?} cannot be sent as gRPC metadata"),
        }
        request
    }
}

/// Turns a gRPC status into an error that reads well on a terminal, with
/// a hint where the status says the other end is not a Tollgate server.
pub fn rpc_error(status: tonic::Status) -> anyhow::Error {
    let hint = match status.code() {
        // What an HTTP server that is not gRPC (the metrics port, a proxy)
        // answers, as tonic maps it.
        tonic::Code::Unimplemented | tonic::Code::Unknown | tonic::Code::Internal
            if status.message().contains("grpc-status header missing") =>
        {
            "\n(the server answered HTTP but not gRPC: is --server the gRPC port (default 50051) rather than the metrics port (default 9464)?)".to_owned()
        }
        tonic::Code::Unavailable => format!("\n{NOT_RUNNING_HINT}"),
        _ => String::new(),
    };
    anyhow::anyhow!("{:?}: {}{hint}", status.code(), status.message())
}
