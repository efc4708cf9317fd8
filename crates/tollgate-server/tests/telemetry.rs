//! What operators watch, from a real server: `/metrics` after traffic for
//! two tenants (checked against the store's own totals, and by `promtool
//! check metrics` where it is installed), gRPC health, `/healthz` and
//! `/readyz`, gRPC reflection, and the process's own series. Run on both
//! stores. The exported families are checked against
//! `deploy/metric-names.txt`, the list the dashboard and the rules are
//! checked against too.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use support::{Backend, Backing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tollgate_core::{BucketKey, TenantId};
use tollgate_proto::v1::key_limits_client::KeyLimitsClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_proto::v1::{self, admin_client::AdminClient};
use tollgate_server::service::AdminAuth;
use tollgate_server::store::{BucketSettings, Store};
use tollgate_server::telemetry::{Telemetry, serve_http};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A server with its HTTP side.
struct Observed {
    grpc: SocketAddr,
    http: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    store: Arc<dyn Store>,
    telemetry: Telemetry,
    _backing: Backing,
}

async fn start(backend: Backend) -> Observed {
    let backing = Backing::new(backend).await;
    let store = backing.open(BucketSettings::default()).await;
    let telemetry = Telemetry::new().expect("telemetry");
    let grpc_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (grpc, http) = (
        grpc_listener.local_addr().expect("addr"),
        http_listener.local_addr().expect("addr"),
    );
    let (stop, stopped) = watch::channel(false);
    let signal = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let tasks = vec![
        tokio::spawn({
            let (store, telemetry, signal) = (
                Arc::clone(&store),
                telemetry.clone(),
                signal(stopped.clone()),
            );
            async move {
                tollgate_server::run_with_telemetry(grpc_listener, store, telemetry, signal)
                    .await
                    .expect("gRPC server ran");
            }
        }),
        tokio::spawn({
            let (store, telemetry, signal) =
                (Arc::clone(&store), telemetry.clone(), signal(stopped));
            async move {
                serve_http(
                    http_listener,
                    store,
                    telemetry,
                    AdminAuth::default(),
                    signal,
                )
                .await
                .expect("HTTP server ran");
            }
        }),
    ];
    Observed {
        grpc,
        http,
        stop,
        tasks,
        store,
        telemetry,
        _backing: backing,
    }
}

impl Observed {
    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    /// GET `path`: the status code and body.
    async fn get(&self, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(self.http).await.expect("connect");
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
            .await
            .expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status code");
        (code, body.to_owned())
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.await.expect("server task");
        }
        self.store.close().await.expect("close");
    }
}

