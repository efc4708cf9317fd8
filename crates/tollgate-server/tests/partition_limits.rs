//! The pod-facing `PartitionLimits/PartitionLoad` exchange through the wire
//! contract alone, on the embedded store and PostgreSQL: pods learn their
//! tenant's table limits when they change, their reports add up across
//! pods (and, on PostgreSQL, across server replicas) and are kept across a
//! restart, a report is forgotten
//! twice its period after it was sent, reports go with their tenant, and
//! bad input is refused naming its field with nothing recorded.

mod support;

use std::time::Duration;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock};
use tollgate_proto::v1;
use tollgate_proto::v1::partition_limits_client::PartitionLimitsClient;
use tollgate_server::store::BucketSettings;
use tonic::Code;
use tonic::transport::Channel;

const HOT: u64 = 0xfeed;

fn hot(table: &str, rate: f64) -> v1::HotPartition {
    v1::HotPartition {
        table: table.into(),
        op: v1::PartitionOp::Write.into(),
        partition_hash: HOT,
        rate,
    }
}

fn report(pod: u32, version: u64, partitions: Vec<v1::HotPartition>) -> v1::PartitionLoadRequest {
    v1::PartitionLoadRequest {
        tenant_id: "acme".into(),
        instance_id: pod,
        known_limits_version: version,
        hot_partitions: partitions,
        report_period: Some(tollgate_proto::duration(Duration::from_secs(10))),
    }
}

async fn pods(server: &TestServer) -> PartitionLimitsClient<Channel> {
    PartitionLimitsClient::new(server.channel().await)
}

async fn exchange(
    client: &mut PartitionLimitsClient<Channel>,
    request: v1::PartitionLoadRequest,
) -> v1::PartitionLoadResponse {
    client
        .partition_load(request)
        .await
        .expect("partition load")
        .into_inner()
}

/// The share of the hot partition the answer gives (1: not listed).
fn share(answer: &v1::PartitionLoadResponse) -> f64 {
    answer
        .shares
        .iter()
        .find(|s| s.partition_hash == HOT)
        .map_or(1.0, |s| s.share)
}

async fn set_limit(server: &TestServer, writes: f64) {
    server
        .admin()
        .await
        .set_table_limits(v1::SetTableLimitsRequest {
            tenant_id: "acme".into(),
            limits: Some(v1::TableLimits {
                table: "orders".into(),
                max_reads_per_second: None,
                max_writes_per_second: Some(writes),
            }),
        })
        .await
        .expect("set table limits");
}

async fn limits_reach_pods_and_reports_add_up(backend: Backend) {
    let backing = Backing::new(backend).await;
    let clock = ManualClock::default();
    clock.set_secs(1_000.0);
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let server = TestServer::start(store).await;
    let mut client = pods(&server).await;

    // A tenant nobody configured: an empty set, not an error.
    let none = exchange(&mut client, report(1, 0, vec![])).await;
    assert!(none.limits_changed && none.tables.is_empty());
    assert_ne!(none.limits_version, 0);
    let same = exchange(&mut client, report(1, none.limits_version, vec![])).await;
    assert!(!same.limits_changed, "the pod has the current version");

    set_limit(&server, 100.0).await;
    let first = exchange(
        &mut client,
        report(1, none.limits_version, vec![hot("orders", 300.0)]),
    )
    .await;
    assert!(first.limits_changed);
    assert_eq!(
        first.tables,
        vec![v1::PartitionTableLimits {
            table: "orders".into(),
            max_reads_per_second: None,
            max_writes_per_second: Some(100.0),
        }]
    );
    assert_eq!(share(&first), 1.0, "alone on the partition");
    let version = first.limits_version;

    // A second pod on the same partition: shares by rate.
    let second = exchange(&mut client, report(2, version, vec![hot("orders", 100.0)])).await;
    assert!(!second.limits_changed);
    assert!((share(&second) - 0.25).abs() < 1e-9, "{second:?}");
    let first_again = exchange(&mut client, report(1, version, vec![hot("orders", 300.0)])).await;
    assert!((share(&first_again) - 0.75).abs() < 1e-9);

    // Reports of a table without a limit are not recorded.
    let other = exchange(&mut client, report(3, version, vec![hot("users", 1e6)])).await;
    assert!(other.shares.is_empty());
    let unchanged = exchange(&mut client, report(2, version, vec![hot("orders", 100.0)])).await;
    assert!((share(&unchanged) - 0.25).abs() < 1e-9);

    // Pod 1 stops reporting: twice its period later, pod 2 is alone.
    clock.advance(Duration::from_secs(21));
    let alone = exchange(&mut client, report(2, version, vec![hot("orders", 100.0)])).await;
    assert_eq!(share(&alone), 1.0);

    // A changed limit is a new version; the pod that has the old one is
    // told.
    set_limit(&server, 50.0).await;
    let changed = exchange(&mut client, report(2, version, vec![hot("orders", 100.0)])).await;
    assert!(changed.limits_changed);
    assert_ne!(changed.limits_version, version);
    assert_eq!(changed.tables[0].max_writes_per_second, Some(50.0));

    // Deleting the tenant forgets its reports.
    exchange(
        &mut client,
        report(1, changed.limits_version, vec![hot("orders", 300.0)]),
    )
    .await;
    server
        .admin()
        .await
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            dry_run: false,
        })
        .await
        .expect("delete tenant");
    set_limit(&server, 50.0).await;
    let fresh = exchange(&mut client, report(2, 0, vec![hot("orders", 100.0)])).await;
    assert_eq!(share(&fresh), 1.0, "pod 1's report went with the tenant");
    server.stop().await;
}

