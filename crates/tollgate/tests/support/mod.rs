//! A `tollgate serve` process for the end-to-end tests.
#![allow(dead_code)] // each test binary uses part of it

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub mod pods;
pub mod usage;

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

pub struct Server {
    child: Child,
    pub url: String,
    pub port: u16,
    /// The file the server's stderr goes to, if it is kept.
    log: Option<PathBuf>,
    /// The admin token every command sends (TOLLGATE_TOKEN), for a server
    /// started with admin tokens.
    token: Option<String>,
}

/// An external program a test drives (a browser, a gRPC tool): `variable`
/// if it names one, else the first of `names` on PATH. `None` skips the
/// test, unless `require` is set in the environment (CI installs the
/// program and sets it), which makes its absence a failure.
pub fn external_tool(variable: &str, names: &[&str], require: &str) -> Option<PathBuf> {
    let found = std::env::var_os(variable).map(PathBuf::from).or_else(|| {
        let path = std::env::var_os("PATH")?;
        names
            .iter()
            .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os(require).is_none(),
            "{require} is set but none of {names:?} is on PATH (or at {variable})"
        );
        eprintln!("none of {names:?} found: skipped (scripts/test.sh installs it)");
    }
    found
}

/// The `tollgate` binary with none of the caller's `TOLLGATE_*` variables:
/// a test sets what it configures.
/// The JSON report of a `tollgate bench` run that exited successfully
/// (else the test fails with the bench's stderr).
pub fn bench_report(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

pub fn command() -> Command {
    let mut command = Command::new(BIN);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TOLLGATE_") {
            command.env_remove(name);
        }
    }
    command
}

