//! Graceful shutdown under load: once the shutdown signal arrives the
//! server stops accepting, but every request it accepted is answered, and
//! nothing is applied without its answer reaching the pod. Run on both
//! stores.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{Backend, Backing};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_core::TenantId;
use tollgate_proto::v1::{self, token_bucket_service_client::TokenBucketServiceClient};
use tollgate_server::store::BucketSettings;
use tollgate_server::telemetry::Telemetry;
use tonic::transport::Channel;

const PODS: u32 = 32;

async fn in_flight_requests_are_answered_at_shutdown(backend: Backend) {
    let backing = Backing::new(backend).await;
    let store = backing.open(BucketSettings::default()).await;
    let telemetry = Telemetry::new().expect("telemetry");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(tollgate_server::run_with_telemetry(
        listener,
        Arc::clone(&store),
        telemetry.clone(),
        async {
            let _ = stopped.await;
        },
    ));

    // Pods on four connections, each sending requests back to back.
    let mut channels = Vec::new();
    for _ in 0..4 {
        channels.push(
            Channel::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect()
                .await
                .expect("connect"),
        );
    }
    let halt = Arc::new(AtomicBool::new(false));
    let pods: Vec<_> = (1..=PODS)
        .map(|instance| {
            let mut client = TokenBucketServiceClient::new(channels[instance as usize % 4].clone());
            let halt = Arc::clone(&halt);
            tokio::spawn(async move {
                let (mut answered, mut units, mut refused) = (0u64, 0.0f64, Vec::new());
                let mut seq = 0;
                while !halt.load(Ordering::Relaxed) {
                    seq += 1;
                    let ru = f64::from(instance);
                    let request = v1::TokenBucketRequest {
                        tenant_id: format!("drain-{}", instance % 2),
                        instance_id: instance,
                        instance_lease: b"lease".to_vec(),
                        seq,
                        requested_tokens: 5.0,
                        shares: 1.0,
                        consumption_since_last_request: Some(v1::Consumption {
                            request_units: ru,
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    match client.token_bucket(request).await {
                        Ok(_) => {
                            answered += 1;
                            units += ru;
                        }
                        Err(status) => {
                            refused.push(status);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
                (instance, answered, units, refused)
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(700)).await;
    let _ = stop.send(());
    server
        .await
        .expect("server task")
        .expect("the server drained and stopped");
    // Let the pods notice the server is gone, then stop them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    halt.store(true, Ordering::Relaxed);

    let mut confirmed = [0.0f64; 2];
    let mut answered_total = 0;
    for pod in pods {
        let (instance, answered, units, refused) = pod.await.expect("pod");
        assert!(
            answered > 0,
            "pod {instance} was served before the shutdown"
        );
        answered_total += answered;
        confirmed[(instance % 2) as usize] += units;
        for status in refused {
            // Refusals come from the client's own transport (a closed
            // connection, a stream above the server's GOAWAY), never from
            // the server: they carry the local error as their source.
            use std::error::Error;
            assert!(
                status.code() == tonic::Code::Unavailable || status.source().is_some(),
                "only refused connections after the shutdown, got {status:?}"
            );
        }
    }
    // Everything applied was answered, and everything answered was applied.
    for (t, confirmed) in confirmed.iter().enumerate() {
        let tenant = TenantId::parse("t", &format!("drain-{t}")).expect("id");
        let stored = store
            .get_bucket(&tollgate_core::BucketKey::request_units(tenant.clone()))
            .await
            .expect("tenant")
            .head
            .totals;
        assert_eq!(
            stored.consumption.request_units(),
            *confirmed,
            "tenant {tenant}"
        );
    }
    let text = telemetry
        .metrics
        .render(store.as_ref())
        .await
        .expect("metrics");
    let served: f64 = text
        .lines()
        .find(|l| l.starts_with("tollgate_rpc_requests_total{code=\"OK\",method=\"TokenBucket\"}"))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .expect("OK count");
    assert_eq!(
        served, answered_total as f64,
        "answers sent = answers received"
    );
    store.close().await.expect("close");
    drop(backing);
}

for_each_store!(in_flight_requests_are_answered_at_shutdown);
