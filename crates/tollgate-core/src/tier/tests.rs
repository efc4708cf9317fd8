//! The tier rules without a store: what onboarding, switches and
//! overrides write.

use super::*;

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn name(s: &str) -> BucketName {
    BucketName::parse("bucket", s).expect("bucket name")
}

fn tier_name(s: &str) -> TierName {
    TierName::parse("tier", s).expect("tier name")
}

fn tenant() -> TenantId {
    TenantId::parse("tenant_id", "t1234").expect("tenant id")
}

fn def(refill_rate: f64, burst_limit: f64) -> BucketDefinition {
    BucketDefinition {
        quota: None,
        limits: Limits {
            refill_rate,
            burst_limit,
        },
        initial_tokens: None,
        kind: BucketKind::Shared,
        enforce: true,
    }
}

fn tier(buckets: &[(&str, BucketDefinition)]) -> Tier {
    Tier::from_definitions(
        "tier.buckets",
        buckets.iter().map(|(n, d)| (*n, d.clone())),
        at(0.0),
    )
    .expect("valid tier")
}

fn pro() -> Tier {
    tier(&[
        ("schedule-email", def(10.0, 100.0)),
        ("invoke-doc-summary-ai", def(1.0, 20.0)),
    ])
}

fn free() -> Tier {
    tier(&[("schedule-email", def(1.0, 10.0))])
}

fn empty() -> LoadedTenant {
    LoadedTenant {
        record: None,
        buckets: BTreeMap::new(),
        tier: None,
        previous_tier: None,
        request_units: None,
    }
}

/// Applies an edit to what was loaded, as a store would; the tier it is
/// on becomes the previous tier of the next change.
fn apply(loaded: &mut LoadedTenant, edit: TenantEdit) {
    loaded.buckets = edit.buckets_after(loaded);
    loaded.previous_tier = edit.record.tier.as_ref().and(loaded.tier.clone());
    loaded.record = Some(edit.record);
}

#[test]
fn onboarding_provisions_every_bucket_of_the_tier() {
    let loaded = LoadedTenant {
        tier: Some(pro()),
        ..empty()
    };
    let create = TenantChange::Create {
        tier: tier_name("pro"),
    };
    let edit = change_tenant(&tenant(), &create, &loaded, at(5.0)).expect("onboard");
    assert_eq!(edit.record.tier, Some(tier_name("pro")));
    let names: Vec<_> = edit.created.keys().map(BucketName::as_str).collect();
    assert_eq!(names, ["invoke-doc-summary-ai", "schedule-email"]);
    let email = &edit.created[&name("schedule-email")];
    assert_eq!(email.state.tokens, 100.0, "starts full by default");
    assert_eq!(email.state.limits.refill_rate, 10.0);
    assert!(email.state.configured);
    assert!(edit.changed.is_empty() && edit.retired.is_empty());

    let mut with_initial = pro();
    with_initial
        .buckets
        .get_mut(&name("schedule-email"))
        .expect("bucket")
        .initial_tokens = Some(5.0);
    let loaded = LoadedTenant {
        tier: Some(with_initial),
        ..empty()
    };
    let edit = change_tenant(&tenant(), &create, &loaded, at(5.0)).expect("onboard");
    assert_eq!(edit.created[&name("schedule-email")].state.tokens, 5.0);
}

#[test]
fn onboarding_an_existing_tenant_or_on_a_missing_tier_is_refused() {
    let create = TenantChange::Create {
        tier: tier_name("pro"),
    };
    let mut loaded = LoadedTenant {
        tier: Some(pro()),
        ..empty()
    };
    loaded.buckets.insert(
        BucketName::REQUEST_UNITS,
        BucketRow::new(def(1.0, 1.0).limits, 1.0, false, at(0.0)),
    );
    assert_eq!(
        change_tenant(&tenant(), &create, &loaded, at(1.0)),
        Err(TierError::TenantExists(tenant()))
    );
    assert_eq!(
        change_tenant(&tenant(), &create, &empty(), at(1.0)),
        Err(TierError::TierNotFound(tier_name("pro")))
    );
}

