//! Who may use which tenant, through the wire: an agent with an access
//! file, on its Unix socket and on loopback TCP, against a real server.
//!
//! - TCP callers without a token, or with another tenant's, are
//!   UNAUTHENTICATED; with their tenant's token they are served (gRPC and
//!   HTTP alike); a tenant without a token is PERMISSION_DENIED to them.
//! - A tenant the file does not list is PERMISSION_DENIED, naming it, on
//!   the socket too.
//! - Without an access file, socket callers use any tenant and TCP
//!   callers none.
//! - The socket file has the mode asked for.

mod support;

use std::os::unix::fs::PermissionsExt;

use support::{AgentUnderTest, Server, options};
use tollgate_agent::AccessRules;
use tollgate_proto::agent::v1::TryAcquireRequest;
use tonic::Code;

fn try_acquire(tenant: &str, token: Option<&str>) -> tonic::Request<TryAcquireRequest> {
    let mut request = tonic::Request::new(TryAcquireRequest {
        tenant: tenant.into(),
        bucket: String::new(),
        tokens: 0.0,
        request_id: String::new(),
    });
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ASCII"),
        );
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_callers_need_their_tenants_token_and_only_listed_tenants_are_served() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("access.toml");
    std::fs::write(
        &file,
        "[tenants.acme]\ntoken = \"acme-s3cret\"\n\n[tenants.initech]\n",
    )
    .expect("write");
    let mut config = options(&server);
    config.access = AccessRules::load(&file).expect("valid access file");
    let agent = AgentUnderTest::start_with(config, 0o600, true).await;
    let mode = std::fs::metadata(&agent.socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let mut tcp = agent.tcp_client().await;
    for token in [None, Some("wrong"), Some("acme-s3cret-")] {
        let refused = tcp
            .try_acquire(try_acquire("acme", token))
            .await
            .expect_err("no valid token");
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "{token:?}: {refused:?}"
        );
    }
    tcp.try_acquire(try_acquire("acme", Some("acme-s3cret")))
        .await
        .expect("its tenant's token");
    let no_token = tcp
        .try_acquire(try_acquire("initech", Some("acme-s3cret")))
        .await
        .expect_err("initech has no token");
    assert_eq!(no_token.code(), Code::PermissionDenied, "{no_token:?}");
    let unlisted = tcp
        .try_acquire(try_acquire("globex", Some("acme-s3cret")))
        .await
        .expect_err("not listed");
    assert_eq!(unlisted.code(), Code::PermissionDenied, "{unlisted:?}");
    assert!(unlisted.message().contains("\"globex\""), "{unlisted:?}");

    // The socket: no token needed, listed tenants only.
    let mut socket = agent.client().await;
    socket
        .try_acquire(try_acquire("initech", None))
        .await
        .expect("socket callers need no token");
    let unlisted = socket
        .try_acquire(try_acquire("globex", None))
        .await
        .expect_err("not listed");
    assert_eq!(unlisted.code(), Code::PermissionDenied, "{unlisted:?}");
    assert!(unlisted.message().contains("\"globex\""), "{unlisted:?}");

    // HTTP over TCP follows the same rules.
    let body = r#"{"tenant":"acme","tokens":0}"#;
    let (code, answer) = agent
        .tcp_http("POST", "/v1/try-acquire", Some(body), None)
        .await;
    assert_eq!(code, 401, "{answer}");
    assert!(answer.contains("UNAUTHENTICATED"), "{answer}");
    let (code, answer) = agent
        .tcp_http("POST", "/v1/try-acquire", Some(body), Some("acme-s3cret"))
        .await;
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = agent
        .tcp_http(
            "POST",
            "/v1/try-acquire",
            Some(r#"{"tenant":"globex","tokens":0}"#),
            Some("acme-s3cret"),
        )
        .await;
    assert_eq!(code, 403, "{answer}");
    agent.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_access_file_tcp_callers_are_refused_and_socket_callers_served() {
    let server = Server::start().await;
    let agent = AgentUnderTest::start_with(options(&server), 0o660, true).await;
    let mut tcp = agent.tcp_client().await;
    for token in [None, Some("anything")] {
        let refused = tcp
            .try_acquire(try_acquire("acme", token))
            .await
            .expect_err("TCP needs --access");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains("--access"), "{refused:?}");
    }
    let mut socket = agent.client().await;
    socket
        .try_acquire(try_acquire("globex", None))
        .await
        .expect("any tenant on the socket");
    agent.stop().await;
    server.stop().await;
}
