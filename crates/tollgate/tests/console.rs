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

use std::time::Duration;

use support::{Server, browse, fact, free_port, get, number, screenshot};

const OPERATOR_TOKEN: &str = "console-test-operator-token";
const READER_TOKEN: &str = "console-test-read-only-token";

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

/// A pod asking its tenant for far more than its bucket holds, again
/// every half second until dropped, over one connection and as one
/// incarnation (one lease, its sequence numbers rising), as a real pod
/// does: its bucket throttled throughout, trickle tokens owed to it at
/// every instant. Its first request is answered before `start` returns.
struct BusyPod {
    busy: std::sync::Arc<std::sync::atomic::AtomicBool>,
    asking: Option<std::thread::JoinHandle<()>>,
}

impl BusyPod {
    fn start(server: &Server, tenant: &str, instance: u32) -> BusyPod {
        use tollgate_proto::v1;
        let url = format!("http://127.0.0.1:{}", server.port);
        let tenant = tenant.to_owned();
        let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (answered, first) = std::sync::mpsc::channel();
        let asking = {
            let busy = std::sync::Arc::clone(&busy);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async move {
                    let mut pod =
                        v1::token_bucket_service_client::TokenBucketServiceClient::connect(url)
                            .await
                            .expect("connect");
                    let lease = format!("busy-pod-{}", std::process::id()).into_bytes();
                    let mut seq = 0;
                    loop {
                        seq += 1;
                        pod.token_bucket(v1::TokenBucketRequest {
                            tenant_id: tenant.clone(),
                            instance_id: instance,
                            instance_lease: lease.clone(),
                            seq,
                            requested_tokens: 5_000.0,
                            // Nearly all of the shares, so that it is never
                            // held to a part of what the bucket holds (the
                            // other pods of the tenant may be silent): what
                            // it lacks is owed to it as a trickle.
                            shares: 100.0,
                            target_request_period: Some(prost_types::Duration {
                                seconds: 10,
                                nanos: 0,
                            }),
                            ..v1::TokenBucketRequest::default()
                        })
                        .await
                        .expect("the busy pod's request answered");
                        if seq == 1 {
                            let _ = answered.send(());
                        }
                        if !busy.load(std::sync::atomic::Ordering::SeqCst) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                });
            })
        };
        first.recv().expect("the busy pod's first answer");
        BusyPod {
            busy,
            asking: Some(asking),
        }
    }
}

impl Drop for BusyPod {
    fn drop(&mut self) {
        self.busy.store(false, std::sync::atomic::Ordering::SeqCst);
        if let Some(asking) = self.asking.take() {
            let joined = asking.join();
            if !std::thread::panicking() {
                joined.expect("the busy pod asked");
            }
        }
    }
}

