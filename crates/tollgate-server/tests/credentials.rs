//! Pod credentials bound to tenants, and read-only admin tokens, through
//! the wire contract alone: a real server on `127.0.0.1:0`, real gRPC
//! clients, plain or mutual TLS.
//!
//! Every pod-facing RPC (`TokenBucket`, `Check`, `PartitionLoad`, Envoy's
//! `ShouldRateLimit`) is called for the credential's tenant (served), for
//! another tenant (PERMISSION_DENIED, nothing changed), without a
//! credential and with an unknown one (UNAUTHENTICATED), the last two
//! whatever bytes the call carries: the caller is authenticated before its
//! message is decoded.

mod support;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::server::{TestServer, get_tenant};
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tollgate_proto::v1::partition_limits_client::PartitionLimitsClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_proto::v1::{self};
use tollgate_server::service::admin_auth::READ_ONLY_METHODS;
use tollgate_server::service::{AdminTokens, PodTokens};
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
use tollgate_server::telemetry::Telemetry;
use tollgate_server::{GrpcOptions, ServerTls};
use tollgate_testdb::TestPki;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};

const ACME_TOKEN: &str = "acme-pods-0123456789abcdef";
const GATEWAY_TOKEN: &str = "gateway-0123456789abcdef";
const OPERATOR_TOKEN: &str = "operator-0123456789abcdef";
const VIEWER_TOKEN: &str = "viewer-0123456789abcdef";

const POD_TOKENS: &str =
    "# pods\nacme-pods acme-pods-0123456789abcdef acme\ngateway gateway-0123456789abcdef *\n";
const ADMIN_TOKENS: &str =
    "ops operator-0123456789abcdef\nviewer viewer-0123456789abcdef read-only\n";

/// The pod-facing RPCs.
#[derive(Clone, Copy, Debug)]
enum Rpc {
    TokenBucket,
    Check,
    PartitionLoad,
    ShouldRateLimit,
}

const RPCS: [Rpc; 4] = [
    Rpc::TokenBucket,
    Rpc::Check,
    Rpc::PartitionLoad,
    Rpc::ShouldRateLimit,
];

fn live<T>(value: T) -> Arc<ArcSwap<T>> {
    Arc::new(ArcSwap::from_pointee(value))
}

fn bearer<M>(message: M, token: Option<&str>) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    request
}

/// Calls `rpc` for `tenant` (taking one token, reporting 5 request units
/// where the RPC reports), with `token` if given, on `channel`.
async fn call(
    channel: &Channel,
    rpc: Rpc,
    tenant: &str,
    token: Option<&str>,
) -> Result<(), Status> {
    match rpc {
        Rpc::TokenBucket => {
            let request = v1::TokenBucketRequest {
                tenant_id: tenant.into(),
                instance_id: 1,
                instance_lease: b"lease-1".to_vec(),
                seq: rand_seq(),
                requested_tokens: 1.0,
                shares: 1.0,
                consumption_since_last_request: Some(v1::Consumption {
                    request_units: 5.0,
                    ..v1::Consumption::default()
                }),
                ..v1::TokenBucketRequest::default()
            };
            TokenBucketServiceClient::new(channel.clone())
                .token_bucket(bearer(request, token))
                .await
                .map(drop)
        }
        Rpc::Check => check(channel, &[tenant], token).await,
        Rpc::PartitionLoad => {
            let request = v1::PartitionLoadRequest {
                tenant_id: tenant.into(),
                instance_id: 1,
                known_limits_version: 0,
                hot_partitions: Vec::new(),
                report_period: Some(tollgate_proto::duration(Duration::from_secs(10))),
            };
            PartitionLimitsClient::new(channel.clone())
                .partition_load(bearer(request, token))
                .await
                .map(drop)
        }
        Rpc::ShouldRateLimit => {
            let request = RateLimitRequest {
                domain: tenant.into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "generic_key".into(),
                            value: "per-user".into(),
                        },
                        Entry {
                            key: "user".into(),
                            value: "alice".into(),
                        },
                    ],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 1,
            };
            RateLimitServiceClient::new(channel.clone())
                .should_rate_limit(bearer(request, token))
                .await
                .map(drop)
        }
    }
}

