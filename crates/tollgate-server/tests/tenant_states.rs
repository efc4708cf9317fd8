//! Deleted and suspended tenants through the wire alone, on the embedded
//! store and PostgreSQL: a deleted tenant's pods are refused by every
//! pod-facing API (never served on the default limits) until an operator
//! creates it again; a suspended tenant's are refused until it is resumed,
//! its limits and totals untouched.

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::server::{TestServer, get_tenant};
use support::{Backend, Backing, ManualClock};
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tollgate_proto::v1::partition_limits_client::PartitionLimitsClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_proto::v1::{self};
use tollgate_server::store::BucketSettings;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// 2027-01-15T08:00:00Z
const START: f64 = 1_800_000_000.0;

struct Pods {
    buckets: TokenBucketServiceClient<Channel>,
    checks: KeyLimitsClient<Channel>,
    envoy: RateLimitServiceClient<Channel>,
    partitions: PartitionLimitsClient<Channel>,
}

impl Pods {
    async fn new(server: &TestServer) -> Pods {
        let channel = server.channel().await;
        Pods {
            buckets: TokenBucketServiceClient::new(channel.clone()),
            checks: KeyLimitsClient::new(channel.clone()),
            envoy: RateLimitServiceClient::new(channel.clone()),
            partitions: PartitionLimitsClient::new(channel),
        }
    }

    async fn token_bucket(
        &mut self,
        tenant: &str,
        bucket: &str,
        seq: u64,
    ) -> Result<v1::TokenBucketResponse, Status> {
        self.buckets
            .token_bucket(v1::TokenBucketRequest {
                tenant_id: tenant.into(),
                bucket: bucket.into(),
                instance_id: 1,
                instance_lease: b"lease".to_vec(),
                seq,
                requested_tokens: 3_000.0,
                shares: 1.0,
                target_request_period: Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                }),
                consumption_since_last_request: Some(v1::Consumption {
                    request_units: 2.0,
                    ..v1::Consumption::default()
                }),
                ..v1::TokenBucketRequest::default()
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn check(&mut self, tenant: &str) -> Result<v1::CheckResponse, Status> {
        self.checks
            .check(v1::CheckRequest {
                items: vec![v1::CheckItem {
                    tenant_id: tenant.into(),
                    bucket: "per-user".into(),
                    key: "alice".into(),
                    tokens: 1.0,
                    request_id: String::new(),
                }],
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// Every pod-facing call for `tenant` is refused with `code`, the
    /// message containing `says`.
    async fn all_refused(&mut self, tenant: &str, code: Code, says: &str) {
        let mut statuses = vec![
            (
                "TokenBucket",
                self.token_bucket(tenant, "", 100).await.err(),
            ),
            (
                "TokenBucket mail",
                self.token_bucket(tenant, "mail", 100).await.err(),
            ),
            ("Check", self.check(tenant).await.err()),
        ];
        let envoy = self
            .envoy
            .should_rate_limit(RateLimitRequest {
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
                    ..Default::default()
                }],
                hits_addend: 1,
            })
            .await;
        statuses.push(("ShouldRateLimit", envoy.err()));
        let partitions = self
            .partitions
            .partition_load(v1::PartitionLoadRequest {
                tenant_id: tenant.into(),
                instance_id: 1,
                known_limits_version: 0,
                hot_partitions: Vec::new(),
                report_period: Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                }),
            })
            .await;
        statuses.push(("PartitionLoad", partitions.err()));
        for (rpc, status) in statuses {
            let status = status.unwrap_or_else(|| panic!("{rpc} for {tenant} was served"));
            assert_eq!(status.code(), code, "{rpc}: {}", status.message());
            assert!(
                status.message().contains(says),
                "{rpc}: {:?} should say {says:?}",
                status.message()
            );
        }
    }
}

/// A server on `backend` (unconfigured tenants get the default limits)
/// with tier `pro` (`mail`: shared, `per-user`: per key) and tenant
/// `acme` on it, its clock at [`START`].
async fn server_with_acme(backend: Backend) -> (TestServer, ManualClock, Backing) {
    let clock = ManualClock::default();
    clock.set_secs(START);
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let server = TestServer::start(store).await;
    let mut admin = server.admin().await;
    let definition = |bucket: &str, kind: v1::BucketKind| v1::BucketDefinition {
        quota: None,
        bucket: bucket.into(),
        refill_rate: 10.0,
        burst_limit: 100.0,
        initial_tokens: None,
        kind: kind as i32,
        enforce: None,
    };
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "pro".into(),
                buckets: vec![
                    definition("mail", v1::BucketKind::Shared),
                    definition("per-user", v1::BucketKind::PerKey),
                ],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await
        .expect("put tier");
    create(&mut admin, "acme").await.expect("create acme");
    (server, clock, backing)
}

async fn create(admin: &mut AdminClient<Channel>, tenant: &str) -> Result<(), Status> {
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: tenant.into(),
            tier: "pro".into(),
        })
        .await
        .map(|_| ())
}

async fn listed(admin: &mut AdminClient<Channel>) -> Vec<v1::Tenant> {
    admin
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .tenants
}