#[test]
fn a_switch_carries_tokens_over_capped_creates_and_retires() {
    let mut loaded = LoadedTenant {
        tier: Some(pro()),
        ..empty()
    };
    let edit = change_tenant(
        &tenant(),
        &TenantChange::Create {
            tier: tier_name("pro"),
        },
        &loaded,
        at(0.0),
    )
    .expect("onboard");
    apply(&mut loaded, edit);
    // The request-unit bucket is not the tiers' business.
    loaded.buckets.insert(
        BucketName::REQUEST_UNITS,
        BucketRow::new(def(7.0, 70.0).limits, 3.0, true, at(0.0)),
    );
    // Spend down the email bucket to 40, then switch to free (burst 10).
    loaded
        .buckets
        .get_mut(&name("schedule-email"))
        .expect("bucket")
        .state
        .tokens = 40.0;
    loaded.tier = Some(free());
    let switch = TenantChange::SetTier {
        tier: tier_name("free"),
    };
    let edit = change_tenant(&tenant(), &switch, &loaded, at(1.0)).expect("switch");
    assert_eq!(edit.record.tier, Some(tier_name("free")));
    let email = &edit.changed[&name("schedule-email")];
    assert_eq!(email.state.tokens, 10.0, "capped at the new burst");
    assert_eq!(email.state.limits, def(1.0, 10.0).limits);
    assert_eq!(edit.retired, vec![name("invoke-doc-summary-ai")]);
    assert!(edit.created.is_empty());
    // The retired bucket leaves its closed record, with what it was.
    let by = ClosedBy::default();
    let retired = edit.retirements(&tenant(), &loaded, switch.close_reason(), &by, at(1.0));
    let ai = &loaded.buckets[&name("invoke-doc-summary-ai")];
    assert_eq!(retired.len(), 1);
    assert_eq!(retired[0].name, name("invoke-doc-summary-ai"));
    assert_eq!(&retired[0].head, ai);
    assert_eq!(retired[0].closed.totals, ai.totals);
    assert_eq!(retired[0].closed.reason, CloseReason::TierChange);
    assert_eq!(retired[0].closed.closed_at, at(1.0));
    apply(&mut loaded, edit);
    assert!(!loaded.buckets.contains_key(&name("invoke-doc-summary-ai")));

    // Back to pro: the AI bucket is created anew, the email bucket keeps
    // its tokens (below the new burst) after refilling at the old rate.
    loaded
        .buckets
        .get_mut(&name("schedule-email"))
        .expect("bucket")
        .state
        .tokens = 2.0;
    loaded.tier = Some(pro());
    let edit = change_tenant(
        &tenant(),
        &TenantChange::SetTier {
            tier: tier_name("pro"),
        },
        &loaded,
        at(4.0),
    )
    .expect("switch back");
    let email = &edit.changed[&name("schedule-email")];
    assert_eq!(email.state.tokens, 5.0, "2 + 3 s at the old 1/s");
    assert_eq!(
        edit.created.keys().collect::<Vec<_>>(),
        vec![&name("invoke-doc-summary-ai")]
    );
    assert!(edit.retired.is_empty());
    assert!(loaded.buckets.contains_key(&BucketName::REQUEST_UNITS));
}

#[test]
fn an_override_survives_switches_until_cleared() {
    let mut loaded = LoadedTenant {
        tier: Some(pro()),
        ..empty()
    };
    let onboard = TenantChange::Create {
        tier: tier_name("pro"),
    };
    let edit = change_tenant(&tenant(), &onboard, &loaded, at(0.0)).expect("onboard");
    apply(&mut loaded, edit);
    let raise = TenantChange::SetOverride {
        bucket: name("schedule-email"),
        definition: def(50.0, 500.0),
    };
    let edit = change_tenant(&tenant(), &raise, &loaded, at(1.0)).expect("override");
    assert_eq!(
        edit.changed[&name("schedule-email")].state.limits,
        def(50.0, 500.0).limits
    );
    apply(&mut loaded, edit);

    loaded.tier = Some(free());
    let switch = TenantChange::SetTier {
        tier: tier_name("free"),
    };
    let edit = change_tenant(&tenant(), &switch, &loaded, at(2.0)).expect("switch");
    assert!(
        !edit.changed.contains_key(&name("schedule-email")),
        "the override wins over the tier"
    );
    apply(&mut loaded, edit);
    assert_eq!(
        loaded.buckets[&name("schedule-email")].state.limits,
        def(50.0, 500.0).limits
    );

    let clear = TenantChange::ClearOverride {
        bucket: name("schedule-email"),
    };
    let edit = change_tenant(&tenant(), &clear, &loaded, at(3.0)).expect("clear");
    assert_eq!(
        edit.changed[&name("schedule-email")].state.limits,
        def(1.0, 10.0).limits,
        "back to the tier's definition"
    );
    apply(&mut loaded, edit);
    assert_eq!(
        change_tenant(&tenant(), &clear, &loaded, at(4.0)),
        Err(TierError::OverrideNotFound {
            tenant: tenant(),
            bucket: name("schedule-email"),
        })
    );
}

