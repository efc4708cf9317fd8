//! Totals outlive the buckets, and destructive changes ask, from the
//! command line against a served store (embedded and PostgreSQL): a tier
//! file with a misspelt bucket, applied without `--yes`, changes nothing
//! and fails naming every tenant and total it would retire; with `--yes`
//! the retired buckets' totals are read back exactly with `tenant show
//! --closed --json`. The same for `tenant set-tier`, `tenant override
//! clear` and `tenant delete`, and closed records survive export and
//! import.

mod support;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use support::Server;
use tollgate_testdb::TestDatabase;

const BUCKETS: [&str; 3] = ["schedule-email", "invoke-doc-summary-ai", "export-report"];
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];

/// A number from the process's random hasher keys: different each run.
fn random(bound: usize) -> usize {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x5eed);
    (hasher.finish() % bound as u64) as usize
}

/// `name` with two neighbouring, different letters swapped at a random
/// place: a typo that names no other bucket.
fn typo_of(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let places: Vec<usize> = (0..chars.len() - 1)
        .filter(|&i| chars[i] != chars[i + 1])
        .collect();
    let at = places[random(places.len())];
    let mut typo = chars.clone();
    typo.swap(at, at + 1);
    let typo: String = typo.into_iter().collect();
    assert_ne!(typo, name);
    assert!(!BUCKETS.contains(&typo.as_str()));
    typo
}

/// A tiers file: `pro` with `pro_buckets`, `free` with schedule-email.
fn tiers_file(pro_buckets: &[&str]) -> String {
    let mut text = String::new();
    for (i, bucket) in pro_buckets.iter().enumerate() {
        text.push_str(&format!(
            "[tiers.pro.buckets.{bucket}]\nrefill_rate = {}\nburst_limit = 1000\n\n",
            i + 1
        ));
    }
    text.push_str("[tiers.free.buckets.schedule-email]\nrefill_rate = 1\nburst_limit = 10\n");
    text
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("tiers.toml");
    std::fs::write(&path, text).expect("write the tiers file");
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A refused command: non-zero exit, nothing on stdout; its stderr.
fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Request units as `closing::exact_units` prints them.
fn exact_units(micros: u64) -> String {
    let (whole, fraction) = (micros / 1_000_000, micros % 1_000_000);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Tenant `tenant`'s bucket `bucket` as `tenant show --json` lists it.
fn bucket(server: &Server, tenant: &str, bucket: &str) -> Option<Value> {
    server
        .json(&["tenant", "show", "--tenant", tenant, "--json"])
        .as_array()
        .expect("a list of buckets")
        .iter()
        .find(|b| b["bucket"] == bucket)
        .cloned()
}

fn closed(server: &Server, tenant: &str) -> Vec<Value> {
    server
        .json(&["tenant", "show", "--tenant", tenant, "--closed", "--json"])
        .as_array()
        .expect("a list of closed buckets")
        .clone()
}

/// Takes tokens and reports request units on `bucket` of `tenant` from
/// two pods, with a different exact amount per call.
fn consume(server: &Server, tenant: &str, bucket: &str, salt: usize) {
    for instance in ["1", "2"] {
        let units = format!("{}.{:06}", 3 + salt, 123_457 * (salt + 1) % 1_000_000);
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
            &(10 + salt).to_string(),
            "--report-ru",
            &units,
        ]);
    }
}

/// What a closed record must say of the bucket it was: the same totals,
/// exactly, and limits.
fn assert_closed_as(record: &Value, was: &Value, reason: &str) {
    assert_eq!(record["tenant_id"], was["tenant_id"], "{record:#}");
    assert_eq!(record["bucket"], was["bucket"], "{record:#}");
    assert_eq!(record["reason"], reason, "{record:#}");
    assert_eq!(record["consumption"], was["consumption"], "{record:#}");
    assert_eq!(
        record["granted_tokens"], was["granted_tokens"],
        "{record:#}"
    );
    assert_eq!(record["refill_rate"], was["refill_rate"], "{record:#}");
    assert_eq!(record["burst_limit"], was["burst_limit"], "{record:#}");
    assert_eq!(record["created_at"], was["created_at"], "{record:#}");
    assert!(record["closed_at"].is_string(), "{record:#}");
}

