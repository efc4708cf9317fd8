//! Per-partition table limits set and cleared through the wire contract
//! alone (`Admin/SetTableLimits`, `ClearTableLimits`, `DescribeTenant`),
//! on the embedded store and PostgreSQL: kept across a restart of the
//! server on the same store, bad input refused naming its field with
//! nothing changed.

mod support;

use support::server::TestServer;
use support::{Backend, Backing};
use tollgate_proto::v1;
use tollgate_server::store::BucketSettings;
use tonic::Code;

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

for_each_store!(table_limits_are_set_kept_and_cleared);
