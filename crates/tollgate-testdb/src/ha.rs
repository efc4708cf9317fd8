//! A highly available PostgreSQL of a test's own: pg_auto_failover.
//!
//! Production PostgreSQL runs as a primary with a standby, and a failover
//! moves the primary to another host; a server that only ever met one
//! database host has not been tested against that. An [`HaCluster`] is
//! pg_auto_failover's monitor and two nodes, started from the installed
//! `pg_autoctl` (Debian's `postgresql-15-auto-failover`), all on 127.0.0.1
//! at free ports in one temporary directory: the first node becomes the
//! primary, the second its synchronous standby (a commit returns once the
//! standby has the WAL, so nothing acknowledged is lost in a failover). The
//! monitor's health checks are tightened so a failover takes seconds, not
//! the default half minute.
//!
//! As for [`TempCluster`](crate::TempCluster), a root process runs the
//! programs as `postgres`, and a guardian kills every process of the
//! cluster and removes the directory however the test process ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::HarnessError;
use crate::binaries::PgBinaries;
use crate::cluster::{Guardian, chown_to_postgres, free_port, program_command, run};
use crate::os_user;

/// The database the nodes are created with.
pub const HA_DATABASE: &str = "tollgate";

/// How long a new cluster may take to have a primary and a standby.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The monitor's health checks, tightened (milliseconds): a node is checked
/// every second and unhealthy two seconds after its last success, and a
/// primary that cannot be reached is given three seconds to demote itself.
const MONITOR_SETTINGS: [(&str, u32); 6] = [
    ("health_check_period", 1000),
    ("health_check_timeout", 1000),
    ("health_check_max_retries", 1),
    ("health_check_retry_delay", 500),
    ("node_considered_unhealthy_timeout", 2000),
    ("primary_demote_timeout", 3000),
];

/// One PostgreSQL node of the cluster.
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    data_dir: PathBuf,
}

/// pg_auto_failover's monitor and two nodes (see the module docs).
///
/// Dropping it kills every process of the cluster and removes its
/// directory. The methods run commands and block.
#[derive(Debug)]
pub struct HaCluster {
    binaries: PgBinaries,
    as_postgres: bool,
    autoctl: PathBuf,
    monitor_port: u16,
    monitor_dir: PathBuf,
    nodes: Vec<Node>,
    /// The `pg_autoctl run` processes (monitor first, then the nodes), by
    /// name; each leads a process group of its own with its services.
    keepers: Mutex<Vec<(String, Child)>>,
    dir: TempDir,
    _guardian: Guardian,
}

impl HaCluster {
    /// Creates the monitor and two nodes and waits until the first is the
    /// primary and the second its standby (about 20 s).
    ///
    /// Fails if `pg_autoctl` is not installed (`apt-get install
    /// postgresql-15-auto-failover`) or the cluster does not come up.
    pub fn start() -> Result<HaCluster, HarnessError> {
        let binaries = PgBinaries::find()?;
        let autoctl = find_autoctl(&binaries)?;
        let as_postgres = os_user::is_root();
        let mut builder = tempfile::Builder::new();
        builder.prefix("tollgate-ha-");
        let dir = if as_postgres {
            builder.tempdir_in("/tmp")
        } else {
            builder.tempdir()
        }
        .map_err(|e| HarnessError::io("create the HA cluster's directory", e))?;
        if as_postgres {
            run(chown_to_postgres(dir.path()))?;
        }
        let guardian = Guardian::spawn(
            dir.path(),
            &stop_command(&binaries, as_postgres, dir.path()),
        )?;
        let mut cluster = HaCluster {
            binaries,
            as_postgres,
            autoctl,
            monitor_port: free_port()?,
            monitor_dir: dir.path().join("monitor"),
            nodes: Vec::new(),
            keepers: Mutex::new(Vec::new()),
            dir,
            _guardian: guardian,
        };
        cluster.create_monitor()?;
        for i in 1..=2 {
            cluster.create_node(i)?;
        }
        cluster.wait_until(SETUP_TIMEOUT, "a primary and a standby", |state| {
            state.contains(&("node1".to_owned(), "primary".to_owned()))
                && state.contains(&("node2".to_owned(), "secondary".to_owned()))
        })?;
        Ok(cluster)
    }

    /// The URL the nodes are reached by, as the superuser: every node's
    /// host and port, and `target_session_attrs=read-write`, so that a
    /// client connects to whichever is the primary.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "postgres://postgres@{}/{HA_DATABASE}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// The name of the node that is the primary now (as the monitor last
    /// heard: `primary`, or `wait_primary` while it has no standby).
    pub fn primary(&self) -> Result<Option<String>, HarnessError> {
        Ok(self
            .state()?
            .into_iter()
            .find(|(_, state)| state == "primary" || state == "wait_primary")
            .map(|(name, _)| name))
    }

