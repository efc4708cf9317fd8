//! How a controller reaches its tenant's global bucket.
//!
//! [`GrpcTransport`] speaks the wire contract to a `tollgate serve`, over a
//! tonic channel or over any other gRPC service: the server's own services
//! in-process, so that tests can run the real client against the real
//! server in tokio's paused time, with no socket in between. The
//! [`Transport`] trait exists so that tests can put a deterministic bucket
//! behind the same controller, and so that users can route requests their
//! own way (through a sidecar, a proxy, another RPC stack).
//!
//! [`FailoverTransport`] spreads a tenant's pods over several replicas of
//! the server (stateless, on one database) and moves a pod to the next
//! replica when a call fails. The pod's retry carries the same request,
//! sequence number included, so whichever replica receives it, the
//! database answers a request it already applied with the stored grant and
//! counts nothing twice. `Controller::connect` builds it from endpoints
//! separated by commas ([`endpoint_list`]), each pod starting on the one at
//! `instance % count`.
//!
//! A transport may leave `partition_load` out: its pods then never learn
//! partition limits. An answer with impossible values is refused, not
//! believed. [`endpoint`] and [`ClientTls`] are the one way the client, the
//! CLI and the load generator build a connection (TLS with a CA and a
//! client certificate for `https://` URLs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tollgate_core::partition::ExchangeAnswer;
use tollgate_core::{BucketName, Grant, InvalidInput, TenantId, TokenBucketRequest};
use tollgate_proto::partition::PartitionLoadCall;
use tollgate_proto::v1;
use tollgate_proto::v1::partition_limits_client::PartitionLimitsClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tonic::client::GrpcService;
use tonic::codegen::{Body, Bytes, StdError};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{ClientError, TransportError};

/// Sends one token-bucket request and returns the server's grant.
///
/// One transport serves every bucket of a controller, so each request names
/// the tenant's bucket it is for ([`BucketName::REQUEST_UNITS`] for the
/// request-unit bucket): a transport must keep the buckets apart, as the
/// server keeps one global bucket, and one lease and sequence per instance,
/// per bucket.
///
/// It also carries the pod's partition-load exchanges (hot-partition
/// limits); a transport that does not leaves the pod applying each limit
/// on its own, once it knows them, and never learning them otherwise.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError>;

    /// Sends a pod's report of its hottest partitions and returns the
    /// tenant's limits (if changed) and the pod's shares.
    async fn partition_load(
        &self,
        _call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        Err(TransportError::new(
            "this transport does not carry partition-load exchanges",
        ))
    }
}

/// A shared transport is a transport: what [`crate::controller::connect_transport`]
/// returns can be wrapped, or handed to [`crate::Controller::with_transport`]
/// as it is.
#[async_trait]
impl Transport for std::sync::Arc<dyn Transport> {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        (**self).token_bucket(bucket, request).await
    }

    async fn partition_load(
        &self,
        call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        (**self).partition_load(call).await
    }
}

/// A pod token (from the server's `--pod-tokens-file`), sent with every
/// pod-facing call as `authorization: Bearer <token>`. Servers that bind
/// pods to tenants refuse calls without one (UNAUTHENTICATED) and calls
/// for a tenant the token does not name (PERMISSION_DENIED).
#[derive(Clone, PartialEq, Eq)]
pub struct PodToken(tonic::metadata::AsciiMetadataValue);

impl PodToken {
    /// `token`, which must be printable ASCII and not empty.
    pub fn new(token: &str) -> Result<PodToken, InvalidInput> {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidInput::new(
                "pod_token",
                "must be printable ASCII without spaces, and not empty",
            ));
        }
        format!("Bearer {token}")
            .parse()
            .map(PodToken)
            .map_err(|_| InvalidInput::new("pod_token", "must be printable ASCII"))
    }

    /// Adds the token to `call`.
    pub fn attach<M>(&self, call: &mut tonic::Request<M>) {
        call.metadata_mut().insert("authorization", self.0.clone());
    }
}

impl std::fmt::Debug for PodToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodToken(…)")
    }
}

/// TLS to the server, for `https://` endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// Certificate authorities (PEM) to trust; the system's roots if `None`.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate and its key (PEM), for servers that require
    /// mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// How often an idle connection to the server is pinged, and how long the
