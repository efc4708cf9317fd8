//! `--preview` from the command line, on a server holding an hour of
//! recorded usage (generated through the store's own operations on a
//! moved clock, exported, and loaded with `tollgate import`): tenant
//! `steady` used 150 tokens/s of its request-unit bucket (200/s) and of
//! its tier's `api` bucket (200/s) for the hour; `own` overrides `api`.
//!
//! - `tenant set-limits --preview` at 100/s says 50/s would have been
//!   throttled (the known answer, within 1 %), and changes nothing;
//! - `tier apply --preview` covers `steady`'s `api` bucket, not `own`'s,
//!   and changes nothing;
//! - `budget set --preview` says when the day's spend reaches the budget
//!   and throttles the rest, and sets nothing;
//! - a look-back past the minute rows is refused naming it.

mod support;

use std::path::Path;

use support::Server;

const HOUR: f64 = 3_600.0;
const USE: f64 = 150.0;

mod generated {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::{Duration, SystemTime};

    use tollgate_core::tier::{BucketDefinition, BucketKind, TenantChange, Tier};
    use tollgate_core::{
        BucketKey, BucketName, Consumption, Limits, LimitsMask, LimitsUpdate, TenantId, TierName,
        Timestamp, TokenBucketRequest,
    };
    use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};

    use super::{HOUR, USE};

    fn api(refill_rate: f64) -> BucketDefinition {
        BucketDefinition {
            limits: Limits {
                refill_rate,
                burst_limit: 10.0 * refill_rate,
            },
            initial_tokens: None,
            kind: BucketKind::Shared,
            quota: None,
            enforce: true,
        }
    }

    fn tenant(id: &str) -> TenantId {
        TenantId::parse("tenant", id).expect("id")
    }

    /// The export of an hour that ended in the last minute.
    pub fn hour() -> Vec<u8> {
        tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(generate())
    }

    async fn generate() -> Vec<u8> {
        // On a minute: a bucket's first use is counted from the start of
        // the minute it was created in (the history has no row before), so
        // a bucket created mid-minute would show its first minute's use
        // spread over the whole minute.
        let now = Timestamp::from_system_time(SystemTime::now());
        let ago = now.saturating_sub(Duration::from_secs_f64(HOUR + 60.0));
        let start =
            Timestamp::from_unix_micros(ago.unix_micros().div_euclid(60_000_000) * 60_000_000);
        let clock = Arc::new(AtomicI64::new(start.unix_micros()));
        let reading = Arc::clone(&clock);
        let store = EmbeddedStore::in_memory_with_clock(
            BucketSettings::default(),
            Arc::new(move || Timestamp::from_unix_micros(reading.load(Ordering::SeqCst))),
        )
        .expect("store");
        let gold = TierName::parse("tier", "gold").expect("name");
        let tier = Tier::from_definitions("tier", [("api", api(200.0))], start).expect("tier");
        store.put_tier(&gold, &tier).await.expect("put tier");
        for id in ["steady", "own"] {
            store
                .change_tenant(&tenant(id), &TenantChange::Create { tier: gold.clone() })
                .await
                .expect("create");
        }
        store
            .change_tenant(
                &tenant("own"),
                &TenantChange::SetOverride {
                    bucket: BucketName::parse("bucket", "api").expect("name"),
                    definition: api(300.0),
                },
            )
            .await
            .expect("override");
        let request_units = BucketKey::request_units(tenant("steady"));
        store
            .update_limits(
                &request_units,
                &LimitsUpdate {
                    available_tokens: 2_000.0,
                    limits: Limits {
                        refill_rate: 200.0,
                        burst_limit: 2_000.0,
                    },
                    as_of: None,
                    as_of_consumed_tokens: 0.0,
                    mask: LimitsMask::ALL,
                },
            )
            .await
            .expect("limits");
        let api_key = |id: &str| {
            BucketKey::new(
                tenant(id),
                BucketName::parse("bucket", "api").expect("name"),
            )
        };
        let keys = [request_units, api_key("steady"), api_key("own")];
        let mut seq = 0;
        let mut t = 0.0;
        while t <= HOUR {
            clock.store(
                start
                    .saturating_add(Duration::from_secs_f64(t))
                    .unix_micros(),
                Ordering::SeqCst,
            );
            if t > 0.0 {
                seq += 1;
                for key in &keys {
                    let request = TokenBucketRequest {
                        instance_id: 1,
                        lease: b"pod".to_vec(),
                        seq,
                        requested_tokens: USE * 10.0,
                        shares: 1.0,
                        target_request_period: Duration::from_secs(10),
                        consumption: Consumption::from_request_units(USE * 10.0),
                        next_live_instance_id: None,
                        returned_tokens: 0.0,
                        held_tokens: 0.0,
                        fallback_tokens: 0.0,
                        fallback_duration: Duration::ZERO,
                    };
                    let grant = store
                        .token_bucket(key, &request)
                        .await
                        .expect("a pod's request");
                    assert_eq!(grant.granted_tokens, USE * 10.0, "unthrottled");
                }
            }
            crate::support::sample_history(&store).await;
            t += 10.0;
        }
        crate::support::export_lines(&store).await
    }
}

