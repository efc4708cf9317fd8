//! Per-key buckets as operators see them through the CLI: a tenant on a
//! tier with only per-key buckets, some keys checked with `tollgate
//! check`, then `tenant describe`, `show`, `list` and `watch`, in text
//! and `--json`: each bucket's definition, its keys stored, the busiest
//! keys and the server replica's checks and refusals per second.

mod support;

use serde_json::Value;
use support::Server;

/// The documented exit status of a refused check.
const REFUSED: i32 = 3;

/// A server with tier `api` (per-key buckets only: `per-user`, 10 per
/// key, and `logins-per-ip`, 3 per key, both refilling so slowly that a
/// test sees its levels as they were left) and tenant `acme` on it, whose
/// keys were checked: per-user `u1` took 8, `u2` 3, `u3` was refused 11;
/// `203.0.113.7` took 1 login.
fn acme_with_checked_keys() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.api.buckets.per-user]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 10\n\
         [tiers.api.buckets.logins-per-ip]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 3\n",
    )
    .expect("write tiers");
    server.ok(&["tier", "apply", "-f", tiers.to_str().expect("utf-8 path")]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "api"]);
    for (bucket, key, tokens, code) in [
        ("per-user", "u1", "8", 0),
        ("per-user", "u2", "3", 0),
        ("per-user", "u3", "11", REFUSED),
        ("logins-per-ip", "203.0.113.7", "1", 0),
    ] {
        let out = server.tollgate(&[
            "check", "--tenant", "acme", "--bucket", bucket, "--key", key, "--tokens", tokens,
        ]);
        assert_eq!(out.status.code(), Some(code), "{bucket}/{key}: {out:?}");
    }
    (dir, server)
}

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The per-user bucket's JSON view: its definition, keys stored, busiest
/// keys with their tokens, and three checks of which one was refused over
/// the window it names.
fn assert_per_user(view: &Value) {
    assert_eq!(view["kind"], "per-key", "{view}");
    assert_eq!(view["tenant_id"], "acme");
    assert_eq!(view["bucket"], "per-user");
    assert_eq!(view["refill_rate"], 0.0001);
    assert_eq!(view["burst_limit"], 10.0);
    assert_eq!(view["defined_by"], "tier");
    assert_eq!(view["keys_stored"], 2);
    let busiest = view["busiest_keys"].as_array().expect("busiest keys");
    let keys: Vec<&str> = busiest.iter().filter_map(|k| k["key"].as_str()).collect();
    assert_eq!(keys, ["u1", "u2"], "the fewest tokens first: {view}");
    assert!((number(&busiest[0]["tokens"]) - 2.0).abs() < 0.1, "{view}");
    assert!(number(&busiest[0]["full_in_seconds"]) > 70_000.0, "{view}");
    let window = number(&view["rate_window_seconds"]);
    assert!(window > 0.0 && window <= 10.0, "{view}");
    assert!(
        (number(&view["checks_per_second"]) * window - 3.0).abs() < 1e-6,
        "{view}"
    );
    assert!(
        (number(&view["refusals_per_second"]) * window - 1.0).abs() < 1e-6,
        "{view}"
    );
}