/// answer may take before the connection is given up.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint for `url` (`http://host:port`, or `https://host:port` for
/// TLS, verified against `tls`'s CA or the system's roots). TLS settings
/// with an `http://` URL are an error rather than silently unused.
pub fn endpoint(
    url: &str,
    connect_timeout: Duration,
    tls: Option<&ClientTls>,
) -> Result<Endpoint, ClientError> {
    let endpoint_err = |reason: String| ClientError::Endpoint {
        endpoint: url.to_string(),
        reason,
    };
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| endpoint_err(e.to_string()))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        // A request given up on (its deadline passed) resets its stream.
        // HTTP/2 libraries count such resets over a connection's whole
        // life and drop the connection past a limit (1024), which under a
        // slow server would fail every request in flight on it; the server
        // is trusted, so no limit.
        .http2_max_local_error_reset_streams(None)
        // A server that vanished without closing the connection (its host
        // died) is noticed within the timeout, not at the next request's.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    let https = url.starts_with("https://");
    match (https, tls) {
        (false, Some(tls)) if *tls != ClientTls::default() => {
            return Err(endpoint_err(
                "TLS settings (a CA or a client certificate) need an https:// URL".into(),
            ));
        }
        (false, _) => {}
        (true, tls) => {
            let tls = tls.cloned().unwrap_or_default();
            let mut config = ClientTlsConfig::new();
            config = match &tls.ca_pem {
                Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
                None => config.with_native_roots(),
            };
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| endpoint_err(format!("TLS: {e}")))?;
        }
    }
    Ok(endpoint)
}

/// The gRPC transport to a Tollgate server: one channel, shared by every
/// bucket of the controller (the bucket travels in each request).
///
/// `S` is the gRPC service calls go to: a tonic [`Channel`] to a server
/// ([`GrpcTransport::new`]), or any other ([`GrpcTransport::with_service`]).
#[derive(Clone, Debug)]
pub struct GrpcTransport<S = Channel> {
    client: TokenBucketServiceClient<S>,
    partitions: PartitionLimitsClient<S>,
    tenant: TenantId,
    /// Sent with every call as its `grpc-timeout`, so that the server drops
    /// a call its caller has given up on instead of doing it for nobody.
    deadline: Option<Duration>,
    /// Sent with every call, for servers that bind pods to tenants.
    token: Option<PodToken>,
}

impl GrpcTransport {
    /// A transport to `endpoint` (`http://host:port`) for `tenant`. It
    /// connects lazily and reconnects as needed: creating it never waits
    /// for the server.
    pub fn new(
        endpoint: &str,
        tenant: TenantId,
        connect_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Self, ClientError> {
        let channel = self::endpoint(endpoint, connect_timeout, tls)?.connect_lazy();
        Ok(GrpcTransport::with_service(channel, tenant))
    }
}

impl<S> GrpcTransport<S>
where
    S: GrpcService<tonic::body::Body> + Clone,
    S::Error: Into<StdError>,
    S::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    /// A transport for `tenant` that sends its calls to `service`: a
    /// channel built some other way, or a server's services in the same
    /// process (each call then runs the server's handler on the caller's
    /// task, encoded and decoded as on the wire).
    pub fn with_service(service: S, tenant: TenantId) -> Self {
        GrpcTransport {
            client: TokenBucketServiceClient::new(service.clone()),
            partitions: PartitionLimitsClient::new(service),
            tenant,
            deadline: None,
            token: None,
        }
    }

    /// Sends every call with `deadline` as its `grpc-timeout`: the server
    /// answers DEADLINE_EXCEEDED, without applying it, a call it could not
    /// take up in time.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sends `token` with every call.
    pub fn with_token(mut self, token: Option<PodToken>) -> Self {
        self.token = token;
        self
    }

    /// `message` as a call, with the deadline and the token if there are.
    fn call<M>(&self, message: M) -> tonic::Request<M> {
        let mut call = tonic::Request::new(message);
        if let Some(deadline) = self.deadline {
            call.set_timeout(deadline);
        }
        if let Some(token) = &self.token {
            token.attach(&mut call);
        }
        call
    }
}

#[async_trait]
impl<S> Transport for GrpcTransport<S>
where
    S: GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Error: Into<StdError>,
    S::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        let wire = to_wire(&self.tenant, bucket, request);
        let response = self
            .client
            .clone()
            .token_bucket(self.call(wire))
            .await
            .map_err(|status| TransportError::from_status(&status))?
            .into_inner();
        from_wire(&response)
    }

    async fn partition_load(
        &self,
        call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        let response = self
            .partitions
            .clone()
            .partition_load(self.call(v1::PartitionLoadRequest::from(call)))
            .await
            .map_err(|status| TransportError::from_status(&status))?
            .into_inner();
        ExchangeAnswer::try_from(response)
            .map_err(|e| TransportError::new(format!("server sent an invalid answer: {e}")))
    }
}

