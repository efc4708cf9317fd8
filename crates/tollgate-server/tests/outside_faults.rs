//! Defects found by driving the server from outside, with a client written
//! only from the `.proto` files: each is a test over the wire contract,
//! on both stores where a store is involved: a late copy from an older
//! incarnation, totals past 2^63 − 1, requests racing `DeleteTenant`,
//! stray instance rows, undecodable and over-large messages (raw bytes),
//! expired deadlines (over bare HTTP/2), `as_of_consumed_tokens` up to the
//! total, brief error messages, exact fractional sums.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use support::server::{TestServer, get_tenant};
use support::{Backend, Backing};
use tollgate_proto::v1;
use tollgate_server::store::BucketSettings;
use tonic::Code;

fn pod_request(tenant: &str, instance: u32, lease: &str, seq: u64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        instance_id: instance,
        instance_lease: lease.as_bytes().to_vec(),
        seq,
        requested_tokens: 1.0,
        shares: 1.0,
        ..v1::TokenBucketRequest::default()
    }
}

fn reporting(mut request: v1::TokenBucketRequest, c: v1::Consumption) -> v1::TokenBucketRequest {
    request.consumption_since_last_request = Some(c);
    request
}

fn units(request_units: f64) -> v1::Consumption {
    v1::Consumption {
        request_units,
        ..v1::Consumption::default()
    }
}

async fn consumption(server: &TestServer, tenant: &str) -> v1::Consumption {
    let tenant = get_tenant(&mut server.admin().await, tenant)
        .await
        .expect("tenant");
    tenant.consumption.expect("consumption")
}

/// `pods` pods of `tenant` on one connection, each sending `per_pod`
/// requests (seq 1, 2, …) that report `report`, concurrently; every one
/// must be served.
async fn report_from_pods(
    server: &TestServer,
    tenant: &str,
    pods: u32,
    per_pod: u64,
    report: v1::Consumption,
) {
    let channel = server.channel().await;
    join_all((1..=pods).map(|instance| {
        let mut client =
            v1::token_bucket_service_client::TokenBucketServiceClient::new(channel.clone());
        async move {
            for seq in 1..=per_pod {
                client
                    .token_bucket(reporting(
                        pod_request(tenant, instance, "lease", seq),
                        report,
                    ))
                    .await
                    .expect("every report is served");
            }
        }
    }))
    .await;
}

/// Issue item 1: `(A, 3)`, `(B, 1)`, then a late copy of `(A, 3)`: the copy
/// is refused and counts nothing, and B's own retry is still a duplicate.
async fn a_late_copy_from_an_older_incarnation_counts_nothing(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut pods = server.pods().await;
    let a3 = reporting(pod_request("late", 1, "A", 3), units(1.0));
    let b1 = reporting(pod_request("late", 1, "B", 1), units(2.0));
    pods.token_bucket(a3.clone()).await.expect("A's request");
    let first_b = pods.token_bucket(b1.clone()).await.expect("B").into_inner();

    let late = pods.token_bucket(a3).await.expect_err("a late copy of A");
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");
    assert!(late.message().contains("newer incarnation"), "{late:?}");
    // A request of A that was never answered, and a lease A never used but
    // lower than B's (an attempt abandoned at a restart): refused too.
    for older in [
        reporting(pod_request("late", 1, "A", 4), units(5.0)),
        reporting(pod_request("late", 1, "A0", 1), units(5.0)),
    ] {
        let refused = pods.token_bucket(older).await.expect_err("older");
        assert_eq!(refused.code(), Code::FailedPrecondition);
    }
    let retry = pods.token_bucket(b1).await.expect("B's retry").into_inner();
    assert_eq!(
        retry, first_b,
        "B's retry is answered from the first answer"
    );
    assert_eq!(
        consumption(&server, "late").await.request_unit_micros,
        3_000_000
    );
    server.stop().await;
}

/// Issue item 2: a total past 2^63 - 1 saturates there on both stores; no
/// request fails and the store counts no failure.
async fn totals_saturate_at_the_bigint_range_without_a_store_failure(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    // 2^63 / 2^53 = 1024 reports of the largest counter reach the limit.
    let largest = v1::Consumption {
        read_bytes: 1 << 53,
        ..v1::Consumption::default()
    };
    report_from_pods(&server, "saturated", 8, 130, largest).await;
    let total = consumption(&server, "saturated").await;
    assert_eq!(total.read_bytes, i64::MAX as u64);
    assert_eq!(server.store.stats().failures, 0);
    server.stop().await;
}

