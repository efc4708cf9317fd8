//! A PostgreSQL cluster of a test's own.
//!
//! Tests of failover, reconnection and crash recovery must stop, restart or
//! kill the database server, which they cannot do to a shared one. A
//! [`TempCluster`] is `initdb` in a temporary directory and a `postgres`
//! server listening on 127.0.0.1 at a free port, with its unix socket in that
//! directory so it never clashes with a system server.
//!
//! When the process runs as root (containers, CI), `initdb` refuses to run;
//! the programs then run as `postgres` through `runuser`, in a directory owned
//! by `postgres` under `/tmp`.
//!
//! Cleanup: dropping the cluster stops the server and removes the directory.
//! A value that is never dropped (a `static`, a test process killed by a
//! timeout) would leave the server running, since `pg_ctl` detaches it into
//! its own session. So each cluster also has a *guardian*: a small shell
//! process that waits for end-of-file on a pipe whose only writer is the test
//! process. However the test process ends, even by `SIGKILL`, the kernel
//! closes the pipe, and the guardian stops the server and removes the
//! directory. The guardian ignores `SIGINT`, `SIGTERM` and `SIGHUP` so that a
//! Ctrl-C on `cargo test` does not take it down before it has cleaned up; only
//! a `SIGKILL` of the guardian itself leaves the cluster behind.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use crate::HarnessError;
use crate::binaries::PgBinaries;
use crate::os_user;

/// How many free ports to try when the one picked is taken before the server
/// binds it.
const START_ATTEMPTS: usize = 3;

/// Lines of the server log quoted in a start error.
const LOG_TAIL_LINES: usize = 30;

/// The file, in the data directory, holding the settings the harness chooses.
const SETTINGS_FILE: &str = "tollgate.conf";

/// The server log, in the data directory.
const LOG_FILE: &str = "server.log";

/// A PostgreSQL cluster of the test's own (`initdb` in a temporary directory,
/// listening on 127.0.0.1 at a free port, trust authentication, superuser
/// `postgres`), for tests that must stop, restart or kill the database server.
///
/// Dropping it stops the server (`pg_ctl stop -m immediate`) and removes the
/// directory. The methods run commands and block; from async code, call them
/// through `tokio::task::spawn_blocking` if blocking the runtime matters.
#[derive(Debug)]
pub struct TempCluster {
    /// Where `initdb` and `pg_ctl` are.
    binaries: PgBinaries,
    /// Run the programs as `postgres` through `runuser` (the process is root).
    as_postgres: bool,
    /// `<dir>/data`: the cluster, its settings and the server log.
    data_dir: PathBuf,
    /// The TCP port, chosen once and kept across restarts.
    port: u16,
    /// Settings a test added with [`TempCluster::configure`].
    extra_settings: std::sync::Mutex<String>,
    /// The temporary directory; the unix socket is in it too.
    // Dropped after `Drop::drop` has stopped the server: first the directory,
    // then the guardian, which then finds nothing left to clean.
    dir: TempDir,
    /// Cleans up if this value is never dropped.
    _guardian: Guardian,
}

impl TempCluster {
    /// Creates the cluster (`initdb`) and starts its server (`pg_ctl start
    /// -w`), on a new free port if the one picked was taken in between.
    ///
    /// Takes a few seconds. Fails if the server programs are not found (see
    /// `TOLLGATE_PG_BINDIR`), or with the tail of the server log if the server
    /// does not start.
    pub fn start() -> Result<TempCluster, HarnessError> {
        let binaries = PgBinaries::find()?;
        let as_postgres = os_user::is_root();
        let mut builder = tempfile::Builder::new();
        builder.prefix("tollgate-pg-");
        // As root the directory must be reachable by `postgres`, which a
        // root-only TMPDIR (under /root, say) would not be.
        let dir = if as_postgres {
            builder.tempdir_in("/tmp")
        } else {
            builder.tempdir()
        }
        .map_err(|e| HarnessError::io("create the temporary cluster's directory", e))?;
        let data_dir = dir.path().join("data");
        if as_postgres {
            run(chown_to_postgres(dir.path()))?;
        }
        let guardian = Guardian::spawn(
            dir.path(),
            &stop_command(&binaries, as_postgres, dir.path(), &data_dir, "immediate"),
        )?;
        let mut cluster = TempCluster {
            binaries,
            as_postgres,
            data_dir,
            port: 0,
            extra_settings: std::sync::Mutex::new(String::new()),
            dir,
            _guardian: guardian,
        };
        cluster.init()?;
        cluster.start_on_free_port()?;
        tracing::debug!(
            port = cluster.port,
            data_dir = %cluster.data_dir.display(),
            "started a temporary PostgreSQL cluster"
        );
        Ok(cluster)
    }