/// The server, and its metrics and console port.
fn served_hour(dir: &Path) -> (Server, u16) {
    let export = dir.join("hour.jsonl");
    std::fs::write(&export, generated::hour()).expect("write the export");
    let store = dir.join("tollgate.redb");
    let out = support::command()
        .args(["import", "--store"])
        .arg(&store)
        .arg(&export)
        .output()
        .expect("run import");
    assert!(out.status.success(), "import: {out:?}");
    let port = support::free_port();
    let server = Server::start_with(&store, &["--metrics-listen", &format!("127.0.0.1:{port}")]);
    (server, port)
}

/// The console's "try a limit" for every tenant on the tier: the same
/// answer as `tier apply --preview` (`proposed` of `known`), over HTTP and
/// in a browser; refused naming the field where it cannot be asked.
fn tier_preview_in_the_console(port: u16, known: f64, proposed: f64) {
    let ask = |query: &str| support::get(port, &format!("/console/api/preview?{query}"), None);
    let (code, body) = ask("tenant=steady&bucket=api&refill_rate=100&burst_limit=100&scope=tier");
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(view["tier"], "gold", "{view}");
    let tenants: Vec<&str> = view["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["tenant_id"].as_str().expect("tenant"))
        .collect();
    assert_eq!(tenants, ["steady"], "own overrides the bucket: {view}");
    let throttled = view["proposed_throttled"].as_f64().expect("throttled");
    assert!(
        (throttled - known).abs() / known < 0.01 && (throttled - proposed).abs() < 1.0,
        "{throttled} throttled, {known} known, {proposed} from the CLI"
    );
    assert!(
        view["tier_file"]
            .as_str()
            .is_some_and(|f| f.contains("[tiers.gold.buckets.api]")),
        "{view}"
    );
    for (query, code, field) in [
        (
            "tenant=steady&bucket=&refill_rate=1&burst_limit=1&scope=tier",
            400,
            "bucket",
        ),
        (
            "tenant=steady&bucket=api&refill_rate=1&burst_limit=1&scope=all",
            400,
            "scope",
        ),
        (
            "tenant=nobody&bucket=api&refill_rate=1&burst_limit=1&scope=tier",
            400,
            "scope",
        ),
    ] {
        let (got, body) = ask(query);
        assert_eq!(got, code, "{query}: {body}");
        assert!(body.contains(field), "{query}: {body}");
    }

    let Some(chromium) = support::chromium() else {
        return;
    };
    let profile = tempfile::tempdir().expect("profile dir");
    let page = format!(
        "http://127.0.0.1:{port}/console#tenant=steady&range=1h&try_bucket=api&try_refill=100&try_burst=100&try_scope=tier"
    );
    let dom = support::browse(&chromium, profile.path(), &page, &["--dump-dom"]);
    let fact = |name: &str| support::fact(&dom, name);
    assert_eq!(fact("try-tenants"), "1");
    let shown = support::number(&fact("try-tier-throttled"));
    assert!(
        (shown - throttled).abs() <= 1.0,
        "{shown} shown, {throttled}"
    );
    assert!(dom.contains("data-try-tenant=\"steady\""), "{dom}");
    let png = support::screenshot(&chromium, profile.path(), &page, "try-tier", "1300,2300");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
}

/// The console's budget preview: the same answer as `budget set
/// --preview` (`proposed` throttled), over HTTP and in a browser; refused
/// naming the parameter at fault.
fn budget_preview_in_the_console(port: u16, proposed: f64) {
    let ask = |query: &str| {
        support::get(
            port,
            &format!("/console/api/preview-budget?tenant=steady&bucket=api&{query}"),
            None,
        )
    };
    let (code, body) = ask("amount=1000&period=daily&at_limit=stop");
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let throttled = view["proposed"]["throttled"].as_f64().expect("throttled");
    assert!(
        (throttled - proposed).abs() < 1.0,
        "{throttled}, {proposed} from the CLI"
    );
    assert!(view["current"]["budget_reached_unix"].is_null(), "{view}");
    assert!(
        view["proposed"]["budget_reached_unix"].is_number(),
        "{view}"
    );
    assert_eq!(
        view["command"],
        "tollgate budget set --tenant steady --bucket api --amount 1000 --cycle daily --at-limit stop"
    );
    for (query, field) in [
        ("amount=0&period=daily&at_limit=stop", "amount"),
        ("amount=10&period=yearly&at_limit=stop", "period"),
        ("amount=10&period=daily&at_limit=throttle", "at_limit"),
    ] {
        let (code, body) = ask(query);
        assert_eq!(code, 400, "{query}: {body}");
        assert!(body.contains(field), "{query}: {body}");
    }

    let Some(chromium) = support::chromium() else {
        return;
    };
    let profile = tempfile::tempdir().expect("profile dir");
    let page = format!(
        "http://127.0.0.1:{port}/console#tenant=steady&range=1h&try_bucket=api&try_budget=1000&try_period=daily&try_at_limit=stop"
    );
    let dom = support::browse(&chromium, profile.path(), &page, &["--dump-dom"]);
    let fact = |name: &str| support::fact(&dom, name);
    assert_eq!(fact("try-budget-reached-now"), "not reached");
    let shown = support::number(&fact("try-budget-throttled-proposed"));
    assert!(
        (shown - throttled).abs() <= 1.0,
        "{shown} shown, {throttled}"
    );
    assert!(
        fact("try-budget-command").starts_with("tollgate budget set --tenant steady"),
        "{dom}"
    );
    let png = support::screenshot(&chromium, profile.path(), &page, "try-budget", "1300,2500");
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
}

fn throttled(view: &serde_json::Value, which: &str) -> f64 {
    view[which]["throttled_tokens"].as_f64().expect("throttled")
}

#[test]
fn previews_change_nothing_and_give_the_known_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, console) = served_hour(dir.path());
    let known = (USE - 100.0) * HOUR;

    // One bucket: the request-unit bucket at 100/s.
    let views = server.json(&[
        "tenant",
        "set-limits",
        "--tenant",
        "steady",
        "--refill-rate",
        "100",
        "--burst-limit",
        "100",
        "--preview",
        "--json",
    ]);
    let bucket = &views[0]["buckets"][0];
    assert_eq!(bucket["tenant_id"], "steady", "{views}");
    assert_eq!(bucket["current_refill_rate"], 200.0);
    assert_eq!(throttled(bucket, "current"), 0.0, "{bucket}");
    let proposed = throttled(bucket, "proposed");
    assert!(
        (proposed - known).abs() / known < 0.01,
        "{proposed} throttled, {known} known"
    );
    let shown = server.json(&["tenant", "show", "--tenant", "steady", "--json"]);
    assert_eq!(shown[0]["refill_rate"], 200.0, "unchanged: {shown}");

    // As text: the table, and that nothing changed. Only the burst given:
    // the refill rate stays.
    let text = server.ok(&[
        "tenant",
        "set-limits",
        "--tenant",
        "steady",
        "--burst-limit",
        "10",
        "--preview",
    ]);
    assert!(text.contains("Nothing was changed"), "{text}");
    assert!(text.contains("200/s, burst 10"), "{text}");
    assert!(text.contains("THROTTLED PROPOSED"), "{text}");

    // A tier: steady's api bucket follows gold, own's overrides it.
    let tiers = dir.path().join("tiers.toml");
    std::fs::write(
        &tiers,
        "[tiers.gold.buckets.api]\nrefill_rate = 100\nburst_limit = 100\n",
    )
    .expect("write tiers");
    let tiers = tiers.to_str().expect("utf-8");
    let views = server.json(&["tier", "apply", "-f", tiers, "--preview", "--json"]);
    let buckets = views[0]["buckets"].as_array().expect("buckets");
    let touched: Vec<_> = buckets
        .iter()
        .map(|b| format!("{}/{}", b["tenant_id"], b["bucket"]))
        .collect();
    assert_eq!(touched, ["\"steady\"/\"api\""], "{views}");
    let proposed = throttled(&buckets[0], "proposed");
    assert!(
        (proposed - known).abs() / known < 0.01,
        "{proposed} throttled, {known} known"
    );
    let tier = server.json(&["tier", "show", "--tier", "gold", "--json"]);
    assert_eq!(
        tier["buckets"][0]["refill_rate"], 200.0,
        "unchanged: {tier}"
    );
    tier_preview_in_the_console(console, known, proposed);
    // The same tier in shadow mode: said so, in the table and in a note.
    std::fs::write(
        tiers,
        "[tiers.gold]\nenforce = false\n[tiers.gold.buckets.api]\nrefill_rate = 100\nburst_limit = 100\n",
    )
    .expect("write tiers");
    let text = server.ok(&["tier", "apply", "-f", tiers, "--preview"]);
    assert!(text.contains("100/s, burst 100 (shadow)"), "{text}");
    assert!(
        text.contains("steady/api is as proposed (not now) in shadow mode"),
        "{text}"
    );

    // A budget of 1 000 tokens a day stopping at the limit: reached in
    // the first seconds of the cycle (today's, from midnight UTC), and
    // the rest of the day's demand throttled; no budget now, and none set.
    let views = server.json(&[
        "budget",
        "set",
        "--tenant",
        "steady",
        "--bucket",
        "api",
        "--amount",
        "1000",
        "--cycle",
        "daily",
        "--at-limit",
        "stop",
        "--preview",
        "--json",
    ]);
    let bucket = &views[0]["buckets"][0];
    assert!(bucket["current"]["budget_reached"].is_null(), "{bucket}");
    assert!(bucket["proposed"]["budget_reached"].is_string(), "{bucket}");
    let demand = bucket["proposed"]["demand_tokens"]
        .as_f64()
        .expect("demand");
    let proposed = throttled(bucket, "proposed");
    // At most a second's refill (200) goes out past the cap.
    assert!(
        (proposed - (demand - 1_000.0)).abs() <= 250.0,
        "{proposed} throttled of {demand}"
    );
    budget_preview_in_the_console(console, proposed);
    let shown = server.tollgate(&["budget", "show", "--tenant", "steady", "--bucket", "api"]);
    let shown = format!("{shown:?}");
    assert!(!shown.contains("1000"), "no budget was set: {shown}");

    // Past the minute rows: refused, naming the flag's field.
    let out = server.tollgate(&[
        "tenant",
        "set-limits",
        "--tenant",
        "steady",
        "--refill-rate",
        "100",
        "--preview",
        "--lookback",
        "30days",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lookback"), "{stderr}");
    server.stop();
}