/// Create the racing tenant (again), as an operator does.
async fn create_racing(admin: &mut v1::admin_client::AdminClient<tonic::transport::Channel>) {
    admin
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "racing".into(),
            available_tokens: 1_000.0,
            refill_rate: 1_000.0,
            burst_limit: 10_000.0,
            ..Default::default()
        })
        .await
        .expect("create");
}

/// Issue item 3: pods keep sending while the tenant is deleted and
/// created again every 10 ms. Every request sees the tenant before or
/// after a delete: served, or refused as deleted (never re-creating it),
/// and the instance list is whole at the end. The race runs until it has
/// served 50 requests across 5 deletes, however slow the machine (at most
/// 30 s), rather than for a fixed time.
async fn requests_racing_delete_tenant_see_it_before_or_after(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut admin = server.admin().await;
    create_racing(&mut admin).await;
    let channel = server.channel().await;
    let give_up_at = tokio::time::Instant::now() + Duration::from_secs(30);
    let served_so_far = Arc::new(AtomicU64::new(0));
    let racing = Arc::new(AtomicBool::new(true));
    let pods = (1..=8u32).map(|instance| {
        let mut pods =
            v1::token_bucket_service_client::TokenBucketServiceClient::new(channel.clone());
        let (served_so_far, racing) = (served_so_far.clone(), racing.clone());
        tokio::spawn(async move {
            let (mut served, mut refused) = (0u64, 0u64);
            let mut seq = 0;
            while racing.load(Ordering::Relaxed) {
                seq += 1;
                match pods
                    .token_bucket(pod_request("racing", instance, "lease", seq))
                    .await
                {
                    Ok(_) => {
                        served += 1;
                        served_so_far.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status)
                        if status.code() == Code::NotFound
                            && status.message().contains("was deleted at") =>
                    {
                        refused += 1
                    }
                    Err(status) => panic!("instance {instance} seq {seq}: {status:?}"),
                }
            }
            (served, refused)
        })
    });
    let pods: Vec<_> = pods.collect();
    let mut deletes = 0;
    while (served_so_far.load(Ordering::Relaxed) <= 50 || deletes <= 5)
        && tokio::time::Instant::now() < give_up_at
    {
        match admin
            .delete_tenant(v1::DeleteTenantRequest {
                tenant_id: "racing".into(),
                dry_run: false,
            })
            .await
        {
            Ok(_) => deletes += 1,
            Err(status) => assert_eq!(status.code(), Code::NotFound, "{status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        create_racing(&mut admin).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    racing.store(false, Ordering::Relaxed);
    let (mut served, mut refused) = (0, 0);
    for pod in pods {
        let (s, r) = pod.await.expect("pod task");
        served += s;
        refused += r;
    }
    assert!(
        served > 50 && deletes > 5,
        "{served} served, {refused} refused, {deletes} deletes"
    );
    // One more request per pod, then the list must hold all eight, in order.
    let mut pods = server.pods().await;
    for instance in 1..=8 {
        pods.token_bucket(pod_request("racing", instance, "lease", 1_000_000))
            .await
            .expect("served");
    }
    let tenant = get_tenant(&mut admin, "racing").await.expect("tenant");
    let ids: Vec<u32> = tenant.instances.iter().map(|i| i.instance_id).collect();
    assert_eq!(ids, (1..=8).collect::<Vec<_>>());
    assert_eq!(tenant.live_instances, 8);
    assert_eq!(server.store.stats().failures, 0);
    server.stop().await;
}

/// Instance rows without a tenant row, as versions that deleted tenants
/// without locking them left behind: a new tenant starts without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_a_new_tenant_drops_stray_instance_rows() {
    let backing = Backing::new(Backend::Postgres).await;
    let server = TestServer::start(backing.open(BucketSettings::default()).await).await;
    let url = backing.url().expect("PostgreSQL");
    let client = tollgate_testdb::connect(url).await.expect("connect");
    for (id, next) in [(2i64, 3i64), (3, 0)] {
        client
            .execute(
                "INSERT INTO tenant_usage (tenant_id, instance_id, next_instance_id, lease, seq, \
                 shares, last_update, committed_rate, committed_until, last_grant_tokens, \
                 last_grant_trickle_nanos, last_grant_max_burst, last_grant_fallback_rate) \
                 VALUES ('stray', $1, $2, 'x', 1, 1, now(), 0, now(), 0, 0, 0, 0)",
                &[&id, &next],
            )
            .await
            .expect("insert a stray row");
    }
    let mut pods = server.pods().await;
    pods.token_bucket(pod_request("stray", 1, "lease", 1))
        .await
        .expect("served");
    pods.token_bucket(pod_request("stray", 3, "lease", 1))
        .await
        .expect("instance 3 starts anew");
    let rows: Vec<i64> = client
        .query(
            "SELECT instance_id FROM tenant_usage WHERE tenant_id = 'stray' ORDER BY 1",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, vec![0, 1, 3]);
    server.stop().await;
    drop(backing);
}

async fn send_raw(
    server: &TestServer,
    path: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    support::raw::unary(server.channel().await, path, tonic::Request::new(body)).await
}

/// Sends one call over a bare HTTP/2 connection with `headers` as they are
/// (a tonic client would enforce a `grpc-timeout` itself, before the
/// server could), and returns the status the server answered.
async fn call_h2(
    server: &TestServer,
    path: &str,
    headers: &[(&str, &str)],
    message: &impl prost::Message,
) -> tonic::Status {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let encoded = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(encoded.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&encoded);
    let mut request = http::Request::post(format!("http://{}{path}", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(framed)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    if let Some(status) = tonic::Status::from_header_map(&parts.headers) {
        return status;
    }
    let trailers = body
        .collect()
        .await
        .expect("body")
        .trailers()
        .cloned()
        .unwrap_or_default();
    tonic::Status::from_header_map(&trailers).expect("a status in the trailers")
}

/// Issue item 4: bytes that are not the message are INVALID_ARGUMENT, and a
/// message over the limit is RESOURCE_EXHAUSTED, on every method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_messages_are_the_clients_error() {
    let server = TestServer::new(Backend::Embedded, BucketSettings::default()).await;
    let undecodable: [(&str, Vec<u8>); 5] = [
        ("invalid UTF-8 in tenant_id", vec![0x0a, 0x02, 0xff, 0xfe]),
        ("truncated varint", vec![0x18, 0xff]),
        ("wrong wire type for tenant_id", vec![0x08, 0x01]),
        ("field number 0", vec![0x00, 0x01]),
        ("length beyond the message", vec![0x0a, 0x7f, 0x61]),
    ];
    for path in [
        "/tollgate.v1.TokenBucketService/TokenBucket",
        "/tollgate.v1.Admin/GetTenant",
        "/tollgate.v1.Admin/UpdateTenantResourceLimits",
        "/tollgate.v1.Admin/ListTenants",
        "/tollgate.v1.Admin/DeleteTenant",
    ] {
        for (what, body) in &undecodable {
            let status = match send_raw(&server, path, body.clone()).await {
                Err(status) => status,
                // ListTenants' field 1 is a number: some bytes are valid there.
                Ok(_) if path.ends_with("ListTenants") => continue,
                Ok(answer) => panic!("{path}, {what}: answered {answer:?}"),
            };
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{path}, {what}: {status:?}"
            );
        }
        let too_large = send_raw(&server, path, vec![0; 5 << 20])
            .await
            .expect_err("too large");
        assert_eq!(
            too_large.code(),
            Code::ResourceExhausted,
            "{path}: {too_large:?}"
        );
    }
    assert_eq!(server.store.stats().failures, 0);
    server.stop().await;
}

/// Issue item 5: a deadline that passed before the request started is
/// answered DEADLINE_EXCEEDED and the request is not applied; the retry
/// with the same identity is applied once.
async fn an_expired_deadline_is_deadline_exceeded_and_nothing_is_applied(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut pods = server.pods().await;
    let request = reporting(pod_request("deadline", 1, "lease", 1), units(4.0));
    let status = call_h2(
        &server,
        "/tollgate.v1.TokenBucketService/TokenBucket",
        &[("grpc-timeout", "1n")],
        &request,
    )
    .await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let mut admin = server.admin().await;
    let missing = get_tenant(&mut admin, "deadline")
        .await
        .expect_err("nothing was applied, not even the tenant");
    assert_eq!(missing.code(), Code::NotFound);
    pods.token_bucket(request.clone()).await.expect("the retry");
    pods.token_bucket(request).await.expect("a duplicate");
    assert_eq!(
        consumption(&server, "deadline").await.request_unit_micros,
        4_000_000
    );
    server.stop().await;
}

/// Issue item 6: `as_of_consumed_tokens` may be any value up to the total,
/// however large.
async fn as_of_consumed_tokens_may_be_the_whole_total(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut pods = server.pods().await;
    for seq in 1..=2 {
        pods.token_bucket(reporting(pod_request("big", 1, "lease", seq), units(1e12)))
            .await
            .expect("the largest report");
    }
    let mut admin = server.admin().await;
    let mut update = v1::UpdateTenantResourceLimitsRequest {
        tenant_id: "big".into(),
        available_tokens: 10.0,
        refill_rate: 0.0,
        burst_limit: 10.0,
        as_of: Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        }),
        as_of_consumed_tokens: 2e12,
        ..v1::UpdateTenantResourceLimitsRequest::default()
    };
    let tenant = admin
        .update_tenant_resource_limits(update.clone())
        .await
        .expect("the whole total is a valid as_of_consumed_tokens")
        .into_inner()
        .tenant
        .expect("tenant");
    assert_eq!(tenant.current_tokens, 10.0);
    update.as_of_consumed_tokens = 2e12 + 1.0;
    let status = admin
        .update_tenant_resource_limits(update)
        .await
        .expect_err("beyond the total");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("as_of_consumed_tokens"),
        "{status:?}"
    );
    server.stop().await;
}

