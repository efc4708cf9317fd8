//! The transaction script without a database: planning, the unconfigured
//! rule, deferral and write-back, and the property that a request on its
//! window's rows does exactly what it does on all rows.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::consumption::Consumption;
use crate::validate::{BucketName, TenantId};

fn key(tenant: &str, bucket: &str) -> BucketKey {
    BucketKey::new(
        TenantId::parse("tenant_id", tenant).expect("tenant id"),
        BucketName::parse("bucket", bucket).expect("bucket name"),
    )
}

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn req(instance_id: InstanceId, seq: u64, requested_tokens: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id,
        lease: vec![1],
        seq,
        requested_tokens,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::default(),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

fn limits(refill_rate: f64, burst_limit: f64) -> Limits {
    Limits {
        refill_rate,
        burst_limit,
    }
}

/// A store that keeps every row in memory, driven through [`Batch`] the
/// way the real stores drive it.
#[derive(Default)]
struct MemoryStore {
    heads: BTreeMap<BucketKey, BucketRow>,
    states: BTreeMap<TenantId, TenantState>,
    instances: BTreeMap<BucketKey, BTreeMap<InstanceId, InstanceState>>,
    nodes: BTreeMap<TenantId, Node>,
    config: GlobalBucketConfig,
}

impl MemoryStore {
    fn run(
        &mut self,
        requests: &[(BucketKey, TokenBucketRequest)],
        now: Timestamp,
        unconfigured: &UnconfiguredTenants,
    ) -> (Vec<Answer>, u64) {
        let (answers, removed, _) = self.run_with_draws(requests, &[], now, unconfigured);
        (answers, removed)
    }

    /// As `run`, also making the due draws of `owed` (as a store does
    /// for draws other transactions left); also returns the draws the
    /// batch found due that another transaction could make.
    fn run_with_draws(
        &mut self,
        requests: &[(BucketKey, TokenBucketRequest)],
        owed: &[BucketKey],
        now: Timestamp,
        unconfigured: &UnconfiguredTenants,
    ) -> (Vec<Answer>, u64, Vec<(BucketKey, BucketKey)>) {
        let config = self.config.clone();
        let plan = Batch::plan(
            requests.iter().map(|(k, r)| (k, r.instance_id)),
            config.cleanup_window,
        )
        .with_draws(owed);
        let heads = plan
            .lock
            .iter()
            .filter_map(|k| self.heads.get(k).map(|h| (k.clone(), h.clone())))
            .collect();
        let mut batch = Batch::open(
            plan.lock.iter().cloned(),
            heads,
            &self.states,
            unconfigured,
            now,
        );
        let empty = BTreeMap::new();
        for ((k, _), window) in requests.iter().zip(&plan.windows) {
            let all = self.instances.get(k).unwrap_or(&empty);
            batch.load(k, window.select(all).into_values());
        }
        batch.join_tree(&self.nodes);
        let mut others_could_draw = Vec::new();
        loop {
            let parents = batch.parents_due(now, &config);
            if parents.is_empty() {
                break;
            }
            others_could_draw.extend(parents.draws.iter().cloned());
            let heads = parents
                .lock
                .iter()
                .filter_map(|k| self.heads.get(k).map(|h| (k.clone(), h.clone())))
                .collect();
            batch.open_parents(
                parents.lock.clone(),
                heads,
                &BTreeSet::new(),
                &self.states,
                &self.nodes,
            );
            for (k, window) in &parents.windows {
                let all = self.instances.get(k).unwrap_or(&empty);
                batch.load(k, window.select(all).into_values());
            }
        }
        batch.draw(
            requests.iter().map(|(k, r)| (k, r.requested_tokens)),
            now,
            &config,
        );
        let answers = requests
            .iter()
            .map(|(k, r)| batch.serve(k, r, now, &config))
            .collect();
        for write in batch.writes() {
            let mut head = self
                .heads
                .get(write.key)
                .cloned()
                .unwrap_or_else(|| write.head.clone());
            write.apply_to(
                &mut head,
                self.instances.entry(write.key.clone()).or_default(),
            );
            self.heads.insert(write.key.clone(), head);
        }
        (answers, batch.report_removed(now), others_could_draw)
    }
}

#[test]
fn a_plan_locks_each_bucket_once_in_key_order_and_loads_a_window_per_request() {
    let (a, b) = (key("t1", "mail"), key("t0", ""));
    let plan = Batch::plan([(&a, 3), (&b, 1), (&a, 7)], 8);
    assert_eq!(plan.lock, vec![b.clone(), a.clone()]);
    assert_eq!(
        plan.windows,
        vec![
            instance_window(3, 8),
            instance_window(1, 8),
            instance_window(7, 8)
        ]
    );
}

#[test]
fn a_missing_request_unit_bucket_follows_the_unconfigured_rule_and_a_named_one_is_not_found() {
    let defaults = UnconfiguredTenants::default();
    let mut store = MemoryStore::default();
    let (ru, mail) = (key("t", ""), key("t", "mail"));
    let (answers, _) = store.run(
        &[(ru.clone(), req(1, 1, 5.0)), (mail.clone(), req(1, 1, 5.0))],
        at(1.0),
        &defaults,
    );
    assert!(matches!(answers[0], Answer::Granted(g) if g.granted_tokens == 5.0));
    assert_eq!(answers[1], Answer::NotFound);
    let head = &store.heads[&ru];
    assert!(!head.state.configured);
    assert_eq!(head.state.limits, DefaultLimits::default().limits);
    assert!(!store.heads.contains_key(&mail));

    let mut strict = MemoryStore::default();
    let (answers, _) = strict.run(
        &[(ru.clone(), req(1, 1, 5.0))],
        at(1.0),
        &UnconfiguredTenants::Reject,
    );
    assert_eq!(answers, vec![Answer::NotFound]);
    assert!(strict.heads.is_empty());
}

#[test]
fn buckets_of_one_tenant_are_isolated() {
    let mut store = MemoryStore::default();
    let (mail, ai) = (key("t", "mail"), key("t", "ai"));
    for k in [&mail, &ai] {
        store.heads.insert(
            k.clone(),
            BucketRow::new(limits(1.0, 10.0), 10.0, true, at(0.0)),
        );
    }
    let (answers, _) = store.run(
        &[
            (mail.clone(), req(1, 1, 10.0)),
            (ai.clone(), req(1, 1, 4.0)),
        ],
        at(0.0),
        &UnconfiguredTenants::Reject,
    );
    assert!(matches!(answers[0], Answer::Granted(g) if g.granted_tokens == 10.0));
    assert!(matches!(answers[1], Answer::Granted(g) if g.granted_tokens == 4.0));
    assert_eq!(store.heads[&mail].state.tokens, 0.0);
    assert_eq!(store.heads[&ai].state.tokens, 6.0);
}

#[test]
fn instance_rows_left_without_a_head_are_ignored_and_replaced() {
    let mut store = MemoryStore::default();
    let ru = key("t", "");
    let mut stray = BTreeMap::new();
    let mut old = InstanceState {
        instance_id: 1,
        next_instance_id: 0,
        lease: vec![9],
        seq: 50,
        shares: 3.0,
        last_update: at(0.0),
        guaranteed: 0.0,
        last_grant: Grant::default(),
        committed_rate: 0.0,
        committed_until: at(0.0),
        held_tokens: 0.0,
        held_use_rate: 0.0,
    };
    stray.insert(1, old.clone());
    old.instance_id = 2;
    stray.insert(2, old);
    store.instances.insert(ru.clone(), stray);
    let (answers, _) = store.run(
        &[(ru.clone(), req(1, 1, 1.0))],
        at(1.0),
        &UnconfiguredTenants::default(),
    );
    assert!(matches!(answers[0], Answer::Granted(_)));
    let rows = &store.instances[&ru];
    assert_eq!(rows.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(rows[&1].seq, 1);
    assert_eq!(store.heads[&ru].members.live_instances, 1);
}

#[test]
fn after_a_removal_the_buckets_later_requests_are_deferred() {
    let mut store = MemoryStore::default();
    let ru = key("t", "");
    let defaults = UnconfiguredTenants::default();
    store.run(&[(ru.clone(), req(2, 1, 1.0))], at(0.0), &defaults);
    // Instance 2 falls silent; instance 1's request removes it.
    let (answers, removed) = store.run(
        &[(ru.clone(), req(1, 1, 1.0)), (ru.clone(), req(3, 1, 1.0))],
        at(100.0),
        &defaults,
    );
    assert!(matches!(answers[0], Answer::Granted(_)));
    assert_eq!(answers[1], Answer::Deferred);
    assert_eq!(removed, 1);
    let ids: Vec<_> = store.instances[&ru].keys().copied().collect();
    assert_eq!(ids, vec![1]);
    // The deferred request runs on its own next time.
    let (answers, removed) = store.run(&[(ru.clone(), req(3, 1, 1.0))], at(100.0), &defaults);
    assert!(matches!(answers[0], Answer::Granted(_)));
    assert_eq!(removed, 0);
}

#[test]
fn a_deleted_tenant_is_not_created_again_by_default_and_a_suspended_one_is_refused_with_its_rows_kept()
 {
    use crate::tenant_state::TenantStateKind;
    let defaults = UnconfiguredTenants::default();
    let mut store = MemoryStore::default();
    let (gone, paused) = (key("gone", ""), key("paused", "mail"));
    let state = |kind, since| TenantState {
        kind,
        since: at(since),
        actor: "alice at 10.0.0.7:51234".into(),
        reason: "unpaid".into(),
    };
    store
        .states
        .insert(gone.tenant.clone(), state(TenantStateKind::Deleted, 1.0));
    store.states.insert(
        paused.tenant.clone(),
        state(TenantStateKind::Suspended, 2.0),
    );
    store.heads.insert(
        paused.clone(),
        BucketRow::new(limits(10.0, 100.0), 50.0, true, at(0.0)),
    );
    let before = store.heads.clone();
    let plan = Batch::plan([(&gone, 1), (&paused, 1)], 8);
    assert_eq!(plan.tenants(), vec![&gone.tenant, &paused.tenant]);
    let (answers, _) = store.run(
        &[
            (gone.clone(), req(1, 1, 5.0)),
            (paused.clone(), req(1, 1, 5.0)),
        ],
        at(3.0),
        &defaults,
    );
    assert!(matches!(
        &answers[0],
        Answer::TenantRefused(TenantRefused::Deleted { since, .. }) if *since == at(1.0)
    ));
    assert!(matches!(
        &answers[1],
        Answer::TenantRefused(TenantRefused::Suspended { reason, .. }) if reason == "unpaid"
    ));
    assert_eq!(store.heads, before, "nothing created, nothing changed");
    assert!(store.instances.is_empty());

    store.states.clear();
    let (answers, _) = store.run(&[(gone.clone(), req(1, 1, 5.0))], at(4.0), &defaults);
    assert!(matches!(answers[0], Answer::Granted(_)));
}

#[test]
fn a_duplicate_writes_nothing() {
    let mut store = MemoryStore::default();
    let ru = key("t", "");
    let defaults = UnconfiguredTenants::default();
    store.run(&[(ru.clone(), req(1, 1, 1.0))], at(0.0), &defaults);
    let config = GlobalBucketConfig::default();
    let heads = store.heads.clone();
    let mut batch = Batch::open([ru.clone()], heads, &BTreeMap::new(), &defaults, at(1.0));
    batch.load(&ru, store.instances[&ru].values().cloned());
    let answer = batch.serve(&ru, &req(1, 1, 1.0), at(1.0), &config);
    assert!(matches!(answer, Answer::Granted(_)));
    assert!(batch.writes().is_empty());
}

// ---------------------------------------------------------------------------
// The window rule
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Step {
    advance_ms: u32,
    instance: InstanceId,
    requested: f64,
    shares: f64,
    next_live: Option<InstanceId>,
    new_lease: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![0u32..2_000, 0u32..90_000],
        prop_oneof![1u32..12, Just(u32::MAX), Just(u32::MAX - 1)],
        prop_oneof![Just(0.0), 0.0..500.0],
        0.0..5.0,
        proptest::option::weighted(0.3, 1u32..12),
        proptest::bool::weighted(0.05),
    )
        .prop_map(
            |(advance_ms, instance, requested, shares, next_live, new_lease)| Step {
                advance_ms,
                instance,
                requested,
                shares,
                next_live,
                new_lease,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A request on the rows of its window gives exactly the grant, and
    /// leaves exactly the rows, that it gives and leaves on all rows.
    #[test]
    fn a_request_on_its_window_does_what_it_does_on_all_rows(
        window in 1usize..5,
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        let config = GlobalBucketConfig { cleanup_window: window, ..GlobalBucketConfig::default() };
        let mut all = BucketRows {
            head: BucketRow::new(limits(100.0, 1_000.0), 500.0, true, at(0.0)),
            instances: BTreeMap::new(),
        };
        let mut seqs = BTreeMap::<InstanceId, (u64, u8)>::new();
        let mut now_ms: i64 = 0;
        for s in &steps {
            now_ms += i64::from(s.advance_ms);
            let now = Timestamp::from_unix_micros(now_ms * 1000);
            let (seq, lease) = seqs.entry(s.instance).or_insert((0, 1));
            if s.new_lease {
                *lease += 1;
                *seq = 0;
            }
            *seq += 1;
            let mut r = req(s.instance, *seq, s.requested);
            r.lease = vec![*lease];
            r.shares = s.shares;
            r.next_live_instance_id = s.next_live;

            let before = all.instances.clone();
            // The window's rows, as a store loads them.
            let mut windowed = BucketRows {
                head: all.head.clone(),
                instances: instance_window(s.instance, window).select(&all.instances),
            };
            let on_window = global_bucket::request(&mut windowed, &r, now, &config);
            let on_all = global_bucket::request(&mut all, &r, now, &config);
            match (on_window, on_all) {
                (Ok(w), Ok(a)) => {
                    prop_assert_eq!(w.grant, a.grant);
                    prop_assert_eq!(w.duplicate, a.duplicate);
                    prop_assert_eq!(&w.changes.removed, &a.changes.removed);
                    // Writing the window's changes back gives all rows as
                    // the request left them.
                    let mut written = before;
                    if !w.duplicate {
                        for id in &w.changes.upserted {
                            written.insert(*id, windowed.instances[id].clone());
                        }
                        for removed in &w.changes.removed {
                            written.remove(&removed.instance_id);
                        }
                    }
                    prop_assert_eq!(&windowed.head, &all.head);
                    prop_assert_eq!(&written, &all.instances);
                }
                (Err(w), Err(a)) => prop_assert_eq!(w, a),
                (w, a) => prop_assert!(false, "window {:?} but all rows {:?}", w, a),
            }
        }
    }
}

/// Organisations through the script: a parent bucket `acme` of `rate`
/// tokens per second, members with their own limits as ceilings, pods
/// asking once a second for what they want.
mod organisations {
    use super::*;
    use crate::organisation::{self, Member, Organisation};

    struct Tree {
        store: MemoryStore,
        seq: u64,
    }

    const POD_PERIOD: Duration = Duration::from_secs(1);

    impl Tree {
        /// `acme` limited to `rate` (burst one draw period of it), members
        /// `(id, ceiling, guaranteed)`, all buckets empty at 0.
        fn new(rate: f64, members: &[(&str, f64, f64)]) -> Tree {
            let mut store = MemoryStore {
                config: GlobalBucketConfig {
                    draw_period: Duration::from_secs(2),
                    ..GlobalBucketConfig::default()
                },
                ..MemoryStore::default()
            };
            let acme = TenantId::parse("t", "acme").expect("id");
            store.heads.insert(
                key("acme", ""),
                BucketRow::new(limits(rate, 2.0 * rate), 0.0, true, at(0.0)),
            );
            store.nodes.insert(
                acme.clone(),
                Node {
                    organisation: Some(Organisation {
                        display_name: "Acme".into(),
                        created_at: at(0.0),
                        next_member_id: 100,
                    }),
                    member_of: None,
                },
            );
            for (i, (id, ceiling, guaranteed)) in members.iter().enumerate() {
                store.heads.insert(
                    key(id, ""),
                    BucketRow::new(limits(*ceiling, *ceiling), 0.0, true, at(0.0)),
                );
                let mut g = BTreeMap::new();
                g.insert(BucketName::REQUEST_UNITS, *guaranteed);
                store.nodes.insert(
                    TenantId::parse("t", id).expect("id"),
                    Node {
                        organisation: None,
                        member_of: Some(Member {
                            organisation: acme.clone(),
                            member_id: u32::try_from(i + 1).expect("small"),
                            guaranteed: g,
                            since: at(0.0),
                        }),
                    },
                );
            }
            Tree { store, seq: 0 }
        }

        /// Adds `id` below organisation `of` as member `member_id`: an
        /// organisation itself if `organisation`, with a bucket of limits
        /// `(rate, burst)` if given.
        fn join(
            &mut self,
            id: &str,
            of: &str,
            member_id: u32,
            organisation: bool,
            bucket: Option<(f64, f64)>,
        ) {
            if let Some((rate, burst)) = bucket {
                self.store.heads.insert(
                    key(id, ""),
                    BucketRow::new(limits(rate, burst), 0.0, true, at(0.0)),
                );
            }
            self.store.nodes.insert(
                TenantId::parse("t", id).expect("id"),
                Node {
                    organisation: organisation.then(|| Organisation {
                        display_name: String::new(),
                        created_at: at(0.0),
                        next_member_id: 2,
                    }),
                    member_of: Some(Member {
                        organisation: TenantId::parse("t", of).expect("id"),
                        member_id,
                        guaranteed: BTreeMap::new(),
                        since: at(0.0),
                    }),
                },
            );
        }

        /// Runs from `from` to `to` seconds, every pod of each member
        /// `(id, pods, wanted per pod per second)` asking once a second;
        /// the tokens granted to each member's pods.
        fn run(&mut self, from: u32, to: u32, demand: &[(&str, u32, f64)]) -> Vec<f64> {
            let mut granted = vec![0.0; demand.len()];
            for t in from..to {
                self.seq += 1;
                for (m, (id, pods, want)) in demand.iter().enumerate() {
                    for pod in 1..=*pods {
                        let mut r = req(pod, self.seq, want * POD_PERIOD.as_secs_f64());
                        r.target_request_period = POD_PERIOD;
                        // Pods start at different points of the second.
                        let now = at(f64::from(t) + f64::from(pod) * 0.01 + m as f64 * 0.003);
                        let (answers, _) =
                            self.store
                                .run(&[(key(id, ""), r)], now, &UnconfiguredTenants::Reject);
                        match &answers[0] {
                            Answer::Granted(g) => granted[m] += g.granted_tokens,
                            other => panic!("{id}: {other:?}"),
                        }
                    }
                }
            }
            granted
        }
    }

    fn draws(tree: &Tree, id: &str) -> u64 {
        tree.store.heads[&key(id, "")]
            .draw
            .as_ref()
            .map_or(0, |d| d.draws)
    }

    #[test]
    fn a_due_draw_is_made_by_a_transaction_without_requests_and_only_once() {
        let mut tree = Tree::new(100.0, &[("a", 1_000.0, 0.0), ("b", 1_000.0, 0.0)]);
        // A first draw asks for its own requests: no other transaction
        // could make it.
        let mut first = req(1, 1, 50.0);
        first.target_request_period = POD_PERIOD;
        let (_, _, others) = tree.store.run_with_draws(
            &[(key("a", ""), first)],
            &[],
            at(0.0),
            &UnconfiguredTenants::Reject,
        );
        assert!(others.is_empty(), "{others:?}");
        tree.run(0, 2, &[("b", 1, 50.0)]);
        assert_eq!((draws(&tree, "a"), draws(&tree, "b")), (1, 1));
        // Both are due at 2 s (the draw period): a request of a's lists
        // a's draw; a transaction with no requests makes b's, asking for
        // what b's pod asked at 1 s.
        let mut next = req(1, 2, 50.0);
        next.target_request_period = POD_PERIOD;
        let (_, _, others) = tree.store.run_with_draws(
            &[(key("a", ""), next)],
            &[],
            at(2.5),
            &UnconfiguredTenants::Reject,
        );
        assert_eq!(others, vec![(key("a", ""), key("acme", ""))]);
        assert_eq!(draws(&tree, "a"), 2, "its own transaction drew");
        let owed = [key("a", ""), key("b", "")];
        let (answers, _, _) =
            tree.store
                .run_with_draws(&[], &owed, at(2.6), &UnconfiguredTenants::Reject);
        assert!(answers.is_empty());
        assert_eq!(
            (draws(&tree, "a"), draws(&tree, "b")),
            (2, 2),
            "b's draw made"
        );
        let b = &tree.store.heads[&key("b", "")];
        let granted = b.draw.as_ref().map_or(0.0, |d| d.last_granted);
        assert!(granted > 0.0, "b asked for what its pod asked: {b:?}");
        // Owed again before the period is over: nothing is drawn twice.
        let before = tree.store.heads.clone();
        tree.store
            .run_with_draws(&[], &owed, at(3.0), &UnconfiguredTenants::Reject);
        assert_eq!(tree.store.heads, before);
        // An owed bucket that is gone is not created.
        tree.store.run_with_draws(
            &[],
            &[key("gone", "")],
            at(3.0),
            &UnconfiguredTenants::Reject,
        );
        assert!(!tree.store.heads.contains_key(&key("gone", "")));
    }

    #[test]
    fn members_together_stay_within_the_organisation_and_split_by_demand() {
        let mut tree = Tree::new(100.0, &[("a", 1_000.0, 0.0), ("b", 1_000.0, 0.0)]);
        // Both saturate: a wants 300/s, b 100/s, against 100/s together.
        tree.run(0, 20, &[("a", 3, 100.0), ("b", 1, 100.0)]);
        let got = tree.run(20, 140, &[("a", 3, 100.0), ("b", 1, 100.0)]);
        let total: f64 = got.iter().sum();
        let bound = 100.0 * 120.0 * 1.05 + 200.0;
        assert!(total <= bound, "{got:?} together {total} beyond {bound}");
        assert!(
            total >= 100.0 * 120.0 * 0.9,
            "{got:?}: the organisation's rate went unused"
        );
        // Split by demand, 3 to 1.
        let share = got[0] / total;
        assert!((share - 0.75).abs() < 0.05, "a got {share} of it: {got:?}");
        // The organisation drew once per member per period: its draws are counted.
        let draws = tree.store.heads[&key("a", "")]
            .draw
            .as_ref()
            .expect("drew")
            .draws;
        assert!(
            draws <= 140 / 2 + 1,
            "{draws} draws in 140 s of 2 s periods"
        );
        // Its totals count what the members' pods reported (none here).
        assert_eq!(
            tree.store.heads[&key("acme", "")].totals.consumption,
            Consumption::default()
        );
    }

    #[test]
    fn an_idle_member_lends_its_part_and_a_guarantee_is_met_when_it_wakes() {
        // b is guaranteed 40/s; a's ceiling is 90/s.
        let mut tree = Tree::new(100.0, &[("a", 90.0, 0.0), ("b", 1_000.0, 40.0)]);
        tree.run(0, 30, &[("a", 2, 100.0), ("b", 2, 100.0)]);
        // b idle: within two draw periods a runs at its ceiling.
        tree.run(30, 34, &[("a", 2, 100.0), ("b", 0, 0.0)]);
        let got = tree.run(34, 64, &[("a", 2, 100.0), ("b", 0, 0.0)]);
        assert!(
            got[0] >= 90.0 * 30.0 * 0.95,
            "a got {} of its 90/s ceiling over 30 s",
            got[0] / 30.0
        );
        assert!(
            got[0] <= 90.0 * 30.0 * 1.05 + 90.0,
            "a passed its ceiling: {}",
            got[0] / 30.0
        );
        // b wakes: within two periods it has at least its guarantee.
        tree.run(64, 68, &[("a", 2, 100.0), ("b", 2, 100.0)]);
        let got = tree.run(68, 98, &[("a", 2, 100.0), ("b", 2, 100.0)]);
        assert!(
            got[1] >= 40.0 * 30.0 * 0.95,
            "b got {}/s, guaranteed 40",
            got[1] / 30.0
        );
        let total: f64 = got.iter().sum();
        assert!(total <= 100.0 * 30.0 * 1.05 + 200.0, "{got:?}");
    }

    #[test]
    fn a_member_that_leaves_runs_on_its_own_limits_at_once() {
        let mut tree = Tree::new(10.0, &[("a", 200.0, 0.0)]);
        tree.run(0, 10, &[("a", 1, 200.0)]);
        let a = TenantId::parse("t", "a").expect("id");
        let row = tree.store.nodes.get(&a).cloned();
        let left = organisation::leave(&a, row.as_ref()).expect("a member");
        assert!(left.is_empty());
        tree.store.nodes.remove(&a);
        let got = tree.run(10, 20, &[("a", 1, 200.0)]);
        assert!(
            got[0] >= 200.0 * 10.0 * 0.9,
            "a got {}/s after leaving",
            got[0] / 10.0
        );
        assert!(tree.store.heads[&key("a", "")].draw.is_none());
    }

    #[test]
    fn an_organisation_without_the_bucket_passes_its_members_draws_up() {
        // acme (100/s) > a; acme > mid (no bucket of its own) > c.
        let mut tree = Tree::new(100.0, &[("a", 1_000.0, 0.0)]);
        tree.join("mid", "acme", 2, true, None);
        tree.join("c", "mid", 1, false, Some((1_000.0, 1_000.0)));
        tree.run(0, 20, &[("a", 3, 100.0), ("c", 3, 100.0)]);
        let got = tree.run(20, 140, &[("a", 3, 100.0), ("c", 3, 100.0)]);
        let total: f64 = got.iter().sum();
        let bound = 100.0 * 120.0 * 1.05 + 200.0;
        assert!(total <= bound, "{got:?} together {total} beyond {bound}");
        assert!(
            total >= 100.0 * 120.0 * 0.9,
            "{got:?}: the rate went unused"
        );
        let share = got[1] / total;
        assert!((share - 0.5).abs() < 0.1, "c got {share} of it: {got:?}");
        // mid's bucket was made, with no limit of its own, and draws.
        let passed = &tree.store.heads[&key("mid", "")];
        assert_eq!(
            passed.state.limits.refill_rate,
            crate::validate::MAX_REFILL_RATE
        );
        assert!(
            passed.draw.as_ref().is_some_and(|d| d.draws > 0),
            "{passed:?}"
        );
    }

    #[test]
    fn a_nested_organisation_draws_for_what_its_members_ask_whatever_their_ids() {
        // acme (100/s) > labs (80/s) > labs-ml: labs sorts before its
        // member, and still draws after it asked.
        let mut tree = Tree::new(100.0, &[]);
        tree.join("labs", "acme", 1, true, Some((80.0, 160.0)));
        tree.join("labs-ml", "labs", 1, false, Some((500.0, 500.0)));
        tree.run(0, 20, &[("labs-ml", 2, 100.0)]);
        let got = tree.run(20, 80, &[("labs-ml", 2, 100.0)]);
        // At labs' 80/s, the lesser of its limit and acme's.
        assert!(
            got[0] >= 80.0 * 60.0 * 0.9,
            "labs-ml got {}/s",
            got[0] / 60.0
        );
        assert!(
            got[0] <= 80.0 * 60.0 * 1.05 + 160.0,
            "labs-ml got {}/s",
            got[0] / 60.0
        );
        let wants = tree.store.heads[&key("labs", "")]
            .draw
            .as_ref()
            .map_or(0.0, |d| d.wants);
        assert!(wants >= 80.0, "labs asked acme for {wants}/s");
    }

    #[test]
    fn pods_of_an_organisation_are_refused_and_change_nothing() {
        let mut tree = Tree::new(10.0, &[("a", 200.0, 0.0)]);
        let before = tree.store.heads[&key("acme", "")].clone();
        let (answers, _) = tree.store.run(
            &[(key("acme", ""), req(1, 1, 5.0))],
            at(1.0),
            &UnconfiguredTenants::default(),
        );
        assert!(
            matches!(
                &answers[0],
                Answer::TenantRefused(TenantRefused::Organisation { .. })
            ),
            "{answers:?}"
        );
        assert_eq!(tree.store.heads[&key("acme", "")], before);
    }
}
