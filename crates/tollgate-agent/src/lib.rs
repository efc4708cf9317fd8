//! `tollgate agent`: a tenant's local buckets, held beside the pods that
//! use them, for pods written in any language.
//!
//! A Rust pod embeds `tollgate-client`; a pod in any other language talks
//! to an agent over a Unix socket (or loopback TCP), with the small API of
//! `proto/tollgate/agent/v1/agent.proto`, and the agent drives
//! `tollgate-client` for it. The algorithms stay in `tollgate-core`: the
//! agent adds listeners, access rules and a journal, nothing else.
//!
//! - [`Agent`]: the state every call shares: one controller per tenant
//!   ([`tenants`]), the answers kept for request ids ([`answers`]), the
//!   access rules ([`access`]) and the metrics ([`metrics`]).
//! - [`calls`]: Acquire, TryAcquire, Charge, Report and Return, settled in
//!   one function ([`Agent::settle`]) whichever way they came.
//! - [`wire`]: the proto's messages into validated calls, and answers
//!   back; [`grpc`] and [`http`] (JSON) are two faces of it.
//! - [`passthrough`]: CheckKeys and Envoy's per-key descriptors, passed
//!   to the server as they are.
//! - [`envoy`]: Envoy's rate limit service, shared buckets answered from
//!   the local buckets.
//! - [`serve`]: the listeners (gRPC and HTTP on each), health, and the
//!   graceful shutdown that reports every bucket's consumption.
//! - [`listen`]: the Unix socket (stale files, mode), the loopback rule and
//!   the state directory's lock.
//! - [`instance`]: the instance id, derived from the node's name.
//! - [`journal`]: answered calls and sent requests on disk, so that a
//!   killed agent loses nothing and counts nothing twice.

pub mod access;
pub mod answers;
pub mod calls;
pub mod envoy;
pub mod error;
pub mod grpc;
pub mod http;
pub mod instance;
pub mod journal;
pub mod listen;
pub mod metrics;
pub mod passthrough;
pub mod serve;
pub mod tenants;
pub mod wire;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::watch;
use tollgate_client::{ClientError, Options, PodToken};
use tollgate_core::{CostModel, InstanceId};

pub use access::{AccessRules, Caller, Listener};
pub use error::AgentError;
pub use serve::{Listeners, run};

use crate::answers::{Answers, Remembered};
use crate::journal::Journal;
use crate::metrics::AgentMetrics;
use crate::passthrough::Passthrough;
use crate::tenants::Tenants;

/// How long an Acquire waits at most when the caller does not say.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

/// How an agent is set up.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The server: one gRPC URL, or several replicas separated by commas.
    pub servers: String,
    /// The agent's instance id, for every tenant.
    pub instance_id: InstanceId,
    /// An Acquire's longest wait when it does not say (`--max-wait`).
    pub max_wait: Duration,
    /// Who may use which tenant.
    pub access: AccessRules,
    /// The pod token the agent presents to the server, if it binds pods to
    /// tenants.
    pub pod_token: Option<PodToken>,
    /// Every controller's options (their local buckets, cost model,
    /// timeouts); the registry and the pod token are the agent's.
    pub client: Options,
    /// The crash journal, opened in the state directory, with what it
    /// found. Without one, a killed agent loses what it had admitted and
    /// not yet reported, and forgets the answers to request ids.
    pub journal: Option<journal::Opened>,
}

impl AgentOptions {
    /// The defaults, against `servers` as instance `instance_id`.
    pub fn new(servers: impl Into<String>, instance_id: InstanceId) -> AgentOptions {
        AgentOptions {
            servers: servers.into(),
            instance_id,
            max_wait: DEFAULT_MAX_WAIT,
            access: AccessRules::socket_only(),
            pod_token: None,
            client: Options::default(),
            journal: None,
        }
    }
}

/// Why an agent could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("--server: {0}")]
    Server(#[source] ClientError),
    #[error("register the agent's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("set up gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// The agent: what every call, on every listener, shares. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Agent {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    tenants: Tenants,
    answers: Mutex<Answers>,
    journal: Option<Arc<Journal>>,
    access: AccessRules,
    registry: Registry,
    metrics: AgentMetrics,
    passthrough: Passthrough,
    max_wait: Duration,
    /// Every controller's cost model.
    cost_model: CostModel,
    /// True once shutdown has begun: waiting acquires and new calls are
    /// answered UNAVAILABLE.
    closing: watch::Sender<bool>,
}