/// Several replicas of the server, one database behind them: calls go to
/// one replica until a call fails, then to the next in the list, and stay
/// there. The failed call is not repeated here: the pod's bucket retries it
/// after its backoff, unchanged, and the retry reaches the next replica.
/// Meanwhile the pod runs on its local bucket, then on its fallback rate,
/// as during any outage.
///
/// A call the pod gave up on (its attempt timed out, and the driver dropped
/// it) counts as failed: a replica that does not answer in time is left
/// like one that refuses.
///
/// Every failure moves on, whatever its cause: a replica that refuses
/// (overloaded, shutting down) is worth leaving too, and an answer that
/// would be the same from every replica (a refusal, which stops the
/// bucket) costs one move.
#[derive(Debug)]
pub struct FailoverTransport<T = GrpcTransport> {
    replicas: Vec<T>,
    current: AtomicUsize,
}

impl<T: Transport> FailoverTransport<T> {
    /// Calls go to `replicas[first % replicas.len()]` first (pods spread
    /// over the replicas by choosing different `first`s). `replicas` must
    /// not be empty.
    pub fn new(replicas: Vec<T>, first: usize) -> Result<Self, ClientError> {
        if replicas.is_empty() {
            return Err(ClientError::Endpoint {
                endpoint: String::new(),
                reason: "no server endpoint given".into(),
            });
        }
        let first = first % replicas.len();
        Ok(FailoverTransport {
            replicas,
            current: AtomicUsize::new(first),
        })
    }

    /// The index of the replica calls go to now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// The replica calls go to now, with its index.
    fn replica(&self) -> (usize, &T) {
        let index = self.current() % self.replicas.len();
        (index, &self.replicas[index])
    }

    /// A call to replica `index` failed: the next call goes to the next
    /// replica (unless a concurrent failure moved on already).
    fn failed(&self, index: usize) {
        let next = (index + 1) % self.replicas.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Sends `call` to the current replica, and moves on if it fails or is
    /// given up before it ends.
    async fn attempt<'a, R, F>(&'a self, call: impl FnOnce(&'a T) -> F) -> Result<R, TransportError>
    where
        F: std::future::Future<Output = Result<R, TransportError>>,
    {
        let (index, replica) = self.replica();
        let mut pending = Pending {
            transport: self,
            index,
            ended: false,
        };
        let result = call(replica).await;
        pending.ended = result.is_ok();
        result
    }
}

/// A call to a replica under way: dropped before it ended well (it failed,
/// or its caller gave it up), it moves the transport to the next replica.
struct Pending<'a, T: Transport> {
    transport: &'a FailoverTransport<T>,
    index: usize,
    ended: bool,
}

impl<T: Transport> Drop for Pending<'_, T> {
    fn drop(&mut self) {
        if !self.ended {
            self.transport.failed(self.index);
        }
    }
}

#[async_trait]
impl<T: Transport> Transport for FailoverTransport<T> {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        self.attempt(|replica| replica.token_bucket(bucket, request))
            .await
    }

    async fn partition_load(
        &self,
        call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        self.attempt(|replica| replica.partition_load(call)).await
    }
}

/// The endpoints in `endpoints`: one URL, or several separated by commas
/// (replicas of one server), each trimmed; empty entries are refused.
pub fn endpoint_list(endpoints: &str) -> Result<Vec<&str>, ClientError> {
    let list: Vec<&str> = endpoints.split(',').map(str::trim).collect();
    if list.iter().any(|e| e.is_empty()) {
        return Err(ClientError::Endpoint {
            endpoint: endpoints.to_string(),
            reason: "an empty endpoint in the list (expected URLs separated by commas)".into(),
        });
    }
    Ok(list)
}

fn to_wire(
    tenant: &TenantId,
    bucket: &BucketName,
    request: TokenBucketRequest,
) -> v1::TokenBucketRequest {
    let period = request.target_request_period;
    v1::TokenBucketRequest {
        tenant_id: tenant.as_str().to_string(),
        bucket: bucket.as_str().to_string(),
        instance_id: request.instance_id,
        instance_lease: request.lease,
        seq: request.seq,
        requested_tokens: request.requested_tokens,
        shares: request.shares,
        target_request_period: Some(tollgate_proto::duration(period)),
        consumption_since_last_request: Some((&request.consumption).into()),
        next_live_instance_id: request.next_live_instance_id,
        returned_tokens: request.returned_tokens,
        held_tokens: request.held_tokens,
        fallback_tokens: request.fallback_tokens,
        fallback_duration: (!request.fallback_duration.is_zero())
            .then(|| tollgate_proto::duration(request.fallback_duration)),
    }
}