#[test]
fn an_override_of_a_bucket_the_tier_lacks_adds_it_and_clearing_retires_it() {
    let mut loaded = LoadedTenant {
        tier: Some(free()),
        ..empty()
    };
    let onboard = TenantChange::Create {
        tier: tier_name("free"),
    };
    let edit = change_tenant(&tenant(), &onboard, &loaded, at(0.0)).expect("onboard");
    apply(&mut loaded, edit);
    let extra = TenantChange::SetOverride {
        bucket: name("export"),
        definition: def(2.0, 4.0),
    };
    let edit = change_tenant(&tenant(), &extra, &loaded, at(1.0)).expect("override");
    assert_eq!(edit.created[&name("export")].state.tokens, 4.0);
    apply(&mut loaded, edit);
    let clear = TenantChange::ClearOverride {
        bucket: name("export"),
    };
    let edit = change_tenant(&tenant(), &clear, &loaded, at(2.0)).expect("clear");
    assert_eq!(edit.retired, vec![name("export")]);
}

#[test]
fn bad_definitions_are_refused_naming_the_field() {
    let cases: Vec<(Vec<(&str, BucketDefinition)>, &str)> = vec![
        (vec![("", def(1.0, 1.0))], "tier.buckets[0].bucket"),
        (vec![("a b", def(1.0, 1.0))], "tier.buckets[0].bucket"),
        (
            vec![("x", def(f64::NAN, 1.0))],
            "tier.buckets[0].refill_rate",
        ),
        (vec![("x", def(-1.0, 1.0))], "tier.buckets[0].refill_rate"),
        (
            vec![("x", def(1.0, f64::INFINITY))],
            "tier.buckets[0].burst_limit",
        ),
        (
            vec![("x", def(1.0, 1.0)), ("x", def(2.0, 2.0))],
            "tier.buckets[1].bucket",
        ),
        (
            vec![(
                "x",
                BucketDefinition {
                    initial_tokens: Some(-1.0),
                    ..def(1.0, 1.0)
                },
            )],
            "tier.buckets[0].initial_tokens",
        ),
    ];
    for (definitions, field) in cases {
        let err = Tier::from_definitions("tier.buckets", definitions.clone(), at(0.0))
            .expect_err("refused");
        assert_eq!(err.field, field, "{definitions:?}: {err}");
    }
    let many: Vec<String> = (0..=MAX_TIER_BUCKETS).map(|i| format!("b{i}")).collect();
    let err = Tier::from_definitions(
        "tier.buckets",
        many.iter().map(|n| (n.as_str(), def(1.0, 1.0))),
        at(0.0),
    )
    .expect_err("too many");
    assert_eq!(err.field, "tier.buckets");
    let request_units = TenantChange::SetOverride {
        bucket: BucketName::REQUEST_UNITS,
        definition: def(1.0, 1.0),
    };
    assert!(matches!(
        change_tenant(&tenant(), &request_units, &empty(), at(0.0)),
        Err(TierError::InvalidInput(e)) if e.field == "bucket.bucket"
    ));
}

