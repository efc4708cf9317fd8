//! `tollgate serve`'s configuration end to end: a config file taking
//! effect, the environment and flags overriding it, a bad file stopping the
//! server with a message naming the problem, which store a server opens or
//! makes (and what it logs about it and about unconfigured tenants), JSON
//! logs, and the audit line an admin change leaves in the server's log.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{BIN, Server, free_port};

/// The limits a pod request for a tenant nobody configured gives it.
fn walk_in_limits(server: &Server, tenant: &str) -> (f64, f64) {
    server.ok(&[
        "pod",
        "request",
        "--tenant",
        tenant,
        "--instance",
        "1",
        "--tokens",
        "1",
    ]);
    let shown = server.json(&[
        "tenant", "show", "--tenant", tenant, "--bucket", "", "--json",
    ]);
    assert_eq!(shown["configured"], false);
    (
        shown["refill_rate"].as_f64().expect("refill rate"),
        shown["burst_limit"].as_f64().expect("burst limit"),
    )
}

fn write_config(path: &Path, text: &str) -> String {
    std::fs::write(path, text).expect("write the config file");
    path.display().to_string()
}

#[test]
fn a_config_file_configures_the_server_and_environment_and_flags_override_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = write_config(
        &dir.path().join("tollgate.toml"),
        &format!(
            "listen = \"127.0.0.1:{port}\"\nstore = \"{}\"\ndefault-refill-rate = 7\ndefault-burst-limit = 70\n",
            dir.path().join("state.redb").display()
        ),
    );
    let log = dir.path().join("serve.log");

    // The server comes up on the file's address, with the file's defaults.
    let server = Server::start_logged(&["--config", &config, "--create"], &[], port, &log);
    assert_eq!(walk_in_limits(&server, "walk-in-1"), (7.0, 70.0));
    let log_text = server.log();
    let startup = log_text
        .lines()
        .find(|l| l.contains("effective configuration"))
        .expect("the configuration is logged at startup");
    assert!(
        startup.contains(&format!("listen=127.0.0.1:{port}")),
        "{startup}"
    );
    assert!(
        startup.contains("set_by=file: default-burst-limit, default-refill-rate, listen, store"),
        "{startup}"
    );
    server.stop();

    // The environment beats the file, a flag beats both; the same file
    // also works through TOLLGATE_CONFIG.
    let server = Server::start_logged(
        &["--default-refill-rate", "9"],
        &[
            ("TOLLGATE_CONFIG", &config),
            ("TOLLGATE_DEFAULT_REFILL_RATE", "8"),
            ("TOLLGATE_DEFAULT_BURST_LIMIT", "80"),
        ],
        port,
        &log,
    );
    assert_eq!(walk_in_limits(&server, "walk-in-2"), (9.0, 80.0));
    let listed = server.json(&["tenant", "list", "--json"]);
    assert_eq!(
        listed.as_array().expect("array").len(),
        2,
        "the store is the file's"
    );
    server.stop();
}

#[test]
fn a_bad_config_file_stops_the_server_with_a_message_naming_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("serve")
            .args(args)
            .env_remove("TOLLGATE_CONFIG")
            .output()
            .expect("run tollgate serve");
        assert!(!out.status.success(), "serve {args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    let unknown = write_config(
        &dir.path().join("unknown.toml"),
        "in-memory = true\nlisten-adress = \"127.0.0.1:1\"\n",
    );
    let stderr = serve(&["--config", &unknown]);
    assert!(stderr.contains("listen-adress"), "{stderr}");
    assert!(stderr.contains(&unknown), "names the file: {stderr}");

    let wrong_type = write_config(&dir.path().join("type.toml"), "pg-pool-size = \"many\"\n");
    let stderr = serve(&["--config", &wrong_type]);
    assert!(stderr.contains("pg-pool-size"), "{stderr}");

    let bad_value = write_config(
        &dir.path().join("value.toml"),
        "in-memory = true\ninactivity-timeout = \"0s\"\n",
    );
    let stderr = serve(&["--config", &bad_value]);
    assert!(
        stderr.contains("--inactivity-timeout: must be more than zero (from config file"),
        "{stderr}"
    );

    let missing = dir.path().join("missing.toml").display().to_string();
    let stderr = serve(&["--config", &missing]);
    assert!(stderr.contains(&missing), "{stderr}");
}

/// The files in `dir`, by name.
fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The server's log line that says which store it opened or made.
fn store_line(log: &str) -> &str {
    log.lines()
        .find(|l| l.contains("store opened") || l.contains("store created"))
        .unwrap_or_else(|| panic!("no store line in the log: {log}"))
}