/// A fresh sequence number, so that every token-bucket call is a new
/// request rather than a retry.
fn rand_seq() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// One check taking a token from key `alice` of `per-user` of each of
/// `tenants`, together.
async fn check(channel: &Channel, tenants: &[&str], token: Option<&str>) -> Result<(), Status> {
    let request = v1::CheckRequest {
        items: tenants
            .iter()
            .map(|tenant| v1::CheckItem {
                tenant_id: (*tenant).into(),
                bucket: "per-user".into(),
                key: "alice".into(),
                tokens: 1.0,
                request_id: String::new(),
            })
            .collect(),
    };
    KeyLimitsClient::new(channel.clone())
        .check(bearer(request, token))
        .await
        .map(drop)
}

/// The tokens left at key `alice` of `tenant`'s `per-user` bucket, read
/// with the gateway's token.
async fn alice_tokens(channel: &Channel, tenant: &str) -> f64 {
    let request = v1::CheckRequest {
        items: vec![v1::CheckItem {
            tenant_id: tenant.into(),
            bucket: "per-user".into(),
            key: "alice".into(),
            tokens: 0.0,
            request_id: String::new(),
        }],
    };
    let answer = KeyLimitsClient::new(channel.clone())
        .check(bearer(request, Some(GATEWAY_TOKEN)))
        .await
        .expect("read the key")
        .into_inner();
    answer.answers[0].remaining_tokens
}

/// A server over an in-memory store with `options`, tenants `acme` and
/// `globex` on a tier with a per-key bucket `per-user` (burst 10, no
/// refill), set up through an operator's token if tokens are required.
async fn start(options: GrpcOptions) -> (TestServer, Telemetry) {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory(BucketSettings::default()).expect("in-memory store"));
    let telemetry = Telemetry::new().expect("telemetry");
    let server = TestServer::start_with(store, telemetry.clone(), options).await;
    (server, telemetry)
}

async fn define_tenants(admin: &mut AdminClient<Channel>, token: Option<&str>) {
    admin
        .put_tier(bearer(
            v1::PutTierRequest {
                tier: Some(v1::Tier {
                    name: "pro".into(),
                    buckets: vec![v1::BucketDefinition {
                        quota: None,
                        bucket: "per-user".into(),
                        refill_rate: 0.0,
                        burst_limit: 10.0,
                        initial_tokens: None,
                        kind: v1::BucketKind::PerKey as i32,
                    }],
                    ..v1::Tier::default()
                }),
                dry_run: false,
            },
            token,
        ))
        .await
        .expect("put tier");
    for tenant in ["acme", "globex"] {
        admin
            .create_tenant(bearer(
                v1::CreateTenantRequest {
                    tenant_id: tenant.into(),
                    tier: "pro".into(),
                },
                token,
            ))
            .await
            .expect("create tenant");
    }
}

async fn metrics(server: &TestServer, telemetry: &Telemetry) -> String {
    telemetry
        .metrics
        .render(&*server.store)
        .await
        .expect("render metrics")
}

