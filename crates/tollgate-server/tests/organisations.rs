//! Organisations through the wire contract alone, on the embedded store
//! and PostgreSQL, with the store's clock moved by the test: an
//! organisation limited to R, members whose own limits are above R, pods
//! sending `TokenBucket` requests once a second. Together the members
//! admit at most R·T + burst + ε·R·T, split by demand; an idle member's
//! part goes to the others within two draw periods; a guarantee is met
//! within two periods of its member waking; a member taken out runs on
//! its own limits at once; totals are exact throughout. Refusals name
//! their field or reason and change nothing. And replica safety: members'
//! pods on two PostgreSQL replicas for 20 s of real time.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use support::server::TestServer;
use support::{Backend, Backing, ManualClock};
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_server::store::BucketSettings;
use tonic::Code;
use tonic::transport::Channel;

/// The organisation's rate and burst (a draw period of its rate).
const RATE: f64 = 100.0;
const BURST: f64 = 1_000.0;
/// The draw period (the server's default).
const PERIOD: u32 = 10;
/// The stated bound's ε (ARCHITECTURE.md, "The stated bound").
const EPSILON: f64 = 0.12;

struct World {
    server: TestServer,
    store: std::sync::Arc<dyn tollgate_server::store::Store>,
    admin: AdminClient<Channel>,
    pods: TokenBucketServiceClient<Channel>,
    clock: ManualClock,
    /// Each pod's last sequence number and what it was granted last
    /// (reported as consumed with its next request).
    pods_state: HashMap<(String, u32), (u64, f64)>,
    /// Request-unit micros each member's pods reported, exactly.
    reported: BTreeMap<String, u64>,
    second: u32,
    /// Keeps the test's database for the test's life.
    _backing: Backing,
}

/// A pod's request to `tenant`'s bucket `bucket` as instance `instance`,
/// asking once a second for `tokens`, reporting `micros` request-unit
/// micros consumed since its last.
fn pod_request(
    tenant: &str,
    bucket: &str,
    instance: u32,
    seq: u64,
    tokens: f64,
    micros: u64,
) -> v1::TokenBucketRequest {
    v1::TokenBucketRequest {
        tenant_id: tenant.into(),
        bucket: bucket.into(),
        instance_id: instance,
        instance_lease: b"lease".to_vec(),
        seq,
        requested_tokens: tokens,
        shares: 1.0,
        target_request_period: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        consumption_since_last_request: Some(v1::Consumption {
            request_unit_micros: micros,
            ..v1::Consumption::default()
        }),
        ..v1::TokenBucketRequest::default()
    }
}

fn limits_request(tenant: &str, rate: f64, burst: f64) -> v1::UpdateTenantResourceLimitsRequest {
    v1::UpdateTenantResourceLimitsRequest {
        tenant_id: tenant.into(),
        bucket: String::new(),
        available_tokens: 0.0,
        refill_rate: rate,
        burst_limit: burst,
        as_of: None,
        as_of_consumed_tokens: 0.0,
        update_mask: None,
    }
}

impl World {
    /// Organisation `acme` (RATE, BURST) and members `(id, own rate,
    /// guaranteed rate)`, every bucket empty.
    async fn new(backend: Backend, members: &[(&str, f64, f64)]) -> World {
        let clock = ManualClock::default();
        clock.set_secs(1_800_000_000.0);
        let backing = Backing::new(backend).await;
        let store = backing
            .open_with_clock(BucketSettings::default(), clock.as_clock())
            .await;
        let server = TestServer::start(std::sync::Arc::clone(&store)).await;
        let mut admin = server.admin().await;
        let pods = server.pods().await;
        admin
            .create_organization(v1::CreateOrganizationRequest {
                organization_id: "acme".into(),
                display_name: "Acme Corp".into(),
            })
            .await
            .expect("create the organisation");
        admin
            .update_tenant_resource_limits(limits_request("acme", RATE, BURST))
            .await
            .expect("the organisation's limits");
        for (id, own, guaranteed) in members {
            admin
                .update_tenant_resource_limits(limits_request(id, *own, *own))
                .await
                .expect("a member's own limits");
            let mut rates = HashMap::new();
            if *guaranteed > 0.0 {
                rates.insert(String::new(), *guaranteed);
            }
            admin
                .add_organization_member(v1::AddOrganizationMemberRequest {
                    organization_id: "acme".into(),
                    member_id: (*id).into(),
                    guaranteed_rates: rates,
                })
                .await
                .expect("add a member");
        }
        World {
            _backing: backing,
            server,
            store,
            admin,
            pods,
            clock,
            pods_state: HashMap::new(),
            reported: BTreeMap::new(),
            second: 0,
        }
    }