    /// The URL of `database` on this cluster, as the superuser:
    /// `postgres://postgres@127.0.0.1:{port}/{database}`. Every cluster has
    /// the databases `postgres`, `template1` and `template0`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The TCP port the server listens on; it stays the same across
    /// restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server cleanly (`pg_ctl stop -m fast -w`): open connections
    /// are closed, and new ones are refused until [`start_again`](Self::start_again).
    pub fn stop(&self) -> Result<(), HarnessError> {
        self.pg_ctl_stop("fast")
    }

    /// Kills the server without a clean shutdown (`pg_ctl stop -m immediate
    /// -w`), as a crash would; the next start runs crash recovery. Committed
    /// transactions survive it.
    pub fn kill(&self) -> Result<(), HarnessError> {
        self.pg_ctl_stop("immediate")
    }

    /// Starts the stopped server again on the same port and data directory.
    /// Fails if another process took the port in the meantime.
    pub fn start_again(&self) -> Result<(), HarnessError> {
        self.pg_ctl_start()
    }

    /// Stops the server cleanly and starts it again.
    pub fn restart(&self) -> Result<(), HarnessError> {
        self.stop()?;
        self.start_again()
    }

    /// Adds `settings` (lines of `postgresql.conf`) to the cluster's
    /// configuration; they take effect at the next start or restart.
    pub fn configure(&self, settings: &str) -> Result<(), HarnessError> {
        if let Ok(mut extra) = self.extra_settings.lock() {
            extra.push_str(settings);
            extra.push('\n');
        }
        self.write_settings()
    }