async fn reports_are_kept_across_a_restart(backend: Backend) {
    let backing = Backing::new(backend).await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    set_limit(&server, 100.0).await;
    let mut client = pods(&server).await;
    exchange(&mut client, report(1, 0, vec![hot("orders", 300.0)])).await;
    server.stop().await;

    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let mut client = pods(&server).await;
    let second = exchange(&mut client, report(2, 0, vec![hot("orders", 100.0)])).await;
    assert!((share(&second) - 0.25).abs() < 1e-9, "{second:?}");
    server.stop().await;
}

async fn bad_reports_are_refused_naming_the_field(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    set_limit(&server, 100.0).await;
    let mut client = pods(&server).await;
    exchange(&mut client, report(1, 0, vec![hot("orders", 300.0)])).await;

    let period = |seconds: i64, nanos: i32| {
        let mut r = report(2, 0, vec![hot("orders", 100.0)]);
        r.report_period = Some(prost_types::Duration { seconds, nanos });
        r
    };
    let with = |edit: fn(&mut v1::HotPartition)| {
        let mut partition = hot("orders", 100.0);
        edit(&mut partition);
        report(2, 0, vec![partition])
    };
    let cases: Vec<(v1::PartitionLoadRequest, &str)> = vec![
        (
            v1::PartitionLoadRequest {
                tenant_id: String::new(),
                ..report(2, 0, vec![])
            },
            "tenant_id",
        ),
        (
            v1::PartitionLoadRequest {
                tenant_id: "a b".into(),
                ..report(2, 0, vec![])
            },
            "tenant_id",
        ),
        (report(0, 0, vec![]), "instance_id"),
        (period(0, 0), "report_period"),
        (period(3_600, 0), "report_period"),
        (period(1, -1), "report_period"),
        (period(1, 1_000_000_000), "report_period"),
        (with(|p| p.rate = f64::NAN), "hot_partitions[0].rate"),
        (with(|p| p.rate = -1.0), "hot_partitions[0].rate"),
        (with(|p| p.rate = f64::INFINITY), "hot_partitions[0].rate"),
        (with(|p| p.rate = 1e300), "hot_partitions[0].rate"),
        (with(|p| p.op = 0), "hot_partitions[0].op"),
        (with(|p| p.op = 7), "hot_partitions[0].op"),
        (with(|p| p.table = String::new()), "hot_partitions[0].table"),
        (
            with(|p| p.table = "x".repeat(65)),
            "hot_partitions[0].table",
        ),
        (
            report(2, 0, vec![hot("orders", 1.0), hot("orders", 2.0)]),
            "hot_partitions[1]",
        ),
        (
            report(
                2,
                0,
                (0..65)
                    .map(|i| v1::HotPartition {
                        partition_hash: i,
                        ..hot("orders", 1.0)
                    })
                    .collect(),
            ),
            "hot_partitions",
        ),
    ];
    for (request, field) in cases {
        let err = client
            .partition_load(request.clone())
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{request:?}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}:")),
            "{field}: {}",
            err.message()
        );
    }
    // Nothing was recorded: pod 1 is still alone.
    let alone = exchange(&mut client, report(1, 0, vec![hot("orders", 300.0)])).await;
    assert_eq!(share(&alone), 1.0);
    server.stop().await;
}

