//! The `KeyLimits` service: exact per-key checks, one store transaction
//! each (batched with others by the store).

use std::sync::Arc;

use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_proto::v1::{self, key_limits_server};
use tonic::{Request, Response, Status};

use super::pod_gate::Admitted;
use super::{Admission, PodAuth, PodGate, convert, status};
use crate::store::{Store, StoreError};
use crate::telemetry::Metrics;

/// Serves checks of per-key buckets from the store, through the
/// [`PodGate`].
#[derive(Debug, Clone)]
pub struct KeyLimitsService {
    gate: PodGate,
}

impl KeyLimitsService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        KeyLimitsService {
            gate: PodGate::new(store),
        }
    }

    /// Counts every check in `metrics`, by tenant, bucket and verdict.
    pub fn with_metrics(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        KeyLimitsService {
            gate: PodGate::new(store).with_metrics(metrics),
        }
    }

    /// Bounds pending checks with `admission` (shared with the server's
    /// other pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.gate = self.gate.with_admission(admission);
        self
    }

    /// Serves only callers whose credentials name every tenant a call's
    /// items belong to.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.gate = self.gate.with_auth(auth);
        self
    }

    /// The gate both APIs of checks enter by (this one and Envoy's).
    pub(crate) fn gate(&self) -> &PodGate {
        &self.gate
    }
}

/// Runs an admitted check: what the native and the Envoy API share. The
/// error is the store's, so that each API names the fields in it its own
/// way before mapping it to a status.
pub(crate) async fn run(admitted: &Admitted<'_, CheckCall>) -> Result<CallAnswer, StoreError> {
    let call = admitted.call();
    let answer = admitted.store().check(call).await?;
    if let Some(metrics) = admitted.metrics() {
        metrics.observe_check(call, &answer);
    }
    Ok(answer)
}

#[tonic::async_trait]
impl key_limits_server::KeyLimits for KeyLimitsService {
    async fn check(
        &self,
        request: Request<v1::CheckRequest>,
    ) -> Result<Response<v1::CheckResponse>, Status> {
        let admitted = self.gate.enter("Check", request, CheckCall::try_from)?;
        let answer = run(&admitted).await.map_err(|e| status("check", e))?;
        Ok(Response::new(convert::check_answer(&answer)))
    }
}