/// A process killed when the test is done with it (or panics).
pub struct Served(pub Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port nobody listens on; a server binds it right after.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl Server {
    pub fn start(store: &Path) -> Server {
        Server::start_on(store, free_port(), &[])
    }

    /// Serves `store` (a file or a database URL) on a free port with `extra` flags.
    pub fn start_with(store: &Path, extra: &[&str]) -> Server {
        Server::start_on(store, free_port(), extra)
    }

    /// Runs `tollgate serve` with exactly `args` (its configuration must
    /// put it on `port`) and `envs`, none of the caller's `TOLLGATE_*`
    /// variables, `RUST_LOG=info`, and stderr kept in `log`.
    pub fn start_logged(args: &[&str], envs: &[(&str, &str)], port: u16, log: &Path) -> Server {
        Server::start_logged_as(args, envs, port, log, None)
    }

    /// As [`Server::start_logged`], for a server with admin tokens:
    /// every command, the check that it is up included, sends `token`.
    pub fn start_logged_as(
        args: &[&str],
        envs: &[(&str, &str)],
        port: u16,
        log: &Path,
        token: Option<&str>,
    ) -> Server {
        Server::spawn_logged(command(), args, envs, port, log, token)
    }

    /// As [`Server::start_logged`], in the working directory `dir` and
    /// without `DATABASE_URL`: where a store nobody names is made.
    pub fn start_logged_in(dir: &Path, args: &[&str], port: u16, log: &Path) -> Server {
        let mut command = command();
        command.current_dir(dir).env_remove("DATABASE_URL");
        Server::spawn_logged(command, args, &[], port, log, None)
    }

    fn spawn_logged(
        mut command: Command,
        args: &[&str],
        envs: &[(&str, &str)],
        port: u16,
        log: &Path,
        token: Option<&str>,
    ) -> Server {
        command.arg("serve").args(args);
        let stderr = File::create(log).expect("create the server log");
        // Several test servers run at once: no fixed metrics port unless a
        // test asks for one.
        let child = command
            .env("TOLLGATE_METRICS_LISTEN", "off")
            .envs(envs.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn tollgate serve");
        Server::wait_until_up(child, port, Some(log.to_owned()), token)
    }

    /// What the server wrote to stderr so far (see [`Server::start_logged`]).
    pub fn log(&self) -> String {
        let path = self.log.as_ref().expect("a server started with a log");
        std::fs::read_to_string(path).expect("read the server log")
    }

    /// Serves `store` on `port` (a restart reuses the port pods know),
    /// making the file if it is not there yet.
    pub fn start_on(store: &Path, port: u16, extra: &[&str]) -> Server {
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--store"])
            .arg(store)
            .arg("--create")
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("TOLLGATE_METRICS_LISTEN", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tollgate serve");
        Server::wait_until_up(child, port, None, None)
    }

    fn wait_until_up(child: Child, port: u16, log: Option<PathBuf>, token: Option<&str>) -> Server {
        let mut server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
            log,
            token: token.map(str::to_owned),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.tollgate(&["tenant", "list"]).status.success() {
            if let Some(status) = server.child.try_wait().expect("wait") {
                let log = server
                    .log
                    .as_ref()
                    .map(|_| server.log())
                    .unwrap_or_default();
                panic!("server exited with {status} before it came up: {log}");
            }
            assert!(Instant::now() < deadline, "server did not come up");
            sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn tollgate(&self, args: &[&str]) -> Output {
        let mut command = Command::new(BIN);
        command.args(args).env("TOLLGATE_SERVER", &self.url);
        if let Some(token) = &self.token {
            command.env("TOLLGATE_TOKEN", token);
        }
        command.output().expect("run tollgate")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.tollgate(args);
        assert!(
            out.status.success(),
            "tollgate {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).expect("valid JSON")
    }

    /// `tenant set-limits` of `tenant`'s request-unit bucket, all three
    /// values given.
    pub fn set_limits(&self, tenant: &str, available: f64, refill_rate: f64, burst_limit: f64) {
        self.ok(&[
            "tenant",
            "set-limits",
            "--tenant",
            tenant,
            "--available",
            &available.to_string(),
            "--refill-rate",
            &refill_rate.to_string(),
            "--burst-limit",
            &burst_limit.to_string(),
        ]);
    }

    /// The server's process id, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then expect a clean exit.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "server exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            sleep(Duration::from_millis(50));
        }
    }
}

impl Server {
    /// SIGKILL: a crash, or a machine gone.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Samples every bucket of `store` into its usage history, as a server's
/// sampling round does (tests that record history on a moved clock).
pub async fn sample_history(store: &dyn tollgate_server::store::Store) {
    let mut after = None;
    while let Some(last) = store
        .sample_history(after.as_ref(), 100)
        .await
        .expect("sample")
        .last
    {
        after = Some(last);
    }
}

/// `store`'s export, as `tollgate export` writes it: for `tollgate import`.
pub async fn export_lines(store: &dyn tollgate_server::store::Store) -> Vec<u8> {
    use tollgate_server::store::RecordSink;
    use tollgate_server::store::image::write_line;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let lines = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(record) = rx.recv().await {
            write_line(&mut out, &record).expect("write a line");
        }
        out
    });
    store.export(RecordSink::new(tx)).await.expect("export");
    lines.await.expect("lines")
}

/// Web pages and the console over plain HTTP and headless Chromium.
/// A plain HTTP/1.0 GET: the status code and the body.
pub fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{auth}\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// Runs headless Chromium on `url` with `args`; its stdout.
pub fn browse(chromium: &Path, profile: &Path, url: &str, args: &[&str]) -> String {
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            // Lets the page's fetch and first refresh finish before the DOM
            // is read.
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A screenshot of `url` at `size` (`W,H`), kept as
/// `target/tmp/console/NAME.png` for a person to look at; its bytes.
pub fn screenshot(chromium: &Path, profile: &Path, url: &str, name: &str, size: &str) -> Vec<u8> {
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let shot = shots.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&shot);
    browse(
        chromium,
        profile,
        url,
        &[
            &format!("--screenshot={}", shot.display()),
            &format!("--window-size={size}"),
        ],
    );
    std::fs::read(&shot).expect("a screenshot")
}

/// Headless Chromium, looked up on `PATH` (`chromium`, `chromium-browser`,
/// `google-chrome`) or at `TOLLGATE_CHROMIUM`; `None` (the test skipped)
/// where there is none, unless `TOLLGATE_REQUIRE_CHROMIUM` is set, which
/// makes its absence a failure.
pub fn chromium() -> Option<PathBuf> {
    external_tool(
        "TOLLGATE_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
        "TOLLGATE_REQUIRE_CHROMIUM",
    )
}

/// The text after `data-fact="NAME">` in the page `html` (not its
/// script), up to the next tag.
pub fn fact(html: &str, name: &str) -> String {
    let html = &html[..html.find("<script").unwrap_or(html.len())];
    let at = html
        .find(&format!("data-fact=\"{name}\">"))
        .unwrap_or_else(|| panic!("fact {name} in {html}"));
    let text = &html[at..];
    let text = &text[text.find('>').expect("tag end") + 1..];
    text[..text.find('<').expect("fact end")].to_owned()
}

/// A number as a page shows it (`12,345.6`).
pub fn number(text: &str) -> f64 {
    text.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("a number, not {text:?}"))
}