/// Generated requests, mostly wrong in some field, from many pods: every
/// answer is OK or INVALID_ARGUMENT (never INTERNAL), and the tenant's
/// kept reports stay within their bound.
async fn generated_requests_are_answered_or_refused_never_internal(backend: Backend) {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    let server = TestServer::new(backend, BucketSettings::default()).await;
    set_limit(&server, 100.0).await;
    let mut client = pods(&server).await;
    let mut rng = SmallRng::seed_from_u64(15);
    let names = ["orders", "users", "", "a b", "é", "x.y:z-1"];
    let mut refused = 0;
    for _ in 0..400 {
        let partitions = (0..rng.random_range(0..70))
            .map(|_| v1::HotPartition {
                table: names[rng.random_range(0..names.len())].to_string(),
                op: rng.random_range(-1..4),
                partition_hash: rng.random_range(0..8),
                rate: match rng.random_range(0..4) {
                    0 => f64::from_bits(rng.random()),
                    1 => -rng.random::<f64>(),
                    _ => rng.random::<f64>() * 1e3,
                },
            })
            .collect();
        let request = v1::PartitionLoadRequest {
            tenant_id: if rng.random_bool(0.9) { "acme" } else { "" }.into(),
            instance_id: rng.random_range(0..50),
            known_limits_version: rng.random(),
            hot_partitions: partitions,
            report_period: rng.random_bool(0.8).then(|| prost_types::Duration {
                seconds: rng.random_range(-1..400),
                nanos: rng.random_range(-1..1_000_000_001),
            }),
        };
        match client.partition_load(request).await {
            Ok(_) => {}
            Err(status) => {
                assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
                refused += 1;
            }
        }
    }
    assert!(refused > 100, "the generator tries bad input: {refused}");
    let answer = exchange(&mut client, report(60, 0, vec![hot("orders", 1.0)])).await;
    assert!(answer.limits_changed);
    server.stop().await;
}

for_each_store!(
    limits_reach_pods_and_reports_add_up,
    reports_are_kept_across_a_restart,
    bad_reports_are_refused_naming_the_field,
    generated_requests_are_answered_or_refused_never_internal
);

/// Two server replicas on one PostgreSQL database add up the same pods:
/// a pod's report through one replica counts in the other's answer.
#[tokio::test]
async fn replicas_on_postgres_add_up_the_same_reports() {
    let backing = Backing::new(Backend::Postgres).await;
    let a = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let b = TestServer::start(backing.open(BucketSettings::default()).await).await;
    set_limit(&a, 100.0).await;
    let mut via_a = pods(&a).await;
    let mut via_b = pods(&b).await;
    exchange(&mut via_a, report(1, 0, vec![hot("orders", 100.0)])).await;
    exchange(&mut via_b, report(2, 0, vec![hot("orders", 100.0)])).await;
    exchange(&mut via_a, report(3, 0, vec![hot("orders", 200.0)])).await;
    let second = exchange(&mut via_b, report(2, 0, vec![hot("orders", 100.0)])).await;
    assert!((share(&second) - 0.25).abs() < 1e-9, "{second:?}");
    // Concurrent exchanges of many pods through both replicas lose none.
    let mut tasks = Vec::new();
    for pod in 10..50u32 {
        let mut client = if pod % 2 == 0 {
            via_a.clone()
        } else {
            via_b.clone()
        };
        tasks.push(tokio::spawn(async move {
            exchange(&mut client, report(pod, 0, vec![hot("orders", 10.0)])).await
        }));
    }
    for task in tasks {
        task.await.expect("exchange task");
    }
    // 100 + 100 + 200 + 40 pods x 10 = 800 in all: pod 3's share is 1/4.
    let third = exchange(&mut via_a, report(3, 0, vec![hot("orders", 200.0)])).await;
    assert!((share(&third) - 0.25).abs() < 1e-9, "{third:?}");
    a.stop().await;
    b.stop().await;
}