/// `name{labels}` → value, from the text format.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn pod_request(tenant: &str, instance: u32, seq: u64, ru: f64) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        instance_id: instance,
        instance_lease: b"lease".to_vec(),
        seq,
        requested_tokens: 50.0,
        shares: 1.0,
        consumption_since_last_request: Some(v1::Consumption {
            request_units: ru,
            read_batches: 1,
            read_requests: 2,
            read_bytes: 300,
            write_batches: 1,
            write_requests: 4,
            write_bytes: 500,
            cpu_seconds: 0.25,
            egress_bytes: 60,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn metrics_match_the_store_after_traffic(backend: Backend) {
    let server = start(backend).await;
    let channel = server.channel().await;
    let mut admin = AdminClient::new(channel.clone());
    let mut pods = TokenBucketServiceClient::new(channel);
    admin
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "alpha".into(),
            available_tokens: 100.0,
            refill_rate: 10.0,
            burst_limit: 500.0,
            ..Default::default()
        })
        .await
        .expect("configure alpha");
    // Alpha's request-unit bucket has a budget it stays well within.
    admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "alpha".into(),
            budget: Some(v1::Budget {
                amount: 1e6,
                cycle: Some(v1::BudgetCycle {
                    period: v1::BudgetPeriod::Daily.into(),
                    ..Default::default()
                }),
                at_limit: v1::BudgetAtLimit::Stop.into(),
                ..Default::default()
            }),
        })
        .await
        .expect("budget for alpha");
    // Beta belongs to organisation holding, whose bucket it draws from.
    admin
        .create_organization(v1::CreateOrganizationRequest {
            organization_id: "holding".into(),
            display_name: String::new(),
        })
        .await
        .expect("create holding");
    admin
        .update_tenant_resource_limits(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "holding".into(),
            available_tokens: 1_000.0,
            refill_rate: 100.0,
            burst_limit: 1_000.0,
            ..Default::default()
        })
        .await
        .expect("configure holding");
    admin
        .add_organization_member(v1::AddOrganizationMemberRequest {
            organization_id: "holding".into(),
            member_id: "beta".into(),
            guaranteed_rates: Default::default(),
        })
        .await
        .expect("beta joins holding");
    let mut answered = 0;
    for seq in 1..=5 {
        for instance in 1..=3 {
            pods.token_bucket(pod_request("alpha", instance, seq, f64::from(instance)))
                .await
                .expect("alpha");
            answered += 1;
        }
        pods.token_bucket(pod_request("beta", 7, seq, 2.5))
            .await
            .expect("beta");
        answered += 1;
    }
    let refused = pods
        .token_bucket(pod_request("", 1, 1, 1.0))
        .await
        .expect_err("no tenant id");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    // Per-key checks: tenant gamma's logins, 4 tokens a time from a burst
    // of 10 (allowed, allowed, refused).
    admin
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: "gamma".into(),
            bucket: Some(v1::BucketDefinition {
                quota: None,
                bucket: "logins".into(),
                refill_rate: 0.001,
                burst_limit: 10.0,
                initial_tokens: None,
                kind: v1::BucketKind::PerKey as i32,
                enforce: None,
            }),
        })
        .await
        .expect("per-key override");
    let mut checks = KeyLimitsClient::new(server.channel().await);
    for _ in 0..3 {
        checks
            .check(v1::CheckRequest {
                items: vec![v1::CheckItem {
                    tenant_id: "gamma".into(),
                    bucket: "logins".into(),
                    key: "203.0.113.7".into(),
                    tokens: 4.0,
                    request_id: String::new(),
                }],
            })
            .await
            .expect("check");
    }

    let (code, text) = server.get("/metrics").await;
    assert_eq!(code, 200, "{text}");
    let m = samples(&text);
    for tenant in ["alpha", "beta"] {
        let stored = server
            .store
            .get_bucket(&BucketKey::request_units(
                TenantId::parse("t", tenant).expect("id"),
            ))
            .await
            .expect("stored")
            .head;
        let c = &stored.totals.consumption;
        let expect = [
            ("request_units_total", c.request_units()),
            ("read_batches_total", c.read_batches as f64),
            ("read_requests_total", c.read_requests as f64),
            ("read_bytes_total", c.read_bytes as f64),
            ("write_batches_total", c.write_batches as f64),
            ("write_requests_total", c.write_requests as f64),
            ("write_bytes_total", c.write_bytes as f64),
            ("cpu_seconds_total", c.cpu_seconds()),
            ("egress_bytes_total", c.egress_bytes as f64),
            ("granted_tokens_total", stored.totals.granted_tokens),
            ("refill_rate", stored.state.limits.refill_rate),
            ("burst_limit", stored.state.limits.burst_limit),
            ("instances", f64::from(stored.members.live_instances)),
        ];
        for (name, value) in expect {
            let key = format!("tollgate_tenant_{name}{{bucket=\"\",tenant_id=\"{tenant}\"}}");
            assert_eq!(m.get(&key), Some(&value), "{key} in\n{text}");
        }
        assert!(
            c.request_units() > 0.0 && c.read_batches == 5 * stored.members.live_instances as u64
        );
        let tokens = m[&format!("tollgate_tenant_tokens{{bucket=\"\",tenant_id=\"{tenant}\"}}")];
        assert!(
            tokens <= stored.state.limits.burst_limit.max(stored.state.tokens),
            "{tokens}"
        );
    }
    assert_eq!(
        m["tollgate_tenant_request_units_total{bucket=\"\",tenant_id=\"alpha\"}"],
        30.0
    );
    assert_eq!(
        m["tollgate_tenant_request_units_total{bucket=\"\",tenant_id=\"beta\"}"],
        12.5
    );
    // The budget's gauges: alpha's only.
    let alpha = server
        .store
        .get_bucket(&BucketKey::request_units(
            TenantId::parse("t", "alpha").expect("id"),
        ))
        .await
        .expect("stored")
        .head;
    let budget = |name: &str, tenant: &str| {
        m.get(&format!(
            "tollgate_budget_{name}{{bucket=\"\",tenant_id=\"{tenant}\"}}"
        ))
        .copied()
    };
    assert_eq!(budget("amount_tokens", "alpha"), Some(1e6));
    assert_eq!(
        budget("spend_tokens", "alpha"),
        Some(alpha.totals.granted_tokens),
        "every grant since the budget was set"
    );
    assert_eq!(budget("limit_reached", "alpha"), Some(0.0));
    assert!(budget("forecast_tokens", "alpha").is_some_and(|f| f >= alpha.totals.granted_tokens));
    assert_eq!(budget("amount_tokens", "beta"), None, "beta has no budget");
    // Beta's draws from holding, as the store has them.
    let beta = server
        .store
        .get_bucket(&BucketKey::request_units(
            TenantId::parse("t", "beta").expect("id"),
        ))
        .await
        .expect("stored")
        .head;
    let draw = beta.draw.as_deref().expect("beta drew from holding");
    let member = |name: &str| {
        m.get(&format!(
            "tollgate_member_{name}{{bucket=\"\",organization=\"holding\",tenant_id=\"beta\"}}"
        ))
        .copied()
    };
    assert_eq!(member("draws_total"), Some(draw.draws as f64), "{text}");
    assert_eq!(member("wanted_rate"), Some(draw.wants));
    assert!(member("drawn_rate").is_some());
    assert_eq!(member("draws_total").map(|d| d >= 1.0), Some(true));
    assert!(
        !m.keys()
            .any(|k| k.starts_with("tollgate_member_") && k.contains("alpha")),
        "alpha belongs to no organisation"
    );
    // Alpha, beta and holding (whose bucket is a tenant's).
    assert_eq!(m["tollgate_tenants"], 3.0);
    assert_eq!(m["tollgate_store_up"], 1.0);
    assert_eq!(
        m["tollgate_rpc_requests_total{code=\"OK\",method=\"TokenBucket\"}"],
        f64::from(answered)
    );
    assert_eq!(
        m["tollgate_rpc_requests_total{code=\"INVALID_ARGUMENT\",method=\"TokenBucket\"}"],
        1.0
    );
    assert_eq!(
        m["tollgate_rpc_duration_seconds_count{code=\"OK\",method=\"TokenBucket\"}"],
        f64::from(answered)
    );
    let grants: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("tollgate_token_bucket_grants_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(grants, f64::from(answered));
    assert_eq!(
        m["tollgate_key_checks_total{bucket=\"logins\",tenant_id=\"gamma\",verdict=\"allowed\"}"],
        2.0
    );
    assert_eq!(
        m["tollgate_key_checks_total{bucket=\"logins\",tenant_id=\"gamma\",verdict=\"refused\"}"],
        1.0
    );
    assert_eq!(m["tollgate_stored_keys"], 1.0);
    assert!(m["tollgate_store_transactions_total"] >= 1.0);
    assert_eq!(m["tollgate_store_failures_total"], 0.0);
    // Every request answered waited in a queue once (the embedded store
    // also queues its other writes), and transactions committed.
    let stage = |stage: &str, part: &str| {
        m[&format!("tollgate_store_stage_seconds_{part}{{stage=\"{stage}\"}}")]
    };
    assert!(stage("queued", "count") >= f64::from(answered));
    assert!(stage("commit", "count") >= 1.0);
    for name in ["queued", "begin", "read", "write", "commit"] {
        let inf =
            m[&format!("tollgate_store_stage_seconds_bucket{{stage=\"{name}\",le=\"+Inf\"}}")];
        assert_eq!(
            inf,
            stage(name, "count"),
            "{name}: +Inf bucket is the count"
        );
        assert!(stage(name, "sum") >= 0.0);
    }
    assert!(stage("commit", "sum") > 0.0);
    assert!(m.contains_key("tollgate_build_info{version=\"0.1.0\"}"));
    promtool_accepts(&text);
    exported_as_listed(&text);
    server.stop().await;
}