/// The "done when", on `server`.
fn a_typo_in_a_tier_file_asks_and_totals_outlive_the_buckets(server: &Server, dir: &Path) {
    let victim = BUCKETS[random(BUCKETS.len())];
    let typo = typo_of(victim);
    let file = write(dir, &tiers_file(&BUCKETS));
    server.ok(&["tier", "apply", "-f", arg(&file)]);
    for (i, tenant) in TENANTS.iter().enumerate() {
        server.ok(&["tenant", "create", "--tenant", tenant, "--tier", "pro"]);
        consume(server, tenant, victim, i);
    }
    server.ok(&["tenant", "create", "--tenant", "hooli", "--tier", "free"]);
    let before: Vec<Value> = TENANTS
        .iter()
        .map(|t| bucket(server, t, victim).expect("the bucket"))
        .collect();
    let tier_before = server.json(&["tier", "show", "--tier", "pro", "--json"]);

    // The typo, without --yes: nothing changes, every tenant and total named.
    let with_typo: Vec<&str> = BUCKETS
        .iter()
        .map(|b| if *b == victim { typo.as_str() } else { b })
        .collect();
    let file = write(dir, &tiers_file(&with_typo));
    let stderr = refused(&server.tollgate(&["tier", "apply", "-f", arg(&file)]));
    assert!(stderr.contains("--yes"), "{stderr}");
    assert!(stderr.contains("closed records"), "{stderr}");
    for was in &before {
        let micros = was["consumption"]["request_unit_micros"]
            .as_u64()
            .expect("micros");
        let line = stderr
            .lines()
            .find(|l| l.contains(was["tenant_id"].as_str().expect("id")))
            .unwrap_or_else(|| panic!("no line for {}: {stderr}", was["tenant_id"]));
        assert!(line.contains(victim), "{line}");
        assert!(line.contains(&exact_units(micros)), "{line} {micros}");
        let granted = was["granted_tokens"].as_f64().expect("granted");
        assert!(line.contains(&granted.to_string()), "{line} {granted}");
    }
    assert!(!stderr.contains("hooli"), "{stderr}");
    assert_eq!(
        server.json(&["tier", "show", "--tier", "pro", "--json"]),
        tier_before
    );
    for was in &before {
        let tenant = was["tenant_id"].as_str().expect("id");
        let now = bucket(server, tenant, victim).expect("still there");
        assert_eq!(now["consumption"], was["consumption"]);
        assert!(bucket(server, tenant, &typo).is_none());
        assert!(closed(server, tenant).is_empty());
    }

    // --dry-run lists the same and changes nothing either.
    let planned = server.json(&["tier", "apply", "-f", arg(&file), "--dry-run", "--json"]);
    assert_eq!(planned["dry_run"], true);
    let would = planned["retired"].as_array().expect("a list");
    assert_eq!(would.len(), TENANTS.len(), "{planned:#}");
    for (record, was) in would.iter().zip(&before) {
        assert_closed_as(record, was, "tier-redefined");
    }
    assert!(bucket(server, TENANTS[0], victim).is_some());

    // With --yes: retired, and the totals read back exactly.
    let applied = server.json(&[
        "tier",
        "apply",
        "-f",
        arg(&file),
        "--yes",
        "--actor",
        "ops-alice",
        "--json",
    ]);
    assert_eq!(
        applied["retired"].as_array().expect("a list").len(),
        TENANTS.len()
    );
    for was in &before {
        let tenant = was["tenant_id"].as_str().expect("id");
        assert!(bucket(server, tenant, victim).is_none());
        assert!(bucket(server, tenant, &typo).is_some());
        let records = closed(server, tenant);
        assert_eq!(records.len(), 1, "{records:#?}");
        assert_closed_as(&records[0], was, "tier-redefined");
        assert_eq!(records[0]["actor"], "ops-alice");
        assert!(records[0]["peer"].is_string(), "{:#}", records[0]);
    }
    assert!(closed(server, "hooli").is_empty());
    let text = server.ok(&["tenant", "show", "--tenant", TENANTS[0], "--closed"]);
    assert!(
        text.contains(victim) && text.contains("tier-redefined"),
        "{text}"
    );
    let described = server.ok(&["tenant", "describe", "--tenant", TENANTS[0]]);
    assert!(described.contains("1 closed bucket"), "{described}");
}