    /// Kills node `name` as a lost machine would be: its keeper and its
    /// postmaster, by SIGKILL. The monitor then promotes the other node.
    pub fn kill_node(&self, name: &str) -> Result<(), HarnessError> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| HarnessError::io(format!("kill node {name}"), not_found()))?;
        let postmaster = std::fs::read_to_string(node.data_dir.join("postmaster.pid"))
            .ok()
            .and_then(|pid| pid.lines().next().map(str::to_owned));
        // The keeper and its services first, all at once (their process
        // group), so that none restarts the postmaster killed next.
        if let Ok(mut keepers) = self.keepers.lock()
            && let Some((_, keeper)) = keepers.iter_mut().find(|(n, _)| n == name)
        {
            let group = format!("-{}", keeper.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = keeper.wait();
        }
        if let Some(pid) = postmaster {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        Ok(())
    }

    /// Waits until a node other than `old` is the primary; returns its name.
    pub fn wait_for_new_primary(
        &self,
        old: &str,
        timeout: Duration,
    ) -> Result<String, HarnessError> {
        let state = self.wait_until(timeout, "a new primary", |state| {
            state
                .iter()
                .any(|(name, s)| name != old && (s == "primary" || s == "wait_primary"))
        })?;
        Ok(state
            .into_iter()
            .find(|(name, s)| name != old && (s == "primary" || s == "wait_primary"))
            .map(|(name, _)| name)
            .unwrap_or_default())
    }

    /// Where the cluster's logs are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn create_monitor(&mut self) -> Result<(), HarnessError> {
        let mut create = self.autoctl_command();
        create
            .args(["create", "monitor", "--pgdata"])
            .arg(&self.monitor_dir)
            .args(["--pgport", &self.monitor_port.to_string()])
            .args(["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"]);
        run(create)?;
        self.spawn_keeper(&self.monitor_dir.clone(), "monitor")?;
        self.wait_until(SETUP_TIMEOUT, "the monitor", |_| true)?;
        let mut settings: Vec<String> = MONITOR_SETTINGS
            .iter()
            .map(|(name, value)| format!("ALTER SYSTEM SET pgautofailover.{name} = {value}"))
            .collect();
        settings.push("SELECT pg_reload_conf()".into());
        for statement in settings {
            self.monitor_sql(&statement)?;
        }
        Ok(())
    }

    fn create_node(&mut self, i: usize) -> Result<(), HarnessError> {
        let node = Node {
            name: format!("node{i}"),
            port: free_port()?,
            data_dir: self.dir.path().join(format!("node{i}")),
        };
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        let mut create = self.autoctl_command();
        create
            .args(["create", "postgres", "--pgdata"])
            .arg(&node.data_dir)
            .args(["--pgport", &node.port.to_string()])
            .args(["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"])
            .args(["--dbname", HA_DATABASE, "--name", &node.name])
            .args(["--monitor", &monitor]);
        run(create)?;
        self.spawn_keeper(&node.data_dir, &node.name)?;
        // The standby is created from the primary once the primary is up.
        let name = node.name.clone();
        self.nodes.push(node);
        self.wait_until(SETUP_TIMEOUT, &format!("{name} registered"), |state| {
            state.iter().any(|(n, _)| *n == name)
        })?;
        Ok(())
    }

    /// Starts `pg_autoctl run` for the node (or monitor) in `data_dir`,
    /// logging to `<dir>/<name>.log`.
    fn spawn_keeper(&self, data_dir: &Path, name: &str) -> Result<(), HarnessError> {
        let log_path = self.dir.path().join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| HarnessError::io(format!("create {}", log_path.display()), e))?;
        let err = log
            .try_clone()
            .map_err(|e| HarnessError::io("duplicate the log file", e))?;
        let mut keeper = self.autoctl_command();
        std::os::unix::process::CommandExt::process_group(&mut keeper, 0);
        keeper
            .args(["run", "--pgdata"])
            .arg(data_dir)
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err));
        let child = keeper
            .spawn()
            .map_err(|e| HarnessError::io(format!("start pg_autoctl run for {name}"), e))?;
        if let Ok(mut keepers) = self.keepers.lock() {
            keepers.push((name.to_owned(), child));
        }
        Ok(())
    }

    /// `pg_autoctl`, as `postgres` when root, with the server programs on
    /// its `PATH`.
    fn autoctl_command(&self) -> Command {
        let mut command = if self.as_postgres {
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", "postgres", "--"]).arg(&self.autoctl);
            runuser
        } else {
            Command::new(&self.autoctl)
        };
        let bindir = self.binaries.program("pg_ctl");
        let bindir = bindir.parent().unwrap_or(Path::new("/"));
        let path = std::env::var("PATH").unwrap_or_default();
        command
            .env("PATH", format!("{}:{path}", bindir.display()))
            .env("PG_CONFIG", self.binaries.program("pg_config"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        command
    }

    /// Runs `sql` on the monitor's database; returns its rows, one per
    /// line, fields separated by `|`.
    fn monitor_sql(&self, sql: &str) -> Result<String, HarnessError> {
        let mut psql = program_command(&self.binaries, false, self.dir.path(), "psql");
        psql.args(["-h", "127.0.0.1", "-p", &self.monitor_port.to_string()])
            .args(["-U", "postgres", "-d", "pg_auto_failover", "-At", "-c", sql]);
        let output = psql
            .output()
            .map_err(|e| HarnessError::io("run psql on the monitor", e))?;
        if !output.status.success() {
            return Err(HarnessError::CommandFailed {
                command: format!("psql -c {sql:?} on the monitor"),
                status: output.status,
                output: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Every node's name and the state it last reported to the monitor.
    fn state(&self) -> Result<Vec<(String, String)>, HarnessError> {
        let rows = self.monitor_sql(
            "SELECT nodename, reportedstate FROM pgautofailover.node ORDER BY nodeid",
        )?;
        Ok(rows
            .lines()
            .filter_map(|line| line.split_once('|'))
            .map(|(name, state)| (name.to_owned(), state.to_owned()))
            .collect())
    }

    /// Polls the monitor until `done` holds for the nodes' states (the
    /// monitor may not answer yet at first); returns that state.
    fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&[(String, String)]) -> bool,
    ) -> Result<Vec<(String, String)>, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.state();
            if let Ok(state) = &state
                && done(state)
            {
                return Ok(state.clone());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::HaTimeout {
                    dir: self.dir.path().to_owned(),
                    what: format!("no {what} within {timeout:?}"),
                    state: match state {
                        Ok(state) => format!("{state:?}"),
                        Err(error) => error.to_string(),
                    },
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        let _ = stop_command(&self.binaries, self.as_postgres, self.dir.path()).status();
        if let Ok(mut keepers) = self.keepers.lock() {
            for (_, keeper) in keepers.iter_mut() {
                let _ = keeper.kill();
                let _ = keeper.wait();
            }
        }
    }
}

/// Stops everything of the cluster in `dir`: the keepers first with their
/// services (SIGKILL to every process of each keeper's process group but
/// the postmaster, so none restarts a server), then every server (`pg_ctl
/// stop -m immediate`: the postmaster takes its children down with it, the
/// monitor's background workers included, which a SIGKILLed postmaster
/// would leave behind).
fn stop_command(binaries: &PgBinaries, as_postgres: bool, dir: &Path) -> Command {
    const SCRIPT: &str = r#"
dir=$1
shift
for pid in $(pgrep -f "pg_autoctl.* --pgdata $dir/"); do
    group=$(ps -o pgid= -p "$pid" | tr -d ' ')
    if [ -z "$group" ]; then continue; fi
    for member in $(ps -eo pid=,pgid=,comm= | awk -v g="$group" '$2 == g && $3 != "postgres" { print $1 }'); do
        kill -KILL "$member"
    done
done
for data in "$dir"/monitor "$dir"/node*; do
    if [ -f "$data/postmaster.pid" ]; then
        "$@" stop --wait --silent --mode immediate --pgdata "$data" >/dev/null 2>&1
    fi
done
"#;
    let pg_ctl = program_command(binaries, as_postgres, dir, "pg_ctl");
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", SCRIPT, "tollgate-testdb-ha-stop"])
        .arg(dir)
        .arg(pg_ctl.get_program())
        .args(pg_ctl.get_args())
        .current_dir("/")
        .stdin(Stdio::null());
    command
}

/// `pg_autoctl`: next to the server programs, or on the `PATH` (Debian
/// installs a wrapper in /usr/bin).
fn find_autoctl(binaries: &PgBinaries) -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let beside = binaries.program("pg_autoctl");
    let dirs: Vec<PathBuf> = beside
        .parent()
        .map(Path::to_path_buf)
        .into_iter()
        .chain(std::env::split_paths(&path))
        .chain([PathBuf::from("/usr/bin")])
        .collect();
    dirs.iter()
        .map(|dir| dir.join("pg_autoctl"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| HarnessError::AutoFailoverNotFound {
            searched: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

fn not_found() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotFound, "no such node")
}