/// Issue items 7 and 8: refused values are quoted briefly, numbers short,
/// lengths in characters, durations strictly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_quote_what_they_refuse_briefly_and_exactly() {
    let server = TestServer::new(Backend::Embedded, BucketSettings::default()).await;
    let mut pods = server.pods().await;
    let mut admin = server.admin().await;
    let huge = "b".repeat(100_000);

    let mut request = pod_request("acme", 1, "lease", 1);
    request.bucket.clone_from(&huge);
    let status = pods
        .token_bucket(request)
        .await
        .expect_err("unknown bucket");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().len() < 300, "{}", status.message());
    let status = admin
        .get_tenant(v1::GetTenantRequest {
            tenant_id: "acme".into(),
            bucket: huge.clone(),
        })
        .await
        .expect_err("unknown bucket");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = admin
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "acme".into(),
            bucket: huge,
            ..v1::UpdateTenantResourceLimitsRequest::default()
        })
        .await
        .expect_err("unknown bucket");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    let mut request = pod_request("acme", 1, "lease", 1);
    request.requested_tokens = -1e-300;
    let status = pods.token_bucket(request).await.expect_err("negative");
    assert_eq!(
        status.message(),
        "requested_tokens: must be >= 0, got -1e-300"
    );

    let status = pods
        .token_bucket(pod_request(&"é".repeat(65), 1, "lease", 1))
        .await
        .expect_err("not ASCII");
    assert!(status.message().contains("found 'é'"), "{status:?}");

    for (seconds, nanos) in [(1, 2_000_000_000), (1, -1), (-1, 0)] {
        let mut request = pod_request("acme", 1, "lease", 1);
        request.target_request_period = Some(prost_types::Duration { seconds, nanos });
        let status = pods.token_bucket(request).await.expect_err("unnormalized");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{seconds} s {nanos} ns"
        );
        assert!(
            status.message().starts_with("target_request_period"),
            "{status:?}"
        );
    }
    server.stop().await;
}