#[test]
fn the_console_shows_tenants_levels_rates_and_throttled_pods_in_a_browser() {
    let Some(chromium) = support::chromium() else {
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
    // And one pod kept throttled while the page is read.
    let busy = BusyPod::start(&server, "acme", 4);

    let profile = dir.path().join("chromium-profile");
    let console = format!("http://127.0.0.1:{metrics}/console#token={READER_TOKEN}");
    let dom = browse(&chromium, &profile, &console, &["--dump-dom"]);
    assert!(dom.contains("data-tenant=\"acme\""), "{dom}");
    assert!(dom.contains("data-tenant=\"globex\""), "{dom}");
    assert_eq!(number(&cell(&dom, "globex", "live")), 1.0);
    // Three, and the busy one.
    assert_eq!(number(&cell(&dom, "acme", "live")), 4.0);
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
    // Throttled: first, marked, and since when said (the first read
    // that saw it: no minute of the history has it yet).
    assert!(
        dom.contains("<tr class=\"throttled\" data-tenant=\"acme\"")
            || dom.contains("<tr class=\"debt throttled\" data-tenant=\"acme\""),
        "acme is throttled: {dom}"
    );
    let since = cell(&dom, "acme", "since");
    assert!(since.ends_with("s ago)") || since == "now", "{since}");
    assert_eq!(cell(&dom, "globex", "since"), "");
    // acme owes what its trickles took in advance.
    assert!(number(&cell(&dom, "acme", "level")) < 0.0, "acme in debt");
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
    drop(busy);
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

#[test]
fn a_shared_bucket_in_shadow_mode_shows_what_it_would_throttle_in_a_browser() {
    let Some(chromium) = support::chromium() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = free_port();
    let server = Server::start_with(
        &dir.path().join("tollgate.redb"),
        &["--metrics-listen", &format!("127.0.0.1:{metrics}")],
    );
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.trial.buckets.api]\nrefill_rate = 1\nburst_limit = 10\nenforce = false\n",
    )
    .expect("write tiers");
    server.ok(&["tier", "apply", "-f", tiers.to_str().expect("utf-8")]);
    server.ok(&["tenant", "create", "--tenant", "initech", "--tier", "trial"]);
    // Two pods asking for ten times the burst: granted, at once.
    for instance in ["1", "2"] {
        for tokens in ["0", "100"] {
            let out = server.json(&[
                "pod",
                "request",
                "--tenant",
                "initech",
                "--bucket",
                "api",
                "--instance",
                instance,
                "--tokens",
                tokens,
                "--json",
            ]);
            assert_eq!(out["granted_tokens"].as_f64(), tokens.parse().ok(), "{out}");
            assert_eq!(out["trickle_duration_seconds"].as_f64(), Some(0.0), "{out}");
        }
    }
    let shown = server.json(&[
        "tenant", "show", "--tenant", "initech", "--bucket", "api", "--json",
    ]);
    assert_eq!(shown["shadow"], true, "{shown}");
    assert_eq!(shown["throttled_seconds"], 0.0, "{shown}");
    let held_back = shown["shadow_throttled_tokens"].as_f64().expect("counted");
    assert!(held_back >= 180.0, "at most 10 of 200 at once: {shown}");

    std::thread::sleep(
        tollgate_server::telemetry::console::SAMPLE_INTERVAL + Duration::from_millis(300),
    );
    let (code, body) = get(metrics, "/console/api/buckets", None);
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let bucket = &view["buckets"][0];
    assert_eq!(bucket["shadow"], true, "{bucket}");
    assert_eq!(
        bucket["throttled"], false,
        "pods are not throttled: {bucket}"
    );
    assert_eq!(bucket["would_throttle"], true, "enforcing would: {bucket}");

    let profile = dir.path().join("chromium-profile");
    let overview = format!("http://127.0.0.1:{metrics}/console");
    let dom = browse(&chromium, &profile, &overview, &["--dump-dom"]);
    // Its row: marked shadow, not throttled (in debt: the enforced level),
    // and what enforcing would throttle in the throttled column.
    let row_class = dom
        .split("data-tenant=\"initech\"")
        .next()
        .and_then(|before| before.rsplit("<tr class=\"").next())
        .and_then(|class| class.split('"').next())
        .expect("the row's class");
    assert!(!row_class.contains("throttled"), "{row_class}");
    assert!(
        dom.contains("<td>api <span class=\"shadow\">shadow</span></td>"),
        "{dom}"
    );
    assert!(dom.contains("class=\"shadow-would\""), "{dom}");
    let page = format!("http://127.0.0.1:{metrics}/console#tenant=initech&range=1h");
    let dom = browse(&chromium, &profile, &page, &["--dump-dom"]);
    let would = fact(&dom, "would-throttle");
    let seconds = shown["shadow_throttled_seconds"].as_f64().expect("seconds");
    let expected = format!("{} tokens, {seconds:.1} pod-s", format_thousands(held_back));
    assert_eq!(would, expected, "{dom}");
    let png = screenshot(&chromium, &profile, &page, "shared-shadow", "1300,900");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
    server.stop();
}

