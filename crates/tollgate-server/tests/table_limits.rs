//! Per-partition table limits through the wire contract alone, on the
//! embedded store and PostgreSQL: a tenant's own (`Admin/SetTableLimits`,
//! `ClearTableLimits`, `DescribeTenant`) and a tier's (`Tier.tables` in
//! `PutTier`, `GetTier`, `ListTiers`), kept across a restart of the
//! server on the same store, bad input refused naming its field with
//! nothing changed.

mod support;

use support::server::TestServer;
use support::{Backend, Backing};
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_server::store::BucketSettings;
use tonic::Code;
use tonic::transport::Channel;

fn limits(table: &str, reads: Option<f64>, writes: Option<f64>) -> v1::TableLimits {
    v1::TableLimits {
        table: table.into(),
        max_reads_per_second: reads,
        max_writes_per_second: writes,
    }
}

fn set(tenant: &str, limits: v1::TableLimits) -> v1::SetTableLimitsRequest {
    v1::SetTableLimitsRequest {
        tenant_id: tenant.into(),
        limits: Some(limits),
    }
}

async fn table_limits_are_set_kept_and_cleared(backend: Backend) {
    let backing = Backing::new(backend).await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut admin = server.admin().await;

    let tenant = admin
        .set_table_limits(set("acme", limits("orders", Some(100.0), None)))
        .await
        .expect("set orders")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(tenant.tenant_id, "acme", "the tenant is created");
    assert_eq!(
        tenant.table_overrides,
        vec![limits("orders", Some(100.0), None)]
    );
    admin
        .set_table_limits(set("acme", limits("users", None, Some(5.5))))
        .await
        .expect("set users");
    // Setting a table again replaces its limits whole.
    admin
        .set_table_limits(set("acme", limits("orders", None, Some(7.0))))
        .await
        .expect("replace orders");

    // Bad input names its field and changes nothing.
    let bad = [
        (
            set("acme", limits("orders", None, None)),
            "limits.max_reads_per_second",
        ),
        (
            set("acme", limits("orders", Some(f64::NAN), None)),
            "limits.max_reads_per_second",
        ),
        (
            set("acme", limits("orders", Some(-1.0), None)),
            "limits.max_reads_per_second",
        ),
        (
            set("acme", limits("orders", None, Some(0.0))),
            "limits.max_writes_per_second",
        ),
        (
            set("acme", limits("orders", None, Some(f64::INFINITY))),
            "limits.max_writes_per_second",
        ),
        (
            set("acme", limits("orders", Some(1e300), None)),
            "limits.max_reads_per_second",
        ),
        (set("acme", limits("", Some(1.0), None)), "limits.table"),
        (set("acme", limits("a b", Some(1.0), None)), "limits.table"),
        (
            set("acme", limits(&"t".repeat(65), Some(1.0), None)),
            "limits.table",
        ),
        (set("", limits("orders", Some(1.0), None)), "tenant_id"),
        (
            v1::SetTableLimitsRequest {
                tenant_id: "acme".into(),
                limits: None,
            },
            "limits",
        ),
    ];
    for (request, field) in bad {
        let status = admin
            .set_table_limits(request.clone())
            .await
            .expect_err(field);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{request:?}: {status:?}"
        );
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    }

    // A restart of the server on the same store keeps them.
    drop(admin);
    server.stop().await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut admin = server.admin().await;
    let described = admin
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(
        described.table_overrides,
        vec![
            limits("orders", None, Some(7.0)),
            limits("users", None, Some(5.5))
        ]
    );

    let cleared = admin
        .clear_table_limits(v1::ClearTableLimitsRequest {
            tenant_id: "acme".into(),
            table: "orders".into(),
        })
        .await
        .expect("clear")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(
        cleared.table_overrides,
        vec![limits("users", None, Some(5.5))]
    );
    for (tenant, table, code) in [
        ("acme", "orders", Code::NotFound),
        ("nobody", "orders", Code::NotFound),
        ("acme", "", Code::InvalidArgument),
    ] {
        let status = admin
            .clear_table_limits(v1::ClearTableLimitsRequest {
                tenant_id: tenant.into(),
                table: table.into(),
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), code, "{tenant}/{table}: {status:?}");
    }
    server.stop().await;
}

fn tier(tables: Vec<v1::TableLimits>) -> v1::Tier {
    v1::Tier {
        name: "pro".into(),
        buckets: vec![v1::BucketDefinition {
            quota: None,
            bucket: "emails".into(),
            refill_rate: 1.0,
            burst_limit: 10.0,
            initial_tokens: None,
            kind: v1::BucketKind::Shared.into(),
            enforce: None,
        }],
        tables,
        ..v1::Tier::default()
    }
}

async fn get_tier(admin: &mut AdminClient<Channel>) -> v1::Tier {
    admin
        .get_tier(v1::GetTierRequest { name: "pro".into() })
        .await
        .expect("get tier")
        .into_inner()
        .tier
        .expect("tier")
}

