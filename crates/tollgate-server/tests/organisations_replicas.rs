//! An organisation's bound holds across replicas: two servers on one
//! PostgreSQL database, for a minute of real time, three member tenants
//! with pods on both replicas, each pod asking for far more than the
//! organisation's rate. Member buckets draw from the organisation's
//! bucket in the transactions of whichever replica serves them, racing
//! each other for its row.
//!
//! Checked afterwards: everything the members' pods were granted together
//! is at most the organisation's burst + R·T + ε·R·T; each member's exact
//! totals are what its pods reported; the organisation's totals count no
//! more than its members reported; and each member drew at most once per
//! draw period.

mod support;

use std::time::{Duration, Instant};

use support::server::TestServer;
use support::{Backend, Backing};
use tollgate_proto::v1;
use tollgate_proto::v1::token_bucket_service_client::TokenBucketServiceClient;
use tollgate_server::store::BucketSettings;

const RUN: Duration = Duration::from_secs(60);
const RATE: f64 = 100.0;
const BURST: f64 = 200.0;
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];
/// Each pod asks every `TICK` for `WANT` tokens per second of it.
const TICK: Duration = Duration::from_millis(200);
const WANT: f64 = 200.0;
const DRAW_PERIOD: Duration = Duration::from_secs(2);
const EPSILON: f64 = 0.12;

fn limits(tenant: &str, rate: f64, burst: f64) -> v1::UpdateTenantResourceLimitsRequest {
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
            .token_bucket(v1::TokenBucketRequest {
                tenant_id: tenant.into(),
                bucket: String::new(),
                instance_id: instance,
                instance_lease: b"lease".to_vec(),
                seq,
                requested_tokens: WANT * TICK.as_secs_f64(),
                shares: 1.0,
                target_request_period: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                consumption_since_last_request: Some(v1::Consumption {
                    request_unit_micros: micros,
                    ..v1::Consumption::default()
                }),
                next_live_instance_id: None,
                returned_tokens: 0.0,
                fallback_tokens: 0.0,
                fallback_duration: None,
            })
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
        .update_tenant_resource_limits(limits("acme", RATE, BURST))
        .await
        .expect("the organisation's limits");
    for member in MEMBERS {
        admin
            .update_tenant_resource_limits(limits(member, 10_000.0, 10_000.0))
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
    let bound = BURST + rt + EPSILON * rt;
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