/// The server's answer, checked: a server is trusted with grants, not with
/// the pod's ability to compute.
fn from_wire(response: &v1::TokenBucketResponse) -> Result<Grant, TransportError> {
    let trickle_duration = match response.trickle_duration {
        None => Duration::ZERO,
        Some(d) => {
            let secs = u64::try_from(d.seconds).ok();
            let nanos = u32::try_from(d.nanos).ok();
            match (secs, nanos) {
                (Some(secs), Some(nanos)) if nanos < 1_000_000_000 => Duration::new(secs, nanos),
                _ => {
                    return Err(TransportError::new(format!(
                        "server sent an invalid trickle_duration {d:?}"
                    )));
                }
            }
        }
    };
    let finite = |field: &str, value: f64| {
        if value.is_finite() && value >= 0.0 {
            Ok(value)
        } else {
            Err(TransportError::new(format!(
                "server sent {field} = {value}"
            )))
        }
    };
    Ok(Grant {
        granted_tokens: finite("granted_tokens", response.granted_tokens)?,
        trickle_duration,
        max_burst_tokens: finite("max_burst_tokens", response.max_burst_tokens)?,
        fallback_rate: finite("fallback_rate", response.fallback_rate)?,
        fallback_charged: response
            .fallback_charged_tokens
            .map(|charged| finite("fallback_charged_tokens", charged))
            .transpose()?,
        initial_allowance: response
            .initial_allowance
            .map(|allowance| finite("initial_allowance", allowance))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_request_names_its_bucket() {
        let tenant = TenantId::parse("tenant", "acme").expect("valid");
        let request = TokenBucketRequest {
            instance_id: 3,
            lease: vec![1; 16],
            seq: 9,
            requested_tokens: 50.0,
            shares: 1.0,
            target_request_period: Duration::from_secs(10),
            consumption: tollgate_core::Consumption::from_request_units(2.0),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            held_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: Duration::ZERO,
        };
        let email = BucketName::parse("bucket", "schedule-email").expect("valid");
        let wire = to_wire(&tenant, &email, request.clone());
        assert_eq!(wire.bucket, "schedule-email");
        assert_eq!(wire.tenant_id, "acme");
        assert_eq!((wire.instance_id, wire.seq), (3, 9));
        let wire = to_wire(&tenant, &BucketName::REQUEST_UNITS, request);
        assert_eq!(wire.bucket, "", "the request-unit bucket is the empty name");
    }

    /// A replica that answers or fails as told, and counts its calls.
    #[derive(Debug, Default)]
    struct Replica {
        down: std::sync::atomic::AtomicBool,
        calls: std::sync::atomic::AtomicU64,
        seqs: std::sync::Mutex<Vec<u64>>,
    }

    #[async_trait]
    impl Transport for std::sync::Arc<Replica> {
        async fn token_bucket(
            &self,
            _bucket: &BucketName,
            request: TokenBucketRequest,
        ) -> Result<Grant, TransportError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            // In flight for a moment, as over a network.
            tokio::task::yield_now().await;
            if self.down.load(Ordering::Relaxed) {
                return Err(TransportError::new("Unavailable: connection refused"));
            }
            self.seqs.lock().expect("lock").push(request.seq);
            Ok(Grant::default())
        }
    }

    fn request(seq: u64) -> TokenBucketRequest {
        TokenBucketRequest {
            instance_id: 1,
            lease: vec![1],
            seq,
            requested_tokens: 1.0,
            shares: 1.0,
            target_request_period: Duration::from_secs(10),
            consumption: tollgate_core::Consumption::default(),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            held_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn a_failed_call_moves_the_next_one_to_the_next_replica_and_it_stays() {
        let replicas: Vec<std::sync::Arc<Replica>> = (0..3).map(|_| Default::default()).collect();
        // Pod 4 of 3 replicas starts on the second.
        let transport = FailoverTransport::new(replicas.clone(), 4).expect("replicas");
        assert_eq!(transport.current(), 1);
        let bucket = BucketName::REQUEST_UNITS;
        transport
            .token_bucket(&bucket, request(1))
            .await
            .expect("up");

        replicas[1].down.store(true, Ordering::Relaxed);
        assert!(transport.token_bucket(&bucket, request(2)).await.is_err());
        // The retry, the same request, reaches the next replica; so does
        // what follows.
        transport
            .token_bucket(&bucket, request(2))
            .await
            .expect("moved");
        transport
            .token_bucket(&bucket, request(3))
            .await
            .expect("stays");
        assert_eq!(*replicas[1].seqs.lock().expect("lock"), vec![1]);
        assert_eq!(*replicas[2].seqs.lock().expect("lock"), vec![2, 3]);

        // Past the last, back to the first.
        replicas[2].down.store(true, Ordering::Relaxed);
        assert!(transport.token_bucket(&bucket, request(4)).await.is_err());
        transport
            .token_bucket(&bucket, request(4))
            .await
            .expect("wraps");
        assert_eq!(*replicas[0].seqs.lock().expect("lock"), vec![4]);
        assert_eq!(transport.current(), 0);
    }

    /// A replica that never answers.
    #[derive(Debug)]
    struct Silent;

    #[async_trait]
    impl Transport for Silent {
        async fn token_bucket(
            &self,
            _bucket: &BucketName,
            _request: TokenBucketRequest,
        ) -> Result<Grant, TransportError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_given_up_moves_on_as_a_failed_one_does() {
        let transport = FailoverTransport::new(vec![Silent, Silent], 0).expect("replicas");
        let bucket = BucketName::REQUEST_UNITS;
        let given_up = tokio::time::timeout(
            Duration::from_millis(250),
            transport.token_bucket(&bucket, request(1)),
        )
        .await;
        assert!(given_up.is_err(), "no answer");
        assert_eq!(transport.current(), 1, "the retry goes to the next replica");
    }

    #[tokio::test]
    async fn concurrent_failures_on_one_replica_move_on_once() {
        let replicas: Vec<std::sync::Arc<Replica>> = (0..3).map(|_| Default::default()).collect();
        replicas[0].down.store(true, Ordering::Relaxed);
        let transport = FailoverTransport::new(replicas.clone(), 0).expect("replicas");
        let bucket = BucketName::REQUEST_UNITS;
        // Both calls went to replica 0 before either failure was seen.
        let (a, b) = tokio::join!(
            transport.token_bucket(&bucket, request(1)),
            transport.token_bucket(&bucket, request(2))
        );
        assert!(a.is_err() && b.is_err());
        assert_eq!(replicas[0].calls.load(Ordering::Relaxed), 2);
        assert_eq!(transport.current(), 1, "not skipped past a live replica");
    }

    #[test]
    fn endpoint_lists_are_split_on_commas_and_empty_entries_refused() {
        assert_eq!(
            endpoint_list("http://a:1, http://b:2").expect("two"),
            vec!["http://a:1", "http://b:2"]
        );
        assert_eq!(
            endpoint_list("http://a:1").expect("one"),
            vec!["http://a:1"]
        );
        for bad in ["", "http://a:1,", ",http://a:1", "http://a:1,,http://b:2"] {
            let err = endpoint_list(bad).expect_err(bad).to_string();
            assert!(err.contains("empty endpoint"), "{err}");
        }
        let none: Vec<std::sync::Arc<Replica>> = Vec::new();
        assert!(FailoverTransport::new(none, 0).is_err());
    }

    #[test]
    fn answers_with_impossible_values_are_refused() {
        let bad = v1::TokenBucketResponse {
            granted_tokens: f64::NAN,
            ..v1::TokenBucketResponse::default()
        };
        assert!(from_wire(&bad).is_err());
        let negative_duration = v1::TokenBucketResponse {
            trickle_duration: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..v1::TokenBucketResponse::default()
        };
        assert!(from_wire(&negative_duration).is_err());
        let good = v1::TokenBucketResponse {
            granted_tokens: 5.0,
            trickle_duration: Some(prost_types::Duration {
                seconds: 2,
                nanos: 500_000_000,
            }),
            max_burst_tokens: 1.0,
            fallback_rate: 3.0,
            fallback_charged_tokens: Some(4.0),
            initial_allowance: Some(6.0),
        };
        let grant = from_wire(&good).expect("valid");
        assert_eq!(grant.initial_allowance, Some(6.0));
        let infinite_allowance = v1::TokenBucketResponse {
            initial_allowance: Some(f64::INFINITY),
            ..good
        };
        assert!(from_wire(&infinite_allowance).is_err());
        assert_eq!(grant.trickle_duration, Duration::from_millis(2500));
        assert_eq!(grant.granted_tokens, 5.0);
        assert_eq!(grant.fallback_charged, Some(4.0));
        let negative_charge = v1::TokenBucketResponse {
            fallback_charged_tokens: Some(-1.0),
            ..good
        };
        assert!(from_wire(&negative_charge).is_err());
        // An older server does not say: the pod takes all it sent as charged.
        let unsaid = v1::TokenBucketResponse {
            fallback_charged_tokens: None,
            ..good
        };
        assert_eq!(from_wire(&unsaid).expect("valid").fallback_charged, None);
    }
}