    /// Writes a file into the data directory, owned by the server's user
    /// and, if `private`, readable by it alone (as a TLS key must be).
    /// Returns its path; settings may name it relative to the data directory.
    pub fn write_data_file(
        &self,
        name: &str,
        contents: &[u8],
        private: bool,
    ) -> Result<PathBuf, HarnessError> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.data_dir.join(name);
        std::fs::write(&path, contents)
            .map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
        let mode = if private { 0o600 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| HarnessError::io(format!("chmod {}", path.display()), e))?;
        if self.as_postgres {
            run(chown_to_postgres(&path))?;
        }
        Ok(path)
    }

    /// Runs `initdb` and makes `postgresql.conf` include the harness's
    /// settings file.
    fn init(&self) -> Result<(), HarnessError> {
        let mut initdb = self.command("initdb");
        initdb
            .arg("--pgdata")
            .arg(&self.data_dir)
            .args(["--username=postgres", "--auth=trust", "--encoding=UTF8"])
            // No locale: the same collation everywhere; no sync: a test
            // cluster does not need to survive a power cut.
            .args(["--no-locale", "--no-sync"]);
        run(initdb)?;
        let include =
            format!("\n# Settings chosen by tollgate-testdb.\ninclude '{SETTINGS_FILE}'\n");
        let postgresql_conf = self.data_dir.join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&postgresql_conf)
            .and_then(|mut file| file.write_all(include.as_bytes()))
            .map_err(|e| HarnessError::io(format!("append to {}", postgresql_conf.display()), e))
    }

    /// Starts the server on a free port, retrying with another if the port
    /// was taken before the server could bind it.
    fn start_on_free_port(&mut self) -> Result<(), HarnessError> {
        let mut attempt = 1;
        loop {
            self.port = free_port()?;
            self.write_settings()?;
            match self.pg_ctl_start() {
                Err(HarnessError::ClusterStart { log_tail, .. })
                    if attempt < START_ATTEMPTS && port_was_taken(&log_tail) =>
                {
                    tracing::debug!(
                        port = self.port,
                        "port taken before the server bound it; trying another"
                    );
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// Writes the settings file: addresses, port, socket directory, sizes.
    fn write_settings(&self) -> Result<(), HarnessError> {
        let settings = format!(
            "listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{socket_dir}'\n\
             shared_buffers = 32MB\n\
             max_connections = 100\n\
             # Durability against a crash of the server (what tests simulate)\n\
             # does not need fsync, only against a crash of the machine.\n\
             fsync = off\n\
             {extra}",
            port = self.port,
            socket_dir = self.dir.path().display().to_string().replace('\'', "''"),
            extra = self
                .extra_settings
                .lock()
                .map(|extra| extra.clone())
                .unwrap_or_default(),
        );
        let path = self.data_dir.join(SETTINGS_FILE);
        std::fs::write(&path, settings)
            .map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
        if self.as_postgres {
            run(chown_to_postgres(&path))?;
        }
        Ok(())
    }

    /// `pg_ctl start -w`; on failure, the error quotes what the server
    /// logged.
    fn pg_ctl_start(&self) -> Result<(), HarnessError> {
        let log = self.data_dir.join(LOG_FILE);
        // Quote only what this start wrote to the log.
        let log_offset = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl
            .args(["start", "--wait", "--timeout=60", "--silent", "--pgdata"])
            .arg(&self.data_dir)
            .arg("--log")
            .arg(&log);
        run(pg_ctl).map_err(|error| HarnessError::ClusterStart {
            data_dir: self.data_dir.clone(),
            reason: error.to_string(),
            log_tail: log_tail(&log, log_offset),
        })
    }

    /// `pg_ctl stop -w` in the given shutdown mode (`fast`, `immediate`).
    fn pg_ctl_stop(&self, mode: &str) -> Result<(), HarnessError> {
        run(stop_command(
            &self.binaries,
            self.as_postgres,
            self.dir.path(),
            &self.data_dir,
            mode,
        ))
    }

    /// A command running one of the server programs for this cluster.
    fn command(&self, program: &str) -> Command {
        program_command(&self.binaries, self.as_postgres, self.dir.path(), program)
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        // No postmaster.pid: the server is not running (never started, or
        // stopped by the test), and pg_ctl would only complain.
        if self.data_dir.join("postmaster.pid").exists()
            && let Err(error) = self.kill()
        {
            tracing::warn!(%error, port = self.port, "could not stop the temporary PostgreSQL cluster");
        }
    }
}

/// The process that stops the server and removes the directory when the test
/// process ends without dropping the cluster (see the module documentation).
#[derive(Debug)]
pub(crate) struct Guardian {
    /// The shell, its stdin the pipe whose end-of-file it waits for.
    child: Child,
}

impl Guardian {
    /// Starts the guardian of the cluster in `dir`; `stop` is the command
    /// that stops its server.
    pub(crate) fn spawn(dir: &Path, stop: &Command) -> Result<Guardian, HarnessError> {
        const SCRIPT: &str = r#"
trap '' HUP INT TERM
cat >/dev/null
dir=$1
shift
"$@" >/dev/null 2>&1
rm -rf "$dir"
"#;
        let child = Command::new("/bin/sh")
            .args(["-c", SCRIPT, "tollgate-testdb-guardian"])
            .arg(dir)
            .arg(stop.get_program())
            .args(stop.get_args())
            .current_dir("/")
            // The write end stays with this process (close-on-exec, so no
            // other child inherits it); end-of-file means this process ended.
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| HarnessError::io("start the temporary cluster's guardian (/bin/sh)", e))?;
        Ok(Guardian { child })
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // The cluster is already stopped and removed; closing the pipe lets
        // the guardian find that out and exit, and waiting reaps it.
        drop(self.child.stdin.take());
        if let Err(error) = self.child.wait() {
            tracing::warn!(%error, "could not wait for the temporary cluster's guardian");
        }
    }
}

/// A command running one of the server programs, as `postgres` when the
/// process is root, from `dir` (`postgres` may not be allowed into the
/// current directory).
pub(crate) fn program_command(
    binaries: &PgBinaries,
    as_postgres: bool,
    dir: &Path,
    program: &str,
) -> Command {
    let path = binaries.program(program);
    let mut command = if as_postgres {
        let mut runuser = Command::new("runuser");
        runuser.args(["-u", "postgres", "--"]).arg(path);
        runuser
    } else {
        Command::new(path)
    };
    command.current_dir(dir).stdin(Stdio::null());
    command
}

/// `pg_ctl stop` for the cluster in `data_dir`, in the given shutdown mode.
fn stop_command(
    binaries: &PgBinaries,
    as_postgres: bool,
    dir: &Path,
    data_dir: &Path,
    mode: &str,
) -> Command {
    let mut pg_ctl = program_command(binaries, as_postgres, dir, "pg_ctl");
    pg_ctl
        .args(["stop", "--wait", "--silent", "--mode", mode, "--pgdata"])
        .arg(data_dir);
    pg_ctl
}

/// `chown -R postgres: <path>`, for the files a root process writes for the
/// server.
pub(crate) fn chown_to_postgres(path: &Path) -> Command {
    let mut chown = Command::new("chown");
    chown.args(["-R", "postgres:"]).arg(path);
    chown
}

/// Runs a command to completion; an unsuccessful exit is an error carrying
/// its output.
pub(crate) fn run(mut command: Command) -> Result<(), HarnessError> {
    let description = describe(&command);
    let output = command
        .output()
        .map_err(|e| HarnessError::io(format!("run {description}"), e))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stderr.trim().is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(stderr.trim());
    }
    Err(HarnessError::CommandFailed {
        command: description,
        status: output.status,
        output: text,
    })
}

/// The command line, for error messages.
fn describe(command: &Command) -> String {
    let mut description = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        let _ = write!(description, " {}", arg.to_string_lossy());
    }
    description
}

