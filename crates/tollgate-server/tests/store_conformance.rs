//! Store behaviour every `Store` implementation must show, written once as
//! functions over `&dyn Store` with a clock the test moves, and run against
//! the embedded store and PostgreSQL: linking, cleanup a window at a
//! time, duplicates, deletes, many concurrent requests with duplicates
//! counted once, a tenant's buckets kept apart, listed in key order and
//! deleted together, a missing named bucket `BucketNotFound`; and tiers:
//! onboarding, a switch carrying tokens over capped, buckets created and
//! retired, an override surviving a switch until cleared, a tier's new
//! definition reaching its tenants, a tier in use kept.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Backend, Backing, ManualClock, bucket_name, tenant_id, tier_name};
use tollgate_core::key_bucket::{CheckCall, CheckError, KeyId, RequestItem};
use tollgate_core::partition::Exchange;
use tollgate_core::tenant_state::StateChange;
use tollgate_core::tier::{
    BucketDefinition, BucketKind, CloseReason, ClosedBy, DefinedBy, TenantChange, Tier, TierError,
};
use tollgate_core::{
    BucketKey, BucketName, Consumption, Limits, LimitsMask, LimitsUpdate, TenantRefused,
    TenantStateKind, Timestamp, TokenBucketRequest,
};
use tollgate_server::store::{AdminCall, BucketSettings, Store, StoreError};

/// A store on a fresh backing, its time read from `clock`.
async fn store_on(backend: Backend, clock: &ManualClock) -> (Backing, Arc<dyn Store>) {
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    (backing, store)
}

/// The request-unit bucket of tenant `id`.
fn tenant(id: &str) -> BucketKey {
    BucketKey::request_units(tenant_id(id))
}

/// Bucket `bucket` of tenant `id`.
fn bucket(id: &str, bucket: &str) -> BucketKey {
    BucketKey::new(
        tenant_id(id),
        BucketName::parse("bucket", bucket).expect("valid name"),
    )
}