#[test]
fn buckets_made_by_hand_and_the_request_unit_bucket_are_never_retired() {
    let hand = BucketRow::new(def(3.0, 30.0).limits, 30.0, true, at(0.0));
    let mut loaded = LoadedTenant {
        tier: Some(free()),
        ..empty()
    };
    loaded.buckets.insert(name("reports"), hand.clone());
    loaded
        .buckets
        .insert(BucketName::REQUEST_UNITS, hand.clone());
    // An override on a tenant on no tier touches only its own bucket.
    let extra = TenantChange::SetOverride {
        bucket: name("export"),
        definition: def(2.0, 4.0),
    };
    let edit = change_tenant(&tenant(), &extra, &loaded, at(1.0)).expect("override");
    assert!(edit.retired.is_empty(), "{:?}", edit.retired);
    apply(&mut loaded, edit);
    // Nor does a tier switch, or a tier's new definition.
    let switch = TenantChange::SetTier {
        tier: tier_name("free"),
    };
    let edit = change_tenant(&tenant(), &switch, &loaded, at(2.0)).expect("switch");
    assert!(edit.retired.is_empty(), "{:?}", edit.retired);
    apply(&mut loaded, edit);
    loaded.tier = Some(tier(&[("other", def(1.0, 1.0))]));
    let reapply = TenantChange::Reapply {
        previous: Some(free()),
    };
    let edit = change_tenant(&tenant(), &reapply, &loaded, at(3.0)).expect("reapply");
    assert_eq!(
        edit.retired,
        vec![name("schedule-email")],
        "only what free provisioned"
    );
    assert!(edit.created.contains_key(&name("other")));
}

#[test]
fn per_key_definitions_provision_no_rows() {
    let per_key = BucketDefinition {
        kind: BucketKind::PerKey,
        ..def(5.0, 50.0)
    };
    let tier = tier(&[
        ("schedule-email", def(1.0, 10.0)),
        ("api-calls-per-user", per_key.clone()),
    ]);
    let loaded = LoadedTenant {
        tier: Some(tier.clone()),
        ..empty()
    };
    let onboard = TenantChange::Create {
        tier: tier_name("pro"),
    };
    let edit = change_tenant(&tenant(), &onboard, &loaded, at(0.0)).expect("onboard");
    let created: Vec<_> = edit.created.keys().map(BucketName::as_str).collect();
    assert_eq!(created, ["schedule-email"]);
    assert_eq!(
        definitions(Some(&tier), &BTreeMap::new())[&name("api-calls-per-user")].kind,
        BucketKind::PerKey
    );
    let with_initial = BucketDefinition {
        initial_tokens: Some(1.0),
        ..per_key
    };
    let err = Tier::from_definitions("tier.buckets", [("k", with_initial)], at(0.0))
        .expect_err("keys start full");
    assert_eq!(err.field, "tier.buckets[0].initial_tokens");
}

#[test]
fn table_limits_are_the_tenants_own_over_its_tiers_until_cleared() {
    let table = |s: &str| TableName::parse("table", s).expect("table name");
    let reads = |r: f64| TableLimits {
        max_reads_per_second: Some(r),
        max_writes_per_second: None,
    };
    let mut on_pro = pro();
    on_pro.tables = table_limits("tables", [("orders", reads(100.0)), ("users", reads(5.0))])
        .expect("valid tables");
    let mut loaded = LoadedTenant {
        tier: Some(on_pro.clone()),
        ..empty()
    };
    let edit = change_tenant(
        &tenant(),
        &TenantChange::Create {
            tier: tier_name("pro"),
        },
        &loaded,
        at(1.0),
    )
    .expect("onboard");
    apply(&mut loaded, edit);
    let set = TenantChange::SetTableLimits {
        table: table("orders"),
        limits: reads(7.0),
    };
    let edit = change_tenant(&tenant(), &set, &loaded, at(2.0)).expect("set");
    assert!(edit.changes_no_bucket(), "table limits provision no bucket");
    apply(&mut loaded, edit);
    let record = loaded.record.clone().expect("record");
    let effective = effective_limits(Some(&on_pro.tables), &record.table_overrides);
    assert_eq!(effective[&table("orders")], reads(7.0));
    assert_eq!(effective[&table("users")], reads(5.0));

    let clear = TenantChange::ClearTableLimits {
        table: table("orders"),
    };
    let edit = change_tenant(&tenant(), &clear, &loaded, at(3.0)).expect("clear");
    apply(&mut loaded, edit);
    assert!(
        loaded
            .record
            .as_ref()
            .expect("record")
            .table_overrides
            .is_empty()
    );
    assert_eq!(
        change_tenant(&tenant(), &clear, &loaded, at(4.0)),
        Err(TierError::TableLimitsNotFound {
            tenant: tenant(),
            table: table("orders"),
        })
    );
    // Bad limits name their field and change nothing.
    let bad = TenantChange::SetTableLimits {
        table: table("orders"),
        limits: reads(f64::NAN),
    };
    let err = change_tenant(&tenant(), &bad, &loaded, at(5.0)).expect_err("NaN");
    assert!(
        matches!(&err, TierError::InvalidInput(e) if e.field == "max_reads_per_second"),
        "{err:?}"
    );
    let twice = table_limits("tables", [("a", reads(1.0)), ("a", reads(2.0))]).expect_err("twice");
    assert_eq!(twice.field, "tables[1].table");
    let unnamed = table_limits("tables", [("", reads(1.0))]).expect_err("empty name");
    assert_eq!(unnamed.field, "tables[0].table");
}

