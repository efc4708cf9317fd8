//! What `GrpcTransport` puts on the wire for several buckets, seen by a
//! recording gRPC server on `127.0.0.1:0`: one connection, each request's
//! `bucket` field set to its bucket's name, a final report with shares 0
//! for each bucket.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tollgate_client::{Controller, LocalBucketConfig, Options, PodToken};
use tollgate_proto::v1;
use tollgate_proto::v1::token_bucket_service_server::{
    TokenBucketService, TokenBucketServiceServer,
};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Grants whatever is asked, at once, and keeps every request (and its
/// `authorization` header, if any).
#[derive(Clone, Default)]
struct Recorder {
    received: Arc<Mutex<Vec<v1::TokenBucketRequest>>>,
    authorization: Arc<Mutex<Vec<Option<String>>>>,
}

#[async_trait::async_trait]
impl TokenBucketService for Recorder {
    async fn token_bucket(
        &self,
        request: Request<v1::TokenBucketRequest>,
    ) -> Result<Response<v1::TokenBucketResponse>, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().expect("ascii").to_owned());
        self.authorization.lock().expect("lock").push(authorization);
        let request = request.into_inner();
        let granted_tokens = request.requested_tokens;
        let request_fallback = request.fallback_tokens;
        self.received.lock().expect("lock").push(request);
        Ok(Response::new(v1::TokenBucketResponse {
            granted_tokens,
            trickle_duration: None,
            max_burst_tokens: 0.0,
            fallback_rate: 1.0,
            fallback_charged_tokens: Some(request_fallback),
            initial_allowance: None,
        }))
    }
}

/// A recording server on `127.0.0.1:0`, and its URL.
async fn recording_server() -> (Recorder, String) {
    let recorder = Recorder::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TokenBucketServiceServer::new(recorder.clone()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    (recorder, url)
}

#[tokio::test]
async fn grpc_transport_sends_each_request_to_its_bucket() {
    let (recorder, url) = recording_server().await;
    let options = Options {
        bucket: LocalBucketConfig {
            initial_tokens: 100.0,
            ..LocalBucketConfig::default()
        },
        ..Options::default()
    };
    let controller = Controller::connect(&url, "acme", 7, options).expect("valid options");
    let emails = controller.bucket("schedule-email").expect("valid name");
    emails.acquire(5.0).await.expect("initial allowance");
    controller.acquire(3.0).await.expect("initial allowance");
    let report = controller.shutdown().await;
    assert!(report.consumption_reported, "{report:?}");

    let mut by_bucket: BTreeMap<String, Vec<v1::TokenBucketRequest>> = BTreeMap::new();
    for request in recorder.received.lock().expect("lock").drain(..) {
        assert_eq!(request.tenant_id, "acme");
        assert_eq!(request.instance_id, 7);
        by_bucket
            .entry(request.bucket.clone())
            .or_default()
            .push(request);
    }
    let names: Vec<&str> = by_bucket.keys().map(String::as_str).collect();
    assert_eq!(names, ["", "schedule-email"]);
    for (bucket, charged) in [("", 3.0), ("schedule-email", 5.0)] {
        let sent = &by_bucket[bucket];
        let last = sent.last().expect("a final report");
        assert_eq!(last.shares, 0.0, "{bucket:?}");
        let reported: f64 = sent
            .iter()
            .filter_map(|r| r.consumption_since_last_request.as_ref())
            .map(|c| c.request_units)
            .sum();
        assert!((reported - charged).abs() < 1e-6, "{bucket:?}: {reported}");
    }
}

#[tokio::test]
async fn every_request_carries_the_pod_token() {
    let (recorder, url) = recording_server().await;
    let options = Options {
        pod_token: Some(PodToken::new("acme-pods-0123456789abcdef").expect("valid")),
        ..Options::default()
    };
    let controller = Controller::connect(&url, "acme", 1, options).expect("valid options");
    controller.acquire(3.0).await.expect("initial allowance");
    let report = controller.shutdown().await;
    assert!(report.consumption_reported, "{report:?}");
    let sent = recorder.authorization.lock().expect("lock").clone();
    assert!(
        sent.len() >= 2,
        "a first request and a final report: {sent:?}"
    );
    for header in sent {
        assert_eq!(header.as_deref(), Some("Bearer acme-pods-0123456789abcdef"));
    }
    for bad in ["", "has space", "tab\there", "é-not-ascii"] {
        assert!(PodToken::new(bad).is_err(), "{bad:?}");
    }
}
