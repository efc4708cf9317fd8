//! The web console in a real browser: `tollgate serve` with admin tokens,
//! two tenants (one throttled), and headless Chromium loading `/console`;
//! and a tenant with per-key buckets only, whose keys were checked. What
//! the page shows after its script ran (Chromium's `--dump-dom`) is
//! checked, and screenshots are kept in `target/tmp/console/`
//! (`console.png`, `per-key.png`).
//!
//! Chromium is looked up on `PATH` (`chromium`, `chromium-browser`,
//! `google-chrome`) or at `TOLLGATE_CHROMIUM`; CI installs Debian's and
//! sets `TOLLGATE_REQUIRE_CHROMIUM`, which makes its absence a failure
//! rather than a skipped test.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{Server, free_port};

const OPERATOR_TOKEN: &str = "console-test-operator-token";
const READER_TOKEN: &str = "console-test-read-only-token";

/// A plain HTTP/1.0 GET: the status code and the body.
fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
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
fn browse(chromium: &Path, profile: &Path, url: &str, args: &[&str]) -> String {
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
fn screenshot(chromium: &Path, profile: &Path, url: &str, name: &str, size: &str) -> Vec<u8> {
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

/// The text of the table cell of `class` in the row of `tenant`.
fn cell(dom: &str, tenant: &str, class: &str) -> String {
    let row_start = dom
        .find(&format!("data-tenant=\"{tenant}\""))
        .unwrap_or_else(|| panic!("a row for {tenant} in {dom}"));
    let row = &dom[row_start..];
    let row = &row[..row.find("</tr>").expect("row end")];
    let at = row
        .find(&format!("class=\"{class}\""))
        .unwrap_or_else(|| panic!("cell {class} in {row}"));
    let text = &row[at..];
    let text = &text[text.find('>').expect("tag end") + 1..];
    text[..text.find('<').expect("cell end")].trim().to_owned()
}

fn number(text: &str) -> f64 {
    text.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("a number, not {text:?}"))
}

#[test]
fn the_console_shows_tenants_levels_rates_and_throttled_pods_in_a_browser() {
    let Some(chromium) = support::external_tool(
        "TOLLGATE_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
        "TOLLGATE_REQUIRE_CHROMIUM",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("admin-tokens");
    std::fs::write(
        &tokens,
        format!("ops {OPERATOR_TOKEN} operator\ndashboards {READER_TOKEN} read-only\n"),
    )
    .expect("write tokens");
    let (port, metrics) = (free_port(), free_port());
    let store = dir.path().join("tollgate.redb");
    let server = Server::start_logged_as(
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
            "--store",
            &store.display().to_string(),
            "--create",
            "--admin-tokens-file",
            &tokens.display().to_string(),
        ],
        &[],
        port,
        &dir.path().join("server.log"),
        Some(OPERATOR_TOKEN),
    );
    // acme: 1 token/s and 10 held, so 100 tokens come as a trickle
    // (throttled); globex: plenty.
    server.set_limits("acme", 10.0, 1.0, 10.0);
    server.set_limits("globex", 10000.0, 1000.0, 10000.0);
    // globex has a monthly budget, with a price.
    server.ok(&[
        "budget",
        "set",
        "--tenant",
        "globex",
        "--amount",
        "1000",
        "--cycle",
        "monthly",
        "--at-limit",
        "stop",
        "--price",
        "2",
        "--currency",
        "EUR",
    ]);

    // The data wants a token where the Admin service does; any role.
    let (code, _) = get(metrics, "/console/api/buckets", None);
    assert_eq!(code, 401);
    let (code, _) = get(metrics, "/console/api/buckets", Some("not a token"));
    assert_eq!(code, 401);
    let (code, body) = get(metrics, "/console/api/buckets", Some(READER_TOKEN));
    assert_eq!(code, 200, "{body}");
    let first: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        first["buckets"].as_array().map(Vec::len),
        Some(2),
        "{first}"
    );
    let (code, page) = get(metrics, "/console", None);
    assert_eq!(code, 200);
    assert!(page.contains("<title>Tollgate console</title>"));

    // Between the first read and the next (5 s later): 500 request units
    // for globex, and three trickles for acme.
    server.ok(&[
        "pod",
        "request",
        "--tenant",
        "globex",
        "--tokens",
        "10",
        "--report-ru",
        "500",
    ]);
    // Each pod reports its shares first, so that its trickle is a whole
    // target period (a new pod's first one is a quarter of it), and asks
    // before the next pod registers: the first takes all the bucket holds
    // (its part while it is alone), the others trickles on the debt.
    for instance in ["1", "2", "3"] {
        for tokens in ["0", "100"] {
            server.ok(&[
                "pod",
                "request",
                "--tenant",
                "acme",
                "--instance",
                instance,
                "--tokens",
                tokens,
            ]);
        }
    }
    std::thread::sleep(
        tollgate_server::telemetry::console::SAMPLE_INTERVAL + Duration::from_millis(300),
    );

    let profile = dir.path().join("chromium-profile");
    let console = format!("http://127.0.0.1:{metrics}/console#token={READER_TOKEN}");
    let dom = browse(&chromium, &profile, &console, &["--dump-dom"]);
    assert!(dom.contains("data-tenant=\"acme\""), "{dom}");
    assert!(dom.contains("data-tenant=\"globex\""), "{dom}");
    assert_eq!(number(&cell(&dom, "globex", "live")), 1.0);
    assert_eq!(number(&cell(&dom, "acme", "live")), 3.0);
    // 500 request units over the time between the two reads, which the
    // page shows (at least the sample interval; how much more depends on
    // how fast the commands and the browser ran).
    let window: f64 = dom
        .split("id=\"rate-window\" data-seconds=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the rate window in {dom}"));
    assert!(
        window >= tollgate_server::telemetry::console::SAMPLE_INTERVAL.as_secs_f64(),
        "{window}"
    );
    let globex_rate = number(&cell(&dom, "globex", "ru"));
    // Shown with one decimal.
    assert!(
        (globex_rate - 500.0 / window).abs() <= 0.051,
        "globex request units/s {globex_rate} over {window} s"
    );
    assert!(
        number(&cell(&dom, "acme", "throttled")) > 0.0,
        "acme is throttled"
    );
    assert_eq!(number(&cell(&dom, "globex", "throttled")), 0.0);
    // acme owes what its trickles took in advance.
    assert!(number(&cell(&dom, "acme", "level")) < 0.0, "acme in debt");
    assert!(dom.contains("<svg"), "a chart: {dom}");
    // globex's budget: 10 tokens granted of 1 000 this month, a bar.
    let figures = cell(&dom, "globex", "figures");
    assert!(
        figures.starts_with("10.0 of 1,000 monthly (0.00002 EUR), forecast"),
        "{figures}"
    );
    assert!(
        dom.contains("<svg class=\"budget ok\""),
        "a budget bar: {dom}"
    );
    assert_eq!(
        cell(&dom, "acme", "no-budget"),
        "none",
        "acme has no budget"
    );
    let header_tenants = dom
        .split("id=\"tenant-count\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("tenant count");
    assert_eq!(header_tenants, "2");

    // The screenshot, for a person to look at.
    let png = screenshot(&chromium, &profile, &console, "console", "1800,500");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );

    // Without a token the page asks for one and shows no tenant.
    let asked = browse(
        &chromium,
        &dir.path().join("chromium-profile-2"),
        &format!("http://127.0.0.1:{metrics}/console"),
        &["--dump-dom"],
    );
    assert!(asked.contains("an admin token is needed"), "{asked}");
    assert!(!asked.contains("data-tenant=\"acme\""), "{asked}");
    server.stop();
}