#[test]
fn table_overrides_replace_a_tables_limits_whole() {
    let name = |table: &str| TableName::parse("t", table).expect("name");
    // Reads limited to `r` per second, writes too.
    let limits = |r: f64| TableLimits {
        max_reads_per_second: Some(r),
        max_writes_per_second: Some(r),
    };
    let tier: TableLimitSet = [(name("orders"), limits(10.0)), (name("users"), limits(5.0))].into();
    let overrides: TableLimitSet = [(name("orders"), limits(99.0))].into();
    let effective = effective_limits(Some(&tier), &overrides);
    assert_eq!(effective[&name("orders")], limits(99.0));
    assert_eq!(effective[&name("users")], limits(5.0));
}

/// A tier's buckets and a list of tables follow the same rules, each
/// refusal naming the entry's field: name, value, twice, too many.
#[test]
fn buckets_and_tables_are_checked_by_the_same_rules() {
    let reads = TableLimits {
        max_reads_per_second: Some(1.0),
        max_writes_per_second: None,
    };
    let twice = Tier::from_definitions(
        "tier.buckets",
        [("a", def(1.0, 1.0)), ("a", def(1.0, 1.0))],
        at(0.0),
    )
    .expect_err("twice");
    assert_eq!(
        (twice.field.as_str(), twice.reason.as_str()),
        ("tier.buckets[1].bucket", "\"a\" is listed twice")
    );
    let twice = table_limits("tier.tables", [("a", reads), ("a", reads)]).expect_err("twice");
    assert_eq!(
        (twice.field.as_str(), twice.reason.as_str()),
        ("tier.tables[1].table", "\"a\" is listed twice")
    );

    let bad = TableLimits {
        max_writes_per_second: Some(-1.0),
        ..reads
    };
    let err = table_limits("tier.tables", [("a", reads), ("b", bad)]).expect_err("negative");
    assert_eq!(err.field, "tier.tables[1].max_writes_per_second");
    let none = TableLimits::default();
    let err = table_limits("tier.tables", [("a", none)]).expect_err("no limit");
    assert_eq!(err.field, "tier.tables[0].max_reads_per_second");

    let names: Vec<String> = (0..=MAX_TABLES).map(|i| format!("t{i}")).collect();
    let err = table_limits("tier.tables", names.iter().map(|n| (n.as_str(), reads)))
        .expect_err("too many");
    assert_eq!(
        (err.field.as_str(), err.reason.as_str()),
        ("tier.tables", "at most 1000 tables")
    );
    let all = table_limits(
        "tier.tables",
        names[..MAX_TABLES].iter().map(|n| (n.as_str(), reads)),
    )
    .expect("a thousand tables");
    assert_eq!(all.len(), MAX_TABLES);
    let many: Vec<String> = (0..=MAX_TIER_BUCKETS).map(|i| format!("b{i}")).collect();
    let err = Tier::from_definitions(
        "tier.buckets",
        many.iter().map(|n| (n.as_str(), def(1.0, 1.0))),
        at(0.0),
    )
    .expect_err("too many");
    assert_eq!(err.reason, "at most 1000 buckets per tier");
}

