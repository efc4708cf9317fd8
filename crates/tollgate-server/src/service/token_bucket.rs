//! The pod-facing `TokenBucketService`.
//!
//! A request passes the gates every pod-facing call passes, in order: the
//! edge ([`edge::enter`]: a deadline already past is refused), the
//! caller's credential, validation of every field into the core's
//! `TokenBucketRequest` (bad input ends here, before any transaction), the
//! caller's right to the tenant, and admission (a permit, or UNAVAILABLE
//! with a retry hint). Only then does it reach `Store::token_bucket`; the
//! grant goes back as a `TokenBucketResponse`, a store error as the status
//! [`super::status`] maps it to.

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
