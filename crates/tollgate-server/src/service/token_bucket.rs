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

use std::sync::Arc;

use tollgate_proto::v1::{self, token_bucket_service_server};
use tonic::{Request, Response, Status};

use super::{Admission, PodAuth, convert, edge, invalid, status};
use crate::store::Store;
use crate::telemetry::Metrics;

/// Serves pods' token-bucket requests from the store.
#[derive(Debug, Clone)]
pub struct TokenBucketService {
    store: Arc<dyn Store>,
    metrics: Option<Arc<Metrics>>,
    admission: Admission,
    auth: PodAuth,
}

impl TokenBucketService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        TokenBucketService {
            store,
            metrics: None,
            admission: Admission::default(),
            auth: PodAuth::default(),
        }
    }

    /// Counts every answer in `metrics`, by bucket and kind of grant.
    pub fn with_metrics(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        TokenBucketService {
            store,
            metrics: Some(metrics),
            admission: Admission::default(),
            auth: PodAuth::default(),
        }
    }

    /// Bounds pending requests with `admission` (shared with the server's
    /// other pod-facing services).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Serves only callers whose credentials name the request's tenant.
    pub fn with_auth(mut self, auth: PodAuth) -> Self {
        self.auth = auth;
        self
    }
}

#[tonic::async_trait]
impl token_bucket_service_server::TokenBucketService for TokenBucketService {
    async fn token_bucket(
        &self,
        request: Request<v1::TokenBucketRequest>,
    ) -> Result<Response<v1::TokenBucketResponse>, Status> {
        edge::enter(&request)?;
        let caller = self.auth.caller(&request)?;
        let (key, req) = convert::token_bucket_request(request.into_inner()).map_err(invalid)?;
        self.auth.authorize(&caller, "TokenBucket", [&key.tenant])?;
        let _permit = self.admission.admit()?;
        let grant = self
            .store
            .token_bucket(&key, &req)
            .await
            .map_err(|e| status("token bucket request", e))?;
        if let Some(metrics) = &self.metrics {
            metrics.observe_grant(&key, &grant);
        }
        Ok(Response::new(convert::grant_to_proto(&grant)))
    }
}