/// A closed record keeps the row's last limits, its totals exactly and
/// when it was created, and says when, why and by whom it was closed.
#[test]
fn a_closed_record_keeps_the_rows_limits_and_exact_totals() {
    let mut row = BucketRow::new(def(3.0, 30.0).limits, 30.0, true, at(10.0));
    row.totals.consumption.request_unit_micros = 1_234_567_891_234;
    row.totals.consumption.cpu_micros = 7;
    row.totals.granted_tokens = 0.1 + 0.2;
    row.state.tokens = -4.0;
    let key = BucketKey::new(tenant(), name("export"));
    let by = ClosedBy {
        actor: Some("alice".into()),
        operator: None,
        peer: Some("10.0.0.7:51234".into()),
    };
    let closed = close_bucket(&key, &row, CloseReason::TierRedefined, &by, at(99.0));
    assert_eq!(closed.tenant, tenant());
    assert_eq!(closed.bucket, name("export"));
    assert_eq!(closed.closed_at, at(99.0));
    assert_eq!(closed.reason, CloseReason::TierRedefined);
    assert_eq!(closed.closed_by, by);
    assert_eq!(closed.limits, row.state.limits);
    assert_eq!(closed.totals, row.totals);
    assert_eq!(closed.created_at, at(10.0));
    assert_eq!(closed.reason.name(), "tier-redefined");
}

#[test]
fn each_change_closes_for_its_own_reason() {
    let cases = [
        (
            TenantChange::SetTier {
                tier: tier_name("free"),
            },
            CloseReason::TierChange,
        ),
        (
            TenantChange::Reapply { previous: None },
            CloseReason::TierRedefined,
        ),
        (
            TenantChange::ClearOverride {
                bucket: name("export"),
            },
            CloseReason::OverrideCleared,
        ),
    ];
    for (change, reason) in cases {
        assert_eq!(change.close_reason(), reason, "{change:?}");
    }
}

#[test]
fn a_put_tier_keeps_when_it_was_created_and_stamps_when_it_was_updated() {
    let first = stamp_tier(&pro(), None, at(10.0));
    assert_eq!((first.created_at, first.updated_at), (at(10.0), at(10.0)));
    let second = stamp_tier(&free(), Some(&first), at(20.0));
    assert_eq!((second.created_at, second.updated_at), (at(10.0), at(20.0)));
    assert_eq!(second.buckets, free().buckets);
}

#[test]
fn a_tier_is_deleted_only_if_it_exists_and_no_tenant_is_on_it() {
    let name = TierName::parse("tier", "pro").expect("name");
    let tenants: Vec<TenantId> = ["a", "b", "c", "d"]
        .iter()
        .map(|t| TenantId::parse("tenant_id", t).expect("tenant"))
        .collect();
    assert_eq!(may_delete_tier(&name, true, 0, []), Ok(()));
    assert_eq!(
        may_delete_tier(&name, false, 4, tenants.clone()),
        Err(TierError::TierNotFound(name.clone())),
        "a tier that is not there is not found, whoever names it"
    );
    assert_eq!(
        may_delete_tier(&name, true, 4, tenants.clone()),
        Err(TierError::TierInUse {
            tier: name.clone(),
            count: 4,
            examples: tenants[..TIER_IN_USE_EXAMPLES].to_vec(),
        })
    );
}

/// A partition-load exchange runs under the tenant's own limits (its
/// record on its tier), and is refused, changing nothing, once the tenant
/// is deleted or suspended.
#[test]
fn a_partition_load_applies_the_tenants_limits_unless_it_is_refused() {
    let orders = TableName::parse("t", "orders").expect("name");
    let limits = TableLimits {
        max_reads_per_second: Some(10.0),
        max_writes_per_second: None,
    };
    let mut tier = pro();
    tier.tables = [(orders.clone(), limits)].into();
    let record = TenantRecord {
        tier: Some(tier_name("pro")),
        overrides: BTreeMap::new(),
        table_overrides: TableLimitSet::new(),
        budgets: BTreeMap::new(),
        created_at: at(0.0),
        updated_at: at(0.0),
    };
    let exchange = Exchange {
        pod: 1,
        partitions: Vec::new(),
        period: std::time::Duration::from_secs(10),
        known_version: 0,
    };
    let mut reports = PartitionReports::default();
    let answer = partition_load(
        &tenant(),
        None,
        Some(&record),
        Some(&tier),
        &mut reports,
        &exchange,
        at(1.0),
    )
    .expect("served");
    let mut direct = PartitionReports::default();
    let expected = partition::exchange(&mut direct, &tier.tables, &exchange, at(1.0));
    assert_eq!(answer, expected);
    assert_eq!(reports, direct);
    assert_eq!(
        answer.limits,
        Some(tier.tables.clone()),
        "a new pod learns them"
    );

    let deleted = TenantState {
        kind: tenant_state::TenantStateKind::Deleted,
        since: at(2.0),
        actor: "op".into(),
        reason: String::new(),
    };
    let before = reports.clone();
    let refused = partition_load(
        &tenant(),
        Some(&deleted),
        Some(&record),
        Some(&tier),
        &mut reports,
        &exchange,
        at(3.0),
    );
    assert!(
        matches!(refused, Err(TenantRefused::Deleted { .. })),
        "{refused:?}"
    );
    assert_eq!(reports, before, "a refused exchange changes nothing");
}