#[test]
fn a_typo_in_a_tier_file_asks_and_totals_outlive_the_buckets_embedded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    a_typo_in_a_tier_file_asks_and_totals_outlive_the_buckets(&server, dir.path());
}

#[tokio::test]
async fn a_typo_in_a_tier_file_asks_and_totals_outlive_the_buckets_postgres() {
    let db = TestDatabase::create().await.expect("test database");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(Path::new(db.url()));
    a_typo_in_a_tier_file_asks_and_totals_outlive_the_buckets(&server, dir.path());
}

/// `tenant set-tier`, `override clear` and `tenant delete` ask as `tier
/// apply` does; confirmed, each leaves the exact totals as closed
/// records, which outlive the tenant, its re-creation, and an export and
/// import into a new store.
#[tokio::test]
async fn set_tier_override_clear_and_delete_ask_and_keep_the_totals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tollgate.redb");
    let server = Server::start(&store);
    let file = write(dir.path(), &tiers_file(&BUCKETS));
    server.ok(&["tier", "apply", "-f", arg(&file)]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "pro"]);
    for (i, b) in BUCKETS.iter().enumerate() {
        consume(&server, "acme", b, i);
    }

    // set-tier to free would retire two buckets: refused without --yes.
    // In name order, as the server retires them.
    let mut retiring: Vec<Value> = BUCKETS[1..]
        .iter()
        .map(|b| bucket(&server, "acme", b).expect("bucket"))
        .collect();
    retiring.sort_by_key(|b| b["bucket"].as_str().expect("name").to_owned());
    let stderr =
        refused(&server.tollgate(&["tenant", "set-tier", "--tenant", "acme", "--tier", "free"]));
    for was in &retiring {
        let micros = was["consumption"]["request_unit_micros"]
            .as_u64()
            .expect("micros");
        assert!(
            stderr.contains(was["bucket"].as_str().expect("name"))
                && stderr.contains(&exact_units(micros)),
            "{stderr}"
        );
    }
    let described = server.json(&["tenant", "describe", "--tenant", "acme", "--json"]);
    assert_eq!(described["tier"], "pro");
    assert_eq!(described["closed_buckets"], 0);
    let planned = server.json(&[
        "tenant",
        "set-tier",
        "--tenant",
        "acme",
        "--tier",
        "free",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(planned["dry_run"], true);
    assert_eq!(planned["closed"].as_array().expect("a list").len(), 2);
    assert!(bucket(&server, "acme", BUCKETS[1]).is_some());
    server.ok(&[
        "tenant", "set-tier", "--tenant", "acme", "--tier", "free", "--yes",
    ]);
    let records = closed(&server, "acme");
    assert_eq!(records.len(), 2);
    for (record, was) in records.iter().zip(&retiring) {
        assert_closed_as(record, was, "tier-change");
    }

    // An override of a bucket free lacks, used, then cleared.
    server.ok(&[
        "tenant",
        "override",
        "set",
        "--tenant",
        "acme",
        "--bucket",
        BUCKETS[1],
        "--refill-rate",
        "5",
        "--burst-limit",
        "50",
    ]);
    consume(&server, "acme", BUCKETS[1], 7);
    let was = bucket(&server, "acme", BUCKETS[1]).expect("bucket");
    let clear = [
        "tenant", "override", "clear", "--tenant", "acme", "--bucket", BUCKETS[1],
    ];
    let stderr = refused(&server.tollgate(&clear));
    assert!(
        stderr.contains("acme") && stderr.contains(BUCKETS[1]),
        "{stderr}"
    );
    assert!(bucket(&server, "acme", BUCKETS[1]).is_some());
    server.ok(&[&clear[..], &["--yes"]].concat());
    let records = closed(&server, "acme");
    assert_eq!(records.len(), 3);
    assert_closed_as(&records[2], &was, "override-cleared");

    // tenant delete: refused without a terminal, then with --yes.
    let email = bucket(&server, "acme", BUCKETS[0]).expect("bucket");
    let stderr = refused(&server.tollgate(&["tenant", "delete", "--tenant", "acme"]));
    assert!(stderr.contains(BUCKETS[0]), "{stderr}");
    let deleted = server.json(&["tenant", "delete", "--tenant", "acme", "--yes", "--json"]);
    assert_eq!(deleted["closed"].as_array().expect("a list").len(), 1);
    let records = closed(&server, "acme");
    assert_eq!(records.len(), 4);
    assert_closed_as(&records[3], &email, "tenant-deleted");
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "free"]);
    assert_eq!(closed(&server, "acme"), records);

    // Export, import into PostgreSQL: the same records.
    server.stop();
    let export = dir.path().join("store.jsonl");
    let out = support::command()
        .env_remove("DATABASE_URL")
        .args(["export", "--store", arg(&store), "--out", arg(&export)])
        .output()
        .expect("export");
    assert!(out.status.success(), "{out:?}");
    let db = TestDatabase::create().await.expect("test database");
    let out = support::command()
        .env_remove("DATABASE_URL")
        .args(["import", "--store", db.url(), arg(&export), "--json"])
        .output()
        .expect("import");
    assert!(out.status.success(), "{out:?}");
    let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(summary["closed_buckets"], 4, "{summary:#}");
    let server = Server::start(Path::new(db.url()));
    assert_eq!(closed(&server, "acme"), records);
}

