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
use tollgate_server::service::admin_auth::{READ_ONLY_METHODS, SCOPED_METHODS};
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
                        enforce: None,
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

const SCOPED_TOKEN: &str = "acme-admins-0123456789abcdef";
const SCOPED_VIEWER_TOKEN: &str = "acme-viewers-0123456789abcdef";

/// A caller with a token.
struct As<'a>(&'a str);

impl As<'_> {
    fn with<M>(&self, message: M) -> tonic::Request<M> {
        bearer(message, Some(self.0))
    }
}

/// Calls every `Admin` method a scoped token may call that names a tenant
/// or organisation, with `id` there and `token`, each with a message it
/// accepts (changes before their undoing); answers the refusal codes, by
/// method.
async fn scoped_calls(
    admin: &mut AdminClient<Channel>,
    id: &str,
    token: &str,
) -> Vec<(&'static str, Result<(), Code>)> {
    fn done<T>(answer: Result<T, Status>) -> Result<(), Code> {
        answer.map(drop).map_err(|s| s.code())
    }
    let t = || id.to_owned();
    let who = As(token);
    vec![
        (
            "UpdateTenantResourceLimits",
            done(
                admin
                    .update_tenant_resource_limits(who.with(
                        v1::UpdateTenantResourceLimitsRequest {
                            tenant_id: t(),
                            available_tokens: 100.0,
                            refill_rate: 10.0,
                            burst_limit: 100.0,
                            ..Default::default()
                        },
                    ))
                    .await,
            ),
        ),
        (
            "GetTenant",
            done(
                admin
                    .get_tenant(who.with(v1::GetTenantRequest {
                        tenant_id: t(),
                        bucket: String::new(),
                    }))
                    .await,
            ),
        ),
        (
            "ListTenants",
            done(
                admin
                    .list_tenants(who.with(v1::ListTenantsRequest {
                        tenant_id: t(),
                        ..Default::default()
                    }))
                    .await,
            ),
        ),
        (
            "ListKeyBuckets",
            done(
                admin
                    .list_key_buckets(who.with(v1::ListKeyBucketsRequest {
                        tenant_id: t(),
                        ..Default::default()
                    }))
                    .await,
            ),
        ),
        (
            "ListClosedBuckets",
            done(
                admin
                    .list_closed_buckets(who.with(v1::ListClosedBucketsRequest {
                        tenant_id: t(),
                        ..Default::default()
                    }))
                    .await,
            ),
        ),
        (
            "SuspendTenant",
            done(
                admin
                    .suspend_tenant(who.with(v1::SuspendTenantRequest {
                        tenant_id: t(),
                        reason: "audit".into(),
                    }))
                    .await,
            ),
        ),
        (
            "ResumeTenant",
            done(
                admin
                    .resume_tenant(who.with(v1::ResumeTenantRequest { tenant_id: t() }))
                    .await,
            ),
        ),
        (
            "SetTenantTier",
            done(
                admin
                    .set_tenant_tier(who.with(v1::SetTenantTierRequest {
                        tenant_id: t(),
                        tier: "pro".into(),
                        dry_run: false,
                    }))
                    .await,
            ),
        ),
        (
            "SetBucketOverride",
            done(
                admin
                    .set_bucket_override(who.with(v1::SetBucketOverrideRequest {
                        tenant_id: t(),
                        bucket: Some(v1::BucketDefinition {
                            bucket: "per-user".into(),
                            burst_limit: 20.0,
                            kind: v1::BucketKind::PerKey as i32,
                            ..Default::default()
                        }),
                    }))
                    .await,
            ),
        ),
        (
            "ClearBucketOverride",
            done(
                admin
                    .clear_bucket_override(who.with(v1::ClearBucketOverrideRequest {
                        tenant_id: t(),
                        bucket: "per-user".into(),
                        dry_run: false,
                    }))
                    .await,
            ),
        ),
        (
            "DescribeTenant",
            done(
                admin
                    .describe_tenant(who.with(v1::DescribeTenantRequest { tenant_id: t() }))
                    .await,
            ),
        ),
        (
            "SetTableLimits",
            done(
                admin
                    .set_table_limits(who.with(v1::SetTableLimitsRequest {
                        tenant_id: t(),
                        limits: Some(v1::TableLimits {
                            table: "orders".into(),
                            max_reads_per_second: Some(5.0),
                            max_writes_per_second: None,
                        }),
                    }))
                    .await,
            ),
        ),
        (
            "ClearTableLimits",
            done(
                admin
                    .clear_table_limits(who.with(v1::ClearTableLimitsRequest {
                        tenant_id: t(),
                        table: "orders".into(),
                    }))
                    .await,
            ),
        ),
        (
            "SetBudget",
            done(
                admin
                    .set_budget(who.with(v1::SetBudgetRequest {
                        tenant_id: t(),
                        budget: Some(v1::Budget {
                            amount: 300.0,
                            cycle: Some(v1::BudgetCycle {
                                period: v1::BudgetPeriod::Daily.into(),
                                ..v1::BudgetCycle::default()
                            }),
                            at_limit: v1::BudgetAtLimit::Stop.into(),
                            ..v1::Budget::default()
                        }),
                    }))
                    .await,
            ),
        ),
        (
            "GetBudget",
            done(
                admin
                    .get_budget(who.with(v1::GetBudgetRequest {
                        tenant_id: t(),
                        bucket: String::new(),
                    }))
                    .await,
            ),
        ),
        (
            "GetUsage",
            done(
                admin
                    .get_usage(who.with(v1::GetUsageRequest {
                        tenant_id: t(),
                        bucket: String::new(),
                        cycles: 0,
                    }))
                    .await,
            ),
        ),
        (
            "GetHistory",
            done(
                admin
                    .get_history(who.with(v1::GetHistoryRequest {
                        tenant_id: t(),
                        since: Some(prost_types::Timestamp {
                            seconds: 1_800_000_000,
                            nanos: 0,
                        }),
                        until: Some(prost_types::Timestamp {
                            seconds: 1_800_003_600,
                            nanos: 0,
                        }),
                        ..Default::default()
                    }))
                    .await,
            ),
        ),
        (
            "PreviewLimits",
            done(
                admin
                    .preview_limits(who.with(v1::PreviewLimitsRequest {
                        change: Some(v1::preview_limits_request::Change::Bucket(
                            v1::ProposedLimits {
                                tenant_id: t(),
                                bucket: String::new(),
                                refill_rate: 5.0,
                                burst_limit: 50.0,
                            },
                        )),
                        ..Default::default()
                    }))
                    .await,
            ),
        ),
        (
            "ClearBudget",
            done(
                admin
                    .clear_budget(who.with(v1::ClearBudgetRequest {
                        tenant_id: t(),
                        bucket: String::new(),
                    }))
                    .await,
            ),
        ),
        (
            "GetOrganization",
            done(
                admin
                    .get_organization(who.with(v1::GetOrganizationRequest {
                        organization_id: t(),
                    }))
                    .await,
            ),
        ),
    ]
}