/// The families exported are exactly those `deploy/metric-names.txt` lists
/// (which the dashboard, the alert rules and the docs are checked against),
/// with the types it gives.
fn exported_as_listed(text: &str) {
    let listed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/metric-names.txt"
    ))
    .expect("deploy/metric-names.txt");
    let listed: BTreeMap<String, String> = listed
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut fields = l.split_whitespace();
            let name = fields.next().expect("name").to_owned();
            let kind = fields.next().expect("type").to_owned();
            (name, kind)
        })
        .collect();
    let exported: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some((name.to_owned(), kind.to_owned()))
        })
        .collect();
    assert_eq!(
        exported, listed,
        "exported families vs deploy/metric-names.txt"
    );
}

/// `promtool check metrics` finds nothing to complain about, where
/// promtool is installed (CI installs it).
fn promtool_accepts(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        assert!(
            std::env::var_os("TOLLGATE_REQUIRE_PROMTOOL").is_none(),
            "TOLLGATE_REQUIRE_PROMTOOL is set but promtool cannot be run"
        );
        eprintln!("promtool is not installed: the metrics lint is left to CI");
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
}

async fn health_readiness_and_reflection(backend: Backend) {
    let server = start(backend).await;
    let channel = server.channel().await;
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "tollgate.v1.TokenBucketService", "tollgate.v1.Admin"] {
        let mut status = ServingStatus::Unknown;
        for _ in 0..100 {
            status = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health check")
                .into_inner()
                .status();
            if status == ServingStatus::Serving {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(status, ServingStatus::Serving, "service {service:?}");
    }
    assert_eq!(server.get("/healthz").await.0, 200);
    assert_eq!(server.get("/readyz").await.0, 200);
    assert_eq!(server.get("/nothing-here").await.0, 404);

    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream_once(request))
        .await
        .expect("reflection")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("answer")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "tollgate.v1.TokenBucketService",
        "tollgate.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    server.stop().await;
}

