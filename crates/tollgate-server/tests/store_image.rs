//! Export and import on both stores, and between them.
//!
//! A store is filled by generated traffic (tiers with shared and per-key
//! buckets, tenants on them with overrides, pods coming and going, keys
//! taken with and without request ids, tenants deleted and suspended,
//! the usage history sampled), exported through
//! the JSON-lines text, and imported into a fresh store of each kind. The
//! second store must then be the first: the same export, the same reads,
//! the same totals, and the same answers to what comes next, retries of
//! requests and checks made before the move included.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{Backend, Backing, ManualClock, bucket_name, definition, tenant_id, tier_name};
use tokio::sync::mpsc;
use tollgate_core::budget::{AtLimit, Budget, CycleRule, Period};
use tollgate_core::global_bucket::{BucketState, sums_agree};
use tollgate_core::history::HistoryConfig;
use tollgate_core::history::checks::CheckTally;
use tollgate_core::key_bucket::{CheckCall, KeyId, RequestItem};
use tollgate_core::organisation::TreeChange;
use tollgate_core::rate_window::Outcome;
use tollgate_core::tenant_state::StateChange;
use tollgate_core::tier::{BucketKind, TenantChange, Tier};
use tollgate_core::{
    BucketKey, BucketName, Consumption, Limits, LimitsMask, LimitsUpdate, TenantId, Timestamp,
    TokenBucketRequest,
};
use tollgate_server::store::image::{FORMAT_VERSION, write_line};
use tollgate_server::store::{
    BucketSettings, Counts, ImageError, NodeFilter, Record, RecordSink, Store, StoreError,
    StoreImage,
};

