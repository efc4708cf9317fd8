//! `tollgate export` and `tollgate import` as an operator runs them: a
//! server on the embedded store takes traffic over gRPC, is stopped, and
//! its store is exported, imported into PostgreSQL, served from there,
//! exported again while that server runs, and imported into a new
//! embedded file. Every step's server shows the same tenants, limits and
//! exact totals, and a retried check is still answered from its record.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::Server;
use tollgate_testdb::TestDatabase;

fn run(args: &[&str]) -> Output {
    support::command()
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tollgate")
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "tollgate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn failed(args: &[&str]) -> String {
    let out = run(args);
    assert!(!out.status.success(), "tollgate {args:?} succeeded");
    String::from_utf8(out.stderr).expect("utf-8")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// What an operator bills from and configures, per bucket: everything
/// `tenant show --json` says that does not move with the clock (of a
/// per-key bucket: its definition and its stored keys).
fn books(server: &Server) -> Vec<Value> {
    let list = server.json(&["tenant", "list", "--json"]);
    let mut tenants: Vec<&str> = list
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["tenant_id"].as_str().expect("tenant id"))
        .collect();
    tenants.dedup();
    let mut books = Vec::new();
    for tenant in tenants {
        let shown = server.json(&["tenant", "show", "--tenant", tenant, "--json"]);
        for bucket in shown.as_array().expect("buckets") {
            if bucket["kind"] == "per-key" {
                // Its definition and the keys the store holds.
                let keys: Vec<&Value> = bucket["busiest_keys"]
                    .as_array()
                    .expect("busiest keys")
                    .iter()
                    .map(|k| &k["key"])
                    .collect();
                books.push(serde_json::json!({
                    "tenant": bucket["tenant_id"],
                    "bucket": bucket["bucket"],
                    "refill_rate": bucket["refill_rate"],
                    "burst_limit": bucket["burst_limit"],
                    "defined_by": bucket["defined_by"],
                    "keys_stored": bucket["keys_stored"],
                    "busiest_keys": keys,
                }));
                continue;
            }
            let instances: Vec<Value> = bucket["instances"]
                .as_array()
                .expect("instances")
                .iter()
                .map(|i| serde_json::json!([i["instance_id"], i["seq"], i["last_update"]]))
                .collect();
            books.push(serde_json::json!({
                "tenant": bucket["tenant_id"],
                "bucket": bucket["bucket"],
                "configured": bucket["configured"],
                "refill_rate": bucket["refill_rate"],
                "burst_limit": bucket["burst_limit"],
                "consumption": bucket["consumption"],
                "granted_tokens": bucket["granted_tokens"],
                "created_at": bucket["created_at"],
                "updated_at": bucket["updated_at"],
                "instances": instances,
            }));
        }
    }
    books
}

