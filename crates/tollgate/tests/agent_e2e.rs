//! Pods in two languages through two agents, as a deployment runs them:
//! `tollgate serve` on an embedded store, two `tollgate agent`s (two
//! "nodes"), and Python and Node workers (real interpreters, the packages
//! of `clients/`) saturating a tenant's request-unit bucket and a named
//! bucket, `schedule-email`, for a fixed time. Mid-run one agent is killed
//! with SIGKILL and started again on the same state directory; its
//! workers' calls in flight are retried with their request ids.
//!
//! What must hold, once both agents stop:
//! - the server's totals of each bucket equal what the workers were told
//!   they got, exactly (nothing lost, nothing counted twice, the killed
//!   agent's replayed request included);
//! - each bucket admitted at most the stated bound (ARCHITECTURE.md):
//!   `max(burst, initial) + R·T + ε·R·T`, ε = 12 %, where `initial` sums
//!   the allowance every incarnation of every agent starts with (a
//!   restarted agent is a new pod to the server), and T is the run.
//!
//! Needs Python with `clients/python` installed (TOLLGATE_PYTHON, else the
//! virtual environment `clients/python/test.sh` makes) and Node with
//! `clients/node` built (TOLLGATE_NODE_CLIENT, else `clients/node` if its
//! `dist/` is there). Missing, the test is skipped, unless
//! TOLLGATE_REQUIRE_CLIENTS is set (scripts/test.sh sets it after
//! preparing both), which makes it a failure.

mod support;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{Server, command, external_tool};

const TENANT: &str = "acme";
const EMAILS: &str = "schedule-email";
/// How long the workers run.
const RUN: Duration = Duration::from_secs(16);
/// The stated bound's ε (ARCHITECTURE.md, "The stated bound").
const EPSILON: f64 = 0.12;
/// The allowance a bucket of a new incarnation starts with
/// (`--initial-tokens`).
const INITIAL_TOKENS: f64 = 50.0;

/// What the tests need to run the workers, or `None` to skip.
struct Interpreters {
    python: PathBuf,
    node: PathBuf,
    node_client: PathBuf,
}

fn interpreters() -> Option<Interpreters> {
    let require = std::env::var_os("TOLLGATE_REQUIRE_CLIENTS").is_some();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("TOLLGATE_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("TOLLGATE_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/tollgate"))
                })?;
            Some(cache.join("python-venv/bin/python")).filter(|p| p.is_file())
        });
    let node_client = std::env::var_os("TOLLGATE_NODE_CLIENT")
        .map(PathBuf::from)
        .or_else(|| Some(repo.join("clients/node")).filter(|p| p.join("dist/index.js").is_file()));
    let node = external_tool("TOLLGATE_NODE", &["node"], "TOLLGATE_REQUIRE_CLIENTS");
    match (python, node, node_client) {
        (Some(python), Some(node), Some(node_client)) => Some(Interpreters {
            python,
            node,
            node_client,
        }),
        missing => {
            assert!(
                !require,
                "TOLLGATE_REQUIRE_CLIENTS is set but the clients are not ready: {missing:?} \
                 (python with clients/python, node, clients/node built)"
            );
            eprintln!(
                "the client packages are not prepared: skipped (scripts/test.sh prepares them)"
            );
            None
        }
    }
}

/// A `tollgate agent` process on its own socket and state directory.
struct Agent {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Agent {
    fn start(server: &Server, dir: &Path, node: &str) -> Agent {
        let socket = dir.join(format!("{node}.sock"));
        let log = dir.join(format!("{node}.log"));
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = command()
            .args(["agent", "--server", &server.url, "--node-name", node])
            .args(["--initial-tokens", &INITIAL_TOKENS.to_string()])
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join(format!("{node}-state")))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn tollgate agent");
        let mut agent = Agent { child, socket, log };
        agent.wait_until_up();
        agent
    }

    fn wait_until_up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!("agent exited with {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "the agent did not come up");
            sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM: the graceful stop, every bucket reported.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .expect("kill")
                .success()
        );
        let status = self.child.wait().expect("wait");
        assert!(
            status.success(),
            "agent exited with {status}: {}",
            self.log()
        );
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A worker process; its JSON report once it exits.
struct Worker {
    child: Child,
    what: String,
}

impl Worker {
    fn python(with: &Interpreters, agent: &Agent, seed: u32) -> Worker {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agent_e2e/worker.py");
        let mut command = Command::new(&with.python);
        command.arg(script);
        Worker::spawn(command, agent, seed, "python")
    }

