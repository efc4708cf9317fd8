//! The pod-facing `TokenBucketService`.

use tollgate_proto::v1::{self, token_bucket_service_server};
use tonic::{Request, Response, Status};

use super::{PodGate, convert, status};

/// Serves pods' token-bucket requests from the store, through the
/// [`PodGate`].
#[derive(Debug, Clone)]
pub struct TokenBucketService {
    gate: PodGate,
}

impl TokenBucketService {
    /// Serves through `gate` (a store alone: any caller, no metrics, the
    /// default admission bounds).
    pub fn new(gate: impl Into<PodGate>) -> Self {
        TokenBucketService { gate: gate.into() }
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