async fn a_deleted_tenant_is_refused_by_every_pod_api_until_created_again(backend: Backend) {
    let (server, clock, backing) = server_with_acme(backend).await;
    let mut admin = server.admin().await;
    let mut pods = Pods::new(&server).await;
    pods.token_bucket("acme", "", 1).await.expect("served");
    pods.check("acme").await.expect("checked");

    admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            dry_run: false,
        })
        .await
        .expect("delete");
    clock.set_secs(START + 60.0);
    pods.all_refused(
        "acme",
        Code::NotFound,
        "tenant \"acme\" was deleted at 2027-01-15T08:00:00Z",
    )
    .await;
    assert!(
        listed(&mut admin).await.is_empty(),
        "nothing granted, nothing created"
    );
    let shown = get_tenant(&mut admin, "acme").await.expect_err("gone");
    assert_eq!(shown.code(), Code::NotFound);
    let suspend = admin
        .suspend_tenant(v1::SuspendTenantRequest {
            tenant_id: "acme".into(),
            reason: String::new(),
        })
        .await
        .expect_err("deleted");
    assert_eq!(suspend.code(), Code::NotFound, "{}", suspend.message());

    // Created again by an operator: served at once, from a fresh bucket.
    create(&mut admin, "acme").await.expect("create again");
    let grant = pods.token_bucket("acme", "mail", 1).await.expect("served");
    assert!(
        grant.granted_tokens <= 100.0 + 10.0 * 10.0,
        "the tier's burst and a period's refill, not the defaults: {}",
        grant.granted_tokens
    );
    pods.check("acme").await.expect("checked");
    server.stop().await;
    drop(backing);
}

async fn a_suspended_tenant_is_refused_and_keeps_its_limits_and_totals(backend: Backend) {
    let (server, clock, backing) = server_with_acme(backend).await;
    let mut admin = server.admin().await;
    let mut pods = Pods::new(&server).await;
    pods.token_bucket("acme", "mail", 1).await.expect("served");
    pods.token_bucket("acme", "", 1).await.expect("served");
    pods.check("acme").await.expect("checked");
    let before = listed(&mut admin).await;
    let keys_before = server.store.key_counts().await.expect("keys");

    let suspended = admin
        .suspend_tenant(v1::SuspendTenantRequest {
            tenant_id: "acme".into(),
            reason: "unpaid invoice".into(),
        })
        .await
        .expect("suspend")
        .into_inner();
    assert!(suspended.changed);
    let state = suspended.state.expect("state");
    assert_eq!(
        (state.kind.as_str(), state.reason.as_str()),
        ("suspended", "unpaid invoice")
    );
    assert!(state.actor.contains("127.0.0.1"), "{}", state.actor);
    pods.all_refused(
        "acme",
        Code::FailedPrecondition,
        "tenant \"acme\" is suspended since 2027-01-15T08:00:00Z: unpaid invoice",
    )
    .await;

    // Limits, tokens, pods and totals exactly as they were; the state shows.
    let after = listed(&mut admin).await;
    assert_eq!(after.len(), before.len());
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(a.state.as_ref(), Some(&state), "{}", a.bucket);
        let unsuspended = v1::Tenant {
            state: None,
            ..a.clone()
        };
        assert_eq!(&unsuspended, b, "bucket {:?} untouched", a.bucket);
    }
    assert_eq!(server.store.key_counts().await.expect("keys"), keys_before);
    let described = admin
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(described.state.as_ref(), Some(&state));

    // Again: nothing changes, the first time and reason stay.
    clock.set_secs(START + 5.0);
    let again = admin
        .suspend_tenant(v1::SuspendTenantRequest {
            tenant_id: "acme".into(),
            reason: "another".into(),
        })
        .await
        .expect("suspend again")
        .into_inner();
    assert!(!again.changed);
    assert_eq!(again.state.as_ref(), Some(&state));

    let resumed = admin
        .resume_tenant(v1::ResumeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("resume")
        .into_inner();
    assert!(resumed.changed);
    pods.token_bucket("acme", "mail", 2)
        .await
        .expect("served at once");
    pods.check("acme").await.expect("checked at once");
    let again = admin
        .resume_tenant(v1::ResumeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("resume again")
        .into_inner();
    assert!(!again.changed);
    assert!(listed(&mut admin).await.iter().all(|t| t.state.is_none()));

    // Unknown tenants, bad reasons.
    for status in [
        admin
            .suspend_tenant(v1::SuspendTenantRequest {
                tenant_id: "nobody".into(),
                reason: String::new(),
            })
            .await
            .expect_err("unknown"),
        admin
            .resume_tenant(v1::ResumeTenantRequest {
                tenant_id: "nobody".into(),
            })
            .await
            .expect_err("unknown"),
    ] {
        assert_eq!(status.code(), Code::NotFound, "{}", status.message());
    }
    for (reason, tenant, field) in [
        ("two\nlines", "acme", "reason"),
        (&"x".repeat(513) as &str, "acme", "reason"),
        ("", "no spaces", "tenant_id"),
    ] {
        let status = admin
            .suspend_tenant(v1::SuspendTenantRequest {
                tenant_id: tenant.into(),
                reason: reason.into(),
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    pods.token_bucket("acme", "mail", 3)
        .await
        .expect("bad suspends changed nothing");
    server.stop().await;
    drop(backing);
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn embedded_store() {
                    super::$name(Backend::Embedded).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres_store() {
                    super::$name(Backend::Postgres).await;
                }
            }
        )*
    };
}

on_both_stores!(
    a_deleted_tenant_is_refused_by_every_pod_api_until_created_again,
    a_suspended_tenant_is_refused_and_keeps_its_limits_and_totals,
);