fn request(instance_id: u32, seq: u64, tokens: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id,
        lease: b"lease".to_vec(),
        seq,
        requested_tokens: tokens,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::from_request_units(1.0),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

async fn configure(store: &dyn Store, id: &BucketKey, refill_rate: f64) {
    store
        .update_limits(
            id,
            &LimitsUpdate {
                available_tokens: 0.0,
                limits: Limits {
                    refill_rate,
                    burst_limit: 0.0,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: LimitsMask::ALL,
            },
        )
        .await
        .expect("configure");
}

/// Instance ids in list order, following the stored pointers, and checks
/// they are exactly the stored rows in ascending order.
async fn list_order(store: &dyn Store, id: &BucketKey) -> Vec<u32> {
    let snapshot = store.get_bucket(id).await.expect("get");
    let ids: Vec<u32> = snapshot.instances.iter().map(|i| i.instance_id).collect();
    let mut walked = Vec::new();
    let mut cur = snapshot.head.members.first_instance_id;
    while cur != 0 {
        assert!(walked.len() <= ids.len(), "cycle that misses the sentinel");
        walked.push(cur);
        cur = snapshot
            .instances
            .iter()
            .find(|i| i.instance_id == cur)
            .map_or(0, |i| i.next_instance_id);
    }
    assert_eq!(walked, ids, "pointers follow ascending ids");
    assert_eq!(snapshot.head.members.live_instances as usize, ids.len());
    let sum: f64 = snapshot.instances.iter().map(|i| i.shares).sum();
    assert!((snapshot.head.members.share_sum - sum).abs() < 1e-9);
    walked
}

async fn new_instances_are_linked_in_order(store: &dyn Store, clock: &ManualClock) {
    let t = tenant("linking");
    configure(store, &t, 10.0).await;
    for (i, id) in [20, 10, 30, 15, 25, 1].into_iter().enumerate() {
        clock.set_secs(i as f64);
        store
            .token_bucket(&t, &request(id, 1, 0.0))
            .await
            .expect("request");
        list_order(store, &t).await;
    }
    assert_eq!(list_order(store, &t).await, vec![1, 10, 15, 20, 25, 30]);
}

async fn silent_instances_are_removed_a_window_at_a_time(store: &dyn Store, clock: &ManualClock) {
    let t = tenant("cleanup");
    configure(store, &t, 100.0).await;
    clock.set_secs(0.0);
    for id in 1..=20 {
        store
            .token_bucket(&t, &request(id, 1, 0.0))
            .await
            .expect("request");
    }
    // Only instance 13 is alive a minute later; each of its requests
    // removes at most a window (8) of the silent ones behind it.
    clock.set_secs(61.0);
    let mut seq = 1;
    let mut remaining = Vec::new();
    for _ in 0..3 {
        seq += 1;
        store
            .token_bucket(&t, &request(13, seq, 0.0))
            .await
            .expect("request");
        remaining.push(list_order(store, &t).await.len());
    }
    assert_eq!(remaining, vec![12, 4, 1]);
    // The survivor now gets the whole refill rate.
    seq += 1;
    let grant = store
        .token_bucket(&t, &request(13, seq, 1e6))
        .await
        .expect("request");
    let rate = grant.granted_tokens / grant.trickle_duration.as_secs_f64();
    assert!((rate - 100.0).abs() < 1e-6, "rate {rate}");
}

async fn duplicates_and_stale_requests_change_nothing(store: &dyn Store, clock: &ManualClock) {
    let t = tenant("dups");
    configure(store, &t, 5.0).await;
    clock.set_secs(1.0);
    let first = store
        .token_bucket(&t, &request(4, 9, 100.0))
        .await
        .expect("request");
    let before = store.get_bucket(&t).await.expect("get");
    clock.set_secs(2.0);
    let again = store
        .token_bucket(&t, &request(4, 9, 100.0))
        .await
        .expect("duplicate");
    assert_eq!(again, first);
    let stale = store.token_bucket(&t, &request(4, 8, 100.0)).await;
    assert!(matches!(stale, Err(StoreError::Rejected(_))), "{stale:?}");
    let after = store.get_bucket(&t).await.expect("get");
    assert_eq!(after.head, before.head);
    assert_eq!(after.instances, before.instances);
}

/// Grants computed from fractions of the refill rate are floats with every
/// digit in use; the stored copy a duplicate gets back must not lose any.
async fn duplicates_get_the_first_grant_bit_for_bit(store: &dyn Store, clock: &ManualClock) {
    let t = tenant("fractions");
    configure(store, &t, 10.0).await;
    clock.set_secs(1.0);
    let mut firsts = Vec::new();
    for id in 1..=7 {
        clock.set_secs(1.0 + f64::from(id) / 7.0);
        let request = request(id, 1, 1000.0 / f64::from(id));
        let first = store.token_bucket(&t, &request).await.expect("request");
        firsts.push((request, first));
    }
    clock.set_secs(3.0);
    for (request, first) in firsts {
        let again = store.token_bucket(&t, &request).await.expect("duplicate");
        assert_eq!(
            again, first,
            "instance {}: the duplicate's grant differs",
            request.instance_id
        );
    }
}

async fn deleting_a_tenant_removes_its_instances(store: &dyn Store, clock: &ManualClock) {
    let t = tenant("short-lived");
    let other = tenant("short-lived-neighbour");
    configure(store, &t, 5.0).await;
    configure(store, &other, 5.0).await;
    clock.set_secs(3.0);
    for id in 1..=3 {
        store
            .token_bucket(&t, &request(id, 1, 0.0))
            .await
            .expect("request");
        store
            .token_bucket(&other, &request(id, 1, 0.0))
            .await
            .expect("request");
    }
    let deleted = store.delete_tenant(&t.tenant).await.expect("delete");
    assert_eq!(deleted.len(), 1);
    let deleted = &deleted[0];
    assert_eq!(deleted.key, t);
    assert_eq!(
        deleted.head.state.limits.refill_rate, 5.0,
        "the answer is the deleted tenant"
    );
    assert_eq!(deleted.head.members.live_instances, 3);
    assert!(deleted.instances.is_empty());
    assert!(matches!(
        store.get_bucket(&t).await,
        Err(StoreError::TenantNotFound(_))
    ));
    assert!(matches!(
        store.delete_tenant(&t.tenant).await,
        Err(StoreError::TenantRefused(TenantRefused::Deleted { .. }))
    ));
    assert_eq!(
        list_order(store, &other).await,
        vec![1, 2, 3],
        "the neighbour is untouched"
    );
}

/// Many requests at once (a PostgreSQL store batches them into shared
/// transactions): pods joining, pods returning after a silence that gets
/// others removed, and every request sent twice. Each is counted once and
/// the list stays whole.
async fn concurrent_requests_are_each_counted_once(store: &dyn Store, clock: &ManualClock) {
    let t = tenant("crowd");
    let other = tenant("crowd-neighbour");
    configure(store, &t, 1000.0).await;
    configure(store, &other, 1000.0).await;
    clock.set_secs(0.0);
    for id in (2..=40).step_by(2) {
        store
            .token_bucket(&t, &request(id, 1, 10.0))
            .await
            .expect("request");
    }
    // A minute later the old pods are silent; new odd ones join while a
    // few old ones come back, all at once, each request sent twice.
    clock.set_secs(61.0);
    let mut sent = Vec::new();
    for id in (1..=39).step_by(2).chain([4, 18, 30]) {
        let seq = if id % 2 == 0 { 2 } else { 1 };
        for tenant_id in [&t, &other] {
            let mut r = request(id, seq, 10.0);
            r.consumption = Consumption::from_request_units(f64::from(id));
            sent.push((tenant_id, r.clone()));
            sent.push((tenant_id, r));
        }
    }
    let answers = futures_util::future::join_all(
        sent.iter()
            .map(|(tenant_id, r)| store.token_bucket(tenant_id, r)),
    )
    .await;
    for pair in answers.chunks(2) {
        let first = pair[0].as_ref().expect("request");
        let again = pair[1].as_ref().expect("duplicate");
        assert_eq!(first, again, "a duplicate gets the first answer");
    }
    let reported = |filter: &BucketKey| -> f64 {
        sent.iter()
            .step_by(2)
            .filter(|(tenant_id, _)| *tenant_id == filter)
            .map(|(_, r)| r.consumption.request_units())
            .sum()
    };
    for tenant_id in [&t, &other] {
        let ids = list_order(store, tenant_id).await;
        for id in (1..=39).step_by(2).chain([4, 18, 30]) {
            assert!(
                ids.contains(&id),
                "{tenant_id}: live instance {id} is listed"
            );
        }
        let head = store.get_bucket(tenant_id).await.expect("get").head;
        let expected = reported(tenant_id) + if *tenant_id == t { 20.0 } else { 0.0 };
        assert_eq!(
            head.totals.consumption.request_units(),
            expected,
            "{tenant_id}"
        );
    }
}

/// A tenant's buckets are independent: exhausting one action's bucket
/// leaves the other's untouched, pods and totals are per bucket, and a
/// bucket nobody created is not found (only the request-unit bucket is
/// created by default).
async fn buckets_of_a_tenant_are_isolated(store: &dyn Store, clock: &ManualClock) {
    clock.set_secs(0.0);
    let (mail, ai) = (
        bucket("t1234", "schedule-email"),
        bucket("t1234", "invoke-doc-summary-ai"),
    );
    for (key, burst) in [(&mail, 100.0), (&ai, 20.0)] {
        store
            .update_limits(
                key,
                &LimitsUpdate {
                    available_tokens: burst,
                    limits: Limits {
                        refill_rate: 1.0,
                        burst_limit: burst,
                    },
                    as_of: None,
                    as_of_consumed_tokens: 0.0,
                    mask: LimitsMask::ALL,
                },
            )
            .await
            .expect("create bucket");
    }
    let grant = store
        .token_bucket(&mail, &request(1, 1, 100.0))
        .await
        .expect("request");
    assert_eq!(grant.granted_tokens, 100.0);
    assert!(grant.trickle_duration.is_zero());
    let grant = store
        .token_bucket(&ai, &request(1, 1, 20.0))
        .await
        .expect("request");
    assert_eq!(grant.granted_tokens, 20.0, "the other bucket is untouched");
    assert!(grant.trickle_duration.is_zero());
    let mail_after = store.get_bucket(&mail).await.expect("get");
    let ai_after = store.get_bucket(&ai).await.expect("get");
    assert_eq!(mail_after.current_tokens(), 0.0);
    assert_eq!(ai_after.current_tokens(), 0.0);
    assert_eq!(mail_after.head.totals.consumption.request_units(), 1.0);
    assert_eq!(mail_after.instances.len(), 1);
    assert_eq!(ai_after.instances.len(), 1);

    let missing = bucket("t1234", "no-such-action");
    let refused = store.token_bucket(&missing, &request(1, 1, 1.0)).await;
    assert!(
        matches!(&refused, Err(StoreError::BucketNotFound(k)) if *k == missing),
        "{refused:?}"
    );
    assert!(matches!(
        store.get_bucket(&missing).await,
        Err(StoreError::BucketNotFound(_))
    ));
    // The request-unit bucket of the same tenant is created by default.
    let ru = tenant("t1234");
    store
        .token_bucket(&ru, &request(1, 1, 1.0))
        .await
        .expect("default bucket");
    let all = store.get_tenant(&ru.tenant).await.expect("tenant");
    let mut keys: Vec<_> = all.iter().map(|b| b.key.clone()).collect();
    keys.sort();
    let mut expected = vec![ru.clone(), mail.clone(), ai.clone()];
    expected.sort();
    assert_eq!(keys, expected);

    // Listing pages through every bucket, in key order, once.
    let mut listed = Vec::new();
    let mut after: Option<BucketKey> = None;
    loop {
        let page = store.list_buckets(after.as_ref(), 2).await.expect("list");
        if page.is_empty() {
            break;
        }
        after = page.last().map(|b| b.key.clone());
        listed.extend(page.into_iter().map(|b| b.key));
    }
    let mut sorted = listed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(sorted.len(), 3, "{listed:?}");

    // Deleting the tenant deletes all its buckets.
    let deleted = store.delete_tenant(&ru.tenant).await.expect("delete");
    assert_eq!(deleted.len(), 3);
    for key in [&ru, &mail, &ai] {
        assert!(store.get_bucket(key).await.is_err(), "{key} is gone");
    }
}

fn definition(refill_rate: f64, burst_limit: f64) -> BucketDefinition {
    support::definition(refill_rate, burst_limit, BucketKind::Shared)
}

fn tier(buckets: &[(&str, f64, f64)]) -> Tier {
    Tier::from_definitions(
        "tier.buckets",
        buckets.iter().map(|(n, r, b)| (*n, definition(*r, *b))),
        Timestamp::EPOCH,
    )
    .expect("valid tier")
}

/// Onboarding provisions every bucket of a tier in one go; a switch
/// carries tokens over (capped at the new burst), creates the buckets the
/// new tier adds and retires those it drops; an override survives
/// switches until cleared; a new definition of a tier reaches its tenants;
/// a tier in use cannot be deleted.
async fn tiers_onboard_switch_and_override(store: &dyn Store, clock: &ManualClock) {
    clock.set_secs(0.0);
    let (pro, free) = (tier_name("pro"), tier_name("free"));
    let put = store
        .put_tier(
            &pro,
            &tier(&[
                ("schedule-email", 10.0, 100.0),
                ("invoke-doc-summary-ai", 1.0, 20.0),
            ]),
        )
        .await
        .expect("put pro");
    assert!(put.created);
    store
        .put_tier(&free, &tier(&[("schedule-email", 1.0, 10.0)]))
        .await
        .expect("put free");
    let t = tenant_id("t1234");
    let missing = store
        .change_tenant(
            &t,
            &TenantChange::Create {
                tier: tier_name("gold"),
            },
        )
        .await;
    assert!(
        matches!(missing, Err(StoreError::Tier(TierError::TierNotFound(_)))),
        "{missing:?}"
    );
    assert!(store.describe_tenant(&t).await.is_err(), "nothing created");

    let onboarded = store
        .change_tenant(&t, &TenantChange::Create { tier: pro.clone() })
        .await
        .expect("onboard");
    let names: Vec<_> = onboarded.created.iter().map(BucketName::as_str).collect();
    assert_eq!(names, ["invoke-doc-summary-ai", "schedule-email"]);
    let email = bucket("t1234", "schedule-email");
    assert_eq!(
        store
            .get_bucket(&email)
            .await
            .expect("email")
            .current_tokens(),
        100.0
    );
    let again = store
        .change_tenant(&t, &TenantChange::Create { tier: pro.clone() })
        .await;
    assert!(matches!(
        again,
        Err(StoreError::Tier(TierError::TenantExists(_)))
    ));

    // A bulk send takes 60 of the 100 tokens; the AI bucket is untouched.
    let grant = store
        .token_bucket(&email, &request(1, 1, 60.0))
        .await
        .expect("bulk send");
    assert_eq!(grant.granted_tokens, 60.0);
    // An override doubles the AI bucket; it survives the switch to free.
    let ai = bucket("t1234", "invoke-doc-summary-ai");
    store
        .change_tenant(
            &t,
            &TenantChange::SetOverride {
                bucket: ai.bucket.clone(),
                definition: definition(2.0, 40.0),
            },
        )
        .await
        .expect("override");
    clock.set_secs(1.0);
    let switched = store
        .change_tenant(&t, &TenantChange::SetTier { tier: free.clone() })
        .await
        .expect("switch");
    assert_eq!(switched.changed, vec![email.bucket.clone()]);
    assert!(
        switched.retired.is_empty(),
        "the override keeps the AI bucket"
    );
    // The records of several tenants in one read: an unknown one left out.
    let records = store
        .tenant_records(&[t.clone(), tenant_id("nobody")])
        .await
        .expect("records");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records.get(&t).and_then(|r| r.tier.as_ref()), Some(&free));
    let after = store.get_bucket(&email).await.expect("email");
    assert_eq!(after.head.state.limits.refill_rate, 1.0);
    assert_eq!(
        after.current_tokens(),
        10.0,
        "40 left, capped at the new burst of 10"
    );
    assert_eq!(after.instances.len(), 1, "the bucket's pods stay");
    let ai_after = store.get_bucket(&ai).await.expect("ai");
    assert_eq!(ai_after.head.state.limits.burst_limit, 40.0);

    // Clearing the override retires the bucket free does not have.
    let cleared = store
        .change_tenant(
            &t,
            &TenantChange::ClearOverride {
                bucket: ai.bucket.clone(),
            },
        )
        .await
        .expect("clear");
    assert_eq!(cleared.retired.len(), 1);
    assert!(matches!(
        store.get_bucket(&ai).await,
        Err(StoreError::BucketNotFound(_))
    ));
    let view = store.describe_tenant(&t).await.expect("describe");
    assert_eq!(
        view.record.as_ref().and_then(|r| r.tier.clone()),
        Some(free.clone())
    );
    assert_eq!(view.buckets.len(), 1);

    // A new definition of free reaches the tenant.
    clock.set_secs(2.0);
    let put = store
        .put_tier(
            &free,
            &tier(&[("schedule-email", 3.0, 30.0), ("export", 1.0, 5.0)]),
        )
        .await
        .expect("redefine free");
    assert!(!put.created);
    assert_eq!(put.tenants.len(), 1);
    assert_eq!(
        store
            .get_bucket(&email)
            .await
            .expect("email")
            .head
            .state
            .limits
            .refill_rate,
        3.0
    );
    assert_eq!(
        store
            .get_bucket(&bucket("t1234", "export"))
            .await
            .expect("export")
            .current_tokens(),
        5.0
    );

    // A tier in use cannot go; an unused one can.
    let refused = store.delete_tier(&free).await;
    assert!(
        matches!(
            &refused,
            Err(StoreError::Tier(TierError::TierInUse { count: 1, .. }))
        ),
        "{refused:?}"
    );
    store.get_tier(&free).await.expect("still there");
    store.delete_tier(&pro).await.expect("unused tier");
    let tiers: Vec<_> = store
        .list_tiers()
        .await
        .expect("list")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(tiers, vec![free.clone()]);
    // Deleting the tenant deletes its record too: the tier is free to go.
    store.delete_tenant(&t).await.expect("delete tenant");
    assert!(store.describe_tenant(&t).await.is_err());
    store.delete_tier(&free).await.expect("no longer in use");
}

/// A call from `actor`, kept or (with `dry_run`) rolled back.
fn call(actor: &str, dry_run: bool) -> AdminCall {
    AdminCall {
        by: ClosedBy {
            actor: Some(actor.to_owned()),
            operator: None,
            peer: Some("127.0.0.1:4000".to_owned()),
        },
        dry_run,
    }
}

/// Every bucket retired (a tier redefined, a tier change, an override
/// cleared) or deleted with its tenant leaves a closed record with its
/// last limits and exact totals, who closed it, when and why; a bucket
/// closed twice has two; they outlive the tenant and its re-creation; and
/// a dry run answers the same closings while changing nothing.
async fn closed_buckets_outlive_their_buckets(store: &dyn Store, clock: &ManualClock) {
    clock.set_secs(0.0);
    let (pro, free) = (tier_name("pro"), tier_name("free"));
    let pro_tier = tier(&[("schedule-email", 10.0, 100.0), ("export", 1.0, 20.0)]);
    store.put_tier(&pro, &pro_tier).await.expect("put pro");
    store
        .put_tier(&free, &tier(&[("schedule-email", 1.0, 10.0)]))
        .await
        .expect("put free");
    let t = tenant_id("acme");
    store
        .change_tenant(&t, &TenantChange::Create { tier: pro.clone() })
        .await
        .expect("onboard");
    let (email, export) = (bucket("acme", "schedule-email"), bucket("acme", "export"));
    for (key, seq, tokens) in [(&email, 1, 7.0), (&export, 1, 3.0), (&export, 2, 4.0)] {
        store
            .token_bucket(key, &request(1, seq, tokens))
            .await
            .expect("grant");
    }
    let export_before = store.get_bucket(&export).await.expect("export").head;
    assert_eq!(
        export_before.totals.consumption.request_unit_micros,
        2_000_000
    );

    // A redefinition of pro without `export`, dry run: answered, not kept.
    clock.set_secs(5.0);
    let typo = tier(&[("schedule-email", 10.0, 100.0), ("exprot", 1.0, 20.0)]);
    let dry = store
        .put_tier_by(&pro, &typo, &call("alice", true))
        .await
        .expect("dry run");
    assert_eq!(dry.tenants.len(), 1);
    let would = &dry.tenants[0].closed;
    assert_eq!(would.len(), 1);
    assert_eq!(would[0].bucket, export.bucket);
    assert_eq!(would[0].totals, export_before.totals);
    assert_eq!(store.get_tier(&pro).await.expect("pro"), {
        let mut kept = pro_tier.clone();
        kept.created_at = Timestamp::EPOCH;
        kept.updated_at = Timestamp::EPOCH;
        kept
    });
    assert_eq!(
        store.get_bucket(&export).await.expect("still there").head,
        export_before
    );
    assert!(store.get_bucket(&bucket("acme", "exprot")).await.is_err());
    assert!(
        store
            .list_closed(&t, 0, 100)
            .await
            .expect("list")
            .is_empty()
    );

    // Kept: the record holds the bucket as it was, who, when and why.
    store
        .put_tier_by(&pro, &typo, &call("alice", false))
        .await
        .expect("redefine");
    let closed = store.list_closed(&t, 0, 100).await.expect("list");
    assert_eq!(closed.len(), 1);
    let first = &closed[0].closed;
    assert_eq!(
        (&first.tenant, &first.bucket, first.reason),
        (&t, &export.bucket, CloseReason::TierRedefined)
    );
    assert_eq!(first.closed_at, Timestamp::from_secs_f64(5.0));
    assert_eq!(first.closed_by, call("alice", false).by);
    assert_eq!(first.limits, export_before.state.limits);
    assert_eq!(first.totals, export_before.totals);
    assert_eq!(first.created_at, export_before.state.created_at);

    // `export` again by an override, used, then cleared: a second record.
    clock.set_secs(6.0);
    store
        .change_tenant(
            &t,
            &TenantChange::SetOverride {
                bucket: export.bucket.clone(),
                definition: definition(2.0, 40.0),
            },
        )
        .await
        .expect("override");
    store
        .token_bucket(&export, &request(2, 1, 5.0))
        .await
        .expect("grant");
    let dry = store
        .change_tenant_by(
            &t,
            &TenantChange::ClearOverride {
                bucket: export.bucket.clone(),
            },
            &call("bob", true),
        )
        .await
        .expect("dry clear");
    assert_eq!(dry.closed.len(), 1);
    assert_eq!(store.list_closed(&t, 0, 100).await.expect("list").len(), 1);
    clock.set_secs(7.0);
    let cleared = store
        .change_tenant_by(
            &t,
            &TenantChange::ClearOverride {
                bucket: export.bucket.clone(),
            },
            &call("bob", false),
        )
        .await
        .expect("clear");
    assert_eq!(cleared.closed.len(), 1);
    assert_eq!(cleared.closed[0].reason, CloseReason::OverrideCleared);
    assert_eq!(
        cleared.closed[0].totals.consumption.request_unit_micros, 1_000_000,
        "a new bucket's totals, not the first one's"
    );

    // A tier change retires `exprot`; deleting the tenant closes the rest.
    clock.set_secs(8.0);
    let switched = store
        .change_tenant(&t, &TenantChange::SetTier { tier: free.clone() })
        .await
        .expect("switch");
    assert_eq!(switched.closed.len(), 1);
    assert_eq!(switched.closed[0].reason, CloseReason::TierChange);
    let email_before = store.get_bucket(&email).await.expect("email").head;
    let dry = store
        .delete_tenant_by(&t, &call("carol", true))
        .await
        .expect("dry delete");
    assert_eq!(dry.closed.len(), 1);
    store.get_bucket(&email).await.expect("not deleted");
    clock.set_secs(9.0);
    let deleted = store
        .delete_tenant_by(&t, &call("carol", false))
        .await
        .expect("delete");
    assert_eq!(deleted.closed.len(), 1);
    let last = &deleted.closed[0];
    assert_eq!(last.reason, CloseReason::TenantDeleted);
    assert_eq!(last.totals, email_before.totals);
    assert_eq!(last.closed_at, Timestamp::from_secs_f64(9.0));

    // They outlive the tenant and its re-creation, in close order, paged.
    store
        .change_tenant(&t, &TenantChange::Create { tier: free.clone() })
        .await
        .expect("re-create");
    let all = store.list_closed(&t, 0, 100).await.expect("list");
    let seen: Vec<_> = all
        .iter()
        .map(|c| (c.closed.bucket.as_str(), c.closed.reason))
        .collect();
    assert_eq!(
        seen,
        [
            ("export", CloseReason::TierRedefined),
            ("export", CloseReason::OverrideCleared),
            ("exprot", CloseReason::TierChange),
            ("schedule-email", CloseReason::TenantDeleted),
        ]
    );
    let page = store.list_closed(&t, all[1].seq, 1).await.expect("page");
    assert_eq!(page, vec![all[2].clone()]);
    assert!(
        store
            .list_closed(&tenant_id("other"), 0, 100)
            .await
            .expect("other")
            .is_empty()
    );
}

fn check_item(tenant: &str, bucket: &str, key: &str, tokens: f64) -> RequestItem {
    RequestItem {
        key: KeyId::new(tenant_id(tenant), support::bucket_name(bucket), key),
        tokens,
        request_id: None,
    }
}

/// Takes `tokens` from one key; it must be allowed.
async fn take(store: &dyn Store, tenant: &str, bucket: &str, key: &str, tokens: f64) {
    let call = CheckCall::new(vec![check_item(tenant, bucket, key, tokens)]).expect("call");
    let answer = store.check(&call).await.expect("check");
    assert!(answer.allowed, "{tenant}/{bucket}/{key} takes {tokens}");
}

/// Per-key buckets are listed from the tenants' definitions (an override
/// winning over the tier, shared buckets left out) in tenant and bucket
/// order, a page at a time, each with its keys below their burst counted
/// and the busiest of them: furthest from full first (a key that never
/// refills first of all), then by key.
async fn per_key_buckets_are_listed_with_their_stored_keys(store: &dyn Store, clock: &ManualClock) {
    clock.set_secs(0.0);
    let per_key = |r, b| support::definition(r, b, BucketKind::PerKey);
    let api = Tier::from_definitions(
        "tier.buckets",
        [
            ("per-user", per_key(1.0, 10.0)),
            ("per-ip", per_key(0.0, 5.0)),
            ("email", definition(1.0, 10.0)),
        ],
        Timestamp::EPOCH,
    )
    .expect("tier");
    store
        .put_tier(&tier_name("api"), &api)
        .await
        .expect("put api");
    store
        .put_tier(&tier_name("plain"), &tier(&[("email", 1.0, 10.0)]))
        .await
        .expect("put plain");
    for (t, on) in [("acme", "api"), ("beta", "api"), ("zeta", "plain")] {
        store
            .change_tenant(
                &tenant_id(t),
                &TenantChange::Create {
                    tier: tier_name(on),
                },
            )
            .await
            .expect("onboard");
    }
    store
        .change_tenant(
            &tenant_id("beta"),
            &TenantChange::SetOverride {
                bucket: support::bucket_name("per-user"),
                definition: per_key(2.0, 20.0),
            },
        )
        .await
        .expect("override");
    configure(store, &tenant("gamma"), 5.0).await;

    // At 0 s: u1 and u0 left with 2 (full at 8 s), u2 with 7 (at 3 s);
    // at 1 s: u3 with 1 (full at 10 s). The address never refills.
    take(store, "acme", "per-user", "u1", 8.0).await;
    take(store, "acme", "per-user", "u0", 8.0).await;
    take(store, "acme", "per-user", "u2", 3.0).await;
    take(store, "acme", "per-ip", "203.0.113.7", 1.0).await;
    clock.set_secs(1.0);
    take(store, "acme", "per-user", "u3", 9.0).await;
    take(store, "beta", "per-user", "b1", 1.0).await;

    let all = store
        .list_key_buckets(None, None, 100, 3)
        .await
        .expect("list");
    let keys: Vec<String> = all.iter().map(|b| b.key.to_string()).collect();
    assert_eq!(
        keys,
        [
            "acme/per-ip",
            "acme/per-user",
            "beta/per-ip",
            "beta/per-user"
        ]
    );
    let acme_users = &all[1];
    assert_eq!(acme_users.keys_stored, 4);
    assert_eq!(acme_users.defined_by, DefinedBy::Tier);
    assert_eq!(acme_users.definition, per_key(1.0, 10.0));
    let busiest: Vec<&str> = acme_users.busiest.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(busiest, ["u3", "u0", "u1"]);
    assert_eq!(acme_users.busiest[0].1.state.tokens, 1.0);
    assert_eq!(acme_users.read_at, Timestamp::from_secs_f64(1.0));
    assert_eq!(all[0].keys_stored, 1);
    assert_eq!(all[0].busiest[0].0, "203.0.113.7");
    assert_eq!(all[0].busiest[0].1.full_at, None);
    assert_eq!((all[2].keys_stored, all[2].busiest.len()), (0, 0));
    assert_eq!(all[3].defined_by, DefinedBy::Override);
    assert_eq!(all[3].definition, per_key(2.0, 20.0));
    assert_eq!(all[3].keys_stored, 1);

    // A page at a time, after the last key listed.
    let page = store
        .list_key_buckets(None, Some(&bucket("acme", "per-user")), 1, 3)
        .await
        .expect("page");
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].key, bucket("beta", "per-ip"));
    // One tenant's; none for a tenant without per-key buckets or unknown.
    let beta = store
        .list_key_buckets(Some(&tenant_id("beta")), None, 100, 0)
        .await
        .expect("beta");
    assert_eq!(beta.len(), 2);
    assert!(beta.iter().all(|b| b.busiest.is_empty()), "none asked for");
    assert_eq!(beta[1].keys_stored, 1, "counted all the same");
    for t in ["zeta", "gamma", "nobody"] {
        let none = store
            .list_key_buckets(Some(&tenant_id(t)), None, 100, 3)
            .await
            .expect("none");
        assert!(none.is_empty(), "{t}: {none:?}");
    }
}