    /// Runs `seconds`: each second every pod of each member `(id, pods,
    /// wanted per pod per second)` asks for a second of what it wants,
    /// reporting what it was granted before as consumed. The tokens each
    /// member's pods were granted.
    async fn run(&mut self, seconds: u32, demand: &[(&str, u32, f64)]) -> Vec<f64> {
        let mut granted = vec![0.0; demand.len()];
        for _ in 0..seconds {
            for (m, (id, pods, want)) in demand.iter().enumerate() {
                for pod in 1..=*pods {
                    let state = self
                        .pods_state
                        .entry(((*id).to_owned(), pod))
                        .or_insert((0, 0.0));
                    state.0 += 1;
                    let micros = (state.1 * 1e6).round() as u64;
                    *self.reported.entry((*id).to_owned()).or_default() += micros;
                    let answer = self
                        .pods
                        .token_bucket(pod_request(id, "", pod, state.0, *want, micros))
                        .await
                        .unwrap_or_else(|e| panic!("{id} pod {pod}: {e}"))
                        .into_inner();
                    state.1 = answer.granted_tokens;
                    granted[m] += answer.granted_tokens;
                }
            }
            self.clock.advance(Duration::from_secs(1));
            self.second += 1;
        }
        granted
    }

    /// Every member's exact totals equal what its pods reported.
    async fn assert_totals_exact(&mut self) {
        for (id, micros) in &self.reported {
            let tenant = support::server::get_tenant(&mut self.admin, id)
                .await
                .expect("the member");
            let got = tenant.consumption.expect("totals").request_unit_micros;
            assert_eq!(got, *micros, "{id}: stored total differs from reported");
        }
    }

    async fn organization(&mut self) -> v1::Organization {
        self.admin
            .get_organization(v1::GetOrganizationRequest {
                organization_id: "acme".into(),
            })
            .await
            .expect("the organisation")
            .into_inner()
            .organization
            .expect("an organisation")
    }
}

async fn members_share_the_organisations_rate_by_demand(backend: Backend) {
    let mut w = World::new(backend, &[("a", 1_000.0, 0.0), ("b", 1_000.0, 0.0)]).await;
    // a's three pods and b's one want 100/s each: 400/s against 100/s.
    let demand = [("a", 3, 100.0), ("b", 1, 100.0)];
    w.run(2 * PERIOD, &demand).await;
    let secs = 120;
    let got = w.run(secs, &demand).await;
    let total: f64 = got.iter().sum();
    let rt = RATE * f64::from(secs);
    let bound = rt + BURST + EPSILON * rt;
    assert!(total <= bound, "together {total}, bound {bound}: {got:?}");
    assert!(
        total >= 0.9 * rt,
        "together {total} of {rt}: capacity unused"
    );
    let a_share = got[0] / total;
    eprintln!(
        "{backend:?}: together {total:.0} in {secs} s ({:.1} % of R·T; bound {bound:.0}); a's share {a_share:.3}",
        total / rt * 100.0
    );
    assert!(
        (a_share - 0.75).abs() <= 0.05,
        "a got {a_share} of it, wanting 3/4"
    );
    w.assert_totals_exact().await;
    // The view: each member draws, at most once per period.
    let org = w.organization().await;
    assert_eq!(org.members.len(), 2);
    for member in &org.members {
        let bucket = &member.buckets[0];
        assert!(bucket.drawing, "{member:?}");
        let most = u64::from(w.second / PERIOD + 1);
        assert!(
            bucket.draws <= most,
            "{} draws in {} s",
            bucket.draws,
            w.second
        );
        assert!(bucket.wanted_rate > 0.0 && bucket.drawn_rate >= 0.0);
    }
    // The organisation counts its members' consumption, a period late at
    // most: never more than they reported.
    let acme = support::server::get_tenant(&mut w.admin, "acme")
        .await
        .expect("the organisation's bucket");
    let org_micros = acme.consumption.expect("totals").request_unit_micros;
    let reported: u64 = w.reported.values().sum();
    assert!(
        org_micros <= reported && org_micros > 0,
        "{org_micros} of {reported}"
    );
    w.server.stop().await;
}

