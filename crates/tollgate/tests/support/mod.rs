//! A `tollgate serve` process for the end-to-end tests.
#![allow(dead_code)] // each test binary uses part of it

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub mod usage;

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

pub struct Server {
    child: Child,
    pub url: String,
    pub port: u16,
}

impl Server {
    pub fn start(store: &Path) -> Server {
        // Find a free port; the server binds it right after.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        Server::start_on(store, port, &[])
    }

    /// Serves `store` (a file or a database URL) on a free port with `extra` flags.
    pub fn start_with(store: &Path, extra: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        Server::start_on(store, port, extra)
    }

    /// Serves `store` on `port` (a restart reuses the port pods know).
    pub fn start_on(store: &Path, port: u16, extra: &[&str]) -> Server {
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--store"])
            .arg(store)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tollgate serve");
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.tollgate(&["tenant", "list"]).status.success() {
            assert!(Instant::now() < deadline, "server did not come up");
            sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn tollgate(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("TOLLGATE_SERVER", &self.url)
            .output()
            .expect("run tollgate")
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