/// Issue item 9: fractional reports sum exactly, whatever their number.
async fn fractional_reports_sum_exactly(backend: Backend) {
    let server = TestServer::new(backend, BucketSettings::default()).await;
    let mut report = units(0.1);
    report.cpu_seconds = 0.001;
    report_from_pods(&server, "exact", 10, 200, report).await;
    let total = consumption(&server, "exact").await;
    assert_eq!(total.request_unit_micros, 200_000_000);
    assert_eq!(total.request_units, 200.0);
    assert_eq!(total.cpu_micros, 2_000_000);
    assert_eq!(total.cpu_seconds, 2.0);
    // Exact micro-units may be sent as well, and must agree with the double.
    let mut pods = server.pods().await;
    let exact = v1::Consumption {
        request_unit_micros: 1,
        ..v1::Consumption::default()
    };
    pods.token_bucket(reporting(pod_request("exact", 11, "lease", 1), exact))
        .await
        .expect("one micro-unit");
    let disagreeing = v1::Consumption {
        request_units: 1.0,
        request_unit_micros: 7,
        ..v1::Consumption::default()
    };
    let status = pods
        .token_bucket(reporting(pod_request("exact", 11, "lease", 2), disagreeing))
        .await
        .expect_err("the two forms disagree");
    assert!(
        status
            .message()
            .starts_with("consumption_since_last_request.request_unit_micros"),
        "{status:?}"
    );
    assert_eq!(
        consumption(&server, "exact").await.request_unit_micros,
        200_000_001
    );
    server.stop().await;
}

for_each_store!(
    a_late_copy_from_an_older_incarnation_counts_nothing,
    totals_saturate_at_the_bigint_range_without_a_store_failure,
    requests_racing_delete_tenant_see_it_before_or_after,
    an_expired_deadline_is_deadline_exceeded_and_nothing_is_applied,
    as_of_consumed_tokens_may_be_the_whole_total,
    fractional_reports_sum_exactly,
);