/// The per-key check every step retries: same request id, so it must be
/// answered from its record, not taken again.
fn retried_check(server: &Server) -> Value {
    server.json(&[
        "check",
        "--tenant",
        "acme",
        "--bucket",
        "logins-per-ip",
        "--key",
        "203.0.113.7",
        "--tokens",
        "2",
        "--request-id",
        "login-1",
        "--json",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_to_postgres_and_back_with_its_totals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first_file = dir.path().join("first.redb");
    let server = Server::start(&first_file);
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.pro.buckets.logins-per-ip]\nkind = \"per-key\"\nrefill_rate = 0.001\nburst_limit = 3\n\
         [tiers.pro.buckets.schedule-email]\nrefill_rate = 10\nburst_limit = 100\n",
    )
    .expect("write tiers");
    server.ok(&["tier", "apply", "-f", path(&tiers)]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "pro"]);
    for (tenant, available) in [("acme", 500.0), ("globex", 80.0)] {
        server.set_limits(tenant, available, 5.0, 1000.0);
    }
    for (tenant, bucket, instance, units) in [
        ("acme", "", "1", "42.5"),
        ("acme", "", "2", "0.25"),
        ("acme", "schedule-email", "1", "3"),
        ("globex", "", "7", "1234.125"),
    ] {
        server.ok(&[
            "pod",
            "request",
            "--tenant",
            tenant,
            "--bucket",
            bucket,
            "--instance",
            instance,
            "--tokens",
            "20",
            "--report-ru",
            units,
        ]);
    }
    let first_answer = retried_check(&server);
    assert_eq!(first_answer["remaining_tokens"], 1.0);
    let before = books(&server);
    // Three shared buckets and the per-key one, with its stored key.
    assert_eq!(before.len(), 4, "{before:#?}");

    // The embedded store is one process's file: stop the server first.
    let export = dir.path().join("first.jsonl");
    let busy = failed(&[
        "export",
        "--store",
        path(&first_file),
        "--out",
        path(&export),
    ]);
    assert!(busy.contains("stop the server"), "{busy}");
    assert!(!export.exists());
    server.stop();
    ok(&[
        "export",
        "--store",
        path(&first_file),
        "--out",
        path(&export),
    ]);
    assert!(!dir.path().join("first.jsonl.partial").exists());

    // Into PostgreSQL, served from there.
    let db = TestDatabase::create().await.expect("test database");
    let imported: Value = serde_json::from_str(&ok(&[
        "import",
        "--store",
        db.url(),
        path(&export),
        "--json",
    ]))
    .expect("JSON summary");
    assert_eq!(imported["store"]["kind"], "postgres");
    assert_eq!(imported["buckets"], 3);
    assert_eq!(imported["tiers"], 1);
    let server = Server::start(Path::new(db.url()));
    assert_eq!(books(&server), before);
    let replayed = retried_check(&server);
    assert_eq!(replayed["replayed"], true, "{replayed}");
    assert_eq!(replayed["remaining_tokens"], 1.0);

    // Again without --replace: refused, and the store is as it was.
    let refused = failed(&["import", "--store", db.url(), path(&export)]);
    assert!(
        refused.contains("not empty") && refused.contains("--replace"),
        "{refused}"
    );
    assert_eq!(books(&server), before);

    // More traffic, then an export while the server runs.
    server.ok(&[
        "pod",
        "request",
        "--tenant",
        "globex",
        "--instance",
        "8",
        "--tokens",
        "1",
        "--report-ru",
        "0.5",
    ]);
    let after = books(&server);
    assert_ne!(after, before);
    let second = dir.path().join("second.jsonl");
    ok(&["export", "--store", db.url(), "--out", path(&second)]);
    server.stop();

    // Back into a new embedded file.
    let second_file = dir.path().join("second.redb");
    let summary = ok(&["import", "--store", path(&second_file), path(&second)]);
    assert!(
        summary.contains("imported 1 tier, 1 tenant record, 3 buckets"),
        "{summary}"
    );
    let server = Server::start(&second_file);
    assert_eq!(books(&server), after);
    assert_eq!(retried_check(&server)["replayed"], true);
    server.stop();

    // --replace: the first export again, over what the file holds.
    ok(&[
        "import",
        "--store",
        path(&second_file),
        path(&export),
        "--replace",
    ]);
    let server = Server::start(&second_file);
    assert_eq!(books(&server), before);
    server.stop();
}

#[test]
fn a_damaged_export_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tollgate.redb");
    let server = Server::start(&file);
    server.set_limits("acme", 5.0, 1.0, 10.0);
    server.stop();
    let export = ok(&["export", "--store", path(&file)]);
    let lines: Vec<&str> = export.lines().collect();
    assert_eq!(lines.len(), 3, "header, bucket, end: {export}");

    let target = dir.path().join("target.redb");
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, lines[..2].join("\n")).expect("write");
    let err = failed(&["import", "--store", path(&target), path(&cut)]);
    assert!(err.contains("cut short"), "{err}");
    assert!(!target.exists(), "a refused import creates no store");

    let err = failed(&[
        "import",
        "--store",
        path(&target),
        path(&dir.path().join("none")),
    ]);
    assert!(err.contains("open"), "{err}");
    let err = failed(&["export", "--store", path(&dir.path().join("none.redb"))]);
    assert!(err.contains("no store file"), "{err}");
    assert!(
        !dir.path().join("none.redb").exists(),
        "export made a store"
    );
    let err = failed(&["export"]);
    assert!(err.contains("which store?"), "{err}");
}