async fn an_idle_members_part_goes_to_a_busy_one_within_two_periods(backend: Backend) {
    // a may have 90/s of its own, b 1000/s.
    let mut w = World::new(backend, &[("a", 90.0, 0.0), ("b", 1_000.0, 0.0)]).await;
    w.run(3 * PERIOD, &[("a", 2, 100.0), ("b", 2, 100.0)]).await;
    // b goes idle: within two draw periods a runs at its own 90/s.
    w.run(2 * PERIOD, &[("a", 2, 100.0)]).await;
    let secs = 60;
    let got = w.run(secs, &[("a", 2, 100.0)]).await;
    let rate = got[0] / f64::from(secs);
    eprintln!("{backend:?}: a alone at {rate:.2}/s (its own limit 90/s)");
    assert!(rate >= 0.95 * 90.0, "a at {rate}/s, its own limit 90/s");
    assert!(
        rate <= 90.0 * 1.05 + 90.0 / f64::from(secs) * 2.0,
        "a at {rate}/s"
    );
    w.assert_totals_exact().await;
    w.server.stop().await;
}

async fn a_guarantee_is_met_within_two_periods_of_waking(backend: Backend) {
    let mut w = World::new(backend, &[("a", 1_000.0, 0.0), ("b", 1_000.0, 40.0)]).await;
    // a alone takes all of it.
    w.run(6 * PERIOD, &[("a", 4, 100.0)]).await;
    // b wakes, wanting 100/s: from two periods on it has its 40/s.
    let both = [("a", 4, 100.0), ("b", 1, 100.0)];
    w.run(2 * PERIOD, &both).await;
    let secs = 60;
    let got = w.run(secs, &both).await;
    let b_rate = got[1] / f64::from(secs);
    eprintln!(
        "{backend:?}: b woken at {b_rate:.2}/s (guaranteed 40), a at {:.2}/s",
        got[0] / f64::from(secs)
    );
    assert!(b_rate >= 0.95 * 40.0, "b at {b_rate}/s, guaranteed 40/s");
    let total: f64 = got.iter().sum();
    let rt = RATE * f64::from(secs);
    assert!(total <= rt + BURST + EPSILON * rt, "together {total}");
    w.assert_totals_exact().await;
    w.server.stop().await;
}

async fn a_member_taken_out_runs_on_its_own_limits_at_once(backend: Backend) {
    let mut w = World::new(backend, &[("a", 1_000.0, 0.0)]).await;
    w.run(3 * PERIOD, &[("a", 2, 300.0)]).await;
    let answer = w
        .admin
        .remove_organization_member(v1::RemoveOrganizationMemberRequest {
            member_id: "a".into(),
        })
        .await
        .expect("remove")
        .into_inner();
    assert_eq!(answer.organization_id, "acme");
    // From the next second on, a gets its own 600/s (well above 100/s).
    w.run(1, &[("a", 2, 300.0)]).await;
    let got = w.run(10, &[("a", 2, 300.0)]).await;
    eprintln!("{backend:?}: a out of acme at {:.1}/s", got[0] / 10.0);
    assert!(
        got[0] >= 0.95 * 600.0 * 10.0,
        "a got {}/s after leaving",
        got[0] / 10.0
    );
    w.assert_totals_exact().await;
    let org = w.organization().await;
    assert!(org.members.is_empty());
    w.server.stop().await;
}

