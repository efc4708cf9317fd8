//! Envoy's `ShouldRateLimit` answered by the agent, from the wire with
//! envoy-types' generated client (Envoy's published proto), against a real
//! server: a lone `generic_key` descriptor is answered from the tenant's
//! shared bucket, locally, and its verdicts follow the bucket; per-key
//! descriptors go to the server; a check is taken all or none (the local
//! tokens given back when the server refuses, and the server not asked
//! when a local bucket is short); refusals name the request's fields; and
//! once the agent has stopped, the server's totals count exactly what
//! was admitted.

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{AgentUnderTest, Server, eventually, options};
use tollgate_agent::AccessRules;
use tollgate_proto::agent::v1::StatusRequest;
use tollgate_proto::v1;
use tonic::transport::Channel;

const TOKEN: &str = "acme-envoy-token";

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

fn shared(hits: Option<u64>) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "api-calls")], hits)
}

fn per_user(user: &str) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "per-user"), ("user", user)], None)
}

async fn check(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    token: Option<&str>,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "acme".into(),
        descriptors,
        hits_addend: 0,
    });
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ASCII"),
        );
    }
    client
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
}

fn codes(answer: &RateLimitResponse) -> (Code, Vec<Code>) {
    let code = |c: i32| Code::try_from(c).expect("a known code");
    (
        code(answer.overall_code),
        answer.statuses.iter().map(|s| code(s.code)).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_buckets_are_answered_locally_and_checks_are_all_or_none() {
    let server = Server::start().await;
    // The shared bucket: 3 tokens, never more.
    server.set_bucket("acme", "api-calls", 3.0, 0.0, 3.0).await;
    // A per-key bucket: 2 tokens per user, never more.
    server
        .admin()
        .await
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: "acme".into(),
            bucket: Some(v1::BucketDefinition {
                quota: None,
                bucket: "per-user".into(),
                refill_rate: 0.0,
                burst_limit: 2.0,
                initial_tokens: None,
                kind: v1::BucketKind::PerKey as i32,
                enforce: None,
            }),
        })
        .await
        .expect("a per-key bucket");
    let dir = tempfile::tempdir().expect("temp dir");
    let access = dir.path().join("access.toml");
    std::fs::write(&access, format!("[tenants.acme]\ntoken = \"{TOKEN}\"\n")).expect("write");
    let mut config = options(&server);
    config.access = AccessRules::load(&access).expect("access file");
    let agent = AgentUnderTest::start_with_envoy(config).await;
    let mut envoy = RateLimitServiceClient::connect(format!(
        "http://{}",
        agent.envoy.expect("Envoy's listener")
    ))
    .await
    .expect("connect to the Envoy listener");
    let socket = agent.client().await;
    let local_tokens = || {
        let mut socket = socket.clone();
        async move {
            socket
                .status(StatusRequest {
                    tenant: "acme".into(),
                    bucket: "api-calls".into(),
                })
                .await
                .expect("status")
                .into_inner()
                .tokens
        }
    };
    eventually("the shared bucket's grant arrives", || async {
        local_tokens().await == 3.0
    })
    .await;

    // Envoy must show the tenant's token.
    let refused = check(&mut envoy, vec![shared(None)], None)
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // The server refuses a per-key descriptor: the local token comes back,
    // and the error names the descriptor by its place in Envoy's request.
    let refused = check(
        &mut envoy,
        vec![shared(None), descriptor(&[], None)],
        Some(TOKEN),
    )
    .await
    .expect_err("a descriptor without entries");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("descriptors[1]"),
        "{refused:?}"
    );
    assert_eq!(local_tokens().await, 3.0);

    // A shared and a per-key descriptor: both taken…
    for remaining in [2, 1] {
        let answer = check(
            &mut envoy,
            vec![shared(None), per_user("alice")],
            Some(TOKEN),
        )
        .await
        .expect("checked");
        assert_eq!(codes(&answer), (Code::Ok, vec![Code::Ok, Code::Ok]));
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
        assert_eq!(local_tokens().await, f64::from(remaining));
    }
    // …until alice has none left: the server says OVER_LIMIT, and the
    // shared token taken for the check comes back.
    let answer = check(
        &mut envoy,
        vec![shared(None), per_user("alice")],
        Some(TOKEN),
    )
    .await
    .expect("checked");
    assert_eq!(
        codes(&answer),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
    );
    assert_eq!(local_tokens().await, 1.0);

    // The shared bucket short: OVER_LIMIT at once, and the server is not
    // asked, so bob's tokens are all still there.
    let answer = check(
        &mut envoy,
        vec![shared(Some(5)), per_user("bob")],
        Some(TOKEN),
    )
    .await
    .expect("checked");
    assert_eq!(
        codes(&answer),
        (Code::OverLimit, vec![Code::OverLimit, Code::Unknown])
    );
    let bob = agent
        .client()
        .await
        .check_keys(v1::CheckRequest {
            items: vec![v1::CheckItem {
                tenant_id: "acme".into(),
                bucket: "per-user".into(),
                key: "bob".into(),
                tokens: 2.0,
                request_id: String::new(),
            }],
        })
        .await
        .expect("check")
        .into_inner();
    assert!(bob.allowed, "bob's 2 tokens were never taken");

    // A lone shared descriptor follows the bucket: its last token, then
    // over the limit.
    let answer = check(&mut envoy, vec![shared(None)], Some(TOKEN))
        .await
        .expect("checked");
    assert_eq!(codes(&answer), (Code::Ok, vec![Code::Ok]));
    let answer = check(&mut envoy, vec![shared(None)], Some(TOKEN))
        .await
        .expect("checked");
    assert_eq!(codes(&answer), (Code::OverLimit, vec![Code::OverLimit]));

    // Refusals name the request's fields.
    let empty = check(
        &mut envoy,
        vec![descriptor(&[("generic_key", "")], None)],
        Some(TOKEN),
    )
    .await
    .expect_err("empty value");
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert!(
        empty
            .message()
            .starts_with("descriptors[0].entries[0].value: "),
        "{empty:?}"
    );
    // A shared bucket the tenant lacks: NOT_FOUND once the server says so.
    let nope = vec![descriptor(&[("generic_key", "nope")], None)];
    eventually("the missing bucket is refused", || {
        let mut envoy = envoy.clone();
        let nope = nope.clone();
        async move {
            match check(&mut envoy, nope, Some(TOKEN)).await {
                Err(status) => {
                    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
                    assert!(
                        status
                            .message()
                            .starts_with("descriptors[0].entries[0].value: "),
                        "{status:?}"
                    );
                    assert!(status.message().contains("\"nope\""), "{status:?}");
                    true
                }
                Ok(answer) => {
                    assert_eq!(codes(&answer).0, Code::OverLimit, "no tokens to give");
                    false
                }
            }
        }
    })
    .await;

    let (_, metrics) = agent.http("GET", "/metrics", None).await;
    let kept: f64 = metrics
        .lines()
        .find(|line| line.starts_with("tollgate_agent_envoy_kept_tokens_total{"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0);
    agent.stop().await;
    // Admitted: alice's two checks and the lone one; the tokens of refused
    // checks came back (save any the bucket had reported already, which
    // the agent counts).
    assert_eq!(server.consumed("acme", "api-calls").await, 3.0 + kept);
    server.stop().await;
}
