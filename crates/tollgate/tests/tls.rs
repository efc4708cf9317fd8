//! gRPC over TLS and mutual TLS, end to end: `tollgate serve` with a
//! certificate from a test CA and a required client CA; the CLI and the
//! pod library reach it with the CA and a client certificate, and not
//! without.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{Served, command, free_port};
use tollgate_client::{ClientTls, Controller, Options};
use tollgate_testdb::TestPki;

struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// A fresh test CA and certificates, written to `dir`.
fn pki(dir: &Path) -> Pki {
    let pki = TestPki::generate().expect("test certificates");
    let write = |name: &str, contents: &str| {
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write");
        path
    };
    Pki {
        ca: write("ca.pem", &pki.ca_pem),
        server_cert: write("server.pem", &pki.server_cert_pem),
        server_key: write("server.key", &pki.server_key_pem),
        client_cert: write("client.pem", &pki.client_cert_pem),
        client_key: write("client.key", &pki.client_key_pem),
    }
}

fn tollgate(args: &[&str]) -> Output {
    let mut command = command();
    command.args(args).output().expect("run tollgate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = pki(dir.path());
    let port = free_port();
    let path = |p: &PathBuf| p.display().to_string();
    let store = dir.path().join("tollgate.redb");
    let mut server = Served(
        command()
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                "off",
            ])
            .args(["--store", &path(&store), "--create"])
            .args([
                "--tls-cert",
                &path(&pki.server_cert),
                "--tls-key",
                &path(&pki.server_key),
            ])
            .args(["--tls-client-ca", &path(&pki.ca)])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("serve"),
    );
    let url = format!("https://localhost:{port}");
    let (ca, cert, key) = (path(&pki.ca), path(&pki.client_cert), path(&pki.client_key));
    let trusted = [
        "--server",
        &url,
        "--ca-file",
        &ca,
        "--client-cert",
        &cert,
        "--client-key",
        &key,
    ];
    let with = |extra: &[&str]| -> Output {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(trusted);
        tollgate(&args)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !with(&["tenant", "list"]).status.success() {
        assert!(
            server.0.try_wait().expect("wait").is_none(),
            "the server exited"
        );
        assert!(Instant::now() < deadline, "the TLS server did not come up");
        sleep(Duration::from_millis(50));
    }

    // The CLI with the CA and a client certificate: served.
    let out = with(&[
        "tenant",
        "set-limits",
        "--tenant",
        "acme",
        "--available",
        "1000",
        "--refill-rate",
        "10",
        "--burst-limit",
        "1000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without a client certificate, without the CA, or in plain text: refused.
    for refused in [
        vec!["tenant", "list", "--server", &url, "--ca-file", &ca],
        vec![
            "tenant",
            "list",
            "--server",
            &url,
            "--client-cert",
            &cert,
            "--client-key",
            &key,
        ],
        vec![
            "tenant",
            "list",
            "--server",
            &format!("http://127.0.0.1:{port}"),
        ],
    ] {
        let out = tollgate(&refused);
        assert!(!out.status.success(), "{refused:?} was served");
    }
    // TLS options with a plain URL are an error, not silently unused.
    let out = tollgate(&[
        "tenant",
        "list",
        "--server",
        &format!("http://127.0.0.1:{port}"),
        "--ca-file",
        &ca,
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("https://"));

    // A pod through the library, over mutual TLS.
    let tls = ClientTls {
        ca_pem: Some(std::fs::read(&pki.ca).expect("CA")),
        identity: Some((
            std::fs::read(&pki.client_cert).expect("cert"),
            std::fs::read(&pki.client_key).expect("key"),
        )),
    };
    let pod = Controller::connect(
        &url,
        "acme",
        1,
        Options {
            tls: Some(tls),
            ..Options::default()
        },
    )
    .expect("controller");
    for _ in 0..5 {
        pod.acquire(10.0).await.expect("admitted");
    }
    let report = pod.shutdown().await;
    assert!(report.consumption_reported, "the pod reported over TLS");
    let shown = with(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    assert_eq!(
        shown["consumption"]["request_units"].as_f64(),
        Some(report.status.charged_tokens),
        "{shown}"
    );
    assert_eq!(shown["live_instances"].as_u64().unwrap_or(0), 1);
    let _ = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status();
    let status = server.0.wait().expect("wait");
    assert!(status.success(), "{status}");
}

#[test]
fn serve_refuses_half_a_tls_configuration() {
    for (args, expected) in [
        (vec!["--tls-cert", "/nonexistent.pem"], "--tls-key"),
        (vec!["--tls-key", "/nonexistent.key"], "--tls-cert"),
        (vec!["--tls-client-ca", "/nonexistent.pem"], "tls-client-ca"),
    ] {
        let mut all = vec!["serve", "--in-memory", "--metrics-listen", "off"];
        all.extend(args);
        let out = tollgate(&all);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{err}");
    }
}
