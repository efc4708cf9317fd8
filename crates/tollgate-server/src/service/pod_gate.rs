//! The one way a pod's call reaches the store.
//!
//! Every pod-facing RPC (`TokenBucket`, `KeyLimits/Check`, Envoy's
//! `ShouldRateLimit`, `PartitionLoad`) takes the same steps before its
//! store transaction, in this order:
//!
//! 1. [`edge::enter`]: the request was decoded (our handler's errors from
//!    here on are ours) and its deadline is known;
//! 2. the caller is authenticated ([`PodAuth::caller`]: a pod token or a
//!    client certificate, when the server has pod credentials);
//! 3. the message is validated into the call (INVALID_ARGUMENT naming the
//!    field, nothing changed);
//! 4. the caller is authorised for every tenant the call names
//!    ([`PodCall::tenants`]);
//! 5. the call takes a place among the pending requests ([`Admission`]),
//!    or is refused at once by an overloaded server.
//!
//! [`PodGate::enter`] is those steps, and the only way to an [`Admitted`]
//! call, which is the only way to the store: the services hold a
//! [`PodGate`], whose store is private to this module. An RPC that skips
//! authentication, authorisation or admission does not compile:
//!
//! ```compile_fail
//! # use tollgate_server::service::PodGate;
//! fn skips_the_gate(gate: &PodGate) {
//!     let _store = &gate.store; // private: only `enter` leads to the store
//! }
//! ```
//!
//! ```compile_fail
//! # use tollgate_core::key_bucket::CheckCall;
//! # use tollgate_server::service::{PodGate, admission::Permit, pod_gate::Admitted};
//! fn forges_an_admission(gate: &PodGate, call: CheckCall, permit: Permit) {
//!     let _admitted = Admitted { gate, call, _permit: permit }; // private fields
//! }
//! ```

use std::sync::Arc;

use tollgate_core::key_bucket::CheckCall;
use tollgate_core::{BucketKey, InvalidInput, TenantId, TokenBucketRequest};
use tollgate_proto::partition::PartitionLoadCall;
use tonic::{Request, Status};

use super::admission::Permit;
use super::{Admission, PodAuth, edge, invalid};
use crate::store::Store;
use crate::telemetry::Metrics;

/// What the gate needs to know of a validated call: the tenants it acts
/// for.
pub trait PodCall {
    fn tenants(&self) -> impl Iterator<Item = &TenantId>;
}

/// A token-bucket request: its bucket's tenant.
impl PodCall for (BucketKey, TokenBucketRequest) {
    fn tenants(&self) -> impl Iterator<Item = &TenantId> {
        std::iter::once(&self.0.tenant)
    }
}

/// A per-key check: the tenant of every item.
impl PodCall for CheckCall {
    fn tenants(&self) -> impl Iterator<Item = &TenantId> {
        self.items.iter().map(|item| &item.key.bucket.tenant)
    }
}

/// A partition-load exchange: its tenant.
impl PodCall for PartitionLoadCall {
    fn tenants(&self) -> impl Iterator<Item = &TenantId> {
        std::iter::once(&self.tenant)
    }
}

/// The store behind the pod-facing services, reachable only through
/// [`PodGate::enter`].
#[derive(Debug, Clone)]
pub struct PodGate {
    store: Arc<dyn Store>,
    metrics: Option<Arc<Metrics>>,
    admission: Admission,
    auth: PodAuth,
}

impl From<Arc<dyn Store>> for PodGate {
    fn from(store: Arc<dyn Store>) -> Self {
        PodGate::new(store)
    }
}

impl PodGate {
    /// Any caller, no metrics, the default admission bounds.
    pub fn new(store: Arc<dyn Store>) -> Self {
        PodGate {
            store,
            metrics: None,
            admission: Admission::default(),
            auth: PodAuth::default(),
        }
    }

    /// Counts the calls' answers in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Bounds pending calls with `admission` (shared by the server's
    /// pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Serves only callers whose credentials name every tenant a call acts
    /// for.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.auth = auth;
        self
    }

    /// Takes `request` through the steps of the module docs, validating
    /// its message with `parse`; `method` names the RPC in the logs of a
    /// refused caller.
    pub fn enter<T, C: PodCall>(
        &self,
        method: &'static str,
        request: Request<T>,
        parse: impl FnOnce(T) -> Result<C, InvalidInput>,
    ) -> Result<Admitted<'_, C>, Status> {
        edge::enter(&request)?;
        let caller = self.auth.caller(&request)?;
        let call = parse(request.into_inner()).map_err(invalid)?;
        self.auth.authorize(&caller, method, call.tenants())?;
        let permit = self.admission.admit()?;
        Ok(Admitted {
            gate: self,
            call,
            _permit: permit,
        })
    }
}

/// A call that passed the gate: its caller may act for its tenants, and it
/// holds its place among the pending requests until dropped.
#[derive(Debug)]
pub struct Admitted<'a, C> {
    gate: &'a PodGate,
    call: C,
    _permit: Permit,
}

impl<C> Admitted<'_, C> {
    /// The validated call.
    pub fn call(&self) -> &C {
        &self.call
    }

    /// The store, to run the call's transaction in.
    pub fn store(&self) -> &dyn Store {
        self.gate.store.as_ref()
    }

    /// Where the call's answer is counted, if anywhere.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.gate.metrics.as_deref()
    }
}
