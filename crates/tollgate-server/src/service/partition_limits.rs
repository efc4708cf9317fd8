//! The pod-facing `PartitionLimits` service: pods report their hottest
//! partitions and learn their tenant's table limits and their shares of
//! them, one store transaction per exchange.

use std::sync::Arc;

use tollgate_proto::partition::PartitionLoadCall;
use tollgate_proto::v1::{self, partition_limits_server};
use tonic::{Request, Response, Status};

use super::{Admission, PodAuth, PodGate, status};
use crate::store::Store;

/// Serves pods' partition-load exchanges from the store, through the
/// [`PodGate`].
#[derive(Debug, Clone)]
pub struct PartitionLimitsService {
    gate: PodGate,
}

impl PartitionLimitsService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        PartitionLimitsService {
            gate: PodGate::new(store),
        }
    }

    /// Bounds pending exchanges with `admission` (shared with the server's
    /// other pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.gate = self.gate.with_admission(admission);
        self
    }

    /// Serves only callers whose credentials name the exchange's tenant.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.gate = self.gate.with_auth(auth);
        self
    }
}

#[tonic::async_trait]
impl partition_limits_server::PartitionLimits for PartitionLimitsService {
    async fn partition_load(
        &self,
        request: Request<v1::PartitionLoadRequest>,
    ) -> Result<Response<v1::PartitionLoadResponse>, Status> {
        let admitted = self
            .gate
            .enter("PartitionLoad", request, PartitionLoadCall::try_from)?;
        let call = admitted.call();
        let answer = admitted
            .store()
            .partition_load(&call.tenant, &call.exchange)
            .await
            .map_err(|e| status("partition load", e))?;
        Ok(Response::new(v1::PartitionLoadResponse::from(&answer)))
    }
}
