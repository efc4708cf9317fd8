//! `--admin-tokens-file`: the `Admin` service wants a known bearer token,
//! names the operator in the audit line, and leaves pods alone.

mod support;

use std::process::{Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{Served, command, free_port};

const ALICE: &str = "alice-0123456789abcdef";

fn tollgate(args: &[&str], token: Option<&str>) -> Output {
    let mut command = command();
    if let Some(token) = token {
        command.env("TOLLGATE_TOKEN", token);
    }
    command.args(args).output().expect("run tollgate")
}

#[test]
fn admin_needs_a_known_token_and_pods_do_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("# operators\nalice {ALICE}\nbob bob-0123456789abcdef\n"),
    )
    .expect("tokens file");
    let log = dir.path().join("server.log");
    let port = free_port();
    let server_url = format!("http://127.0.0.1:{port}");
    let mut server = Served(
        command()
            .args(["serve", "--in-memory", "--metrics-listen", "off"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--admin-tokens-file")
            .arg(&tokens)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("serve"),
    );
    let server = &mut server;
    let list = |token: Option<&str>| tollgate(&["tenant", "list", "--server", &server_url], token);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !list(Some(ALICE)).status.success() {
        assert!(
            server.0.try_wait().expect("wait").is_none(),
            "the server exited"
        );
        assert!(Instant::now() < deadline, "the server did not come up");
        sleep(Duration::from_millis(50));
    }

    // No token, or an unknown one: refused, and nothing changes.
    let out = list(None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
    let out = tollgate(
        &[
            "tenant",
            "set-limits",
            "--server",
            &server_url,
            "--tenant",
            "acme",
            "--available",
            "10",
            "--refill-rate",
            "1",
            "--burst-limit",
            "10",
        ],
        Some("mallory-0123456789abcdef"),
    );
    assert!(!out.status.success());

    // A pod needs no token.
    let out = tollgate(
        &[
            "pod",
            "request",
            "--server",
            &server_url,
            "--tenant",
            "acme",
            "--tokens",
            "5",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Alice's change is served and logged under her name.
    let out = tollgate(
        &[
            "tenant",
            "set-limits",
            "--server",
            &server_url,
            "--tenant",
            "acme",
            "--available",
            "10",
            "--refill-rate",
            "1",
            "--burst-limit",
            "10",
            "--actor",
            "someone",
        ],
        Some(ALICE),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = logged
            .lines()
            .find(|l| l.contains("set the limits of tenant acme"))
        {
            assert!(line.contains("operator alice"), "{line}");
            assert!(line.contains("someone"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no audit line in\n{logged}");
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_bad_tokens_file_stops_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice short\n").expect("tokens file");
    let out = tollgate(
        &[
            "serve",
            "--in-memory",
            "--metrics-listen",
            "off",
            "--listen",
            "127.0.0.1:0",
            "--admin-tokens-file",
            tokens.to_str().expect("path"),
        ],
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && err.contains("alice"), "{err}");
}