/// `x` rounded, with thousands separated by commas, as the console
/// writes it.
fn format_thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
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
    let Some(chromium) = support::chromium() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = free_port();
    let server = Server::start_with(
        &dir.path().join("tollgate.redb"),
        &[
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
            "--history-interval",
            "1s",
        ],
    );
    // A tier of per-key buckets only; acme on it. Refill so slow that the
    // keys' levels stay as the checks left them.
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.api.buckets.per-user]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 10\n\
         [tiers.api.buckets.logins-per-ip]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 3\n\
         [tiers.api.buckets.search]\nkind = \"per-key\"\nrefill_rate = 0.0001\nburst_limit = 2\nenforce = false\n",
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

    // search is in shadow mode: 5 checks of a 2-token key, none refused,
    // 3 that enforcing would have refused.
    for n in 1..=5 {
        let out = server.tollgate(&[
            "check", "--tenant", "acme", "--bucket", "search", "--key", "s1", "--tokens", "1",
        ]);
        assert_eq!(out.status.code(), Some(0), "check {n}: {out:?}");
    }
    // The data the page polls: the rates over the window they name.
    let (code, body) = get(metrics, "/console/api/buckets", None);
    assert_eq!(code, 200, "{body}");
    let data: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(data["total_tenants"], 1, "{data}");
    let search = &data["key_buckets"][2];
    assert_eq!(search["bucket"], "search", "{data}");
    assert_eq!(search["enforce"], false, "{data}");
    let window = search["rate_window_seconds"].as_f64().expect("window");
    let would = search["shadow_refusals_per_second"].as_f64().expect("rate") * window;
    assert!((would - 3.0).abs() < 1e-6, "{data}");
    assert_eq!(search["refusals_per_second"], 0.0, "{data}");
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
    assert_eq!(key_cell(&dom, "acme", "search", "from"), "tier shadow");
    assert!(
        number(&key_cell(&dom, "acme", "search", "shadow-refusals")) > 0.0,
        "{dom}"
    );
    assert_eq!(number(&key_cell(&dom, "acme", "search", "refusals")), 0.0);
    let count = dom
        .split("id=\"key-bucket-count\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("per-key bucket count");
    assert_eq!(count, "3");

    let png = screenshot(&chromium, &profile, &console, "per-key", "1400,600");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());

    // The tenant page charts the same checks from the usage history, once
    // the replica has written them (every second here).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let histories = loop {
        let (code, body) = get(metrics, "/console/api/tenant?tenant=acme&range=1h", None);
        assert_eq!(code, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let histories = page["key_histories"]
            .as_array()
            .expect("key histories")
            .clone();
        let checks: u64 = histories.iter().filter_map(|h| h["checks"].as_u64()).sum();
        if checks == 8 {
            break histories;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the checks were not written to the history: {page}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let per_user = histories
        .iter()
        .find(|h| h["bucket"] == "per-user")
        .expect("per-user");
    assert_eq!(
        (per_user["checks"].as_u64(), per_user["refusals"].as_u64()),
        (Some(3), Some(1))
    );
    let search = histories
        .iter()
        .find(|h| h["bucket"] == "search")
        .expect("search");
    assert_eq!(search["shadow_refusals"], 3, "{search}");
    assert_eq!(search["busiest_keys"][0]["key"], "s1", "{search}");
    assert_eq!(search["busiest_keys"][0]["checks_at_least"], 5, "{search}");
    let page = format!("http://127.0.0.1:{metrics}/console#tenant=acme&range=1h");
    let dom = browse(&chromium, &profile, &page, &["--dump-dom"]);
    let card = |bucket: &str| -> String {
        let at = dom
            .find(&format!("data-key-history=\"{bucket}\""))
            .unwrap_or_else(|| panic!("the card of {bucket} in {dom}"));
        dom[at..].to_owned()
    };
    let per_user = card("per-user");
    assert_eq!(fact(&per_user, "checks"), "3", "{per_user}");
    assert_eq!(fact(&per_user, "refused"), "1", "{per_user}");
    assert_eq!(fact(&per_user, "busiest"), "u1 (1), u2 (1), u3 (1)");
    assert!(
        per_user.contains("data-chart=\"per-user:checks\""),
        "{per_user}"
    );
    let search = card("search");
    assert_eq!(fact(&search, "would-refuse"), "3", "{search}");
    assert_eq!(fact(&search, "busiest"), "s1 (5)", "{search}");
    assert!(
        search.contains("data-series=\"would refuse /s\""),
        "{search}"
    );
    let png = screenshot(&chromium, &profile, &page, "per-key-history", "1400,1000");
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
    let Some(chromium) = support::chromium() else {
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

/// An hour of usage, generated through the store's own operations on a
/// clock that runs from an hour ago to now: tenant `acme` (refill 50/s)
/// with two pods using 40/s in all for 40 minutes, then 120/s (throttled
/// from then on); `globex` (refill 1 000/s) with three pods using 300/s.
/// Every 10 s each pod asks for its use and reports the last 10 s; the
/// history is sampled as a server would. Returns the export's lines, when
/// acme's throttling began and the request units acme's pods reported.
mod generated {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::{Duration, SystemTime};

    use tollgate_core::{
        BucketKey, Consumption, Limits, LimitsMask, LimitsUpdate, TenantId, Timestamp,
        TokenBucketRequest,
    };
    use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};

    pub const HOUR: f64 = 3_600.0;
    /// When acme's use rises over its refill rate, after the hour began.
    pub const THROTTLED_AFTER: f64 = 40.0 * 60.0;

    pub struct Hour {
        pub export: Vec<u8>,
        pub throttled_from: Timestamp,
        pub acme_request_units: f64,
    }

    fn key(tenant: &str) -> BucketKey {
        BucketKey::request_units(TenantId::parse("tenant", tenant).expect("id"))
    }

    pub fn hour() -> Hour {
        tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(generate())
    }

    async fn generate() -> Hour {
        let end = Timestamp::from_system_time(SystemTime::now());
        let start = end.saturating_sub(Duration::from_secs_f64(HOUR));
        let clock = Arc::new(AtomicI64::new(start.unix_micros()));
        let reading = Arc::clone(&clock);
        let store = EmbeddedStore::in_memory_with_clock(
            BucketSettings::default(),
            Arc::new(move || Timestamp::from_unix_micros(reading.load(Ordering::SeqCst))),
        )
        .expect("store");
        for (tenant, rate) in [("acme", 50.0), ("globex", 1_000.0)] {
            store
                .update_limits(
                    &key(tenant),
                    &LimitsUpdate {
                        available_tokens: 10.0 * rate,
                        limits: Limits {
                            refill_rate: rate,
                            burst_limit: 10.0 * rate,
                        },
                        as_of: None,
                        as_of_consumed_tokens: 0.0,
                        mask: LimitsMask::ALL,
                    },
                )
                .await
                .expect("limits");
        }
        let mut seq = 0;
        let mut acme_request_units = 0.0;
        let mut t = 0.0;
        while t < HOUR {
            clock.store(
                start
                    .saturating_add(Duration::from_secs_f64(t))
                    .unix_micros(),
                Ordering::SeqCst,
            );
            seq += 1;
            let acme_use = if t < THROTTLED_AFTER { 20.0 } else { 60.0 };
            for (tenant, pods, per_pod) in [("acme", 2, acme_use), ("globex", 3, 100.0)] {
                for instance in 1..=pods {
                    let used = if seq == 1 { 0.0 } else { per_pod * 10.0 };
                    if tenant == "acme" {
                        acme_request_units += used;
                    }
                    let request = TokenBucketRequest {
                        instance_id: instance,
                        lease: format!("{tenant}-{instance}").into_bytes(),
                        seq,
                        requested_tokens: per_pod * 10.0,
                        shares: per_pod,
                        target_request_period: Duration::from_secs(10),
                        consumption: Consumption::from_request_units(used),
                        next_live_instance_id: None,
                        returned_tokens: 0.0,
                        held_tokens: 0.0,
                        fallback_tokens: 0.0,
                        fallback_duration: Duration::ZERO,
                    };
                    store
                        .token_bucket(&key(tenant), &request)
                        .await
                        .expect("a pod's request");
                }
            }
            crate::support::sample_history(&store).await;
            t += 10.0;
        }
        Hour {
            export: crate::support::export_lines(&store).await,
            throttled_from: start.saturating_add(Duration::from_secs_f64(THROTTLED_AFTER)),
            acme_request_units,
        }
    }
}

#[test]
fn a_tenant_page_charts_an_hour_of_history_with_axes_in_a_browser() {
    let Some(chromium) = support::chromium() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let hour = generated::hour();
    let export = dir.path().join("hour.jsonl");
    std::fs::write(&export, &hour.export).expect("write the export");
    let store = dir.path().join("tollgate.redb");
    let out = support::command()
        .args(["import", "--store"])
        .arg(&store)
        .arg(&export)
        .output()
        .expect("run import");
    assert!(out.status.success(), "import: {out:?}");
    let metrics = free_port();
    let server = Server::start_with(
        &store,
        &["--metrics-listen", &format!("127.0.0.1:{metrics}")],
    );
    // A tenant on a tier, for the tier column.
    server.ok(&[
        "tier",
        "create",
        "--tier",
        "gold",
        "--bucket",
        "api-calls=100/1000",
    ]);
    server.ok(&["tenant", "create", "--tenant", "initech", "--tier", "gold"]);
    // A pod of acme asking for far more than its bucket holds, again as
    // each trickle ends, while the pages are read: throttled throughout.
    let busy = BusyPod::start(&server, "acme", 3);
    let (code, body) = get(metrics, "/console/api/buckets", None);
    assert_eq!(code, 200, "{body}");

    // The data: a point a minute; what the points add up to is what
    // acme's pods reported (the first minute's slot is cut by the span).
    let (code, body) = get(metrics, "/console/api/tenant?tenant=acme&range=1h", None);
    assert_eq!(code, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let acme = &page["buckets"][0];
    let points = acme["points"].as_array().expect("points");
    assert!((60..=61).contains(&points.len()), "{} points", points.len());
    let charted: f64 = points
        .iter()
        .map(|p| {
            p["request_units_per_second"].as_f64().expect("rate")
                * (p["to_unix"].as_f64().expect("to") - p["from_unix"].as_f64().expect("from"))
        })
        .sum();
    let reported = hour.acme_request_units;
    assert!(
        charted <= reported * (1.0 + 1e-9) && charted >= reported * 0.97,
        "charted {charted} of {reported} request units"
    );
    // Throttled since the minute its use rose over the refill rate.
    assert_eq!(acme["throttled"], true, "{acme}");
    let since = acme["throttled_since_unix"].as_f64().expect("since when");
    let began = hour.throttled_from.unix_micros() as f64 / 1e6;
    assert!(
        (since - began).abs() <= 90.0,
        "throttled since {since}, began {began}"
    );
    // Before: at most 40/s used, none throttled; after: pods throttled.
    let before: Vec<&serde_json::Value> = points
        .iter()
        .filter(|p| p["to_unix"].as_f64().expect("to") < began - 60.0)
        .collect();
    assert!(before.len() > 30, "{} points before", before.len());
    assert!(before.iter().all(|p| p["throttled_pods"] == 0.0), "{acme}");
    // The summed chart has acme's only bucket.
    assert_eq!(page["total"].as_array().map(Vec::len), Some(points.len()));
    // Bad parameters: 400 naming them; an unknown tenant: 404.
    let (code, body) = get(metrics, "/console/api/tenant?tenant=acme&range=2h", None);
    assert_eq!(code, 400);
    assert!(body.contains("range"), "{body}");
    let (code, body) = get(metrics, "/console/api/tenant?range=1h", None);
    assert_eq!(code, 400);
    assert!(body.contains("tenant"), "{body}");
    let (code, _) = get(metrics, "/console/api/tenant?tenant=nobody", None);
    assert_eq!(code, 404);

    let profile = dir.path().join("chromium-profile");
    let page_url = format!("http://127.0.0.1:{metrics}/console#tenant=acme&range=1h");
    let dom = browse(&chromium, &profile, &page_url, &["--dump-dom"]);
    // Two charts a bucket and two for the sum, each with axes: time ticks
    // along x and values along y, and its series with a point a minute.
    for chart in [
        ":tokens",
        ":throttled",
        ":level",
        "total:ru",
        "total:throttled",
    ] {
        let at = dom
            .find(&format!("data-chart=\"{chart}\""))
            .unwrap_or_else(|| panic!("chart {chart} in {dom}"));
        let svg = &dom[at..at + dom[at..].find("</svg>").expect("svg end")];
        assert!(svg.matches("class=\"tick x\"").count() >= 3, "{svg}");
        assert!(svg.matches("class=\"tick y\"").count() >= 3, "{svg}");
        // The level where a row kept one: every minute acme was used (the
        // first, cut by the span, may have none).
        let want = if chart == ":level" {
            vec![points.len(), points.len() - 1]
        } else {
            vec![points.len()]
        };
        assert!(
            want.iter()
                .any(|n| svg.contains(&format!("data-points=\"{n}\""))),
            "{svg}"
        );
    }
    assert!(
        dom.contains("refill rate: 50.0"),
        "the refill rate's line: {dom}"
    );
    let when = fact(&dom, "since");
    assert!(when.contains("min ago"), "{when}");
    assert_eq!(fact(&dom, "tier"), "none");
    assert!(
        fact(&dom, "throttled").starts_with("request units since"),
        "{dom}"
    );
    let png = screenshot(&chromium, &profile, &page_url, "tenant", "1300,1250");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );

    // The overview: acme first (throttled), with since when; the tier.
    let overview = format!("http://127.0.0.1:{metrics}/console");
    let dom = browse(&chromium, &profile, &overview, &["--dump-dom"]);
    let first_row = dom
        .split("id=\"rows\">")
        .nth(1)
        .expect("rows")
        .split("</tr>")
        .next()
        .expect("a row");
    // Throttled, and in debt too at times ("debt throttled").
    let class = first_row
        .split("class=\"")
        .nth(1)
        .and_then(|c| c.split('"').next())
        .expect("the row's class");
    assert!(
        first_row.contains("data-tenant=\"acme\"") && class.split(' ').any(|c| c == "throttled"),
        "{first_row}"
    );
    assert!(cell(&dom, "acme", "since").contains("min ago"), "{dom}");
    assert_eq!(cell(&dom, "globex", "since"), "");
    assert_eq!(cell(&dom, "initech", "tier"), "gold");
    let png = screenshot(&chromium, &profile, &overview, "overview", "1500,700");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());

    // Trying a limit: half acme's refill rate over the hour throttles
    // more than the limits it ran on, and the page shows the API's
    // figures, that acme's demand was cut by throttling, and the command
    // that applies the limits; nothing changes.
    let try_api =
        "/console/api/preview?tenant=acme&bucket=&refill_rate=25&burst_limit=250&lookback=1h";
    let (code, body) = get(metrics, try_api, None);
    assert_eq!(code, 200, "{body}");
    let tried: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let now_throttled = tried["current"]["throttled"].as_f64().expect("throttled");
    let proposed_throttled = tried["proposed"]["throttled"].as_f64().expect("throttled");
    // 25/s under 40/s for 40 minutes and under 50/s granted after.
    assert!(
        proposed_throttled > now_throttled + 40_000.0,
        "now {now_throttled}, proposed {proposed_throttled}"
    );
    assert!(tried["current"]["recorded_throttled_seconds"].as_f64() > Some(0.0));
    for (query, field, code) in [
        (
            "tenant=acme&refill_rate=x&burst_limit=1",
            "refill_rate",
            400,
        ),
        (
            "tenant=acme&refill_rate=1&burst_limit=-1",
            "burst_limit",
            400,
        ),
        (
            "tenant=acme&refill_rate=1&burst_limit=1&lookback=2h",
            "lookback",
            400,
        ),
        ("tenant=nobody&refill_rate=1&burst_limit=1", "nobody", 404),
    ] {
        let (got, body) = get(metrics, &format!("/console/api/preview?{query}"), None);
        assert_eq!(got, code, "{query}: {body}");
        assert!(body.contains(field), "{query}: {body}");
    }
    let try_url = format!(
        "http://127.0.0.1:{metrics}/console#tenant=acme&range=1h&try_refill=25&try_burst=250&try_lookback=1h"
    );
    let dom = browse(&chromium, &profile, &try_url, &["--dump-dom"]);
    assert_eq!(
        fact(&dom, "try-command"),
        "tollgate tenant set-limits --tenant acme --refill-rate 25 --burst-limit 250"
    );
    let shown = |label: &str| -> f64 {
        fact(&dom, &format!("try-throttled-{label}"))
            .replace(',', "")
            .parse()
            .expect("a number")
    };
    // The page reads its own replay, moments after the API's: the busy
    // pod adds to the history between them.
    assert!(
        (shown("proposed") - proposed_throttled).abs() / proposed_throttled < 0.05,
        "{} shown, {proposed_throttled} from the API",
        shown("proposed")
    );
    assert!(
        dom.contains("under-states what a lower limit throttles"),
        "{dom}"
    );
    let png = screenshot(&chromium, &profile, &try_url, "try", "1300,1800");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
    let (_, body) = get(metrics, "/console/api/tenant?tenant=acme&range=1h", None);
    let page: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(page["buckets"][0]["refill_rate"], 50.0, "unchanged");

    drop(busy);
    server.stop();
}