#[test]
fn a_store_file_that_is_not_there_is_an_error_naming_its_absolute_path_unless_create() {
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let logs = tempfile::tempdir().expect("tempdir");
    let absolute = elsewhere.path().join("billing.redb");

    // A relative --store from another working directory: refused, the
    // error names the absolute path and --create, and nothing is made.
    let mut serve = support::Served(
        support::command()
            .args([
                "serve",
                "--store",
                "billing.redb",
                "--listen",
                "127.0.0.1:0",
            ])
            .env_remove("DATABASE_URL")
            .env("TOLLGATE_METRICS_LISTEN", "off")
            .current_dir(elsewhere.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tollgate serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = serve.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve started on a missing store"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "serve started on a missing store");
    let mut stderr = String::new();
    serve
        .0
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(
        stderr.contains(&format!("no store file at {}", absolute.display())),
        "{stderr}"
    );
    assert!(stderr.contains("--create"), "{stderr}");
    assert!(
        files_in(elsewhere.path()).is_empty(),
        "serve made {:?}",
        files_in(elsewhere.path())
    );

    // --create makes it, and the log says so, by the absolute path.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = logs.path().join("created.log");
    let args = ["--store", "billing.redb", "--listen", listen.as_str()];
    let server = Server::start_logged_in(
        elsewhere.path(),
        &[&args[..], &["--create"]].concat(),
        port,
        &log,
    );
    let text = server.log();
    let line = store_line(&text);
    assert!(line.contains("store created"), "{line}");
    assert!(line.contains(&absolute.display().to_string()), "{line}");
    assert!(
        line.contains("created=true") && line.contains("--create"),
        "{line}"
    );
    server.set_limits("acme", 10.0, 10.0, 10.0);
    server.stop();
    assert!(absolute.is_file(), "--create made no store file");

    // Without --create the file now opens, the tenant still configured.
    let log = logs.path().join("opened.log");
    let server = Server::start_logged_in(elsewhere.path(), &args, port, &log);
    let text = server.log();
    let line = store_line(&text);
    assert!(line.contains("store opened"), "{line}");
    assert!(line.contains(&absolute.display().to_string()), "{line}");
    assert!(line.contains("created=false"), "{line}");
    let shown = server.json(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "", "--json",
    ]);
    assert_eq!(shown["configured"], true, "{shown}");
    server.stop();
}

#[test]
fn the_default_store_is_made_on_the_first_run_and_the_log_says_where_why_and_the_tenant_policy() {
    let workdir = tempfile::tempdir().expect("tempdir");
    let logs = tempfile::tempdir().expect("tempdir");
    let absolute = workdir.path().join("tollgate.redb");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");

    let log = logs.path().join("first.log");
    let server = Server::start_logged_in(workdir.path(), &["--listen", &listen], port, &log);
    let text = server.log();
    let line = store_line(&text);
    assert!(line.contains("store created"), "{line}");
    assert!(line.contains(&absolute.display().to_string()), "{line}");
    assert!(line.contains("the default file"), "{line}");
    assert!(
        text.contains("tenants nobody has configured are served with the default limits: refill rate 1000 tokens/s, burst limit 10000 tokens"),
        "{text}"
    );
    server.stop();
    assert!(absolute.is_file(), "no default store file was made");

    // The second run opens it; with --require-configured-tenants the log
    // says such tenants are refused.
    let log = logs.path().join("second.log");
    let server = Server::start_logged_in(
        workdir.path(),
        &["--listen", &listen, "--require-configured-tenants"],
        port,
        &log,
    );
    let text = server.log();
    let line = store_line(&text);
    assert!(line.contains("store opened"), "{line}");
    assert!(line.contains(&absolute.display().to_string()), "{line}");
    assert!(
        text.contains("tenants nobody has configured are refused"),
        "{text}"
    );
    server.stop();
}

#[test]
fn json_logs_are_one_object_per_line_and_the_audit_line_has_its_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = dir.path().join("serve.log");
    let server = Server::start_logged(
        &["--in-memory", "--listen", &listen, "--log-format", "json"],
        &[],
        port,
        &log,
    );
    server.ok(&[
        "tenant",
        "set-limits",
        "--tenant",
        "acme",
        "--available",
        "10",
        "--refill-rate",
        "0",
        "--burst-limit",
        "100",
        "--actor",
        "alice",
    ]);
    server.stop();

    let text = std::fs::read_to_string(&log).expect("read the log");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    assert!(
        lines.len() >= 3,
        "startup, audit and shutdown lines: {text}"
    );
    let startup = lines
        .iter()
        .find(|l| l["fields"]["message"] == "effective configuration")
        .expect("the configuration is logged");
    assert_eq!(startup["fields"]["log_format"], "json");
    assert_eq!(startup["fields"]["listen"], listen);
    let audit = lines
        .iter()
        .find(|l| l["fields"]["operation"] == "update_tenant_resource_limits")
        .expect("an audit line");
    assert_eq!(audit["level"], "INFO");
    let fields = &audit["fields"];
    assert_eq!(fields["actor"], "alice");
    assert_eq!(fields["tenant"], "acme");
    assert_eq!(fields["created"], true);
    assert_eq!(fields["after.refill_rate"], 0.0);
    assert_eq!(fields["after.burst_limit"], 100.0);
    assert_eq!(fields["after.tokens"], 10.0);
    assert!(
        fields["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{audit}"
    );
}

#[test]
fn set_limits_and_delete_leave_an_audit_line_with_actor_tenant_and_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = dir.path().join("serve.log");
    let server = Server::start_logged(&["--in-memory", "--listen", &listen], &[], port, &log);
    let set_limits = |available: &str, refill: &str, burst: &str, actor: &str| {
        server.ok(&[
            "tenant",
            "set-limits",
            "--tenant",
            "acme",
            "--available",
            available,
            "--refill-rate",
            refill,
            "--burst-limit",
            burst,
            "--actor",
            actor,
        ]);
    };
    set_limits("10", "0", "100", "alice");
    set_limits("50", "7", "200", "alice");
    // Without --actor the client sends $USER.
    let out = Command::new(BIN)
        .args(["tenant", "delete", "--tenant", "acme", "--yes"])
        .env("TOLLGATE_SERVER", &server.url)
        .env_remove("TOLLGATE_ACTOR")
        .env("USER", "bob")
        .output()
        .expect("run tollgate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A name the server will not log does not fail the change.
    set_limits("1", "1", "1", "caf\u{e9}");
    server.stop();

    let text = std::fs::read_to_string(&log).expect("read the log");
    let audit: Vec<&str> = text.lines().filter(|l| l.contains("operation=")).collect();
    // The delete logs its bucket and its tombstone; the last set-limits
    // creates the tenant again and logs the tombstone it removed.
    assert_eq!(audit.len(), 6, "one line per change: {text}");

    let created = audit[0];
    assert!(created.contains("alice at 127.0.0.1:"), "{created}");
    assert!(created.contains("created tenant acme"), "{created}");
    assert!(created.contains("actor=\"alice\""), "{created}");

    let updated = audit[1];
    for expected in [
        "alice at 127.0.0.1:",
        "set the limits of tenant acme",
        "refill rate 0 -> 7 tokens/s",
        "burst limit 100 -> 200 tokens",
        "tokens 10.0 -> 50.0",
        "tenant=acme",
        "before.refill_rate=0.0",
        "before.burst_limit=100.0",
        "before.tokens=10.0",
        "after.refill_rate=7.0",
        "after.burst_limit=200.0",
        "after.tokens=50.0",
    ] {
        assert!(updated.contains(expected), "{expected:?} in {updated}");
    }

    let deleted = audit[2];
    for expected in [
        "bob at 127.0.0.1:",
        "deleted tenant acme",
        "operation=\"delete_tenant\"",
        "before.refill_rate=7.0",
        "before.burst_limit=200.0",
    ] {
        assert!(deleted.contains(expected), "{expected:?} in {deleted}");
    }

    let tombstone = audit[3];
    assert!(
        tombstone.contains("deleted tenant acme (1 buckets); its tombstone refuses its pods"),
        "{tombstone}"
    );

    let unnamed = audit[4];
    assert!(unnamed.contains("x-tollgate-actor ignored"), "{unnamed}");
    assert!(!unnamed.contains("actor=\""), "{unnamed}");
    let revived = audit[5];
    assert!(
        revived.contains("created tenant acme again (deleted at ")
            && revived.contains("by bob at 127.0.0.1:"),
        "{revived}"
    );
}

/// `deploy/serve-options.txt`, against which the deployment files are
/// validated, lists exactly the options `tollgate serve` has (but for
/// `--config`, which cannot be set in a file, and `--in-memory`).
#[test]
fn the_deploy_option_list_matches_serve() {
    let listed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/serve-options.txt"
    ))
    .expect("deploy/serve-options.txt");
    let listed: std::collections::BTreeSet<String> = listed
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let help = std::process::Command::new(support::BIN)
        .args(["serve", "--help"])
        .output()
        .expect("serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let real: std::collections::BTreeSet<String> = help
        .lines()
        .filter_map(|l| {
            let flag = l.trim_start().trim_start_matches("-h, ");
            let name = flag.strip_prefix("--")?;
            Some(name.split([' ', '=', '[']).next()?.to_owned())
        })
        .filter(|name| !["config", "in-memory", "help"].contains(&name.as_str()))
        .collect();
    assert_eq!(listed, real);
}