async fn refusals_name_their_reason_and_change_nothing(backend: Backend) {
    let mut w = World::new(backend, &[("a", 1_000.0, 0.0)]).await;
    let before = w.organization().await;
    // Pods never draw on the organisation's own bucket.
    let refused = w
        .pods
        .token_bucket(v1::TokenBucketRequest {
            tenant_id: "acme".into(),
            instance_id: 1,
            instance_lease: b"x".to_vec(),
            seq: 1,
            requested_tokens: 5.0,
            ..v1::TokenBucketRequest::default()
        })
        .await
        .expect_err("an organisation's pod");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("organisation"), "{refused:?}");

    let add = |org: &str, member: &str, rate: f64| v1::AddOrganizationMemberRequest {
        organization_id: org.into(),
        member_id: member.into(),
        guaranteed_rates: [(String::new(), rate)].into_iter().collect(),
    };
    let cases = [
        (
            add("acme", "b", -1.0),
            Code::InvalidArgument,
            "guaranteed_rates",
        ),
        (
            add("acme", "b", f64::NAN),
            Code::InvalidArgument,
            "guaranteed_rates",
        ),
        (
            add("acme", "bad id!", 1.0),
            Code::InvalidArgument,
            "member_id",
        ),
        (add("", "b", 1.0), Code::InvalidArgument, "organization_id"),
        (add("nobody", "b", 1.0), Code::NotFound, "nobody"),
        (add("acme", "acme", 1.0), Code::FailedPrecondition, "acme"),
    ];
    for (request, code, says) in cases {
        let e = w
            .admin
            .add_organization_member(request.clone())
            .await
            .expect_err("refused");
        assert_eq!(e.code(), code, "{request:?}: {e:?}");
        assert!(e.message().contains(says), "{request:?}: {e:?}");
    }
    // A tenant with buckets cannot become an organisation; an organisation
    // cannot be made twice, nor deleted with members.
    let create = |id: &str| v1::CreateOrganizationRequest {
        organization_id: id.into(),
        display_name: String::new(),
    };
    let e = w
        .admin
        .create_organization(create("a"))
        .await
        .expect_err("a has buckets");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = w
        .admin
        .create_organization(create("acme"))
        .await
        .expect_err("twice");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let e = w
        .admin
        .delete_organization(v1::DeleteOrganizationRequest {
            organization_id: "acme".into(),
        })
        .await
        .expect_err("has members");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // a belongs to acme: another organisation cannot take it.
    w.admin
        .create_organization(create("other"))
        .await
        .expect("other");
    let e = w
        .admin
        .add_organization_member(add("other", "a", 0.0))
        .await
        .expect_err("a is acme's");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Five organisations deep is one too many; a cycle is refused.
    for (parent, child) in [("o1", "o2"), ("o2", "o3"), ("o3", "o4")] {
        for id in [parent, child] {
            let _ = w.admin.create_organization(create(id)).await;
        }
        w.admin
            .add_organization_member(add(parent, child, 0.0))
            .await
            .expect("nest");
    }
    let e = w
        .admin
        .add_organization_member(add("o4", "o1", 0.0))
        .await
        .expect_err("a cycle");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    w.admin
        .add_organization_member(add("o4", "t", 0.0))
        .await
        .expect("a tenant 4 deep");
    w.admin.create_organization(create("o0")).await.expect("o0");
    let e = w
        .admin
        .add_organization_member(add("o0", "o1", 0.0))
        .await
        .expect_err("5 deep");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("at most 4"), "{e:?}");
    assert_eq!(w.organization().await.members, before.members);
    w.server.stop().await;
}