/// A tier with a shared bucket `mail` and a per-key bucket `per-user`.
fn tier_with_keys() -> Tier {
    let mut tier = tier(&[("mail", 10.0, 100.0)]);
    tier.buckets.insert(
        bucket_name("per-user"),
        support::definition(1.0, 5.0, BucketKind::PerKey),
    );
    tier
}

fn check_call(tenant: &str, key: &str) -> CheckCall {
    CheckCall::new(vec![RequestItem {
        key: KeyId::new(tenant_id(tenant), bucket_name("per-user"), key),
        tokens: 1.0,
        request_id: None,
    }])
    .expect("a valid call")
}

fn exchange() -> Exchange {
    Exchange {
        pod: 1,
        partitions: Vec::new(),
        period: Duration::from_secs(10),
        known_version: 0,
    }
}

/// Every pod-facing operation on `tenant` (its request-unit bucket, its
/// `mail` bucket, a per-key check, a partition exchange) is refused as
/// `kind`, naming `since`.
async fn every_pod_call_refused(
    store: &dyn Store,
    tenant: &str,
    kind: TenantStateKind,
    since: Timestamp,
) {
    let refused_as = |e: &TenantRefused| match (e, kind) {
        (TenantRefused::Deleted { since: s, .. }, TenantStateKind::Deleted)
        | (TenantRefused::Suspended { since: s, .. }, TenantStateKind::Suspended) => *s == since,
        _ => false,
    };
    for key in [self::tenant(tenant), bucket(tenant, "mail")] {
        match store.token_bucket(&key, &request(1, 100, 5.0)).await {
            Err(StoreError::TenantRefused(e)) if refused_as(&e) => {}
            other => panic!("{key}: expected a refusal as {kind:?}, got {other:?}"),
        }
    }
    match store.check(&check_call(tenant, "alice")).await {
        Err(StoreError::Check(CheckError::TenantRefused(e))) if refused_as(&e) => {}
        other => panic!("check: expected a refusal as {kind:?}, got {other:?}"),
    }
    match store.partition_load(&tenant_id(tenant), &exchange()).await {
        Err(StoreError::TenantRefused(e)) if refused_as(&e) => {}
        other => panic!("partition load: expected a refusal as {kind:?}, got {other:?}"),
    }
}

