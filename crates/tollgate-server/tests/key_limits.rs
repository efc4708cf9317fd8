//! Per-key checks through the wire contract alone (`KeyLimits/Check`, and
//! `Admin` to define the tier), on the embedded store and PostgreSQL, with
//! the store's clock moved by the test.

mod support;

use std::sync::Arc;

use support::server::TestServer;
use support::{Backend, Backing, ManualClock};
use tollgate_proto::v1::{self, key_limits_client::KeyLimitsClient};
use tollgate_server::store::BucketSettings;
use tonic::Code;
use tonic::transport::Channel;

struct Fixture {
    server: TestServer,
    checks: KeyLimitsClient<Channel>,
    clock: ManualClock,
    _backing: Backing,
}

fn definition(
    bucket: &str,
    refill_rate: f64,
    burst_limit: f64,
    kind: v1::BucketKind,
) -> v1::BucketDefinition {
    v1::BucketDefinition {
        quota: None,
        bucket: bucket.into(),
        refill_rate,
        burst_limit,
        initial_tokens: None,
        kind: kind as i32,
        enforce: None,
    }
}

/// A server on `backend` with tier `pro` (`per-user`: 2/s burst 10;
/// `per-tenant`: 10/s burst 5; `emails`: shared) and tenants `acme`,
/// `globex` on it.
async fn fixture(backend: Backend) -> Fixture {
    let clock = ManualClock::default();
    clock.set_secs(1_000.0);
    let backing = Backing::new(backend).await;
    let store = backing
        .open_with_clock(BucketSettings::default(), clock.as_clock())
        .await;
    let server = TestServer::start(store).await;
    let mut admin = server.admin().await;
    admin
        .put_tier(v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "pro".into(),
                buckets: vec![
                    definition("per-user", 2.0, 10.0, v1::BucketKind::PerKey),
                    definition("per-tenant", 10.0, 5.0, v1::BucketKind::PerKey),
                    definition("emails", 1.0, 10.0, v1::BucketKind::Shared),
                ],
                ..v1::Tier::default()
            }),
            dry_run: false,
        })
        .await
        .expect("put tier");
    for tenant in ["acme", "globex"] {
        admin
            .create_tenant(v1::CreateTenantRequest {
                tenant_id: tenant.into(),
                tier: "pro".into(),
            })
            .await
            .expect("create tenant");
    }
    let checks = KeyLimitsClient::new(server.channel().await);
    Fixture {
        server,
        checks,
        clock,
        _backing: backing,
    }
}

fn item(tenant: &str, bucket: &str, key: &str, tokens: f64) -> v1::CheckItem {
    v1::CheckItem {
        tenant_id: tenant.into(),
        bucket: bucket.into(),
        key: key.into(),
        tokens,
        request_id: String::new(),
    }
}

fn with_id(mut item: v1::CheckItem, id: &str) -> v1::CheckItem {
    item.request_id = id.into();
    item
}