    fn node(with: &Interpreters, agent: &Agent, seed: u32) -> Worker {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agent_e2e/worker.mjs");
        let mut command = Command::new(&with.node);
        command
            .arg(script)
            .env("TOLLGATE_NODE_CLIENT", &with.node_client);
        Worker::spawn(command, agent, seed, "node")
    }

    fn spawn(mut command: Command, agent: &Agent, seed: u32, language: &str) -> Worker {
        let child = command
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--tenant", TENANT, "--buckets", &format!(",{EMAILS}")])
            .args(["--seconds", &RUN.as_secs_f64().to_string()])
            .args(["--concurrency", "4", "--seed", &seed.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a worker");
        Worker {
            child,
            what: format!("{language} worker {seed} on {}", agent.socket.display()),
        }
    }

    fn report(self) -> serde_json::Value {
        let out = self.child.wait_with_output().expect("worker ran");
        assert!(
            out.status.success(),
            "{} failed: {}",
            self.what,
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{}: no report ({e}): {out:?}", self.what));
        assert_eq!(report["error_count"], 0, "{}: {report}", self.what);
        report
    }
}

/// A bucket's total request units at the server, in micro-units.
fn stored_micros(server: &Server, bucket: &str) -> u64 {
    let shown = server.json(&[
        "tenant", "show", "--tenant", TENANT, "--bucket", bucket, "--json",
    ]);
    shown["consumption"]["request_unit_micros"]
        .as_u64()
        .unwrap_or_else(|| panic!("no consumption in {shown}"))
}

#[test]
fn python_and_node_workers_through_two_agents_are_counted_exactly_through_a_sigkill() {
    let Some(with) = interpreters() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(&dir.path().join("store.redb"));
    // (rate, burst) of each bucket.
    let limits = [("", 300.0, 300.0), (EMAILS, 100.0, 100.0)];
    for (bucket, rate, burst) in limits {
        server.ok(&[
            "tenant",
            "set-limits",
            "--tenant",
            TENANT,
            "--bucket",
            bucket,
            "--available",
            &burst.to_string(),
            "--refill-rate",
            &rate.to_string(),
            "--burst-limit",
            &burst.to_string(),
        ]);
    }
    let mut first = Agent::start(&server, dir.path(), "node-1");
    let second = Agent::start(&server, dir.path(), "node-2");
    let started = Instant::now();
    let workers = vec![
        Worker::python(&with, &first, 1),
        Worker::node(&with, &first, 2),
        Worker::python(&with, &second, 3),
        Worker::node(&with, &second, 4),
    ];

    // A third of the way in, the first agent dies without a word, and
    // comes back a second later on the same state directory.
    sleep(RUN / 3);
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    sleep(Duration::from_secs(1));
    let restarted = Agent::start(&server, dir.path(), "node-1");
    drop(first);

    let reports: Vec<serde_json::Value> = workers.into_iter().map(Worker::report).collect();
    let elapsed = started.elapsed().as_secs_f64();
    let log = restarted.log();
    restarted.stop();
    second.stop();

    assert!(
        log.contains("settled what an earlier incarnation owed") || log.contains("owes the server"),
        "the restarted agent found what its predecessor owed: {log}"
    );
    for (bucket, rate, burst) in limits {
        let given: u64 = reports
            .iter()
            .map(|r| r["admitted"][bucket].as_u64().expect("a count per bucket"))
            .sum();
        let stored = stored_micros(&server, bucket);
        assert_eq!(
            stored,
            given * 1_000_000,
            "bucket {bucket:?}: the server counts {} tokens, the workers were given {given}",
            stored as f64 / 1e6
        );
        // Three incarnations started: two agents, and the restarted one.
        let initial = 3.0 * INITIAL_TOKENS;
        let bound = f64::max(burst, initial) + rate * elapsed * (1.0 + EPSILON);
        assert!(
            (given as f64) <= bound,
            "bucket {bucket:?} admitted {given} in {elapsed:.1} s, beyond the stated bound {bound:.0}"
        );
        assert!(
            given as f64 >= rate * RUN.as_secs_f64() * 0.5,
            "bucket {bucket:?} admitted only {given}: the workers did not saturate it"
        );
        eprintln!(
            "bucket {bucket:?}: {given} admitted in {elapsed:.1} s (rate {rate}/s, bound {bound:.0}), \
             the server counts the same"
        );
    }
    server.stop();
}
