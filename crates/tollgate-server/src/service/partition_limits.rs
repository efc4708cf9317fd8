//! The pod-facing `PartitionLimits` service: pods report their hottest
//! partitions and learn their tenant's table limits and their shares of
//! them, one store transaction per exchange. A report is checked by
//! `PartitionLoadCall::try_from` (in `tollgate-proto`, fields named as the
//! request names them) and run by `Store::partition_load`, which applies
//! the core's `partition::exchange` to the tenant's reports row.

use tollgate_proto::partition::PartitionLoadCall;
use tollgate_proto::v1::{self, partition_limits_server};
use tonic::{Request, Response, Status};

use super::{PodGate, status};

/// Serves pods' partition-load exchanges from the store, through the
/// [`PodGate`].
#[derive(Debug, Clone)]
pub struct PartitionLimitsService {
    gate: PodGate,
}

impl PartitionLimitsService {
    /// Serves through `gate` (a store alone: any caller, no metrics, the
    /// default admission bounds).
    pub fn new(gate: impl Into<PodGate>) -> Self {
        PartitionLimitsService { gate: gate.into() }
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