impl Fixture {
    async fn check(
        &mut self,
        items: Vec<v1::CheckItem>,
    ) -> Result<v1::CheckResponse, tonic::Status> {
        self.checks
            .check(v1::CheckRequest { items })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn ok(&mut self, items: Vec<v1::CheckItem>) -> v1::CheckResponse {
        self.check(items).await.expect("check answered")
    }

    /// The tokens `key` holds now (a check of 0 tokens).
    async fn level(&mut self, tenant: &str, bucket: &str, key: &str) -> f64 {
        self.ok(vec![item(tenant, bucket, key, 0.0)]).await.answers[0].remaining_tokens
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

fn secs(d: &Option<prost_types::Duration>) -> Option<f64> {
    d.map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

async fn exact_refill_and_cap(backend: Backend) {
    let mut f = fixture(backend).await;
    let first = f.ok(vec![item("acme", "per-user", "u1", 10.0)]).await;
    assert!(first.allowed, "a key never seen starts full");
    let a = &first.answers[0];
    assert_eq!(a.remaining_tokens, 0.0);
    assert_eq!((a.refill_rate, a.burst_limit), (2.0, 10.0));
    assert_eq!(secs(&a.reset_after), Some(5.0));
    let refused = f.ok(vec![item("acme", "per-user", "u1", 1.0)]).await;
    assert!(!refused.allowed);
    assert_eq!(secs(&refused.answers[0].retry_after), Some(0.5));
    f.clock.set_secs(1_001.25);
    assert_eq!(
        f.level("acme", "per-user", "u1").await,
        2.5,
        "2/s for 1.25 s"
    );
    let more_than_burst = f.ok(vec![item("acme", "per-user", "u1", 11.0)]).await;
    assert!(!more_than_burst.allowed);
    assert_eq!(more_than_burst.answers[0].retry_after, None, "never");
    f.clock.set_secs(2_000.0);
    assert_eq!(
        f.level("acme", "per-user", "u1").await,
        10.0,
        "capped at the burst"
    );
    assert_eq!(
        f.server.store.key_counts().await.expect("counts").keys,
        0,
        "a key found full has no row"
    );
    f.stop().await;
}

async fn items_are_taken_together_or_not_at_all(backend: Backend) {
    let mut f = fixture(backend).await;
    // per-tenant holds 5; per-user 10: the fourth call of 2 fails on the
    // tenant's bucket, and takes nothing from the user's.
    for n in 0..2 {
        let answer = f
            .ok(vec![
                item("acme", "per-user", "u1", 2.0),
                item("acme", "per-tenant", "all", 2.0),
            ])
            .await;
        assert!(answer.allowed, "call {n}");
    }
    let refused = f
        .ok(vec![
            item("acme", "per-user", "u1", 2.0),
            item("acme", "per-tenant", "all", 2.0),
        ])
        .await;
    assert!(!refused.allowed);
    assert!(refused.answers.iter().all(|a| !a.allowed));
    assert_eq!(
        secs(&refused.answers[0].retry_after),
        Some(0.0),
        "the user's tokens are there"
    );
    assert_eq!(secs(&refused.answers[1].retry_after), Some(0.1));
    assert_eq!(
        f.level("acme", "per-user", "u1").await,
        6.0,
        "nothing taken"
    );
    assert_eq!(f.level("acme", "per-tenant", "all").await, 1.0);
    // Two items on one key take in turn.
    let twice = f
        .ok(vec![
            item("acme", "per-user", "u2", 6.0),
            item("acme", "per-user", "u2", 6.0),
        ])
        .await;
    assert!(!twice.allowed);
    assert_eq!(f.level("acme", "per-user", "u2").await, 10.0);
    f.stop().await;
}

async fn retries_are_answered_once(backend: Backend) {
    let mut f = fixture(backend).await;
    let call = vec![
        with_id(item("acme", "per-user", "u1", 4.0), "req-1"),
        with_id(item("acme", "per-tenant", "all", 1.0), "req-1"),
    ];
    let first = f.ok(call.clone()).await;
    assert!(first.allowed);
    f.clock.set_secs(1_000.5);
    for _ in 0..3 {
        let retry = f.ok(call.clone()).await;
        assert!(retry.allowed);
        for (r, a) in retry.answers.iter().zip(&first.answers) {
            assert!(r.replayed);
            assert_eq!(r.remaining_tokens, a.remaining_tokens, "the first answer");
        }
    }
    assert_eq!(
        f.level("acme", "per-user", "u1").await,
        7.0,
        "6 + 0.5 s × 2/s: taken once"
    );
    let err = f
        .check(vec![with_id(item("acme", "per-user", "u1", 5.0), "req-1")])
        .await
        .expect_err("other tokens under the same id");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("items[0].request_id"),
        "{}",
        err.message()
    );
    // The same id on another key is another check.
    let other = f
        .ok(vec![with_id(item("acme", "per-user", "u9", 4.0), "req-1")])
        .await;
    assert!(!other.answers[0].replayed);
    // A refused check's answer is kept too: its retry is refused again
    // even once the tokens are there.
    let refused = f
        .ok(vec![with_id(item("acme", "per-user", "u1", 9.0), "req-2")])
        .await;
    assert!(!refused.allowed);
    f.clock.set_secs(1_010.0);
    let again = f
        .ok(vec![with_id(item("acme", "per-user", "u1", 9.0), "req-2")])
        .await;
    assert!(!again.allowed && again.answers[0].replayed);
    f.stop().await;
}

async fn idle_keys_are_removed_and_restart_full(backend: Backend) {
    let mut f = fixture(backend).await;
    for n in 0..50 {
        let key = format!("user-{n}");
        let answer = f
            .ok(vec![with_id(
                item("acme", "per-user", &key, 1.0 + f64::from(n % 9)),
                "r",
            )])
            .await;
        assert!(answer.allowed);
    }
    let store = Arc::clone(&f.server.store);
    let counts = store.key_counts().await.expect("counts");
    assert_eq!((counts.keys, counts.records), (50, 50));
    // 4.5 s later the keys that took at most 9 tokens... all took ≤ 9: full
    // after 4.5 s at 2/s; the records stay until they expire.
    f.clock.set_secs(1_004.5);
    let swept = store.sweep_keys(20).await.expect("sweep");
    assert_eq!(swept.keys, 20);
    assert!(swept.more);
    while store.sweep_keys(20).await.expect("sweep").more {}
    let counts = store.key_counts().await.expect("counts");
    assert_eq!((counts.keys, counts.records), (0, 50));
    assert_eq!(
        f.level("acme", "per-user", "user-8").await,
        10.0,
        "full again"
    );
    f.clock.set_secs(1_000.0 + 601.0);
    while store.sweep_keys(20).await.expect("sweep").more {}
    assert_eq!(store.key_counts().await.expect("counts").records, 0);
    assert!(store.stats().keys_removed >= 50);
    f.stop().await;
}

async fn keys_of_different_tenants_and_buckets_never_mix(backend: Backend) {
    let mut f = fixture(backend).await;
    let odd_keys = ["u1", "ключ-🔑", "a\u{0}b", "a", "A", &"k".repeat(512)];
    for key in odd_keys {
        assert!(
            f.ok(vec![item("acme", "per-user", key, 3.0)]).await.allowed,
            "{key:?}"
        );
    }
    for key in odd_keys {
        assert_eq!(f.level("acme", "per-user", key).await, 7.0, "{key:?}");
        assert_eq!(f.level("globex", "per-user", key).await, 10.0, "{key:?}");
        assert_eq!(f.level("acme", "per-tenant", key).await, 5.0, "{key:?}");
    }
    f.stop().await;
}

async fn bad_input_is_refused_naming_the_field_and_takes_nothing(backend: Backend) {
    let mut f = fixture(backend).await;
    let good = item("acme", "per-user", "u1", 1.0);
    let cases: Vec<(Vec<v1::CheckItem>, Code, &str)> = vec![
        (vec![], Code::InvalidArgument, "items"),
        (vec![good.clone(); 65], Code::InvalidArgument, "items"),
        (
            vec![good.clone(), item("acme", "per-user", "", 1.0)],
            Code::InvalidArgument,
            "items[1].key",
        ),
        (
            vec![
                good.clone(),
                item("acme", "per-user", &"k".repeat(513), 1.0),
            ],
            Code::InvalidArgument,
            "items[1].key",
        ),
        (
            vec![good.clone(), item("acme", "per-user", "u1", f64::NAN)],
            Code::InvalidArgument,
            "items[1].tokens",
        ),
        (
            vec![good.clone(), item("acme", "per-user", "u1", -1.0)],
            Code::InvalidArgument,
            "items[1].tokens",
        ),
        (
            vec![good.clone(), item("acme", "per-user", "u1", f64::INFINITY)],
            Code::InvalidArgument,
            "items[1].tokens",
        ),
        (
            vec![good.clone(), item("acme", "nope", "u1", 1.0)],
            Code::NotFound,
            "items[1].bucket",
        ),
        (
            vec![good.clone(), item("acme", "emails", "u1", 1.0)],
            Code::InvalidArgument,
            "items[1].bucket",
        ),
        (
            vec![good.clone(), item("acme", "", "u1", 1.0)],
            Code::InvalidArgument,
            "items[1].bucket",
        ),
        (
            vec![good.clone(), item("acme", "bad name!", "u1", 1.0)],
            Code::InvalidArgument,
            "items[1].bucket",
        ),
        (
            vec![good.clone(), item("", "per-user", "u1", 1.0)],
            Code::InvalidArgument,
            "items[1].tenant_id",
        ),
        (
            vec![good.clone(), item("initech", "per-user", "u1", 1.0)],
            Code::NotFound,
            "items[1].bucket",
        ),
        (
            vec![
                good.clone(),
                with_id(item("acme", "per-user", "u1", 1.0), &"i".repeat(129)),
            ],
            Code::InvalidArgument,
            "items[1].request_id",
        ),
    ];
    for (items, code, field) in cases {
        let err = f.check(items).await.expect_err(field);
        assert_eq!(err.code(), code, "{field}: {}", err.message());
        assert!(err.message().contains(field), "{field}: {}", err.message());
        assert!(err.message().len() < 400, "brief: {}", err.message());
    }
    assert_eq!(
        f.level("acme", "per-user", "u1").await,
        10.0,
        "nothing taken"
    );
    f.stop().await;
}

async fn a_definition_change_applies_to_the_next_check(backend: Backend) {
    let mut f = fixture(backend).await;
    assert!(
        f.ok(vec![item("acme", "per-user", "u1", 10.0)])
            .await
            .allowed
    );
    let mut admin = f.server.admin().await;
    admin
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: "acme".into(),
            bucket: Some(definition(
                "per-user",
                100.0,
                1000.0,
                v1::BucketKind::PerKey,
            )),
        })
        .await
        .expect("override");
    f.clock.set_secs(1_001.0);
    let answer = f.ok(vec![item("acme", "per-user", "u1", 0.0)]).await;
    assert_eq!(answer.answers[0].remaining_tokens, 100.0, "0 + 1 s × 100/s");
    assert_eq!(answer.answers[0].burst_limit, 1000.0);
    assert_eq!(
        f.level("globex", "per-user", "u1").await,
        10.0,
        "globex keeps the tier's"
    );
    f.stop().await;
}

async fn deleting_a_tenant_deletes_its_keys_and_records(backend: Backend) {
    let mut f = fixture(backend).await;
    for key in ["u1", "u2"] {
        assert!(
            f.ok(vec![with_id(item("acme", "per-user", key, 4.0), "r")])
                .await
                .allowed
        );
    }
    assert!(
        f.ok(vec![item("globex", "per-user", "u1", 4.0)])
            .await
            .allowed
    );
    let mut admin = f.server.admin().await;
    admin
        .delete_tenant(v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            dry_run: false,
        })
        .await
        .expect("delete acme");
    let counts = f.server.store.key_counts().await.expect("counts");
    assert_eq!((counts.keys, counts.records), (1, 0), "globex's key stays");
    let gone = f.check(vec![item("acme", "per-user", "u1", 1.0)]).await;
    assert_eq!(gone.expect_err("no such tenant").code(), Code::NotFound);
    admin
        .create_tenant(v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "pro".into(),
        })
        .await
        .expect("acme again");
    assert_eq!(f.level("acme", "per-user", "u1").await, 10.0, "starts full");
    let retry = f
        .ok(vec![with_id(item("acme", "per-user", "u2", 4.0), "r")])
        .await;
    assert!(
        !retry.answers[0].replayed,
        "the old record went with the tenant"
    );
    assert_eq!(f.level("globex", "per-user", "u1").await, 6.0);
    f.stop().await;
}