// Budgets: tiers and records set them, a change applies them to the rows.

fn monthly_stop(amount: f64) -> crate::budget::Budget {
    use crate::budget::{AtLimit, Budget, CycleRule, Period};
    Budget::new(
        amount,
        CycleRule::utc(Period::Monthly { anchor_day: 1 }),
        AtLimit::Stop,
    )
}

fn onboarded(tier: Tier) -> LoadedTenant {
    let mut loaded = empty();
    loaded.tier = Some(tier);
    let edit = change_tenant(
        &tenant(),
        &TenantChange::Create {
            tier: tier_name("pro"),
        },
        &loaded,
        at(0.0),
    )
    .expect("onboarded");
    apply(&mut loaded, edit);
    loaded
}

#[test]
fn a_tenant_budget_lands_on_its_bucket_and_clearing_it_closes_the_cycle() {
    let mut loaded = onboarded(pro());
    let email = name("schedule-email");
    let set = TenantChange::SetBudget {
        bucket: email.clone(),
        budget: monthly_stop(1_000.0),
    };
    let edit = change_tenant(&tenant(), &set, &loaded, at(10.0)).expect("set");
    let row = &edit.changed[&email];
    assert_eq!(row.budget.as_ref().map(|b| b.budget.amount), Some(1_000.0));
    assert!(edit.closed_cycles.is_empty());
    apply(&mut loaded, edit);
    let clear = TenantChange::ClearBudget {
        bucket: email.clone(),
    };
    let edit = change_tenant(&tenant(), &clear, &loaded, at(20.0)).expect("cleared");
    assert!(edit.changed[&email].budget.is_none());
    let (name, record) = &edit.closed_cycles[0];
    assert_eq!(name, &email);
    assert_eq!(record.cycle.end, at(20.0));
    apply(&mut loaded, edit);
    assert_eq!(
        change_tenant(&tenant(), &clear, &loaded, at(30.0)),
        Err(TierError::BudgetNotFound {
            tenant: tenant(),
            bucket: email
        })
    );
}

#[test]
fn a_tier_budget_applies_to_its_tenants_and_leaves_with_the_tier() {
    let mut tier = pro();
    let email = name("schedule-email");
    tier.budgets.insert(email.clone(), monthly_stop(500.0));
    let mut loaded = onboarded(tier);
    let row = &loaded.buckets[&email];
    assert_eq!(row.budget.as_ref().map(|b| b.budget.amount), Some(500.0));
    // A tier without the budget takes it off, closing the cycle.
    loaded.tier = Some(pro());
    let edit = change_tenant(
        &tenant(),
        &TenantChange::Reapply {
            previous: loaded.previous_tier.clone(),
        },
        &loaded,
        at(5.0),
    )
    .expect("reapplied");
    assert!(edit.changed[&email].budget.is_none());
    assert_eq!(edit.closed_cycles.len(), 1);
}

