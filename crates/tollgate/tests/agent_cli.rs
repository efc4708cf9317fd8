//! The `tollgate agent` binary against a `tollgate serve` process: called
//! over its Unix socket (HTTP/JSON), stopped with SIGTERM (exit 0, its
//! consumption at the server), and refused clearly when a second agent
//! would share its state directory or its socket, or when the flags
//! cannot work.

mod support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{Server, command};

/// An HTTP/1.1 call on the socket at `socket`: the status and the body.
fn http(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = UnixStream::connect(socket).expect("connect to the agent");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_owned())
}

fn agent(server: &Server, dir: &Path, socket: &str, state: &str, log: &Path) -> Command {
    let mut agent = command();
    agent
        .args(["agent", "--server", &server.url, "--node-name", "node-1"])
        .arg("--socket")
        .arg(dir.join(socket))
        .arg("--state-dir")
        .arg(dir.join(state))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    agent
}

/// Runs an agent that is expected to fail at once.
fn refused(mut agent: Command) -> Output {
    agent.stderr(Stdio::piped());
    let out = agent.output().expect("run tollgate agent");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    out
}

fn wait_for_socket(child: &mut Child, socket: &Path, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(socket).is_err() {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!(
                "agent exited with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the agent did not come up");
        sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_agent_serves_its_socket_stops_on_sigterm_and_refuses_a_second_agent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(&dir.path().join("store.redb"));
    server.set_limits("acme", 1000.0, 0.0, 1000.0);
    let log = dir.path().join("agent.log");
    let mut child = agent(&server, dir.path(), "run/agent.sock", "state", &log)
        .args(["--socket-mode", "0600"])
        .spawn()
        .expect("spawn tollgate agent");
    let socket = dir.path().join("run/agent.sock");
    wait_for_socket(&mut child, &socket, &log);
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let (code, body) = http(
        &socket,
        "POST",
        "/v1/acquire",
        r#"{"tenant":"acme","tokens":12,"max_wait_ms":5000}"#,
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""admitted":true"#), "{body}");
    let (code, body) = http(
        &socket,
        "POST",
        "/v1/charge",
        r#"{"tenant":"acme","tokens":3.5}"#,
    );
    assert_eq!((code, body.as_str()), (200, "{}"));

    // A second agent on the same state directory stops at once, saying so.
    let second_log = dir.path().join("second.log");
    let out = refused(agent(
        &server,
        dir.path(),
        "run/other.sock",
        "state",
        &second_log,
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--state-dir") && stderr.contains("another tollgate agent holds it"),
        "{stderr}"
    );
    assert!(!dir.path().join("run/other.sock").exists());
    // …and on the same socket.
    let out = refused(agent(
        &server,
        dir.path(),
        "run/agent.sock",
        "state-2",
        &second_log,
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another tollgate agent is listening"),
        "{stderr}"
    );
    // The first is untouched.
    let (code, _) = http(&socket, "GET", "/readyz", "");
    assert_eq!(code, 200);

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not stop on SIGTERM"
        );
        sleep(Duration::from_millis(20));
    };
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(exit.success(), "{exit}: {logged}");
    assert!(!socket.exists(), "the socket file is removed");
    for line in [
        "tollgate agent listening",
        "instance_id=",
        "node_name=\"node-1\"",
        "every bucket's consumption reported",
    ] {
        assert!(logged.contains(line), "{line} in {logged}");
    }
    let shown = server.json(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ]);
    assert_eq!(shown["consumption"]["request_units"], 15.5);
    server.stop();
}

#[test]
fn flags_that_cannot_work_are_refused_naming_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |args: &[&str]| {
        let out = command()
            .args([
                "agent",
                "--server",
                "http://127.0.0.1:1",
                "--node-name",
                "n",
            ])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(args)
            .output()
            .expect("run tollgate agent");
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let socket = dir.path().join("agent.sock");
    let socket = socket.to_str().expect("UTF-8 path");
    for (args, said) in [
        (vec!["--socket", ""], "--listen"),
        (vec!["--no-socket"], "--listen"),
        (
            vec!["--socket", socket, "--listen", "0.0.0.0:7000"],
            "loopback",
        ),
        (vec!["--socket", socket, "--socket-mode", "999"], "octal"),
        (
            vec!["--socket", socket, "--instance-id", "0"],
            "--instance-id",
        ),
        (vec!["--socket", socket, "--max-wait", "2h"], "--max-wait"),
        (
            vec!["--socket", socket, "--min-attempt-timeout", "0s"],
            "--min-attempt-timeout",
        ),
        (
            vec!["--socket", socket, "--access", "/nonexistent.toml"],
            "--access",
        ),
        (
            vec!["--socket", socket, "--pod-token-file", "/nonexistent"],
            "--pod-token-file",
        ),
        (vec!["--socket", socket, "--threads", "0"], "--threads"),
        (vec!["--socket", socket, "--threads", "257"], "--threads"),
    ] {
        let stderr = run(&args);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    let out = command()
        .args(["agent", "--socket", socket])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--server", "not a url"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server"));
}

/// deploy/agent-options.txt lists every flag `tollgate agent --help`
/// shows, with its default, and nothing else (deploy/validate.sh checks the
/// deploy files and the docs against that list).
#[test]
fn the_options_list_names_every_flag_of_the_agent_with_its_default() {
    let list = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agent-options.txt"),
    )
    .expect("deploy/agent-options.txt");
    let listed: std::collections::BTreeMap<String, String> = list
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(columns.len(), 3, "name, type, default: {line:?}");
            (columns[0].to_owned(), columns[2].to_owned())
        })
        .collect();
    let out = command()
        .args(["agent", "--help"])
        .output()
        .expect("run tollgate agent --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    // One line per flag: `--name <VALUE>  text [env: …=] [default: …]`.
    let mut flags = std::collections::BTreeMap::new();
    for line in help.lines() {
        let Some(rest) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name == "help" {
            continue;
        }
        let default = line
            .rsplit_once("=] [default: ")
            .map(|(_, default)| default.trim_end_matches(']').to_owned());
        flags.insert(name, default);
    }
    let named: Vec<&String> = flags.keys().collect();
    let in_list: Vec<&String> = listed.keys().collect();
    assert_eq!(
        named, in_list,
        "flags of `tollgate agent --help` against the list"
    );
    for (flag, default) in &flags {
        if let Some(default) = default {
            // clap's defaults as the help prints them (a path, a number).
            assert_eq!(&listed[flag], default, "default of --{flag}");
        }
    }
}
