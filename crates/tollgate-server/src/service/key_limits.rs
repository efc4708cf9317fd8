//! The `KeyLimits` service: exact per-key checks, one store transaction
//! each (batched with others by the store).
//!
//! A call is validated by `CheckCall::try_from` (in `tollgate-proto`), run
//! by `Store::check`, counted in `tollgate_key_checks_total` and answered
//! item by item. [`KeyLimitsService::run`] is that sequence without the
//! wire, which Envoy's `ShouldRateLimit` shares, so every check rule and
//! metric is written once.

use std::sync::Arc;

use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_proto::v1::{self, key_limits_server};
use tonic::{Request, Response, Status};

use super::{Admission, PodAuth, convert, edge, invalid, status};
use crate::store::{Store, StoreError};
use crate::telemetry::Metrics;

/// Serves checks of per-key buckets from the store.
#[derive(Debug, Clone)]
pub struct KeyLimitsService {
    store: Arc<dyn Store>,
    metrics: Option<Arc<Metrics>>,
    admission: Admission,
    auth: PodAuth,
}

impl KeyLimitsService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        KeyLimitsService {
            store,
            metrics: None,
            admission: Admission::default(),
            auth: PodAuth::default(),
        }
    }

    /// Counts every check in `metrics`, by tenant, bucket and verdict.
    pub fn with_metrics(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        KeyLimitsService {
            store,
            metrics: Some(metrics),
            admission: Admission::default(),
            auth: PodAuth::default(),
        }
    }

    /// Bounds pending checks with `admission` (shared with the server's
    /// other pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Serves only callers whose credentials name every tenant a call's
    /// items belong to.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.auth = auth;
        self
    }

    /// Who made a call (the first step of every check, either API).
    pub(crate) fn caller<T>(
        &self,
        request: &Request<T>,
    ) -> Result<super::pod_auth::PodCaller, Status> {
        self.auth.caller(request)
    }

    /// Refuses `call` unless `caller` may act for all its tenants.
    pub(crate) fn authorize(
        &self,
        caller: &super::pod_auth::PodCaller,
        service: &'static str,
        call: &CheckCall,
    ) -> Result<(), Status> {
        self.auth.authorize(
            caller,
            service,
            call.items.iter().map(|i| &i.key.bucket.tenant),
        )
    }

    /// Runs a validated call: what the native and the Envoy API share.
    /// The error is the store's, so that each API names the fields in it
    /// its own way before mapping it to a status. Each API admits the call
    /// first ([`Self::admit`]).
    pub(crate) async fn run(&self, call: &CheckCall) -> Result<CallAnswer, StoreError> {
        let answer = self.store.check(call).await?;
        if let Some(metrics) = &self.metrics {
            metrics.observe_check(call, &answer);
        }
        Ok(answer)
    }

    /// A place among the pending requests, or the refusal of an
    /// overloaded server.
    pub(crate) fn admit(&self) -> Result<super::admission::Permit, Status> {
        self.admission.admit()
    }
}

#[tonic::async_trait]
impl key_limits_server::KeyLimits for KeyLimitsService {
    async fn check(
        &self,
        request: Request<v1::CheckRequest>,
    ) -> Result<Response<v1::CheckResponse>, Status> {
        edge::enter(&request)?;
        let caller = self.caller(&request)?;
        let call = CheckCall::try_from(request.into_inner()).map_err(invalid)?;
        self.authorize(&caller, "Check", &call)?;
        let _permit = self.admit()?;
        let answer = self.run(&call).await.map_err(|e| status("check", e))?;
        Ok(Response::new(convert::check_answer(&answer)))
    }
}
