//! Rotating credentials on a running `tollgate serve`: new pod and admin
//! tokens take effect on SIGHUP, or when the file changes, without a
//! restart; a broken file keeps the credentials in force and says why.

mod support;

use std::path::Path;
use std::process::{Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{Served, command, free_port};

const POD_1: &str = "pod-one-0123456789abcdef";
const POD_2: &str = "pod-two-0123456789abcdef";
const POD_3: &str = "pod-three-0123456789abcdef";
const OPS_1: &str = "ops-one-0123456789abcdef";
const OPS_2: &str = "ops-two-0123456789abcdef";
const VIEWER: &str = "viewer-0123456789abcdef";

struct Running {
    server: Served,
    url: String,
    log: std::path::PathBuf,
}

impl Running {
    /// `tollgate serve` with both credentials files, checking them for
    /// changes every `interval`.
    fn start(dir: &Path, interval: &str) -> Running {
        let port = free_port();
        let log = dir.join("server.log");
        let server = Served(
            command()
                .args(["serve", "--in-memory", "--metrics-listen", "off"])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .arg("--pod-tokens-file")
                .arg(dir.join("pods"))
                .arg("--admin-tokens-file")
                .arg(dir.join("admins"))
                .args(["--credentials-reload-interval", interval])
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log"))
                .spawn()
                .expect("serve"),
        );
        let mut running = Running {
            server,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        running.wait_for("the server to come up", |r| {
            r.admin(OPS_1, &["tenant", "list"]).status.success()
        });
        running
    }

    fn admin(&self, token: &str, args: &[&str]) -> Output {
        command()
            .args(args)
            .args(["--server", &self.url, "--token", token])
            .output()
            .expect("run tollgate")
    }

    fn pod(&self, tenant: &str, token: Option<&str>) -> Output {
        let mut command = command();
        command.args([
            "pod", "request", "--server", &self.url, "--tenant", tenant, "--tokens", "1",
        ]);
        if let Some(token) = token {
            command.args(["--pod-token", token]);
        }
        command.output().expect("run tollgate")
    }

    fn wait_for(&mut self, what: &str, done: impl Fn(&Running) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(self) {
            assert!(
                self.server.0.try_wait().expect("wait").is_none(),
                "the server exited: {}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "waited in vain for {what}: {}",
                self.log()
            );
            sleep(Duration::from_millis(50));
        }
    }

    fn hangup(&self) {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &self.server.0.id().to_string()])
            .status()
            .expect("kill -HUP");
        assert!(status.success());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn refused_with(out: &Output, code: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected {code}, but it succeeded");
    assert!(stderr.contains(code), "expected {code}: {stderr}");
}

fn write(dir: &Path, name: &str, text: &str) {
    // Written aside and renamed, as a secret volume swaps its files.
    let aside = dir.join(format!(".{name}.new"));
    std::fs::write(&aside, text).expect("write credentials");
    std::fs::rename(&aside, dir.join(name)).expect("rename credentials");
}

#[test]
fn rotated_credentials_take_effect_on_sighup_and_a_broken_file_keeps_the_old() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "pods", &format!("first {POD_1} acme\n"));
    write(dir.path(), "admins", &format!("ops {OPS_1}\n"));
    // Changes are looked for only every hour: what changes below is the
    // signal's doing.
    let mut running = Running::start(dir.path(), "1h");

    assert!(running.pod("acme", Some(POD_1)).status.success());
    refused_with(&running.pod("acme", None), "Unauthenticated");
    refused_with(&running.pod("globex", Some(POD_1)), "PermissionDenied");

    write(dir.path(), "pods", &format!("second {POD_2} acme,globex\n"));
    write(
        dir.path(),
        "admins",
        &format!("ops {OPS_2}\nviewer {VIEWER} read-only\n"),
    );
    refused_with(&running.pod("globex", Some(POD_2)), "Unauthenticated");
    running.hangup();
    running.wait_for("the new pod token", |r| {
        r.pod("globex", Some(POD_2)).status.success()
    });
    refused_with(&running.pod("acme", Some(POD_1)), "Unauthenticated");
    assert!(running.admin(OPS_2, &["tenant", "list"]).status.success());
    refused_with(
        &running.admin(OPS_1, &["tenant", "list"]),
        "Unauthenticated",
    );
    assert!(running.admin(VIEWER, &["tenant", "list"]).status.success());
    refused_with(
        &running.admin(VIEWER, &["tenant", "delete", "--tenant", "acme", "--yes"]),
        "PermissionDenied",
    );

    // A broken file: the old credentials stay, and the log says why.
    write(
        dir.path(),
        "pods",
        &format!("third {POD_3} acme\nbroken short acme\n"),
    );
    running.hangup();
    running.wait_for("the failed reload in the log", |r| {
        r.log().contains("credentials reload failed")
    });
    let log = running.log();
    assert!(
        log.contains("--pod-tokens-file") && log.contains("line 2: the token of broken is shorter"),
        "{log}"
    );
    assert!(running.pod("globex", Some(POD_2)).status.success());
    refused_with(&running.pod("acme", Some(POD_3)), "Unauthenticated");
}

#[test]
fn a_changed_credentials_file_takes_effect_without_a_signal() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "pods", &format!("first {POD_1} acme\n"));
    write(dir.path(), "admins", &format!("ops {OPS_1}\n"));
    let mut running = Running::start(dir.path(), "100ms");
    assert!(running.pod("acme", Some(POD_1)).status.success());
    write(dir.path(), "pods", &format!("second {POD_2} acme\n"));
    running.wait_for("the new pod token", |r| {
        r.pod("acme", Some(POD_2)).status.success()
    });
    refused_with(&running.pod("acme", Some(POD_1)), "Unauthenticated");
    assert!(running.log().contains("credentials reloaded"));
}

#[test]
fn bench_sends_a_pod_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "pods", &format!("bench {POD_1} *\n"));
    write(dir.path(), "admins", &format!("ops {OPS_1}\n"));
    let running = Running::start(dir.path(), "1h");
    let bench = |token: &str| {
        command()
            .args(["bench", "--server", &running.url])
            .args(["--duration", "1s", "--warmup", "0s", "--tenants", "2"])
            .args([
                "--instances-per-tenant",
                "2",
                "--json",
                "--pod-token",
                token,
            ])
            .output()
            .expect("run tollgate bench")
    };
    let report = support::bench_report(&bench(POD_1));
    assert_eq!(
        report["total"]["errors"],
        serde_json::json!({}),
        "{report:#}"
    );
    let refused = support::bench_report(&bench(POD_2));
    assert!(
        refused["total"]["errors"]
            .as_object()
            .is_some_and(|e| e.contains_key("Unauthenticated")),
        "{refused:#}"
    );
}

/// SIGHUP to a server without credentials files (out of habit, or from a
/// config-management tool) is logged and changes nothing: the server goes
/// on serving, and stops cleanly afterwards.
#[test]
fn sighup_without_credentials_files_is_harmless() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = support::Server::start_logged(
        &["--in-memory", "--listen", &listen],
        &[],
        port,
        &dir.path().join("server.log"),
    );
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill -HUP");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .log()
        .contains("SIGHUP: no credentials files to reload")
    {
        assert!(
            Instant::now() < deadline,
            "no SIGHUP line: {}",
            server.log()
        );
        sleep(Duration::from_millis(20));
    }
    server.ok(&["tenant", "list"]);
    server.stop();
}