/// A port that was free a moment ago: bound to 127.0.0.1:0, then released.
/// Another process may take it before the server binds it, hence the retries
/// in [`TempCluster::start`].
pub(crate) fn free_port() -> Result<u16, HarnessError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| HarnessError::io("find a free port on 127.0.0.1", e))
}

/// Whether the server log says the port was in use.
fn port_was_taken(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("could not create any TCP/IP sockets")
}

/// The last lines the log received after `offset`.
fn log_tail(log: &Path, offset: u64) -> String {
    let Ok(bytes) = std::fs::read(log) else {
        return format!("(no log at {})", log.display());
    };
    let start = usize::try_from(offset).unwrap_or(0).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guardian_stops_the_server_and_removes_the_directory_when_the_process_is_gone() {
        let mut cluster = TempCluster::start().expect("start a temporary cluster");
        let dir = cluster.dir.path().to_owned();
        let address = ("127.0.0.1", cluster.port());
        assert!(std::net::TcpStream::connect(address).is_ok());

        // What the kernel does when the test process dies: the pipe's only
        // writer goes away.
        drop(cluster._guardian.child.stdin.take());
        let status = cluster
            ._guardian
            .child
            .wait()
            .expect("wait for the guardian");

        assert!(status.success());
        assert!(!dir.exists(), "{} still exists", dir.display());
        assert!(std::net::TcpStream::connect(address).is_err());
    }

    #[test]
    fn dropping_the_cluster_stops_the_server_and_removes_the_directory() {
        let cluster = TempCluster::start().expect("start a temporary cluster");
        let dir = cluster.dir.path().to_owned();
        let address = ("127.0.0.1", cluster.port());

        drop(cluster);

        assert!(!dir.exists(), "{} still exists", dir.display());
        assert!(std::net::TcpStream::connect(address).is_err());
    }

    #[test]
    fn only_the_new_part_of_the_log_is_quoted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("server.log");
        std::fs::write(&log, "old line\nnew line 1\nnew line 2\n").expect("log");
        assert_eq!(log_tail(&log, 9), "new line 1\nnew line 2");
    }
}