async fn an_organisations_tier_and_budget_limit_its_members(backend: Backend) {
    let mut w = World::new(backend, &[("a", 1_000.0, 0.0), ("b", 1_000.0, 0.0)]).await;
    // The organisation is put on a tier like a tenant: its `emails` bucket
    // (5/s, burst 10) limits its members' `emails` buckets (1 000/s each).
    let emails = |rate: f64, burst: f64| v1::BucketDefinition {
        bucket: "emails".into(),
        refill_rate: rate,
        burst_limit: burst,
        initial_tokens: Some(0.0),
        kind: v1::BucketKind::Shared as i32,
        quota: None,
        enforce: None,
    };
    w.admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "team".into(),
                buckets: vec![emails(5.0, 10.0)],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await
        .expect("put tier");
    w.admin
        .set_tenant_tier(v1::SetTenantTierRequest {
            tenant_id: "acme".into(),
            tier: "team".into(),
            dry_run: false,
        })
        .await
        .expect("the organisation on the tier");
    for member in ["a", "b"] {
        w.admin
            .set_bucket_override(v1::SetBucketOverrideRequest {
                tenant_id: member.into(),
                bucket: Some(emails(1_000.0, 1_000.0)),
            })
            .await
            .expect("a member's emails bucket");
    }
    // And a budget on its request-unit bucket: 300 tokens a day, then stop.
    w.admin
        .set_budget(v1::SetBudgetRequest {
            tenant_id: "acme".into(),
            budget: Some(v1::Budget {
                amount: 300.0,
                cycle: Some(v1::BudgetCycle {
                    period: v1::BudgetPeriod::Daily.into(),
                    ..v1::BudgetCycle::default()
                }),
                at_limit: v1::BudgetAtLimit::Stop.into(),
                ..v1::Budget::default()
            }),
        })
        .await
        .expect("the organisation's budget");
    let mut granted = BTreeMap::<(&str, &str), f64>::new();
    for second in 0..120u64 {
        for member in ["a", "b"] {
            for bucket in ["", "emails"] {
                let answer = w
                    .pods
                    .token_bucket(pod_request(member, bucket, 1, second + 1, 50.0, 0))
                    .await
                    .unwrap_or_else(|e| panic!("{member} {bucket:?}: {e}"))
                    .into_inner();
                *granted.entry((member, bucket)).or_default() += answer.granted_tokens;
            }
        }
        w.clock.advance(Duration::from_secs(1));
    }
    let emails_total = granted[&("a", "emails")] + granted[&("b", "emails")];
    let units_total = granted[&("a", "")] + granted[&("b", "")];
    eprintln!(
        "{backend:?}: members' emails {emails_total:.0} in 120 s (tier: 5/s, burst 10); request units {units_total:.0} (budget 300)"
    );
    let rt = 5.0 * 120.0;
    assert!(
        emails_total <= rt + 10.0 + EPSILON * rt,
        "emails {emails_total}"
    );
    assert!(emails_total >= 0.8 * rt, "emails {emails_total}");
    // The budget caps what the members draw, exactly; their pods may have
    // been granted, in advance, up to a pod period of what they drew
    // beyond it (one request of 50 each here).
    assert!(
        units_total <= 300.0 + 2.0 * 50.0 + 1e-6,
        "request units {units_total} past the budget"
    );
    let acme = w
        .admin
        .get_budget(v1::GetBudgetRequest {
            tenant_id: "acme".into(),
            bucket: String::new(),
        })
        .await
        .expect("the organisation's budget")
        .into_inner()
        .status
        .expect("a status");
    assert_eq!(acme.state, "stopped");
    assert_eq!(acme.remaining, Some(0.0));
    assert!(
        units_total >= 250.0,
        "request units {units_total}: the budget went unused"
    );
    w.server.stop().await;
}