/// `tier delete` asks for the tier's name unless `--yes` is given.
#[test]
fn tier_delete_asks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    server.ok(&["tier", "create", "--tier", "pro", "--bucket", "a=1/10"]);
    let stderr = refused(&server.tollgate(&["tier", "delete", "--tier", "pro"]));
    assert!(stderr.contains("--yes"), "{stderr}");
    server.ok(&["tier", "show", "--tier", "pro"]);
    server.ok(&["tier", "delete", "--tier", "pro", "--yes"]);
    assert_eq!(
        server.json(&["tier", "list", "--json"]),
        serde_json::json!([])
    );
}

/// Runs `tollgate args` at a terminal (util-linux `script` gives it one)
/// and types `answer`; answers its exit status.
fn at_a_terminal(server: &Server, args: &[&str], answer: &str) -> std::process::ExitStatus {
    use std::io::Write;
    let command = std::iter::once(support::BIN)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("TOLLGATE_SERVER", &server.url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run script (util-linux) to give tollgate a terminal");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{answer}\n").as_bytes())
        .expect("type the answer");
    child.wait().expect("wait for tollgate")
}

/// At a terminal, `tier apply` goes on only when the file's name is typed
/// back: any other answer changes nothing.
#[test]
fn at_a_terminal_only_the_typed_name_confirms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let file = write(dir.path(), &tiers_file(&BUCKETS));
    server.ok(&["tier", "apply", "-f", arg(&file)]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "pro"]);
    let victim = BUCKETS[random(BUCKETS.len())];
    let typo = typo_of(victim);
    let with_typo: Vec<&str> = BUCKETS
        .iter()
        .map(|b| if *b == victim { typo.as_str() } else { b })
        .collect();
    let file = write(dir.path(), &tiers_file(&with_typo));
    let apply = ["tier", "apply", "-f", arg(&file)];

    let status = at_a_terminal(&server, &apply, "yes");
    assert!(!status.success(), "{status:?}");
    assert!(bucket(&server, "acme", victim).is_some());
    assert!(closed(&server, "acme").is_empty());

    let status = at_a_terminal(&server, &apply, arg(&file));
    assert!(status.success(), "{status:?}");
    assert!(bucket(&server, "acme", victim).is_none());
    assert_eq!(closed(&server, "acme").len(), 1);
}
