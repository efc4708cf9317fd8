use super::*;

fn tenant() -> TenantId {
    TenantId::parse("tenant_id", "acme").expect("valid tenant id")
}

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs_f64(secs)
}

fn suspended(secs: f64, reason: &str) -> TenantState {
    TenantState {
        kind: TenantStateKind::Suspended,
        since: at(secs),
        actor: "alice at 10.0.0.7:51234".into(),
        reason: reason.into(),
    }
}

fn deleted(secs: f64) -> TenantState {
    TenantState {
        kind: TenantStateKind::Deleted,
        since: at(secs),
        actor: "bob at 10.0.0.8:40000".into(),
        reason: String::new(),
    }
}

#[test]
fn a_tenant_without_a_state_is_served_and_one_with_a_state_is_refused_saying_since_when() {
    assert_eq!(admit(&tenant(), None), Ok(()));
    let refused = admit(&tenant(), Some(&deleted(1_800_000_000.0))).expect_err("refused");
    assert_eq!(
        refused.to_string(),
        "tenant \"acme\" was deleted at 2027-01-15T08:00:00Z; an operator must create it again before it is served"
    );
    let refused = admit(
        &tenant(),
        Some(&suspended(1_800_000_000.0, "unpaid invoice")),
    )
    .expect_err("refused");
    assert_eq!(
        refused.to_string(),
        "tenant \"acme\" is suspended since 2027-01-15T08:00:00Z: unpaid invoice"
    );
    let refused = admit(&tenant(), Some(&suspended(0.0, ""))).expect_err("refused");
    assert_eq!(
        refused.to_string(),
        "tenant \"acme\" is suspended since 1970-01-01T00:00:00Z"
    );
}

#[test]
fn an_operator_change_removes_a_tombstone_and_keeps_a_suspension() {
    assert_eq!(after_operator_change(None), StateWrite::Keep);
    assert_eq!(
        after_operator_change(Some(&deleted(1.0))),
        StateWrite::Remove
    );
    assert_eq!(
        after_operator_change(Some(&suspended(1.0, "x"))),
        StateWrite::Keep
    );
}

#[test]
fn delete_leaves_a_tombstone_on_an_existing_tenant_only() {
    let delete = StateChange::Delete {
        actor: "bob at 10.0.0.8:40000".into(),
    };
    let edit = change(
        &tenant(),
        true,
        Some(&suspended(1.0, "x")),
        &delete,
        at(5.0),
    )
    .expect("deleted");
    assert_eq!(edit.write, StateWrite::Put(deleted(5.0)));
    assert!(edit.changed);
    assert_eq!(
        change(&tenant(), false, None, &delete, at(5.0)),
        Err(StateChangeError::TenantNotFound(tenant()))
    );
    assert!(matches!(
        change(&tenant(), false, Some(&deleted(1.0)), &delete, at(5.0)),
        Err(StateChangeError::Refused(TenantRefused::Deleted { .. }))
    ));
}

#[test]
fn suspend_and_resume_are_idempotent_and_refuse_unknown_or_deleted_tenants() {
    let suspend = StateChange::Suspend {
        actor: "alice at 10.0.0.7:51234".into(),
        reason: "unpaid invoice".into(),
    };
    let edit = change(&tenant(), true, None, &suspend, at(3.0)).expect("suspended");
    assert_eq!(
        edit.write,
        StateWrite::Put(suspended(3.0, "unpaid invoice"))
    );
    assert!(edit.changed);

    let first = suspended(3.0, "unpaid invoice");
    let again = change(&tenant(), true, Some(&first), &suspend, at(9.0)).expect("idempotent");
    assert_eq!(again.write, StateWrite::Keep);
    assert_eq!(again.state, Some(first.clone()));
    assert!(!again.changed);

    let resumed =
        change(&tenant(), true, Some(&first), &StateChange::Resume, at(9.0)).expect("resumed");
    assert_eq!(resumed.write, StateWrite::Remove);
    assert_eq!(resumed.state, None);
    let again = change(&tenant(), true, None, &StateChange::Resume, at(9.0)).expect("idempotent");
    assert_eq!(again.write, StateWrite::Keep);
    assert!(!again.changed);

    for change_of in [&suspend, &StateChange::Resume] {
        assert_eq!(
            change(&tenant(), false, None, change_of, at(9.0)),
            Err(StateChangeError::TenantNotFound(tenant()))
        );
        assert!(matches!(
            change(&tenant(), false, Some(&deleted(1.0)), change_of, at(9.0)),
            Err(StateChangeError::Refused(TenantRefused::Deleted { .. }))
        ));
    }
}

#[test]
fn a_reason_is_bounded_and_printable() {
    let with = |reason: &str| StateChange::Suspend {
        actor: String::new(),
        reason: reason.into(),
    };
    assert_eq!(with("unpaid invoice").validate(), Ok(()));
    assert_eq!(
        with("a\nb").validate().expect_err("refused").field,
        "reason"
    );
    assert_eq!(
        with(&"x".repeat(MAX_REASON_LEN + 1))
            .validate()
            .expect_err("refused")
            .field,
        "reason"
    );
}