/// Whether `method` changes what it names.
fn changes(method: &str) -> bool {
    !READ_ONLY_METHODS.contains(&method)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_organisation_scoped_token_acts_on_its_tenants_only() {
    let tokens = format!(
        "{ADMIN_TOKENS}acme-admins {SCOPED_TOKEN} organization=acme\n\
         acme-viewers {SCOPED_VIEWER_TOKEN} read-only organization=acme\n"
    );
    let (server, _telemetry) = start(GrpcOptions {
        admin_tokens: Some(live(AdminTokens::parse(&tokens).expect("tokens"))),
        ..GrpcOptions::default()
    })
    .await;
    let channel = server.channel().await;
    let mut admin = AdminClient::new(channel.clone());
    define_tenants(&mut admin, Some(OPERATOR_TOKEN)).await;
    // acme > acme-eu > acme-db (two levels down); initech is another
    // organisation, globex a tenant of none.
    let ops = As(OPERATOR_TOKEN);
    for org in ["acme", "acme-eu", "initech"] {
        admin
            .create_organization(ops.with(v1::CreateOrganizationRequest {
                organization_id: org.into(),
                display_name: String::new(),
            }))
            .await
            .expect("create organization");
    }
    admin
        .create_tenant(ops.with(v1::CreateTenantRequest {
            tenant_id: "acme-db".into(),
            tier: "pro".into(),
        }))
        .await
        .expect("create tenant");
    for (org, member) in [("acme", "acme-eu"), ("acme-eu", "acme-db")] {
        admin
            .add_organization_member(ops.with(v1::AddOrganizationMemberRequest {
                organization_id: org.into(),
                member_id: member.into(),
                ..Default::default()
            }))
            .await
            .expect("add member");
    }
    let globex_before = admin
        .describe_tenant(ops.with(v1::DescribeTenantRequest {
            tenant_id: "globex".into(),
        }))
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");

    // Outside the organisation, existing or not: refused, whatever the
    // method, with both scoped tokens.
    let mut tried = Vec::new();
    for token in [SCOPED_TOKEN, SCOPED_VIEWER_TOKEN] {
        for outsider in ["globex", "initech", "nobody"] {
            for (method, answer) in scoped_calls(&mut admin, outsider, token).await {
                assert_eq!(answer, Err(Code::PermissionDenied), "{outsider} {method}");
                tried.push(method);
            }
        }
    }
    // Every scoped method that names an id is tried here.
    let untried: Vec<&str> = SCOPED_METHODS
        .into_iter()
        .filter(|m| !tried.contains(m))
        .collect();
    assert_eq!(untried, ["GetTier", "ListTiers", "ListOrganizations"]);
    let globex_after = admin
        .describe_tenant(ops.with(v1::DescribeTenantRequest {
            tenant_id: "globex".into(),
        }))
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(globex_before.tier, globex_after.tier);
    assert_eq!(globex_before.buckets, globex_after.buckets);
    assert_eq!(globex_after.state, None, "never suspended");

    // The organisation itself: read, not changed (its limits are its
    // provider's).
    for (method, answer) in scoped_calls(&mut admin, "acme", SCOPED_TOKEN).await {
        if changes(method) {
            assert_eq!(answer, Err(Code::PermissionDenied), "acme {method}");
        } else {
            assert_ne!(answer, Err(Code::PermissionDenied), "acme {method}");
        }
    }
    // Below it, at any depth: everything, with the operator's role; reads
    // only with the read-only one.
    for below in ["acme-eu", "acme-db"] {
        for (method, answer) in scoped_calls(&mut admin, below, SCOPED_VIEWER_TOKEN).await {
            if changes(method) {
                assert_eq!(answer, Err(Code::PermissionDenied), "{below} {method}");
            } else {
                assert_ne!(answer, Err(Code::PermissionDenied), "{below} {method}");
            }
        }
        for (method, answer) in scoped_calls(&mut admin, below, SCOPED_TOKEN).await {
            assert_ne!(answer, Err(Code::PermissionDenied), "{below} {method}");
        }
    }
    let db = admin
        .get_tenant(bearer(
            v1::GetTenantRequest {
                tenant_id: "acme-db".into(),
                bucket: String::new(),
            },
            Some(SCOPED_TOKEN),
        ))
        .await
        .expect("a tenant below acme")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(
        db.limits.expect("limits").refill_rate,
        10.0,
        "changed by the scoped token"
    );

    // Listings: one tenant at a time; its own organisations only.
    let all = admin
        .list_tenants(bearer(
            v1::ListTenantsRequest::default(),
            Some(SCOPED_TOKEN),
        ))
        .await
        .expect_err("every tenant");
    assert_eq!(all.code(), Code::PermissionDenied);
    assert!(all.message().contains("tenant_id"), "{}", all.message());
    let orgs = admin
        .list_organizations(bearer(
            v1::ListOrganizationsRequest::default(),
            Some(SCOPED_VIEWER_TOKEN),
        ))
        .await
        .expect("list organizations")
        .into_inner();
    let ids: Vec<&str> = orgs
        .organizations
        .iter()
        .map(|o| o.organization_id.as_str())
        .collect();
    assert_eq!(ids, ["acme", "acme-eu"]);
    for method in [
        "CreateTenant",
        "DeleteTenant",
        "PutTier",
        "AddOrganizationMember",
    ] {
        let status = admin_raw(&channel, method, SCOPED_TOKEN)
            .await
            .expect_err("beyond one tenant");
        assert_eq!(status.code(), Code::PermissionDenied, "{method}");
    }
    server.stop().await;
}