/// Many members due at the same instant, their pods' requests all in
/// flight at once: on PostgreSQL most of their transactions find the
/// organisation's row held by another, and the draws they skip are owed
/// to their workers' next transactions, made at once even when no other
/// request comes. Every member still draws exactly once per draw period,
/// none a second late.
async fn members_due_together_all_draw_on_time(backend: Backend) {
    const MEMBERS: usize = 40;
    let ids: Vec<String> = (0..MEMBERS).map(|m| format!("m{m:02}")).collect();
    let members: Vec<(&str, f64, f64)> = ids.iter().map(|id| (id.as_str(), 1_000.0, 0.0)).collect();
    let mut w = World::new(backend, &members).await;
    // The first draws one after another (a first draw asks for its own
    // request, so it is never owed): every member drew at second 0.
    let one_each: Vec<(&str, u32, f64)> = ids.iter().map(|id| (id.as_str(), 1, 5.0)).collect();
    w.run(1, &one_each).await;
    for second in 1..=3 * PERIOD {
        let requests = ids
            .iter()
            .flat_map(|id| (1..=2).map(move |pod| (id.clone(), pod)));
        let mut calls = Vec::new();
        for (id, pod) in requests {
            let state = w.pods_state.entry((id.clone(), pod)).or_insert((0, 0.0));
            state.0 += 1;
            let micros = (state.1 * 1e6).round() as u64;
            *w.reported.entry(id.clone()).or_default() += micros;
            let mut client = w.pods.clone();
            let request = pod_request(&id, "", pod, state.0, 5.0, micros);
            calls.push(async move { (id, pod, client.token_bucket(request).await) });
        }
        for (id, pod, answer) in futures_util::future::join_all(calls).await {
            let answer = answer
                .unwrap_or_else(|e| panic!("{id} pod {pod}: {e}"))
                .into_inner();
            w.pods_state.entry((id, pod)).or_default().1 = answer.granted_tokens;
        }
        // Owed draws are made after the requests are answered: wait for
        // them, at this same second of the store's clock.
        let expected = u64::from(second / PERIOD) + 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let view = w.organization().await;
            let late: Vec<(String, u64)> = view
                .members
                .iter()
                .map(|m| (m.member_id.clone(), m.buckets[0].draws))
                .filter(|(_, draws)| *draws != expected)
                .collect();
            if late.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "second {second}: {} members without draw {expected}: {late:?}",
                late.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        w.clock.advance(Duration::from_secs(1));
        w.second += 1;
    }
    let owed = w.store.stats().owed_draws;
    eprintln!(
        "{backend:?}: {owed} owed draws of {MEMBERS} members' {} periodic draws",
        3 * MEMBERS
    );
    if backend == Backend::Postgres {
        assert!(owed > 0, "no draw found the organisation's row held");
    }
    w.assert_totals_exact().await;
    w.server.stop().await;
}

/// Replica safety: two servers on one PostgreSQL database for 20 s of
/// real time (ten draw periods), three members with a pod on each replica, each pod asking
/// for far more than the organisation's rate, member buckets racing each
/// other for the organisation's row from both replicas. Afterwards:
/// everything granted together is within the bound, each member's totals
/// are what its pods reported, the organisation's count no more than its
/// members reported, and each member drew at most once per draw period.
const RUN: Duration = Duration::from_secs(20);
const REPLICA_BURST: f64 = 200.0;
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];
/// Each pod asks every `TICK` for `WANT` tokens per second of it.
const TICK: Duration = Duration::from_millis(200);
const WANT: f64 = 200.0;
const DRAW_PERIOD: Duration = Duration::from_secs(2);

fn replica_limits(tenant: &str, rate: f64, burst: f64) -> v1::UpdateTenantResourceLimitsRequest {
    v1::UpdateTenantResourceLimitsRequest {
        tenant_id: tenant.into(),
        bucket: String::new(),
        available_tokens: 0.0,
        refill_rate: rate,
        burst_limit: burst,
        as_of: None,
        as_of_consumed_tokens: 0.0,
        update_mask: None,
    }
}