/// A pod's request: instance `instance` of lease `lease`, number `seq`.
fn request(instance: u32, lease: u32, seq: u64, tokens: f64, units: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id: instance,
        lease: format!("lease-{lease}").into_bytes(),
        seq,
        requested_tokens: tokens,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::from_request_units(units),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        // Pods hold something, so the sums of what they hold move too.
        held_tokens: tokens / 2.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

/// What generated traffic did, to be done again after the move.
#[derive(Default)]
struct History {
    /// Each pod's last request, by bucket and instance.
    last_requests: BTreeMap<(BucketKey, u32), TokenBucketRequest>,
    /// Checks made with a request id.
    checks: Vec<CheckCall>,
    /// The tenants deleted and suspended.
    tenants: Vec<TenantId>,
}

/// Fills `store` with state generated from `seed`; the clock moves on by
/// up to a minute and a half between steps, so pods fall silent and are
/// removed, and keys refill.
async fn populate(store: &dyn Store, clock: &ManualClock, seed: u64) -> History {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut history = History::default();
    let mut tally = CheckTally::new(HistoryConfig::default().resolutions);
    clock.set_secs(1_700_000_000.0 + rng.random_range(0.0..1e6));
    let tiers = ["free", "pro", "enterprise"];
    for (i, tier) in tiers.iter().enumerate() {
        let scale = 10f64.powi(i as i32);
        let buckets = BTreeMap::from([
            (
                bucket_name("schedule-email"),
                definition(scale, 10.0 * scale, BucketKind::Shared),
            ),
            (
                bucket_name("per-user"),
                definition(scale, 5.0 * scale, BucketKind::PerKey),
            ),
        ]);
        let tier_doc = Tier {
            buckets,
            tables: BTreeMap::new(),
            budgets: BTreeMap::new(),
            enforce: true,
            created_at: clock.now(),
            updated_at: clock.now(),
        };
        store
            .put_tier(&tier_name(tier), &tier_doc)
            .await
            .expect("put tier");
    }
    let tenants: Vec<String> = (0..rng.random_range(4..9))
        .map(|i| format!("tenant-{seed}-{i}"))
        .collect();
    for tenant in &tenants {
        let id = tenant_id(tenant);
        if rng.random_bool(0.75) {
            let tier = tiers[rng.random_range(0..tiers.len())];
            store
                .change_tenant(
                    &id,
                    &TenantChange::Create {
                        tier: tier_name(tier),
                    },
                )
                .await
                .expect("onboard");
            if rng.random_bool(0.4) {
                store
                    .change_tenant(
                        &id,
                        &TenantChange::SetOverride {
                            bucket: bucket_name("schedule-email"),
                            definition: definition(
                                rng.random_range(0.5..50.0),
                                rng.random_range(1.0..500.0),
                                BucketKind::Shared,
                            ),
                        },
                    )
                    .await
                    .expect("override");
            }
        }
        // Every tenant has a request-unit bucket of its own limits.
        store
            .update_limits(
                &BucketKey::request_units(id.clone()),
                &LimitsUpdate {
                    available_tokens: rng.random_range(0.0..1000.0),
                    limits: Limits {
                        refill_rate: rng.random_range(1.0..100.0),
                        burst_limit: rng.random_range(0.0..1000.0),
                    },
                    as_of: None,
                    as_of_consumed_tokens: 0.0,
                    mask: LimitsMask::ALL,
                },
            )
            .await
            .expect("set limits");
        // Most request-unit buckets have a daily budget, small enough to
        // cross thresholds.
        if rng.random_bool(0.7) {
            let budget = Budget::new(
                rng.random_range(20.0..300.0),
                CycleRule {
                    period: Period::Daily,
                    time_zone: "Asia/Kolkata".into(),
                },
                if rng.random_bool(0.5) {
                    AtLimit::Stop
                } else {
                    AtLimit::Throttle {
                        baseline: Limits {
                            refill_rate: 0.5,
                            burst_limit: 5.0,
                        },
                    }
                },
            );
            store
                .change_tenant(
                    &id,
                    &TenantChange::SetBudget {
                        bucket: BucketName::REQUEST_UNITS,
                        budget,
                    },
                )
                .await
                .expect("budget");
        }
    }
    // An organisation over some of the tenants, one nested under it, so
    // that the tree, the members' draws and their guarantees move with
    // the store.
    let org = tenant_id(&format!("org-{seed}"));
    let sub = tenant_id(&format!("sub-{seed}"));
    for id in [&org, &sub] {
        store
            .change_tree(&TreeChange::Create {
                organisation: id.clone(),
                display_name: format!("Org {seed}"),
            })
            .await
            .expect("create an organisation");
        store
            .update_limits(
                &BucketKey::request_units(id.clone()),
                &LimitsUpdate {
                    available_tokens: 50.0,
                    limits: Limits {
                        refill_rate: rng.random_range(5.0..50.0),
                        burst_limit: 200.0,
                    },
                    as_of: None,
                    as_of_consumed_tokens: 0.0,
                    mask: LimitsMask::ALL,
                },
            )
            .await
            .expect("an organisation's limits");
    }
    store
        .change_tree(&TreeChange::Join {
            organisation: org.clone(),
            member: sub.clone(),
            guaranteed: BTreeMap::new(),
        })
        .await
        .expect("nest");
    for (i, tenant) in tenants.iter().enumerate().skip(2) {
        let parent = if i % 2 == 0 { &org } else { &sub };
        let guaranteed = BTreeMap::from([(BucketName::REQUEST_UNITS, rng.random_range(0.0..5.0))]);
        store
            .change_tree(&TreeChange::Join {
                organisation: parent.clone(),
                member: tenant_id(tenant),
                guaranteed,
            })
            .await
            .expect("join");
    }
    let mut seqs: BTreeMap<(BucketKey, u32), u64> = BTreeMap::new();
    for step in 0..rng.random_range(60..160) {
        clock.advance(Duration::from_millis(rng.random_range(0..90_000)));
        if step == 30 {
            // A day later: budgets close their cycles at the next request.
            clock.advance(Duration::from_secs(86_400));
        }
        let tenant = tenant_id(&tenants[rng.random_range(0..tenants.len())]);
        if rng.random_bool(0.8) {
            let bucket = if rng.random_bool(0.5) {
                BucketKey::request_units(tenant)
            } else {
                BucketKey::new(tenant, bucket_name("schedule-email"))
            };
            let instance = rng.random_range(1..12);
            let seq = seqs.entry((bucket.clone(), instance)).or_insert(0);
            *seq += 1;
            let request = request(
                instance,
                1,
                *seq,
                rng.random_range(0.0..200.0),
                rng.random_range(0.0..50.0),
            );
            // A tenant not on a tier has no schedule-email bucket.
            if store.token_bucket(&bucket, &request).await.is_ok() {
                history
                    .last_requests
                    .insert((bucket.clone(), instance), request);
            }
        } else {
            let key = KeyId::new(
                tenant,
                bucket_name("per-user"),
                format!("user-{}", rng.random_range(0..6)),
            );
            let request_id = rng
                .random_bool(0.5)
                .then(|| format!("req-{}", rng.random::<u32>()));
            let call = CheckCall::new(vec![RequestItem {
                key,
                tokens: rng.random_range(0.5..4.0),
                request_id: request_id.clone(),
            }])
            .expect("a valid call");
            // A tenant not on a tier has no per-user bucket.
            if let Ok(answer) = store.check(&call).await {
                let item = &call.items[0];
                let outcome = if answer.allowed {
                    Outcome::Allowed
                } else {
                    Outcome::Refused
                };
                tally.record(
                    &item.key.bucket,
                    answer.at,
                    [item.key.key.as_str()],
                    outcome,
                );
                if request_id.is_some() {
                    history.checks.push(call);
                }
            }
        }
        // The usage history, as a server samples it, and its replica
        // writes its checks.
        if rng.random_bool(0.3) {
            store
                .record_checks("replica-1", &tally.take_rows())
                .await
                .expect("write checks");
            let mut after = None;
            while let Some(last) = store
                .sample_history(after.as_ref(), 7)
                .await
                .expect("sample the history")
                .last
            {
                after = Some(last);
            }
        }
    }
    // A deleted tenant leaves only its tombstone and the closed records of
    // its buckets behind to export; a suspended one keeps everything, its
    // suspension with it.
    let gone = tenant_id(&tenants[0]);
    store.delete_tenant(&gone).await.expect("delete");
    let suspended = tenant_id(&tenants[1]);
    store
        .change_tenant_state(
            &suspended,
            &StateChange::Suspend {
                actor: "bob at 10.0.0.8:40000".into(),
                reason: format!("unpaid invoice {seed}"),
            },
        )
        .await
        .expect("suspend");
    history.tenants = vec![gone.clone(), suspended.clone()];
    history
        .last_requests
        .retain(|(bucket, _), _| bucket.tenant != gone);
    history.checks.retain(|call| {
        call.items
            .iter()
            .all(|i| i.key.bucket.tenant != gone && i.key.bucket.tenant != suspended)
    });
    history
}

/// A `check_history` line of tenant `acme`'s per-user bucket.
fn check_history_line(
    step_secs: u64,
    slot: i64,
    replica: &str,
    checks: u64,
    refusals: u64,
) -> String {
    format!(
        r#"{{"kind":"check_history","tenant":"acme","bucket":"per-user","step_secs":{step_secs},"slot":{slot},"replica":"{replica}","counts":{{"checks":{checks},"refusals":{refusals},"shadow_refusals":0,"busiest":[{{"key":"alice","checks":{checks}}}]}}}}"#
    )
}

/// A `history` line of tenant `acme`'s request-unit bucket.
fn history_line(step_secs: u64, slot: i64, at: i64) -> String {
    format!(
        r#"{{"kind":"history","tenant":"acme","bucket":"","step_secs":{step_secs},"slot":{slot},"sample":{{"at":{at},"totals":{{"consumption":{{}},"granted_tokens":1.0}}}}}}"#
    )
}

/// Everything `store` exports, in order.
async fn export(store: &dyn Store) -> (Vec<Record>, Counts) {
    let (tx, mut rx) = mpsc::channel(16);
    let collect = tokio::spawn(async move {
        let mut records = Vec::new();
        while let Some(record) = rx.recv().await {
            records.push(record);
        }
        records
    });
    let counts = store.export(RecordSink::new(tx)).await.expect("export");
    (collect.await.expect("collector"), counts)
}

/// The records as the text `tollgate export` writes.
fn text(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        write_line(&mut out, record).expect("write to memory");
    }
    out
}