impl Agent {
    /// An agent as `options` say. Checks the server URLs; connects to
    /// nothing yet (each tenant's controller connects on first use).
    pub fn new(options: AgentOptions) -> Result<Agent, SetupError> {
        let AgentOptions {
            servers,
            instance_id,
            max_wait,
            access,
            pod_token,
            client,
            journal,
        } = options;
        let urls = tollgate_client::endpoint_list(&servers).map_err(SetupError::Server)?;
        for url in &urls {
            tollgate_client::endpoint(url, client.connect_timeout, client.tls.as_ref())
                .map_err(SetupError::Server)?;
        }
        let registry = Registry::new();
        let metrics = AgentMetrics::register(&registry)?;
        let passthrough =
            Passthrough::new(&urls, &client, pod_token.clone()).map_err(SetupError::Server)?;
        let cost_model = client.cost_model;
        let client = Options {
            registry: Some(registry.clone()),
            pod_token,
            ..client
        };
        let (closing, _) = watch::channel(false);
        let mut answers = Answers::new();
        let journal = journal.map(|opened| {
            restore_answers(&mut answers, opened.remembered);
            opened.journal
        });
        Ok(Agent {
            shared: Arc::new(Shared {
                tenants: Tenants::new(
                    servers,
                    instance_id,
                    client,
                    metrics.clone(),
                    journal.clone(),
                ),
                answers: Mutex::new(answers),
                journal,
                access,
                registry,
                metrics,
                passthrough,
                max_wait,
                cost_model,
                closing,
            }),
        })
    }

    pub fn instance_id(&self) -> InstanceId {
        self.shared.tenants.instance_id()
    }

    /// The registry of `/metrics`: the agent's and the buckets' metrics.
    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    /// Starts shutting down: waiting acquires and every new call are
    /// answered UNAVAILABLE ("agent shutting down").
    pub fn begin_shutdown(&self) {
        self.shared.closing.send_replace(true);
    }

    pub fn is_closing(&self) -> bool {
        *self.shared.closing.borrow()
    }

    pub(crate) fn closing_signal(&self) -> watch::Receiver<bool> {
        self.shared.closing.subscribe()
    }

    pub(crate) fn tenants(&self) -> &Tenants {
        &self.shared.tenants
    }

    pub(crate) fn answers(&self) -> MutexGuard<'_, Answers> {
        // Every change of the answers is whole before the lock is let go.
        self.shared
            .answers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.shared.journal.as_deref()
    }

    /// Settles what earlier incarnations of this agent owed the server
    /// (see [`journal`]): returns once every orphan is settled, at once
    /// without a journal or orphans. Each bucket's new requests wait for
    /// its own orphans meanwhile.
    pub async fn settle_orphans(&self) {
        let Some(journal) = self.shared.journal.clone() else {
            return;
        };
        let tenants = self.tenants();
        journal
            .settle(|tenant| tenants.server_transport(tenant))
            .await;
    }

    pub(crate) fn access(&self) -> &AccessRules {
        &self.shared.access
    }

    pub(crate) fn metrics(&self) -> &AgentMetrics {
        &self.shared.metrics
    }

    pub(crate) fn passthrough(&self) -> &Passthrough {
        &self.shared.passthrough
    }

    pub(crate) fn max_wait(&self) -> Duration {
        self.shared.max_wait
    }

    pub(crate) fn cost_model(&self) -> &CostModel {
        &self.shared.cost_model
    }
}

/// Loads the answers the journal kept into `answers`. One the agent can
/// no longer read (written by another version) is left out, loudly: its
/// retry would be taken as a new call.
fn restore_answers(answers: &mut Answers, remembered: Vec<journal::Remembered>) {
    let mut unreadable = 0usize;
    for kept in remembered {
        match serde_json::from_value::<Remembered>(kept.payload) {
            Ok(answer) => answers.restore(answer),
            Err(_) => unreadable += 1,
        }
    }
    if unreadable > 0 {
        tracing::error!(
            unreadable,
            "journal: answers to request ids this agent cannot read were left out; their retries count as new calls"
        );
    }
}
