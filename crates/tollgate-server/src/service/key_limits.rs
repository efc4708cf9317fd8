//! The `KeyLimits` service: exact per-key checks, one store transaction
//! each (batched with others by the store).
//!
//! A call is validated by `CheckCall::try_from` (in `tollgate-proto`), run
//! by `Store::check`, counted in `tollgate_key_checks_total` and answered
//! item by item. [`KeyLimitsService::run`] is that sequence without the
//! wire, which Envoy's `ShouldRateLimit` shares, so every check rule and
//! metric is written once.

use tollgate_core::key_bucket::{CallAnswer, CheckCall};
use tollgate_proto::v1::{self, key_limits_server};
use tonic::{Request, Response, Status};

use super::pod_gate::Admitted;
use super::{PodGate, convert, status};
use crate::store::StoreError;

/// Serves checks of per-key buckets from the store, through the
/// [`PodGate`].
#[derive(Debug, Clone)]
pub struct KeyLimitsService {
    gate: PodGate,
}

impl KeyLimitsService {
    /// Serves through `gate` (a store alone: any caller, no metrics, the
    /// default admission bounds).
    pub fn new(gate: impl Into<PodGate>) -> Self {
        KeyLimitsService { gate: gate.into() }
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