/// Removes every `held_reported` field, wherever it is in a record.
fn strip_held_reported(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            fields.remove("held_reported");
            fields.values_mut().for_each(strip_held_reported);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_held_reported),
        _ => {}
    }
}

/// The records after the header, which names the store and the time.
fn body(records: &[Record]) -> &[Record] {
    assert!(matches!(records.first(), Some(Record::Header(_))));
    &records[1..]
}

/// Everything a server reads of a store: buckets with their instances,
/// tenants as tiers see them, tiers, key counts.
async fn reads(store: &dyn Store, states_of: &[TenantId]) -> String {
    let mut out = String::new();
    let buckets = store.list_buckets(None, 10_000).await.expect("list");
    let mut tenants: Vec<TenantId> = buckets.iter().map(|b| b.key.tenant.clone()).collect();
    tenants.dedup();
    for tenant in tenants {
        out += &format!("{:#?}\n", store.get_tenant(&tenant).await.expect("tenant"));
        out += &format!(
            "{:#?}\n",
            store.describe_tenant(&tenant).await.expect("view")
        );
    }
    out += &format!("{:#?}\n", store.list_tiers().await.expect("tiers"));
    out += &format!(
        "{:#?}\n",
        store.tenant_states(states_of).await.expect("tenant states")
    );
    out += &format!("{:#?}\n", store.key_counts().await.expect("key counts"));
    let orgs = store
        .tree_nodes(&NodeFilter::Organisations)
        .await
        .expect("organisations");
    out += &format!("{orgs:#?}\n");
    for (org, _) in &orgs {
        out += &format!(
            "{:#?}\n",
            store
                .tree_nodes(&NodeFilter::MembersOf(org.clone()))
                .await
                .expect("members")
        );
    }
    for bucket in &buckets {
        out += &format!(
            "{:#?}\n",
            store.budget_cycles(&bucket.key, 100).await.expect("cycles")
        );
    }
    out
}