fn counted(metrics: &str, reason: &str) -> u64 {
    let needle = format!("tollgate_auth_refusals_total{{reason=\"{reason}\",service=\"pod\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_token_acts_only_for_the_tenants_it_names() {
    let (server, telemetry) = start(GrpcOptions {
        pod_tokens: Some(live(PodTokens::parse(POD_TOKENS).expect("pod tokens"))),
        ..GrpcOptions::default()
    })
    .await;
    define_tenants(&mut server.admin().await, None).await;
    let channel = server.channel().await;

    for rpc in RPCS {
        call(&channel, rpc, "acme", Some(ACME_TOKEN))
            .await
            .unwrap_or_else(|s| panic!("{rpc:?} for its own tenant: {s:?}"));
        call(&channel, rpc, "globex", Some(GATEWAY_TOKEN))
            .await
            .unwrap_or_else(|s| panic!("{rpc:?} with a token for every tenant: {s:?}"));
        let denied = call(&channel, rpc, "globex", Some(ACME_TOKEN))
            .await
            .expect_err("another tenant");
        assert_eq!(denied.code(), Code::PermissionDenied, "{rpc:?}: {denied:?}");
        assert!(
            denied.message().contains("acme-pods") && denied.message().contains("globex"),
            "{rpc:?}: {}",
            denied.message()
        );
        for token in [None, Some("mallory-0123456789abcdef")] {
            let refused = call(&channel, rpc, "acme", token)
                .await
                .expect_err("no credential");
            assert_eq!(refused.code(), Code::Unauthenticated, "{rpc:?} {token:?}");
        }
    }
    // A check for two tenants needs both.
    let denied = check(&channel, &["acme", "globex"], Some(ACME_TOKEN))
        .await
        .expect_err("one tenant not named");
    assert_eq!(denied.code(), Code::PermissionDenied);

    // Nothing a refused call carried reached the store: globex's key lost
    // only what the gateway took (one check, one ShouldRateLimit), acme's
    // what its own pods took, and globex's bill holds only the gateway's
    // report.
    assert_eq!(alice_tokens(&channel, "globex").await, 8.0);
    assert_eq!(alice_tokens(&channel, "acme").await, 8.0);
    let mut admin = server.admin().await;
    for (tenant, consumed) in [("globex", 5.0), ("acme", 5.0)] {
        let bucket = get_tenant(&mut admin, tenant).await.expect("tenant");
        assert_eq!(
            bucket.consumption.expect("consumption").request_units,
            consumed,
            "{tenant}"
        );
    }

    let metrics = metrics(&server, &telemetry).await;
    assert_eq!(counted(&metrics, "permission_denied"), 5, "{metrics}");
    assert_eq!(counted(&metrics, "unauthenticated"), 8, "{metrics}");
    server.stop().await;
}

/// Each pod-facing RPC's path, for calls with bytes of our choosing.
const PATHS: [&str; 4] = [
    "/tollgate.v1.TokenBucketService/TokenBucket",
    "/tollgate.v1.KeyLimits/Check",
    "/tollgate.v1.PartitionLimits/PartitionLoad",
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_calls_are_authenticated_before_their_message_is_decoded() {
    let (server, telemetry) = start(GrpcOptions {
        pod_tokens: Some(live(PodTokens::parse(POD_TOKENS).expect("pod tokens"))),
        ..GrpcOptions::default()
    })
    .await;
    let channel = server.channel().await;
    // Field 1, length-delimited, of a length no message has.
    let undecodable = vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
    for path in PATHS {
        for token in [None, Some("mallory-0123456789abcdef")] {
            let refused =
                support::raw::unary(channel.clone(), path, bearer(undecodable.clone(), token))
                    .await
                    .expect_err("not authenticated");
            assert_eq!(
                refused.code(),
                Code::Unauthenticated,
                "{path} with {token:?}: {refused:?}"
            );
        }
        // Known, the caller's bytes are judged next.
        let invalid = support::raw::unary(
            channel.clone(),
            path,
            bearer(undecodable.clone(), Some(ACME_TOKEN)),
        )
        .await
        .expect_err("undecodable");
        assert_eq!(invalid.code(), Code::InvalidArgument, "{path}: {invalid:?}");
    }
    let metrics = metrics(&server, &telemetry).await;
    assert_eq!(counted(&metrics, "unauthenticated"), 8, "{metrics}");
    assert_eq!(server.store.stats().failures, 0);
    server.stop().await;
}

/// A channel to `server` over mutual TLS, presenting `identity`.
async fn tls_channel(server: &TestServer, pki: &TestPki, identity: (String, String)) -> Channel {
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .identity(Identity::from_pem(identity.0, identity.1))
        .domain_name("localhost");
    Channel::from_shared(format!("https://localhost:{}", server.addr.port()))
        .expect("uri")
        .tls_config(config)
        .expect("tls config")
        .connect()
        .await
        .expect("connect over TLS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_acts_only_for_the_tenants_it_names() {
    let pki = TestPki::generate().expect("certificates");
    let (server, telemetry) = start(GrpcOptions {
        tls: Some(ServerTls {
            cert_pem: pki.server_cert_pem.clone().into_bytes(),
            key_pem: pki.server_key_pem.clone().into_bytes(),
            client_ca_pem: Some(pki.ca_pem.clone().into_bytes()),
        }),
        pod_tokens: Some(live(PodTokens::parse(POD_TOKENS).expect("pod tokens"))),
        pod_tenants_from_certificates: true,
        ..GrpcOptions::default()
    })
    .await;
    let client = |uris: &[&str]| pki.client_with_uris(uris).expect("client certificate");
    let acme = tls_channel(&server, &pki, client(&["tollgate://tenant/acme"])).await;
    define_tenants(&mut AdminClient::new(acme.clone()), None).await;
    let gateway = tls_channel(&server, &pki, client(&["tollgate://tenant/*"])).await;
    let nameless = tls_channel(
        &server,
        &pki,
        (pki.client_cert_pem.clone(), pki.client_key_pem.clone()),
    )
    .await;

    for rpc in RPCS {
        call(&acme, rpc, "acme", None)
            .await
            .unwrap_or_else(|s| panic!("{rpc:?} for its own tenant: {s:?}"));
        call(&gateway, rpc, "globex", None)
            .await
            .unwrap_or_else(|s| panic!("{rpc:?} with a certificate for every tenant: {s:?}"));
        for (channel, who) in [(&acme, "acme's"), (&nameless, "a nameless")] {
            let denied = call(channel, rpc, "globex", None)
                .await
                .expect_err("another tenant");
            assert_eq!(
                denied.code(),
                Code::PermissionDenied,
                "{rpc:?} with {who} certificate: {denied:?}"
            );
        }
        // A token, where one is sent, decides instead of the certificate.
        call(&nameless, rpc, "acme", Some(ACME_TOKEN))
            .await
            .unwrap_or_else(|s| panic!("{rpc:?} with acme's token: {s:?}"));
        let denied = call(&gateway, rpc, "globex", Some(ACME_TOKEN))
            .await
            .expect_err("the token does not name globex");
        assert_eq!(denied.code(), Code::PermissionDenied, "{rpc:?}");
    }
    assert_eq!(alice_tokens(&acme, "globex").await, 8.0);
    assert_eq!(alice_tokens(&acme, "acme").await, 6.0);
    let metrics = metrics(&server, &telemetry).await;
    assert_eq!(counted(&metrics, "permission_denied"), 12, "{metrics}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_from_certificates_need_mutual_tls() {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory(BucketSettings::default()).expect("store"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let refused = tollgate_server::run_with_options(
        listener,
        store,
        Telemetry::new().expect("telemetry"),
        GrpcOptions {
            pod_tenants_from_certificates: true,
            ..GrpcOptions::default()
        },
        std::future::pending(),
    )
    .await
    .expect_err("no client CA");
    assert!(refused.to_string().contains("mutual TLS"), "{refused}");
}

/// Calls `/tollgate.v1.Admin/<method>` with an empty message and `token`:
/// what the guard answers does not depend on the message.
async fn admin_raw(channel: &Channel, method: &str, token: &str) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let path: http::uri::PathAndQuery = format!("/tollgate.v1.Admin/{method}")
        .parse()
        .expect("path");
    grpc.unary(
        bearer(v1::GetTenantRequest::default(), Some(token)),
        path,
        tonic_prost::ProstCodec::<v1::GetTenantRequest, ()>::default(),
    )
    .await
    .map(drop)
}

/// Every method of the `Admin` service in the descriptor the server
/// publishes.
fn admin_methods() -> Vec<String> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(tollgate_proto::FILE_DESCRIPTOR_SET)
        .expect("descriptor set");
    set.file
        .iter()
        .flat_map(|f| f.service.iter())
        .filter(|s| s.name() == "Admin")
        .flat_map(|s| s.method.iter().map(|m| m.name().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_admin_token_reads_and_changes_nothing() {
    let (server, _telemetry) = start(GrpcOptions {
        admin_tokens: Some(live(AdminTokens::parse(ADMIN_TOKENS).expect("tokens"))),
        ..GrpcOptions::default()
    })
    .await;
    let channel = server.channel().await;
    let mut admin = AdminClient::new(channel.clone());
    define_tenants(&mut admin, Some(OPERATOR_TOKEN)).await;

    let methods = admin_methods();
    assert!(methods.len() >= 15, "{methods:?}");
    for method in &methods {
        let answer = admin_raw(&channel, method, VIEWER_TOKEN).await;
        if READ_ONLY_METHODS.contains(&method.as_str()) {
            // Let through: whatever the empty message gets, it is not a
            // refusal of the token.
            if let Err(status) = answer {
                assert!(
                    !matches!(
                        status.code(),
                        Code::PermissionDenied | Code::Unauthenticated
                    ),
                    "{method}: {status:?}"
                );
            }
        } else {
            let status = answer.expect_err("a change with a read-only token");
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{method}: {status:?}"
            );
        }
    }

    // The reads answer, the changes change nothing.
    fn viewer<M>(message: M) -> tonic::Request<M> {
        bearer(message, Some(VIEWER_TOKEN))
    }
    let listed = admin
        .list_tiers(viewer(v1::ListTiersRequest::default()))
        .await
        .expect("list with a read-only token")
        .into_inner();
    assert_eq!(listed.tiers.len(), 1);
    let deleted = admin
        .delete_tenant(viewer(v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            dry_run: false,
        }))
        .await
        .expect_err("delete with a read-only token");
    assert_eq!(deleted.code(), Code::PermissionDenied);
    let described = admin
        .describe_tenant(viewer(v1::DescribeTenantRequest {
            tenant_id: "acme".into(),
        }))
        .await
        .expect("acme is still there")
        .into_inner();
    assert_eq!(described.tenant.expect("tenant").tier, "pro");
    server.stop().await;
}