/// What `DescribeTenant` says of acme's buckets: name, limits, configured.
async fn buckets_of_acme(admin: &mut AdminClient<Channel>) -> Vec<(String, f64, f64, bool)> {
    let tenant = admin
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(tenant.tier, "pro");
    assert!(
        tenant.table_overrides.is_empty(),
        "a tier's tables are not the tenant's own: {tenant:?}"
    );
    tenant
        .buckets
        .iter()
        .map(|b| {
            let limits = b.limits.unwrap_or_default();
            (
                b.bucket.clone(),
                limits.refill_rate,
                limits.burst_limit,
                b.configured,
            )
        })
        .collect()
}

async fn a_tiers_tables_round_trip_and_bad_ones_change_nothing(backend: Backend) {
    let backing = Backing::new(backend).await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut admin = server.admin().await;

    // Sent in any order, answered by table name.
    let tables = vec![
        limits("users", None, Some(5.5)),
        limits("orders", Some(100.0), Some(20.0)),
    ];
    let sorted = vec![
        limits("orders", Some(100.0), Some(20.0)),
        limits("users", None, Some(5.5)),
    ];
    let put = admin
        .put_tier(v1::PutTierRequest {
            tier: Some(tier(tables)),
            dry_run: false,
        })
        .await
        .expect("put tier")
        .into_inner();
    assert!(put.created);
    assert_eq!(put.tier.expect("tier").tables, sorted);
    assert_eq!(get_tier(&mut admin).await.tables, sorted);
    let listed = admin
        .list_tiers(v1::ListTiersRequest {})
        .await
        .expect("list tiers")
        .into_inner()
        .tiers;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].tables, sorted);

    // A tenant on the tier gets the tier's buckets, whatever its tables.
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "pro".into(),
        })
        .await
        .expect("create tenant");
    let buckets = vec![("emails".to_owned(), 1.0, 10.0, true)];
    assert_eq!(buckets_of_acme(&mut admin).await, buckets);

    // New tables alone change no tenant's buckets.
    let changed = vec![limits("orders", Some(200.0), None)];
    let put = admin
        .put_tier(v1::PutTierRequest {
            tier: Some(tier(changed.clone())),
            dry_run: false,
        })
        .await
        .expect("change the tables")
        .into_inner();
    assert!(!put.created);
    assert_eq!(put.tenants_updated, 0);
    assert_eq!(put.tier.expect("tier").tables, changed);
    assert_eq!(buckets_of_acme(&mut admin).await, buckets);

    // Bad tables name their field and change nothing, nor create a tier.
    let too_many = (0..=1000)
        .map(|i| limits(&format!("t{i}"), Some(1.0), None))
        .collect();
    let bad = [
        (vec![limits("", Some(1.0), None)], "tier.tables[0].table"),
        (vec![limits("a b", Some(1.0), None)], "tier.tables[0].table"),
        (
            vec![
                limits("orders", Some(1.0), None),
                limits("orders", Some(2.0), None),
            ],
            "tier.tables[1].table",
        ),
        (
            vec![limits("orders", None, None)],
            "tier.tables[0].max_reads_per_second",
        ),
        (
            vec![
                limits("orders", Some(1.0), None),
                limits("users", Some(f64::NAN), None),
            ],
            "tier.tables[1].max_reads_per_second",
        ),
        (
            vec![limits("orders", None, Some(-1.0))],
            "tier.tables[0].max_writes_per_second",
        ),
        (
            vec![limits("orders", None, Some(f64::INFINITY))],
            "tier.tables[0].max_writes_per_second",
        ),
        (too_many, "tier.tables"),
    ];
    let before = get_tier(&mut admin).await;
    for (tables, field) in bad {
        for name in ["pro", "team"] {
            let status = admin
                .put_tier(v1::PutTierRequest {
                    tier: Some(v1::Tier {
                        name: name.into(),
                        ..tier(tables.clone())
                    }),
                    dry_run: false,
                })
                .await
                .expect_err(field);
            assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
            assert!(
                status.message().starts_with(&format!("{field}:")),
                "{field}: {}",
                status.message()
            );
        }
    }
    assert_eq!(get_tier(&mut admin).await, before);
    let status = admin
        .get_tier(v1::GetTierRequest {
            name: "team".into(),
        })
        .await
        .expect_err("never created");
    assert_eq!(status.code(), Code::NotFound);

    // A restart of the server on the same store keeps them.
    drop(admin);
    server.stop().await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut admin = server.admin().await;
    assert_eq!(get_tier(&mut admin).await, before);

    // A tier put without tables has none.
    let put = admin
        .put_tier(v1::PutTierRequest {
            tier: Some(tier(Vec::new())),
            dry_run: false,
        })
        .await
        .expect("remove the tables")
        .into_inner();
    assert_eq!(put.tier.expect("tier").tables, Vec::new());
    assert_eq!(get_tier(&mut admin).await.tables, Vec::new());
    assert_eq!(buckets_of_acme(&mut admin).await, buckets);
    server.stop().await;
}

for_each_store!(
    table_limits_are_set_kept_and_cleared,
    a_tiers_tables_round_trip_and_bad_ones_change_nothing,
);