/// Asserts the reads of the copy and of the original are the same, naming
/// the first line that differs (the whole texts are too long to compare
/// by eye).
fn same_lines(copy: &str, original: &str, seed: u64) {
    let (copy, original): (Vec<&str>, Vec<&str>) =
        (copy.lines().collect(), original.lines().collect());
    for (n, (c, o)) in copy.iter().zip(&original).enumerate() {
        if c != o {
            let around =
                |lines: &[&str]| lines[n.saturating_sub(40)..(n + 40).min(lines.len())].join("\n");
            panic!(
                "seed {seed}: line {n} of the reads differs\n=== copy\n{}\n=== original\n{}",
                around(&copy),
                around(&original)
            );
        }
    }
    assert_eq!(
        copy.len(),
        original.len(),
        "seed {seed}: the reads have different lengths"
    );
}

/// Moves a generated store from `from` to `to` and checks the copy is the
/// original in every way a server or an operator can tell.
async fn moves_whole(from: Backend, to: Backend, seed: u64) {
    let clock = ManualClock::default();
    let source_backing = Backing::new(from).await;
    let source = source_backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let history = populate(source.as_ref(), &clock, seed).await;
    let (records, counts) = export(source.as_ref()).await;
    assert_eq!(records.last(), Some(&Record::End(counts)));
    assert_eq!(counts.tenant_states, 2, "a tombstone and a suspension");
    assert!(
        counts.tiers == 3
            && counts.buckets > 0
            && counts.instances > 0
            && counts.keys > 0
            && counts.closed_buckets > 0
            && counts.budget_cycles > 0
            && counts.budget_events > 0
            && counts.organisation_nodes > 0
            && counts.history_rows > 0
            && counts.check_history_rows > 0,
        "seed {seed}: a thin store exercises little: {counts}"
    );

    let image = StoreImage::read(text(&records).as_slice()).expect("read the export");
    assert_eq!(image.counts(), counts);
    let mut holding = 0;
    for bucket in &image.buckets {
        let held = BucketState::reported_by(&bucket.instances);
        let reported = bucket.head.state.held_reported;
        assert!(
            sums_agree(reported, held),
            "seed {seed}: {} sums {reported} of {held} held",
            bucket.key
        );
        holding += usize::from(held > 0.0);
    }
    assert!(holding > 0, "seed {seed}: no pod holds anything");
    // An export from before head rows kept `held_reported` reads as this
    // one: the sums come from the instances.
    let exported = String::from_utf8(text(&records)).expect("UTF-8");
    assert!(
        exported.contains("\"held_reported\""),
        "exports carry the sums"
    );
    let old_text: Vec<u8> = exported
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).expect("JSON");
            strip_held_reported(&mut value);
            format!("{value}\n")
        })
        .collect::<String>()
        .into_bytes();
    let old = StoreImage::read(old_text.as_slice()).expect("read the older export");
    assert_eq!(old.buckets.len(), image.buckets.len());
    for (a, b) in old.buckets.iter().zip(&image.buckets) {
        let (a, b) = (a.head.state.held_reported, b.head.state.held_reported);
        assert!(sums_agree(a, b), "{a} for {b}");
    }
    let target_backing = Backing::new(to).await;
    let target = target_backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    assert_eq!(
        target.import(image.clone(), false).await.expect("import"),
        counts
    );

    let (copied, _) = export(target.as_ref()).await;
    assert_eq!(
        body(&copied),
        body(&records),
        "seed {seed}: the exports differ"
    );
    same_lines(
        &reads(target.as_ref(), &history.tenants).await,
        &reads(source.as_ref(), &history.tenants).await,
        seed,
    );

    // Into a store that holds something: refused, and nothing changes.
    let refused = target.import(image.clone(), false).await;
    assert!(
        matches!(refused, Err(StoreError::NotEmpty(ref what)) if what.contains("buckets")),
        "{refused:?}"
    );
    assert_eq!(body(&export(target.as_ref()).await.0), body(&records));

    // What comes next is answered the same on both: retries of the last
    // requests (answered from the stored grant, counted once), new
    // requests, retried checks.
    clock.advance(Duration::from_secs(1));
    for ((bucket, _), last) in &history.last_requests {
        let mut next = last.clone();
        next.seq += 1;
        for request in [last, &next] {
            let there = source.token_bucket(bucket, request).await;
            let here = target.token_bucket(bucket, request).await;
            assert_eq!(
                format!("{here:?}"),
                format!("{there:?}"),
                "{bucket}, instance {}",
                request.instance_id
            );
        }
    }
    for call in &history.checks {
        let there = source.check(call).await.expect("check");
        let here = target.check(call).await.expect("check");
        assert_eq!(here, there);
    }
    same_lines(
        &reads(target.as_ref(), &history.tenants).await,
        &reads(source.as_ref(), &history.tenants).await,
        seed,
    );

    // --replace: the store becomes the export, whatever it held.
    assert_eq!(target.import(image, true).await.expect("replace"), counts);
    assert_eq!(body(&export(target.as_ref()).await.0), body(&records));

    source.close().await.expect("close");
    target.close().await.expect("close");
}