/// Operators see per-key buckets through the Admin API: `DescribeTenant`
/// and `ListKeyBuckets` give each its definition (tier or override), the
/// keys stored and the busiest of them with their tokens now, and this
/// replica's checks and refusals per second over the window they name;
/// `ListKeyBuckets` pages, and refuses bad input naming the field.
async fn operators_see_per_key_buckets_with_keys_and_rates(backend: Backend) {
    let mut f = fixture(backend).await;
    let mut admin = f.server.admin().await;
    admin
        .set_bucket_override(v1::SetBucketOverrideRequest {
            tenant_id: "globex".into(),
            bucket: Some(definition("per-user", 1.0, 4.0, v1::BucketKind::PerKey)),
        })
        .await
        .expect("override");
    // acme/per-user: u1 left with 2, u2 with 7, u3 refused (11 > 10).
    f.ok(vec![item("acme", "per-user", "u1", 8.0)]).await;
    f.ok(vec![item("acme", "per-user", "u2", 3.0)]).await;
    let refused = f.ok(vec![item("acme", "per-user", "u3", 11.0)]).await;
    assert!(!refused.allowed);
    f.ok(vec![item("acme", "per-tenant", "all", 1.0)]).await;

    let acme = admin
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: "acme".into(),
        })
        .await
        .expect("describe")
        .into_inner()
        .tenant
        .expect("tenant");
    let names: Vec<&str> = acme.key_buckets.iter().map(|b| b.bucket.as_str()).collect();
    assert_eq!(names, ["per-tenant", "per-user"]);
    let users = &acme.key_buckets[1];
    assert_eq!(users.tenant_id, "acme");
    assert_eq!(
        users.limits,
        Some(v1::ResourceLimits {
            refill_rate: 2.0,
            burst_limit: 10.0
        })
    );
    assert!(!users.overridden);
    assert_eq!(users.keys_stored, 2);
    let busiest: Vec<(&str, f64, Option<f64>)> = users
        .busiest_keys
        .iter()
        .map(|k| (k.key.as_str(), k.tokens, secs(&k.full_in)))
        .collect();
    assert_eq!(busiest, [("u1", 2.0, Some(4.0)), ("u2", 7.0, Some(1.5))]);
    // Three checks, one refused, over the window the answer names.
    let window = secs(&users.rate_window).expect("window");
    assert!(window > 0.0 && window <= 10.0, "{window}");
    assert!(
        (users.checks_per_second * window - 3.0).abs() < 1e-6,
        "{} checks/s over {window} s",
        users.checks_per_second
    );
    assert!((users.refusals_per_second * window - 1.0).abs() < 1e-6);
    assert_eq!(
        users.read_at.map(|t| (t.seconds, t.nanos)),
        Some((1_000, 0)),
        "the store's clock"
    );
    let per_tenant = &acme.key_buckets[0];
    assert_eq!(per_tenant.keys_stored, 1);
    assert!((per_tenant.checks_per_second * window - 1.0).abs() < 0.5);
    assert_eq!(per_tenant.refusals_per_second, 0.0);

    // Every tenant's, a page of one at a time.
    let mut listed = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_key_buckets(v1::ListKeyBucketsRequest {
                page_size: 1,
                page_token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        listed.extend(page.key_buckets);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let keys: Vec<String> = listed
        .iter()
        .map(|b| format!("{}/{}", b.tenant_id, b.bucket))
        .collect();
    assert_eq!(
        keys,
        [
            "acme/per-tenant",
            "acme/per-user",
            "globex/per-tenant",
            "globex/per-user"
        ]
    );
    let globex_users = &listed[3];
    assert!(globex_users.overridden);
    assert_eq!(
        globex_users.limits.map(|l| (l.refill_rate, l.burst_limit)),
        Some((1.0, 4.0))
    );
    assert_eq!(globex_users.keys_stored, 0);
    assert_eq!(globex_users.checks_per_second, 0.0);
    // One tenant's, with one busiest key each.
    let one = admin
        .list_key_buckets(v1::ListKeyBucketsRequest {
            tenant_id: "acme".into(),
            busiest_keys: 1,
            ..Default::default()
        })
        .await
        .expect("acme's")
        .into_inner();
    assert_eq!(one.key_buckets.len(), 2);
    assert_eq!(one.key_buckets[1].busiest_keys.len(), 1);
    assert_eq!(one.key_buckets[1].keys_stored, 2);
    // Shared buckets stay in ListTenants, per-key ones do not appear there.
    let tenants = admin
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect("list tenants")
        .into_inner();
    assert!(tenants.tenants.iter().all(|t| t.bucket == "emails"));

    for (request, field) in [
        (
            v1::ListKeyBucketsRequest {
                busiest_keys: 101,
                ..Default::default()
            },
            "busiest_keys",
        ),
        (
            v1::ListKeyBucketsRequest {
                page_size: 1001,
                ..Default::default()
            },
            "page_size",
        ),
        (
            v1::ListKeyBucketsRequest {
                page_token: "acme/".into(),
                ..Default::default()
            },
            "page_token",
        ),
        (
            v1::ListKeyBucketsRequest {
                tenant_id: "no spaces".into(),
                ..Default::default()
            },
            "tenant_id",
        ),
    ] {
        let refused = admin
            .list_key_buckets(request)
            .await
            .expect_err("bad input");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().starts_with(field),
            "{}",
            refused.message()
        );
    }
    f.stop().await;
}

for_each_store!(
    exact_refill_and_cap,
    items_are_taken_together_or_not_at_all,
    retries_are_answered_once,
    idle_keys_are_removed_and_restart_full,
    keys_of_different_tenants_and_buckets_never_mix,
    bad_input_is_refused_naming_the_field_and_takes_nothing,
    a_definition_change_applies_to_the_next_check,
    deleting_a_tenant_deletes_its_keys_and_records,
    operators_see_per_key_buckets_with_keys_and_rates,
);