async fn a_deleted_tenant_is_refused_until_an_operator_creates_it_again(
    store: &dyn Store,
    clock: &ManualClock,
) {
    let pro = tier_name("pro");
    store.put_tier(&pro, &tier_with_keys()).await.expect("tier");
    let create = TenantChange::Create { tier: pro.clone() };
    let t = tenant_id("t");
    store.change_tenant(&t, &create).await.expect("create");
    let ru = tenant("t");
    store
        .token_bucket(&ru, &request(1, 1, 5.0))
        .await
        .expect("served on the defaults before the delete");
    clock.set_secs(10.0);
    store
        .delete_tenant_by(&t, &call("alice", false))
        .await
        .expect("delete");
    let deleted_at = clock.now();
    clock.set_secs(20.0);

    every_pod_call_refused(store, "t", TenantStateKind::Deleted, deleted_at).await;
    assert!(
        store
            .list_buckets(None, 100)
            .await
            .expect("list")
            .is_empty(),
        "no bucket was created again"
    );
    assert!(matches!(
        store.get_bucket(&ru).await,
        Err(StoreError::TenantNotFound(_))
    ));
    let states = store
        .tenant_states(std::slice::from_ref(&t))
        .await
        .expect("states");
    let tombstone = &states[&t];
    assert_eq!(tombstone.kind, TenantStateKind::Deleted);
    assert_eq!(tombstone.since, deleted_at);
    assert_eq!(tombstone.actor, "alice at 127.0.0.1:4000");
    for change in [
        StateChange::Suspend {
            actor: "bob".into(),
            reason: String::new(),
        },
        StateChange::Resume,
    ] {
        assert!(
            matches!(
                store.change_tenant_state(&t, &change).await,
                Err(StoreError::TenantRefused(TenantRefused::Deleted { .. }))
            ),
            "{change:?} of a deleted tenant"
        );
    }

    // Created again: the tombstone goes in the same transaction.
    let outcome = store
        .change_tenant(&t, &create)
        .await
        .expect("create again");
    assert_eq!(outcome.revived.as_ref(), Some(tombstone));
    assert!(
        store
            .tenant_states(std::slice::from_ref(&t))
            .await
            .expect("states")
            .is_empty()
    );
    store
        .token_bucket(&bucket("t", "mail"), &request(1, 1, 5.0))
        .await
        .expect("served again");
    store
        .check(&check_call("t", "alice"))
        .await
        .expect("checked again");

    // Setting a bucket's limits creates a deleted tenant again too.
    let u = tenant("u");
    configure(store, &u, 5.0).await;
    store
        .delete_tenant_by(&u.tenant, &call("bob", false))
        .await
        .expect("delete");
    assert!(matches!(
        store.token_bucket(&u, &request(1, 1, 1.0)).await,
        Err(StoreError::TenantRefused(TenantRefused::Deleted { .. }))
    ));
    let change = store
        .update_limits(
            &u,
            &LimitsUpdate {
                available_tokens: 10.0,
                limits: Limits {
                    refill_rate: 1.0,
                    burst_limit: 10.0,
                },
                as_of: None,
                as_of_consumed_tokens: 0.0,
                mask: LimitsMask::ALL,
            },
        )
        .await
        .expect("set limits");
    assert_eq!(
        change.revived.map(|s| s.actor).as_deref(),
        Some("bob at 127.0.0.1:4000")
    );
    store
        .token_bucket(&u, &request(1, 1, 1.0))
        .await
        .expect("served again");
}