/// `/metrics` carries the process's own series beside Tollgate's: CPU,
/// memory, file descriptors, threads and start time, as every Prometheus
/// exporter does (the process is the store-agnostic server, so the
/// embedded store is enough).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_the_process_series() {
    let server = start(Backend::Embedded).await;
    let (code, text) = server.get("/metrics").await;
    assert_eq!(code, 200, "{text}");
    let m = samples(&text);
    for (name, at_least) in [
        ("process_cpu_seconds_total", 0.0),
        ("process_resident_memory_bytes", 1.0),
        ("process_virtual_memory_bytes", 1.0),
        ("process_open_fds", 1.0),
        ("process_max_fds", 1.0),
        ("process_threads", 1.0),
        ("process_start_time_seconds", 1.0),
    ] {
        let value = m.get(name).unwrap_or_else(|| panic!("{name} in\n{text}"));
        assert!(*value >= at_least, "{name} = {value}");
    }
    assert!(
        text.contains("# TYPE process_cpu_seconds_total counter"),
        "{text}"
    );
    server.stop().await;
}

fn tokio_stream_once<T: Send + 'static>(item: T) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::iter([item])
}

/// Scrapes within the interval are served the last read of the store;
/// a scrape after it (here: with the interval at zero) reads it again.
async fn tenant_metrics_are_read_at_most_once_per_interval(backend: Backend) {
    let server = start(backend).await;
    let mut pods = TokenBucketServiceClient::new(server.channel().await);
    let consumed = "tollgate_tenant_request_units_total{bucket=\"\",tenant_id=\"acme\"}";
    let scrape = || async {
        let (code, body) = server.get("/metrics").await;
        assert_eq!(code, 200);
        samples(&body)
    };
    pods.token_bucket(pod_request("acme", 1, 1, 5.0))
        .await
        .expect("first report");
    assert_eq!(scrape().await[consumed], 5.0);
    pods.token_bucket(pod_request("acme", 1, 2, 7.0))
        .await
        .expect("second report");
    let cached = scrape().await;
    assert_eq!(cached[consumed], 5.0, "served the last read");
    assert_eq!(cached["tollgate_store_up"], 1.0);
    server
        .telemetry
        .metrics
        .set_store_read_interval(Duration::ZERO);
    assert_eq!(scrape().await[consumed], 12.0, "read again");
    server.stop().await;
}

/// A tier of one per-key bucket, enforced or in shadow mode.
fn shadow_tier(enforce: Option<bool>) -> v1::PutTierRequest {
    v1::PutTierRequest {
        tier: Some(v1::Tier {
            name: "shadowed".into(),
            buckets: vec![v1::BucketDefinition {
                bucket: "per-user".into(),
                refill_rate: 0.0001,
                burst_limit: 5.0,
                kind: v1::BucketKind::PerKey.into(),
                enforce,
                ..Default::default()
            }],
            ..Default::default()
        }),
        dry_run: false,
    }
}