/// The text of the cell of `class` in the row of per-key bucket
/// `tenant`/`bucket`.
fn key_cell(dom: &str, tenant: &str, bucket: &str, class: &str) -> String {
    let row_start = dom
        .find(&format!(
            "data-key-tenant=\"{tenant}\" data-key-bucket=\"{bucket}\""
        ))
        .unwrap_or_else(|| panic!("a row for {tenant}/{bucket} in {dom}"));
    let row = &dom[row_start..];
    let row = &row[..row.find("</tr>").expect("row end")];
    let at = row
        .find(&format!("class=\"{class}\""))
        .unwrap_or_else(|| panic!("cell {class} in {row}"));
    let text = &row[at..];
    let text = &text[text.find('>').expect("tag end") + 1..];
    let end = text.find("</td>").expect("cell end");
    // The cell's text without its tags.
    let mut plain = String::new();
    let mut in_tag = false;
    for c in text[..end].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => plain.push(c),
            _ => {}
        }
    }
    plain.trim().to_owned()
}

#[test]
fn the_console_shows_per_key_buckets_with_keys_checks_and_busiest_keys_in_a_browser() {
    let Some(chromium) = support::external_tool(
        "TOLLGATE_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
        "TOLLGATE_REQUIRE_CHROMIUM",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = free_port();
    let server = Server::start_with(
        &dir.path().join("tollgate.redb"),
        &["--metrics-listen", &format!("127.0.0.1:{metrics}")],
    );
    // A tier of per-key buckets only; acme on it. Refill so slow that the
    // keys' levels stay as the checks left them.
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.api.buckets.per-user]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 10\n\
         [tiers.api.buckets.logins-per-ip]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 3\n",
    )
    .expect("write tiers");
    server.ok(&["tier", "apply", "-f", tiers.to_str().expect("utf-8 path")]);
    server.ok(&["tenant", "create", "--tenant", "acme", "--tier", "api"]);
    // per-user: u1 left with 2, u2 with 7, u3 refused; nothing for logins.
    for (key, tokens, code) in [("u1", "8", 0), ("u2", "3", 0), ("u3", "11", 3)] {
        let out = server.tollgate(&[
            "check", "--tenant", "acme", "--bucket", "per-user", "--key", key, "--tokens", tokens,
        ]);
        assert_eq!(out.status.code(), Some(code), "{key}: {out:?}");
    }

    // The data the page polls: the rates over the window they name.
    let (code, body) = get(metrics, "/console/api/buckets", None);
    assert_eq!(code, 200, "{body}");
    let data: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(data["total_tenants"], 1, "{data}");
    let per_user = &data["key_buckets"][1];
    assert_eq!(per_user["bucket"], "per-user", "{data}");
    assert_eq!(per_user["keys_stored"], 2);
    let window = per_user["rate_window_seconds"].as_f64().expect("window");
    let rate = |field: &str| per_user[field].as_f64().expect("a number") * window;
    assert!((rate("checks_per_second") - 3.0).abs() < 1e-6, "{data}");
    assert!((rate("refusals_per_second") - 1.0).abs() < 1e-6, "{data}");

    let profile = dir.path().join("chromium-profile");
    let console = format!("http://127.0.0.1:{metrics}/console");
    let dom = browse(&chromium, &profile, &console, &["--dump-dom"]);
    assert_eq!(key_cell(&dom, "acme", "per-user", "from"), "tier");
    assert_eq!(number(&key_cell(&dom, "acme", "per-user", "keys")), 2.0);
    assert!(
        number(&key_cell(&dom, "acme", "per-user", "checks")) > 0.0,
        "{dom}"
    );
    assert!(
        number(&key_cell(&dom, "acme", "per-user", "refusals")) > 0.0,
        "{dom}"
    );
    let busiest = key_cell(&dom, "acme", "per-user", "busiest");
    assert!(busiest.starts_with("u1: 2.0"), "{busiest}");
    assert!(busiest.contains("u2: 7.0"), "{busiest}");
    assert_eq!(
        number(&key_cell(&dom, "acme", "logins-per-ip", "keys")),
        0.0
    );
    assert_eq!(
        key_cell(&dom, "acme", "logins-per-ip", "busiest"),
        "none stored"
    );
    assert!(dom.contains("this replica's own"), "{dom}");
    let count = dom
        .split("id=\"key-bucket-count\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("per-key bucket count");
    assert_eq!(count, "2");

    let png = screenshot(&chromium, &profile, &console, "per-key", "1400,600");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
    server.stop();
}

