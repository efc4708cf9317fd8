//! The pod-facing `PartitionLimits` service: pods report their hottest
//! partitions and learn their tenant's table limits and their shares of
//! them, one store transaction per exchange. A report is checked by
//! `PartitionLoadCall::try_from` (in `tollgate-proto`, fields named as the
//! request names them) and run by `Store::partition_load`, which applies
//! the core's `partition::exchange` to the tenant's reports row.

use std::sync::Arc;

use tollgate_proto::partition::PartitionLoadCall;
use tollgate_proto::v1::{self, partition_limits_server};
use tonic::{Request, Response, Status};

use super::{Admission, PodAuth, edge, invalid, status};
use crate::store::Store;

/// Serves pods' partition-load exchanges from the store.
#[derive(Debug, Clone)]
pub struct PartitionLimitsService {
    store: Arc<dyn Store>,
    admission: Admission,
    auth: PodAuth,
}

impl PartitionLimitsService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        PartitionLimitsService {
            store,
            admission: Admission::default(),
            auth: PodAuth::default(),
        }
    }

    /// Bounds pending exchanges with `admission` (shared with the server's
    /// other pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Serves only callers whose credentials name the exchange's tenant.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.auth = auth;
        self
    }
}

#[tonic::async_trait]
impl partition_limits_server::PartitionLimits for PartitionLimitsService {
    async fn partition_load(
        &self,
        request: Request<v1::PartitionLoadRequest>,
    ) -> Result<Response<v1::PartitionLoadResponse>, Status> {
        edge::enter(&request)?;
        let caller = self.auth.caller(&request)?;
        let call = PartitionLoadCall::try_from(request.into_inner()).map_err(invalid)?;
        self.auth
            .authorize(&caller, "PartitionLoad", [&call.tenant])?;
        let _permit = self.admission.admit()?;
        let answer = self
            .store
            .partition_load(&call.tenant, &call.exchange)
            .await
            .map_err(|e| status("partition load", e))?;
        Ok(Response::new(v1::PartitionLoadResponse::from(&answer)))
    }
}