#[test]
fn a_request_unit_budget_makes_the_bucket_only_where_the_server_would() {
    let loaded = onboarded(pro());
    let ru = BucketName::REQUEST_UNITS;
    let set = TenantChange::SetBudget {
        bucket: ru.clone(),
        budget: monthly_stop(50e6),
    };
    let refused = change_tenant(&tenant(), &set, &loaded, at(1.0));
    assert!(
        matches!(&refused, Err(TierError::NoBucketForBudget(m)) if m.contains("request-unit limits first")),
        "{refused:?}"
    );
    let mut with_defaults = loaded.clone();
    let defaults = Limits {
        refill_rate: 1_000.0,
        burst_limit: 10_000.0,
    };
    with_defaults.request_units = Some((defaults, 10_000.0));
    let edit = change_tenant(&tenant(), &set, &with_defaults, at(1.0)).expect("set");
    let row = &edit.created[&ru];
    assert_eq!(row.state.limits, defaults);
    assert!(!row.state.configured);
    assert!(row.budget.is_some());
}

#[test]
fn a_budget_on_a_missing_or_per_key_bucket_is_refused_naming_it() {
    let loaded = onboarded(pro());
    let set = |bucket: &str| TenantChange::SetBudget {
        bucket: name(bucket),
        budget: monthly_stop(1.0),
    };
    let missing = change_tenant(&tenant(), &set("nope"), &loaded, at(1.0));
    assert!(
        matches!(&missing, Err(TierError::NoBucketForBudget(m)) if m.contains("\"nope\" does not exist")),
        "{missing:?}"
    );
    let mut per_key = pro();
    per_key.buckets.insert(
        name("api-key"),
        BucketDefinition {
            quota: None,
            limits: Limits {
                refill_rate: 1.0,
                burst_limit: 1.0,
            },
            initial_tokens: None,
            kind: BucketKind::PerKey,
            enforce: true,
        },
    );
    let loaded = onboarded(per_key);
    let refused = change_tenant(&tenant(), &set("api-key"), &loaded, at(1.0));
    assert!(
        matches!(&refused, Err(TierError::NoBucketForBudget(m)) if m.contains("per-key")),
        "{refused:?}"
    );
}

#[test]
fn a_whole_tier_in_shadow_mode_shadows_its_buckets_and_budgets_but_not_a_tenants_own() {
    use crate::budget::{AtLimit, Budget, CycleRule, Period};
    let mut shadowed = pro();
    shadowed.enforce = false;
    let daily = |amount| Budget::new(amount, CycleRule::utc(Period::Daily), AtLimit::Stop);
    shadowed
        .budgets
        .insert(name("schedule-email"), daily(100.0));
    let mut record = TenantRecord {
        tier: Some(tier_name("pro")),
        overrides: BTreeMap::from([(name("invoke-doc-summary-ai"), def(5.0, 50.0))]),
        table_overrides: BTreeMap::new(),
        budgets: BTreeMap::new(),
        created_at: at(0.0),
        updated_at: at(0.0),
    };
    let defined = definitions(Some(&shadowed), &record.overrides);
    assert!(
        !defined[&name("schedule-email")].enforce,
        "the tier's: shadow"
    );
    assert!(
        defined[&name("invoke-doc-summary-ai")].enforce,
        "the tenant's own: enforced"
    );
    let budgets = wanted_budgets(Some(&shadowed), &record);
    assert!(!budgets[&name("schedule-email")].enforce);
    record.budgets.insert(name("schedule-email"), daily(50.0));
    assert!(wanted_budgets(Some(&shadowed), &record)[&name("schedule-email")].enforce);

    // Onboarding provisions the tier's shared bucket in shadow mode; the
    // tier enforced again switches it back, the row's state kept.
    let mut loaded = empty();
    loaded.tier = Some(shadowed.clone());
    let edit = change_tenant(
        &tenant(),
        &TenantChange::Create {
            tier: tier_name("pro"),
        },
        &loaded,
        at(1.0),
    )
    .expect("create");
    let row = edit.created[&name("schedule-email")].clone();
    assert!(!row.enforce);
    let mut enforced = shadowed;
    enforced.enforce = true;
    let mut loaded = empty();
    loaded.record = Some(edit.record.clone());
    loaded.buckets = edit.created.clone();
    loaded.tier = Some(enforced);
    let reapplied = change_tenant(
        &tenant(),
        &TenantChange::Reapply { previous: None },
        &loaded,
        at(2.0),
    )
    .expect("reapply");
    let back = &reapplied.changed[&name("schedule-email")];
    assert!(back.enforce);
    assert_eq!(back.state.tokens, row.state.tokens, "the level kept");
}