/// The text of the cell of `class` in the tree's row of `id`/`bucket`.
fn tree_cell(dom: &str, id: &str, bucket: &str, class: &str) -> String {
    let row_start = dom
        .find(&format!(
            "data-tree-id=\"{id}\" data-tree-bucket=\"{bucket}\""
        ))
        .unwrap_or_else(|| panic!("a tree row for {id}/{bucket} in {dom}"));
    let row = &dom[row_start..];
    let row = &row[..row.find("</tr>").expect("row end")];
    let at = row
        .find(&format!("class=\"{class}"))
        .unwrap_or_else(|| panic!("cell {class} in {row}"));
    let text = &row[at..];
    let text = &text[text.find('>').expect("tag end") + 1..];
    text[..text.find('<').expect("cell end")].trim().to_owned()
}

#[test]
fn the_console_shows_the_tree_of_organisations_in_a_browser() {
    let Some(chromium) = support::external_tool(
        "TOLLGATE_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
        "TOLLGATE_REQUIRE_CHROMIUM",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = free_port();
    let server = Server::start_with(
        &dir.path().join("tollgate.redb"),
        &[
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
            "--draw-period",
            "1s",
        ],
    );
    // initech (100/s) > initech-eu (an organisation, no limit of its own)
    // > db-eu; initech >
    // db-us, guaranteed 40/s; globex, alone.
    for org in ["initech", "initech-eu"] {
        server.ok(&["org", "create", "--org", org, "--name", &org.to_uppercase()]);
    }
    server.ok(&[
        "org",
        "set-limits",
        "--org",
        "initech",
        "--available",
        "0",
        "--refill-rate",
        "100",
        "--burst-limit",
        "1000",
    ]);
    for tenant in ["db-us", "db-eu", "globex"] {
        server.set_limits(tenant, 0.0, 1000.0, 1000.0);
    }
    server.ok(&[
        "org",
        "add-tenant",
        "--org",
        "initech",
        "--tenant",
        "db-us",
        "--guaranteed",
        "=40",
    ]);
    server.ok(&[
        "org",
        "add-tenant",
        "--org",
        "initech",
        "--tenant",
        "initech-eu",
    ]);
    server.ok(&[
        "org",
        "add-tenant",
        "--org",
        "initech-eu",
        "--tenant",
        "db-eu",
    ]);
    // Both members draw: their pods ask for more than the organisation
    // refills, twice, a draw period apart; read at once after the second
    // draws, while they trickle.
    for round in 0..2 {
        if round > 0 {
            std::thread::sleep(Duration::from_millis(1100));
        }
        for tenant in ["db-us", "db-eu"] {
            server.ok(&["pod", "request", "--tenant", tenant, "--tokens", "300"]);
        }
    }

    let (code, body) = get(metrics, "/console/api/buckets", None);
    assert_eq!(code, 200, "{body}");
    let data: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let rows = data["organisations"].as_array().expect("tree rows");
    let order: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_str().expect("id").to_owned(),
                r["depth"].as_u64().expect("depth"),
            )
        })
        .collect();
    let expected = [
        ("initech", 0),
        ("db-us", 1),
        ("initech-eu", 1),
        ("db-eu", 2),
    ];
    assert_eq!(
        order,
        expected.map(|(id, depth)| (id.to_owned(), depth)),
        "{data}"
    );
    let db_us = &rows[1];
    let rate = |row: &serde_json::Value, field: &str| row[field].as_f64().unwrap_or(f64::NAN);
    assert!(rate(db_us, "wanted_rate") > 40.0, "{db_us}");
    assert_eq!(rate(db_us, "guaranteed_rate"), 40.0, "{db_us}");
    assert!(rate(db_us, "drawn_rate") > 0.0, "{db_us}");
    // Never above its own limit (a draw may pass the organisation's
    // rate for a while: it hands out what its bucket held too).
    assert!(rate(db_us, "drawn_rate") <= 1000.0, "{db_us}");
    assert_eq!(rate(&rows[0], "refill_rate"), 100.0);
    assert!(
        rows[0]["wanted_rate"].is_null(),
        "the organisation draws on none"
    );

    let profile = dir.path().join("chromium-profile");
    let console = format!("http://127.0.0.1:{metrics}/console");
    let dom = browse(&chromium, &profile, &console, &["--dump-dom"]);
    assert_eq!(number(&tree_cell(&dom, "initech", "", "limit")), 100.0);
    assert_eq!(number(&tree_cell(&dom, "db-us", "", "guaranteed")), 40.0);
    assert!(
        number(&tree_cell(&dom, "db-us", "", "drawn")) > 0.0,
        "{dom}"
    );
    assert!(
        number(&tree_cell(&dom, "db-eu", "", "wanted")) > 0.0,
        "{dom}"
    );
    // initech-eu set no limit: its members draw from initech through a
    // bucket with none of its own.
    assert_eq!(number(&tree_cell(&dom, "initech-eu", "", "limit")), 1e12);
    assert!(
        number(&tree_cell(&dom, "db-eu", "", "drawn")) > 0.0,
        "{dom}"
    );
    let indent = |id: &str| {
        let at = dom
            .find(&format!("data-tree-id=\"{id}\""))
            .expect("a tree row");
        dom[at..]
            .split("data-depth=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .map(str::to_owned)
    };
    assert_eq!(indent("db-eu").as_deref(), Some("2"));
    assert!(
        !dom.contains("data-tree-id=\"globex\""),
        "globex belongs to none"
    );
    assert!(
        dom.contains("borrowed what it draws beyond its guarantee"),
        "{dom}"
    );

    let png = screenshot(&chromium, &profile, &console, "organisations", "1400,1000");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
    server.stop();
}