async fn a_suspended_tenant_keeps_everything_and_is_refused_until_resumed(
    store: &dyn Store,
    clock: &ManualClock,
) {
    let pro = tier_name("pro");
    store.put_tier(&pro, &tier_with_keys()).await.expect("tier");
    let t = tenant_id("t");
    store
        .change_tenant(&t, &TenantChange::Create { tier: pro.clone() })
        .await
        .expect("create");
    let mail = bucket("t", "mail");
    for id in 1..=2 {
        store
            .token_bucket(&mail, &request(id, 1, 5.0))
            .await
            .expect("served");
    }
    store
        .check(&check_call("t", "alice"))
        .await
        .expect("checked");
    clock.set_secs(5.0);
    let before = store.get_tenant(&t).await.expect("read");
    let keys_before = store.key_counts().await.expect("keys");

    let suspend = StateChange::Suspend {
        actor: "alice at 10.0.0.7:51234".into(),
        reason: "unpaid invoice".into(),
    };
    let edit = store
        .change_tenant_state(&t, &suspend)
        .await
        .expect("suspend");
    assert!(edit.changed);
    let state = edit.state.expect("suspended");
    assert_eq!(
        (state.kind, state.since, state.reason.as_str()),
        (TenantStateKind::Suspended, clock.now(), "unpaid invoice")
    );
    every_pod_call_refused(store, "t", TenantStateKind::Suspended, clock.now()).await;
    assert_eq!(
        store.get_tenant(&t).await.expect("read"),
        before,
        "limits, buckets, pods' rows and totals untouched"
    );
    assert_eq!(store.key_counts().await.expect("keys"), keys_before);
    assert_eq!(
        store
            .tenant_states(std::slice::from_ref(&t))
            .await
            .expect("states")[&t],
        state
    );

    // Idempotent: the first time and reason stay.
    clock.set_secs(6.0);
    let again = store
        .change_tenant_state(
            &t,
            &StateChange::Suspend {
                actor: "bob".into(),
                reason: "another".into(),
            },
        )
        .await
        .expect("suspend again");
    assert!(!again.changed);
    assert_eq!(again.state.as_ref(), Some(&state));
    // An operator's change keeps the suspension.
    store
        .change_tenant(&t, &TenantChange::SetTier { tier: pro.clone() })
        .await
        .expect("set tier");
    assert_eq!(
        store
            .tenant_states(std::slice::from_ref(&t))
            .await
            .expect("states")[&t],
        state
    );

    let resumed = store
        .change_tenant_state(&t, &StateChange::Resume)
        .await
        .expect("resume");
    assert!(resumed.changed);
    assert_eq!(resumed.state, None);
    store
        .token_bucket(&mail, &request(1, 2, 5.0))
        .await
        .expect("served at once");
    store
        .check(&check_call("t", "alice"))
        .await
        .expect("checked");
    store
        .partition_load(&t, &exchange())
        .await
        .expect("exchanged");
    let again = store
        .change_tenant_state(&t, &StateChange::Resume)
        .await
        .expect("resume again");
    assert!(!again.changed);

    let nobody = tenant_id("nobody");
    for change in [suspend, StateChange::Resume] {
        assert!(
            matches!(
                store.change_tenant_state(&nobody, &change).await,
                Err(StoreError::TenantNotFound(_))
            ),
            "{change:?} of an unknown tenant"
        );
    }
    assert!(
        store
            .tenant_states(&[nobody])
            .await
            .expect("states")
            .is_empty()
    );
}

/// Runs `test` on a fresh store of `backend` and closes it.
async fn with_store<F>(backend: Backend, test: F)
where
    F: AsyncFnOnce(&dyn Store, &ManualClock),
{
    let clock = ManualClock::default();
    let (_backing, store) = store_on(backend, &clock).await;
    test(store.as_ref(), &clock).await;
    store.close().await.expect("close");
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn embedded_store() {
                    with_store(Backend::Embedded, super::$name).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres_store() {
                    with_store(Backend::Postgres, super::$name).await;
                }
            }
        )*
    };
}

conformance!(
    new_instances_are_linked_in_order,
    silent_instances_are_removed_a_window_at_a_time,
    duplicates_and_stale_requests_change_nothing,
    duplicates_get_the_first_grant_bit_for_bit,
    deleting_a_tenant_removes_its_instances,
    concurrent_requests_are_each_counted_once,
    buckets_of_a_tenant_are_isolated,
    tiers_onboard_switch_and_override,
    closed_buckets_outlive_their_buckets,
    per_key_buckets_are_listed_with_their_stored_keys,
    a_deleted_tenant_is_refused_until_an_operator_creates_it_again,
    a_suspended_tenant_keeps_everything_and_is_refused_until_resumed,
);