#[test]
fn tenant_describe_shows_per_key_buckets_with_keys_checks_and_busiest_keys() {
    let (_dir, server) = acme_with_checked_keys();
    let text = server.ok(&["tenant", "describe", "--tenant", "acme"]);
    assert!(!text.contains("no buckets"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("per-user "))
        .unwrap_or_else(|| panic!("a line for per-user: {text}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    // PER-KEY BUCKET FROM REFILL/S BURST KEYS STORED …
    assert_eq!(
        &columns[..5],
        ["per-user", "tier", "0.0001", "10", "2"],
        "{row}"
    );
    assert!(row.contains("u1 (2.0 tokens"), "{row}");
    assert!(text.contains("logins-per-ip "), "{text}");
    assert!(text.contains("this replica's"), "{text}");

    let json = server.json(&["tenant", "describe", "--tenant", "acme", "--json"]);
    assert_eq!(json["buckets"], serde_json::json!([]), "{json}");
    let per_key = json["key_buckets"].as_array().expect("key_buckets");
    assert_eq!(per_key.len(), 2, "{json}");
    assert_eq!(per_key[0]["bucket"], "logins-per-ip");
    assert_eq!(per_key[0]["keys_stored"], 1);
    assert_per_user(&per_key[1]);
}

#[test]
fn tenant_show_shows_a_tenant_with_only_per_key_buckets() {
    let (_dir, server) = acme_with_checked_keys();
    let text = server.ok(&["tenant", "show", "--tenant", "acme"]);
    assert!(text.starts_with("tier       api\n"), "{text}");
    assert!(text.contains("per-key (from the tier)"), "{text}");
    assert!(text.contains("2 (below their burst)"), "{text}");
    assert!(text.contains("this replica"), "{text}");
    let busiest = text
        .lines()
        .find(|l| l.starts_with("u1 "))
        .unwrap_or_else(|| panic!("a line for u1: {text}"));
    assert!(busiest.contains("2.0"), "{busiest}");

    let json = server.json(&["tenant", "show", "--tenant", "acme", "--json"]);
    let buckets = json.as_array().expect("a list of buckets");
    let names: Vec<&str> = buckets
        .iter()
        .filter_map(|b| b["bucket"].as_str())
        .collect();
    assert_eq!(names, ["logins-per-ip", "per-user"], "{json}");
    assert_per_user(&buckets[1]);
    // One bucket by name, as one object.
    let one = server.json(&[
        "tenant", "show", "--tenant", "acme", "--bucket", "per-user", "--json",
    ]);
    assert_per_user(&one);
    // Deleting it asks (here, with no terminal, it wants --yes) rather
    // than saying it does not exist.
    let out = server.tollgate(&["tenant", "delete", "--tenant", "acme"]);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pass --yes"), "{stderr}");
    // A tenant that does not exist, and a bucket it does not have, still
    // fail as before.
    for args in [
        &["tenant", "show", "--tenant", "nobody"][..],
        &["tenant", "show", "--tenant", "acme", "--bucket", "nothing"][..],
    ] {
        let out = server.tollgate(args);
        assert!(!out.status.success(), "{out:?}");
        assert!(out.stdout.is_empty());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("NotFound"), "{stderr}");
    }
}

#[test]
fn tenant_list_shows_per_key_buckets_beside_shared_ones() {
    let (_dir, server) = acme_with_checked_keys();
    server.set_limits("beta", 100.0, 10.0, 100.0);
    let text = server.ok(&["tenant", "list"]);
    assert!(text.lines().any(|l| l.starts_with("beta ")), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("acme ") && l.contains("per-user"))
        .unwrap_or_else(|| panic!("a line for acme's per-user: {text}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &columns[..6],
        ["acme", "per-user", "tier", "0.0001", "10", "2"],
        "{row}"
    );
    assert!(row.contains("u1 (2.0 tokens"), "{row}");

    let json = server.json(&["tenant", "list", "--json"]);
    let buckets = json.as_array().expect("a list");
    let listed: Vec<(&str, &str, &str)> = buckets
        .iter()
        .map(|b| {
            (
                b["tenant_id"].as_str().unwrap_or_default(),
                b["bucket"].as_str().unwrap_or_default(),
                b["kind"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("acme", "logins-per-ip", "per-key"),
            ("acme", "per-user", "per-key"),
            ("beta", "", "shared"),
        ]
    );
    assert_per_user(&buckets[1]);
}

#[test]
fn tenant_watch_shows_per_key_buckets_the_most_checked_first() {
    let (_dir, server) = acme_with_checked_keys();
    let text = server.ok(&["tenant", "watch", "--tenant", "acme", "--count", "1"]);
    assert!(text.contains("2 per-key buckets"), "{text}");
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("acme ")).collect();
    // Three checks of per-user, one of logins-per-ip.
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows[0].contains("per-user"), "{text}");
    assert!(rows[0].contains("u1 (2.0 tokens"), "{text}");
    assert!(rows[1].contains("logins-per-ip"), "{text}");
    assert!(text.contains("this replica's"), "{text}");
}

/// The checks outlive the server that answered them: it writes them to
/// the usage history when it stops, and `tenant history` of the per-key
/// bucket, from the next server on the same file, shows them per step with
/// the busiest keys, in text, JSON and CSV.
#[test]
fn tenant_history_shows_a_per_key_buckets_checks_after_a_restart() {
    let (dir, server) = acme_with_checked_keys();
    server.stop();
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let args = [
        "tenant", "history", "--tenant", "acme", "--bucket", "per-user", "--since", "1h",
    ];
    let view = server.json(&[&args[..], &["--json"]].concat());
    assert_eq!(view["checks"], 3, "{view}");
    assert_eq!(view["refusals"], 1, "{view}");
    assert_eq!(view["points"], serde_json::json!([]), "{view}");
    let points = view["check_points"].as_array().expect("check points");
    let checks: u64 = points
        .iter()
        .map(|p| p["checks"].as_u64().expect("checks"))
        .sum();
    assert_eq!(checks, 3, "{view}");
    assert!(points.iter().all(|p| p["replicas"] == 1), "{view}");
    let keys: Vec<(&str, u64)> = view["busiest_keys"]
        .as_array()
        .expect("busiest keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().expect("key"),
                k["checks_at_least"].as_u64().expect("count"),
            )
        })
        .collect();
    assert_eq!(keys, [("u1", 1), ("u2", 1), ("u3", 1)], "{view}");

    let text = server.ok(&args);
    assert!(text.contains("CHECKS/S"), "{text}");
    assert!(
        text.contains("bucket per-user of tenant acme: 3 checks, 1 refused"),
        "{text}"
    );
    assert!(text.contains("busiest keys: u1 (at least 1)"), "{text}");
    let csv = server.ok(&[&args[..], &["--csv"]].concat());
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .is_some_and(|h| h.starts_with("from,to,checks,refusals")),
        "{csv}"
    );
    assert_eq!(lines.count(), points.len(), "{csv}");
}