macro_rules! moves {
    ($($name:ident: $from:ident -> $to:ident, seeds $seeds:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                for seed in $seeds {
                    moves_whole(Backend::$from, Backend::$to, seed).await;
                }
            }
        )*
    };
}

moves! {
    embedded_to_embedded: Embedded -> Embedded, seeds 0..6;
    embedded_to_postgres: Embedded -> Postgres, seeds 10..13;
    postgres_to_embedded: Postgres -> Embedded, seeds 20..23;
    postgres_to_postgres: Postgres -> Postgres, seeds 30..32;
}

/// A file cut short anywhere, or with a line changed into something
/// inconsistent, is refused as a whole: the store stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_exports_are_refused_whole() {
    let clock = ManualClock::default();
    let backing = Backing::new(Backend::Embedded).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    populate(store.as_ref(), &clock, 99).await;
    let (records, _) = export(store.as_ref()).await;
    let whole = text(&records);
    let lines: Vec<&[u8]> = whole.split_inclusive(|b| *b == b'\n').collect();

    // Every cut at a line boundary but the whole file.
    for kept in 0..lines.len() {
        let cut = lines[..kept].concat();
        let read = StoreImage::read(cut.as_slice());
        assert!(
            matches!(read, Err(ImageError::Truncated { .. } | ImageError::Empty)),
            "cut after {kept} lines: {read:?}"
        );
    }
    // A cut inside the last line.
    let cut = &whole[..whole.len() - 5];
    assert!(StoreImage::read(cut).is_err());

    // A line dropped (but not the header or the end line): the counts or
    // the pod lists no longer add up.
    for dropped in 1..lines.len() - 1 {
        let mut edited = lines.clone();
        edited.remove(dropped);
        let read = StoreImage::read(edited.concat().as_slice());
        assert!(
            matches!(read, Err(ImageError::Line { .. })),
            "line {} dropped: {read:?}",
            dropped + 1
        );
    }
    // A line twice.
    for doubled in 1..lines.len() - 1 {
        let mut edited = lines.clone();
        edited.insert(doubled, lines[doubled]);
        let read = StoreImage::read(edited.concat().as_slice());
        assert!(
            matches!(read, Err(ImageError::Line { .. })),
            "line {} doubled: {read:?}",
            doubled + 1
        );
    }

    // A bucket edited out of what a store holds: limits out of range,
    // a total beyond a BIGINT, an instance's seq beyond one.
    let bucket_line = lines
        .iter()
        .position(|l| l.starts_with(b"{\"kind\":\"bucket\""))
        .expect("a bucket line");
    let instance_line = lines
        .iter()
        .position(|l| l.starts_with(b"{\"kind\":\"instance\""))
        .expect("an instance line");
    let closed_line = lines
        .iter()
        .position(|l| l.starts_with(b"{\"kind\":\"closed_bucket\""))
        .expect("a closed bucket line");
    let edits: [(usize, &str, serde_json::Value, &str); 6] = [
        (
            bucket_line,
            "/head/limits/refill_rate",
            (-1.0).into(),
            "refill_rate",
        ),
        (
            bucket_line,
            "/head/consumption/read_bytes",
            u64::MAX.into(),
            "read_bytes total",
        ),
        (instance_line, "/instance/seq", u64::MAX.into(), "seq"),
        (
            closed_line,
            "/totals/consumption/read_bytes",
            u64::MAX.into(),
            "closed bucket",
        ),
        (
            closed_line,
            "/limits/burst_limit",
            (-1.0).into(),
            "burst_limit",
        ),
        (
            closed_line,
            "/created_at",
            i64::MAX.into(),
            "before it was created",
        ),
    ];
    for (line, pointer, value, expected) in edits {
        let mut record: serde_json::Value =
            serde_json::from_slice(lines[line]).expect("a JSON line");
        *record.pointer_mut(pointer).expect(pointer) = value;
        let mut edited = lines.clone();
        let text = format!("{record}\n");
        edited[line] = text.as_bytes();
        let message = StoreImage::read(edited.concat().as_slice())
            .expect_err("refused")
            .to_string();
        assert!(
            message.starts_with(&format!("line {}:", line + 1)) && message.contains(expected),
            "{pointer}: {message}"
        );
    }

    let fresh_backing = Backing::new(Backend::Embedded).await;
    let fresh = fresh_backing.open(BucketSettings::default()).await;
    let (empty, counts) = export(fresh.as_ref()).await;
    assert_eq!(counts, Counts::default());
    assert_eq!(empty.len(), 2, "a header and an end line");
    store.close().await.expect("close");
    fresh.close().await.expect("close");
}