/// The value of `family` for the series whose labels include every one of
/// `labels` (0 if there is none).
fn series(text: &str, family: &str, labels: &[&str]) -> f64 {
    samples(text)
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with(&format!("{family}{{")) && labels.iter().all(|l| k.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

/// A per-key bucket in shadow mode (`enforce: false`), checked through
/// `KeyLimits/Check` and Envoy's `ShouldRateLimit`: nothing is refused,
/// the answers past the burst are marked `shadow_refused`, the keys are
/// left as enforcing leaves them, `/metrics` counts exactly what would
/// have been refused, and so does the console; set back to enforcing,
/// the next check is refused where enforcing left the key.
async fn shadow_buckets_refuse_nothing_and_count_what_they_would_have(backend: Backend) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let server = start(backend).await;
    let channel = server.channel().await;
    let mut admin = AdminClient::new(channel.clone());
    admin
        .put_tier(shadow_tier(Some(false)))
        .await
        .expect("a shadow tier");
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "shadowed".into(),
        })
        .await
        .expect("onboard");

    // Native checks: 5 within the burst, 7 beyond it, none refused.
    let mut checks = KeyLimitsClient::new(channel.clone());
    let check = |key: &str| v1::CheckRequest {
        items: vec![v1::CheckItem {
            tenant_id: "acme".into(),
            bucket: "per-user".into(),
            key: key.into(),
            tokens: 1.0,
            ..Default::default()
        }],
    };
    for n in 1..=12 {
        let answer = checks
            .check(check("u1"))
            .await
            .expect("a check")
            .into_inner();
        assert!(answer.allowed, "check {n}: {answer:?}");
        let item = &answer.answers[0];
        assert_eq!(item.shadow_refused, n > 5, "check {n}: {item:?}");
        let left = (5.0 - f64::from(n.min(5))).max(0.0);
        assert!(
            (item.remaining_tokens - left).abs() < 0.01,
            "check {n}: {item:?}"
        );
    }
    // Envoy: 5 within the burst of another key, 3 beyond.
    let mut envoy = RateLimitServiceClient::new(channel.clone());
    for n in 1..=8 {
        let answer = envoy
            .should_rate_limit(RateLimitRequest {
                domain: "acme".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "generic_key".into(),
                            value: "per-user".into(),
                        },
                        Entry {
                            key: "user".into(),
                            value: "u2".into(),
                        },
                    ],
                    ..Default::default()
                }],
                hits_addend: 1,
            })
            .await
            .expect("Envoy's check")
            .into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32, "call {n}: {answer:?}");
    }

    // What would have been refused: exactly the 7 and the 3.
    let (code, text) = server.get("/metrics").await;
    assert_eq!(code, 200);
    let count = |verdict: &str| {
        series(
            &text,
            "tollgate_key_checks_total",
            &[
                "tenant_id=\"acme\"",
                "bucket=\"per-user\"",
                &format!("verdict=\"{verdict}\""),
            ],
        )
    };
    assert_eq!(count("shadow_refused"), 10.0, "{text}");
    assert_eq!(count("allowed"), 10.0, "{text}");
    assert_eq!(count("refused"), 0.0, "{text}");
    let (code, body) = server.get("/console/api/buckets").await;
    assert_eq!(code, 200, "{body}");
    let console: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let per_user = &console["key_buckets"][0];
    assert_eq!(per_user["enforce"], false, "{console}");
    let window = per_user["rate_window_seconds"].as_f64().expect("window");
    let would = per_user["shadow_refusals_per_second"]
        .as_f64()
        .expect("rate")
        * window;
    assert!((would - 10.0).abs() < 1e-6, "{console}");
    assert_eq!(per_user["refusals_per_second"], 0.0, "{console}");

    // Enforcing again: the keys are where enforcing left them.
    admin
        .put_tier(shadow_tier(None))
        .await
        .expect("enforced again");
    let answer = checks
        .check(check("u1"))
        .await
        .expect("a check")
        .into_inner();
    assert!(!answer.allowed, "{answer:?}");
    assert!(!answer.answers[0].shadow_refused);
    assert!(answer.answers[0].remaining_tokens < 0.01, "{answer:?}");
    let answer = checks
        .check(check("u3"))
        .await
        .expect("a check")
        .into_inner();
    assert!(answer.allowed, "a fresh key is full: {answer:?}");
    server.stop().await;
}

for_each_store!(
    metrics_match_the_store_after_traffic,
    health_readiness_and_reflection,
    tenant_metrics_are_read_at_most_once_per_interval,
    shadow_buckets_refuse_nothing_and_count_what_they_would_have,
);
