//! The pod-facing `TokenBucketService`.

use std::sync::Arc;

use tollgate_proto::v1::{self, token_bucket_service_server};
use tonic::{Request, Response, Status};

use super::{Admission, PodAuth, PodGate, convert, status};
use crate::store::Store;
use crate::telemetry::Metrics;

/// Serves pods' token-bucket requests from the store, through the
/// [`PodGate`].
#[derive(Debug, Clone)]
pub struct TokenBucketService {
    gate: PodGate,
}

impl TokenBucketService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        TokenBucketService {
            gate: PodGate::new(store),
        }
    }

    /// Counts every answer in `metrics`, by bucket and kind of grant.
    pub fn with_metrics(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        TokenBucketService {
            gate: PodGate::new(store).with_metrics(metrics),
        }
    }

    /// Bounds pending requests with `admission` (shared with the server's
    /// other pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.gate = self.gate.with_admission(admission);
        self
    }

    /// Serves only callers whose credentials name the request's tenant.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.gate = self.gate.with_auth(auth);
        self
    }
}

#[tonic::async_trait]
impl token_bucket_service_server::TokenBucketService for TokenBucketService {
    async fn token_bucket(
        &self,
        request: Request<v1::TokenBucketRequest>,
    ) -> Result<Response<v1::TokenBucketResponse>, Status> {
        let admitted = self
            .gate
            .enter("TokenBucket", request, convert::token_bucket_request)?;
        let (key, req) = admitted.call();
        let grant = admitted
            .store()
            .token_bucket(key, req)
            .await
            .map_err(|e| status("token bucket request", e))?;
        if let Some(metrics) = admitted.metrics() {
            metrics.observe_grant(key, &grant);
        }
        Ok(Response::new(convert::grant_to_proto(&grant)))
    }
}