/// What an operator sees for the common mistakes: the line, and what is
/// wrong with it.
#[test]
fn errors_name_the_line_and_the_fault() {
    let header = format!(
        r#"{{"kind":"header","format":"tollgate-store-export","version":1,"store":"embedded","exported_at":{}}}"#,
        Timestamp::EPOCH.unix_micros()
    );
    let end = r#"{"kind":"end","tiers":0,"tenants":0,"buckets":0,"instances":0,"keys":0,"check_requests":0}"#;
    let cases = [
        (format!("{header}\n{end}\n"), None),
        (String::new(), Some("the export is empty".to_owned())),
        (
            format!("{end}\n"),
            Some("line 1: the first line must be the \"header\" line".into()),
        ),
        (
            header.replace(
                "\"version\":1",
                &format!("\"version\":{}", FORMAT_VERSION + 1),
            ) + "\n",
            Some(format!(
                "line 1: written in format version {} by a newer Tollgate",
                FORMAT_VERSION + 1
            )),
        ),
        (
            header.replace("tollgate-store-export", "something-else") + "\n",
            Some("line 1: not a Tollgate export".into()),
        ),
        (
            format!("{header}\n{{\"kind\":\"tier\",\"name\":\"bad name!\",\"tier\":{{}}}}\n"),
            Some("line 2:".into()),
        ),
        (
            format!("{header}\nnot json\n{end}\n"),
            Some("line 2: expected ident".into()),
        ),
        (
            format!("{header}\n{end}\n{end}\n"),
            Some("line 3: a line after the \"end\" line".into()),
        ),
        (
            format!("{header}\n"),
            Some("the export ends after line 1 without its \"end\" line".into()),
        ),
        (
            format!("{header}\n{}\n", end.replace("\"tiers\":0", "\"tiers\":1")),
            Some("line 2: the end line counts 1 tier,".into()),
        ),
        (
            format!(
                "{header}\n{}\n{end}\n",
                history_line(60, 90_000_000, 95_000_000)
            ),
            Some("line 2: the history row of bucket".into()),
        ),
        (
            format!(
                "{header}\n{}\n{end}\n",
                history_line(60, 60_000_000, 125_000_000)
            ),
            Some("line 2: the history row of bucket".into()),
        ),
        (
            format!(
                "{header}\n{0}\n{0}\n{end}\n",
                history_line(60, 60_000_000, 65_000_000)
            ),
            Some("line 3: the history row of bucket".into()),
        ),
        (
            format!(
                "{header}\n{}\n{end}\n",
                check_history_line(60, 60_000_000, "a", 2, 3)
            ),
            Some("line 2: the check history row of bucket acme/per-user at slot 60000000: refusals".into()),
        ),
        (
            format!(
                "{header}\n{}\n{end}\n",
                check_history_line(60, 61_000_000, "a", 3, 1)
            ),
            Some("line 2: the check history row of bucket acme/per-user at slot 61000000: the slot is not a multiple".into()),
        ),
        (
            format!(
                "{header}\n{0}\n{0}\n{end}\n",
                check_history_line(60, 60_000_000, "a", 3, 1)
            ),
            Some("line 3: the check history row of bucket acme/per-user, step 60 s, slot 60000000, replica \"a\" appears twice".into()),
        ),
    ];
    // Two replicas' rows of one slot.
    let two = format!(
        "{header}\n{}\n{}\n{}\n",
        check_history_line(60, 60_000_000, "a", 3, 1),
        check_history_line(60, 60_000_000, "b", 3, 1),
        end.replace(
            "\"check_requests\":0",
            "\"check_requests\":0,\"check_history_rows\":2"
        )
    );
    let image = StoreImage::read(two.as_bytes()).expect("valid");
    assert_eq!(image.check_history.len(), 2);
    assert_eq!(image.counts().check_history_rows, 2);
    for (input, expected) in cases {
        let read = StoreImage::read(input.as_bytes());
        match expected {
            None => assert_eq!(read.expect("valid").counts(), Counts::default()),
            Some(expected) => {
                let message = read.expect_err("invalid").to_string();
                assert!(
                    message.starts_with(&expected),
                    "{message:?}, expected {expected:?}"
                );
            }
        }
    }
}