/// One pod: asks every tick until `until`, reporting what it was granted
/// before as consumed. Answers (granted, reported micros).
async fn pod(
    mut client: TokenBucketServiceClient<tonic::transport::Channel>,
    tenant: &'static str,
    instance: u32,
    until: Instant,
) -> (f64, u64) {
    let (mut granted, mut reported, mut last, mut seq) = (0.0, 0u64, 0.0f64, 0u64);
    let mut tick = tokio::time::interval(TICK);
    while Instant::now() < until {
        tick.tick().await;
        seq += 1;
        let micros = (last * 1e6).round() as u64;
        let answer = client
            .token_bucket(pod_request(
                tenant,
                "",
                instance,
                seq,
                WANT * TICK.as_secs_f64(),
                micros,
            ))
            .await
            .unwrap_or_else(|e| panic!("{tenant} pod {instance}: {e}"))
            .into_inner();
        reported += micros;
        last = answer.granted_tokens;
        granted += answer.granted_tokens;
    }
    (granted, reported)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_organisations_bound_holds_across_two_replicas() {
    let backing = Backing::new(Backend::Postgres).await;
    let mut settings = BucketSettings::default();
    settings.bucket.draw_period = DRAW_PERIOD;
    let replicas = [
        TestServer::start(backing.open(settings.clone()).await).await,
        TestServer::start(backing.open(settings).await).await,
    ];
    let mut admin = replicas[0].admin().await;
    admin
        .create_organization(v1::CreateOrganizationRequest {
            organization_id: "acme".into(),
            display_name: String::new(),
        })
        .await
        .expect("create");
    admin
        .update_tenant_resource_limits(replica_limits("acme", RATE, REPLICA_BURST))
        .await
        .expect("the organisation's limits");
    for member in MEMBERS {
        admin
            .update_tenant_resource_limits(replica_limits(member, 10_000.0, 10_000.0))
            .await
            .expect("a member's limits");
        admin
            .add_organization_member(v1::AddOrganizationMemberRequest {
                organization_id: "acme".into(),
                member_id: member.into(),
                guaranteed_rates: Default::default(),
            })
            .await
            .expect("join");
    }
    let started = Instant::now();
    let until = started + RUN;
    let mut pods = Vec::new();
    for member in MEMBERS {
        for (i, replica) in replicas.iter().enumerate() {
            let instance = u32::try_from(i + 1).expect("small");
            pods.push((
                member,
                tokio::spawn(pod(replica.pods().await, member, instance, until)),
            ));
        }
    }
    let mut total = 0.0;
    let mut reported = std::collections::BTreeMap::<&str, u64>::new();
    for (member, task) in pods {
        let (granted, micros) = task.await.expect("a pod");
        total += granted;
        *reported.entry(member).or_default() += micros;
    }
    let secs = started.elapsed().as_secs_f64();
    let rt = RATE * secs;
    let bound = REPLICA_BURST + rt + EPSILON * rt;
    eprintln!(
        "3 members on 2 replicas for {secs:.1} s: granted {total:.0} together, {:.1} % of R·T (bound {bound:.0})",
        total / rt * 100.0
    );
    assert!(total <= bound, "granted {total} together, bound {bound}");
    assert!(
        total >= 0.8 * rt,
        "granted {total} of {rt}: capacity unused"
    );
    let mut all = 0;
    for member in MEMBERS {
        let tenant = support::server::get_tenant(&mut admin, member)
            .await
            .expect("the member");
        let stored = tenant.consumption.expect("totals").request_unit_micros;
        assert_eq!(
            stored, reported[member],
            "{member}: totals differ from reported"
        );
        all += stored;
    }
    let org = support::server::get_tenant(&mut admin, "acme")
        .await
        .expect("the organisation");
    let org_micros = org.consumption.expect("totals").request_unit_micros;
    assert!(org_micros <= all && org_micros > 0, "{org_micros} of {all}");
    let view = admin
        .get_organization(v1::GetOrganizationRequest {
            organization_id: "acme".into(),
        })
        .await
        .expect("the organisation")
        .into_inner()
        .organization
        .expect("an organisation");
    let most = (secs / DRAW_PERIOD.as_secs_f64()).ceil() as u64 + 1;
    for member in &view.members {
        let draws = member.buckets[0].draws;
        eprintln!("{}: {draws} draws in {secs:.1} s", member.member_id);
        assert!(
            draws <= most,
            "{}: {draws} draws, at most {most}",
            member.member_id
        );
    }
    for replica in replicas {
        replica.stop().await;
    }
}

for_each_store!(
    members_share_the_organisations_rate_by_demand,
    an_idle_members_part_goes_to_a_busy_one_within_two_periods,
    a_guarantee_is_met_within_two_periods_of_waking,
    a_member_taken_out_runs_on_its_own_limits_at_once,
    refusals_name_their_reason_and_change_nothing,
    an_organisations_tier_and_budget_limit_its_members,
    members_due_together_all_draw_on_time,
);
