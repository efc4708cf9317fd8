//! The log line every `Admin` change leaves: who asked for it, what it was,
//! and the tenant before and after.
//!
//! Who is the connection's peer address and, when the request carries it,
//! the `x-tollgate-actor` metadata (`tollgate tenant` sends the operator's
//! name). The actor is only what the client claims, so it is logged only
//! when it is printable ASCII of at most [`MAX_ACTOR_LEN`] characters; any
//! other value is replaced by a note saying why, and the change goes ahead:
//! a log field never makes an operator's change fail.
//!
//! Each line is one `info` event with structured fields (`operation`,
//! `peer`, `actor`, `actor_note`, `tenant`, `bucket`, `before.*`, `after.*`)
//! and a
//! message that reads on its own.
//!
//! The lines: a limits update (the bucket's limits and tokens before and
//! after); a tenant's deletion, one line per bucket, its totals the last
//! word on them; tier changes: [`tenant_changed`] (the tenant's tier and
//! the buckets created, changed and retired), then a line per retired
//! bucket with every cumulative total exactly and its live instances (the
//! only record of them in the log once the bucket is gone); [`tier_put`]
//! (created or replaced, the buckets and the tenants updated, then a
//! `tenant_changed` line for each of those tenants); [`tier_deleted`]; and
//! a tenant's suspension, resumption or tombstone removed.

use std::fmt;
use std::net::SocketAddr;

use tollgate_core::tenant_state::{self, StateEdit};
use tollgate_core::tier::ClosedBy;
use tollgate_core::{BucketKey, LimitsUpdate, TenantId, TenantState, TierName};
use tollgate_proto::{ACTOR_METADATA, MAX_ACTOR_LEN};
use tonic::Request;

use super::convert;
use crate::store::{BucketSnapshot, LimitsChange, PutTierOutcome, TenantChangeOutcome};

/// Who asked for a change.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Caller {
    peer: Option<SocketAddr>,
    actor: Actor,
    /// The operator the request's token authenticated, if tokens are on.
    operator: Option<String>,
    /// The organisation the token is scoped to, if it is.
    scope: Option<super::Scope>,
}

/// The `x-tollgate-actor` metadata of a request.
#[derive(Clone, Debug, PartialEq)]
enum Actor {
    Absent,
    Named(String),
    /// Present but not logged; why.
    Ignored(&'static str),
}

impl Caller {
    pub(super) fn of<T>(request: &Request<T>) -> Caller {
        let actor = match request.metadata().get(ACTOR_METADATA) {
            None => Actor::Absent,
            Some(value) => actor(value.as_encoded_bytes()),
        };
        Caller {
            peer: request.remote_addr(),
            actor,
            operator: request
                .extensions()
                .get::<super::Operator>()
                .map(|o| o.0.clone()),
            scope: request.extensions().get::<super::Scope>().cloned(),
        }
    }

    /// The organisation the caller's token is scoped to, if it is.
    pub(super) fn scope(&self) -> Option<&super::Scope> {
        self.scope.as_ref()
    }

    /// Who asked, as a closed record keeps it.
    pub(super) fn closed_by(&self) -> ClosedBy {
        ClosedBy {
            actor: self.actor().map(str::to_owned),
            operator: self.operator.clone(),
            peer: self.peer.map(|p| p.to_string()),
        }
    }

    fn actor(&self) -> Option<&str> {
        match &self.actor {
            Actor::Named(name) => Some(name),
            Actor::Absent | Actor::Ignored(_) => None,
        }
    }

    fn actor_note(&self) -> Option<&'static str> {
        match self.actor {
            Actor::Ignored(why) => Some(why),
            Actor::Absent | Actor::Named(_) => None,
        }
    }
}

fn actor(value: &[u8]) -> Actor {
    if value.is_empty() {
        Actor::Ignored("x-tollgate-actor ignored: empty")
    } else if value.len() > MAX_ACTOR_LEN {
        Actor::Ignored("x-tollgate-actor ignored: longer than 128 characters")
    } else if !value.iter().all(|b| (b' '..=b'~').contains(b)) {
        Actor::Ignored("x-tollgate-actor ignored: not printable ASCII")
    } else {
        // Printable ASCII is UTF-8.
        Actor::Named(String::from_utf8_lossy(value).into_owned())
    }
}

impl fmt::Display for Caller {
    /// `alice at 10.0.0.7:51234`, or the address alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(operator) = &self.operator {
            write!(f, "operator {operator} ")?;
        }
        if let Some(super::Scope(org)) = &self.scope {
            write!(f, "(organization {org}) ")?;
        }
        if let Some(actor) = self.actor() {
            write!(f, "{actor} at ")?;
        } else if self.operator.is_some() {
            f.write_str("at ")?;
        }
        match self.peer {
            Some(peer) => write!(f, "{peer}"),
            None => f.write_str("an unknown peer"),
        }
    }
}

fn peer(caller: &Caller) -> String {
    caller
        .peer
        .map_or_else(|| "unknown".to_owned(), |p| p.to_string())
}

/// Logs a limits update: the limits and tokens before (if the bucket
/// existed) and as set.
pub(super) fn limits_updated(
    caller: &Caller,
    key: &BucketKey,
    update: &LimitsUpdate,
    change: &LimitsChange,
) {
    let before = change.before.as_ref().map(|b| &b.state);
    let before_tokens = before.map(|b| b.tokens_at(change.after.read_at));
    let after = &change.after.head.state;
    let as_of = update
        .as_of
        .map(|t| convert::timestamp_to_proto(t).to_string());
    let (action, summary) = match (before, before_tokens) {
        (Some(b), Some(tokens)) => (
            "set the limits of",
            format!(
                "refill rate {} -> {} tokens/s, burst limit {} -> {} tokens, tokens {:.1} -> {:.1}",
                b.limits.refill_rate,
                after.limits.refill_rate,
                b.limits.burst_limit,
                after.limits.burst_limit,
                tokens,
                after.tokens,
            ),
        ),
        _ => (
            "created",
            format!(
                "refill rate {} tokens/s, burst limit {} tokens, tokens {:.1}",
                after.limits.refill_rate, after.limits.burst_limit, after.tokens,
            ),
        ),
    };
    tracing::info!(
        operation = "update_tenant_resource_limits",
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tenant = %key.tenant,
        bucket = %key.bucket,
        created = before.is_none(),
        before.configured = before.map(|b| b.configured),
        before.refill_rate = before.map(|b| b.limits.refill_rate),
        before.burst_limit = before.map(|b| b.limits.burst_limit),
        before.tokens = before_tokens,
        after.refill_rate = after.limits.refill_rate,
        after.burst_limit = after.limits.burst_limit,
        after.tokens = after.tokens,
        available_tokens = update.available_tokens,
        as_of = as_of.as_deref(),
        as_of_consumed_tokens = update.as_of.map(|_| update.as_of_consumed_tokens),
        "{caller} {action} {}: {summary}",
        describe(key)
    );
    tombstone_removed(
        caller,
        "update_tenant_resource_limits",
        &key.tenant,
        change.revived.as_ref(),
    );
}

/// `tenant t1` for a request-unit bucket, `bucket mail of tenant t1` for
/// a named one.
fn describe(key: &BucketKey) -> String {
    if key.bucket.is_request_units() {
        format!("tenant {}", key.tenant)
    } else {
        format!("bucket {} of tenant {}", key.bucket, key.tenant)
    }
}

/// Logs a deletion: what each of the tenant's buckets was when it went,
/// and the tombstone it left.
pub(super) fn tenant_deleted(caller: &Caller, tenant: &TenantId, deleted: &[BucketSnapshot]) {
    for bucket in deleted {
        let (state, members, totals) = (
            &bucket.head.state,
            &bucket.head.members,
            &bucket.head.totals,
        );
        let tokens = bucket.current_tokens();
        tracing::info!(
            operation = "delete_tenant",
            peer = %peer(caller),
            operator = caller.operator.as_deref(),
            actor = caller.actor(),
            actor_note = caller.actor_note(),
            tenant = %tenant,
            bucket = %bucket.key.bucket,
            before.configured = state.configured,
            before.refill_rate = state.limits.refill_rate,
            before.burst_limit = state.limits.burst_limit,
            before.tokens = tokens,
            before.live_instances = members.live_instances,
            before.granted_tokens = totals.granted_tokens,
            before.request_units = totals.consumption.request_units(),
            before.request_unit_micros = totals.consumption.request_unit_micros,
            "{caller} deleted {}: refill rate {} tokens/s, burst limit {} tokens, \
             tokens {tokens:.1}, live instances {}, granted {:.1} tokens, consumed {:.1} request units",
            describe(&bucket.key),
            state.limits.refill_rate,
            state.limits.burst_limit,
            members.live_instances,
            totals.granted_tokens,
            totals.consumption.request_units(),
        );
    }
    tracing::info!(
        operation = "delete_tenant",
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tenant = %tenant,
        buckets = deleted.len(),
        "{caller} deleted tenant {tenant} ({} buckets); its tombstone refuses its pods until it is created again",
        deleted.len(),
    );
}

/// Logs that an operator's change created a deleted tenant again, removing
/// its tombstone.
pub(super) fn tombstone_removed(
    caller: &Caller,
    operation: &'static str,
    tenant: &TenantId,
    tombstone: Option<&TenantState>,
) {
    let Some(tombstone) = tombstone else {
        return;
    };
    let deleted_at = tenant_state::rfc3339(tombstone.since);
    tracing::info!(
        operation,
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tenant = %tenant,
        deleted_at = %deleted_at,
        deleted_by = %tombstone.actor,
        "{caller} created tenant {tenant} again (deleted at {deleted_at} by {}): its tombstone is removed, its pods are served",
        tombstone.actor,
    );
}

/// Logs a suspension or resumption, or that it changed nothing.
pub(super) fn tenant_state_changed(
    caller: &Caller,
    operation: &'static str,
    tenant: &TenantId,
    edit: &StateEdit,
) {
    let what = match (&edit.state, edit.changed) {
        (Some(state), true) => format!("suspended tenant {tenant}: {:?}", state.reason),
        (Some(state), false) => format!(
            "asked to suspend tenant {tenant}, suspended since {} already: nothing changed",
            tenant_state::rfc3339(state.since)
        ),
        (None, true) => format!("resumed tenant {tenant}"),
        (None, false) => {
            format!("asked to resume tenant {tenant}, which is not suspended: nothing changed")
        }
    };
    tracing::info!(
        operation,
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tenant = %tenant,
        changed = edit.changed,
        reason = edit.state.as_ref().map(|s| s.reason.as_str()),
        "{caller} {what}"
    );
}

/// Logs a change of a tenant's tier or overrides: what it is on now, and
/// which buckets were created, changed and retired (each retired bucket's
/// last totals on a line of its own).
pub(super) fn tenant_changed(
    caller: &Caller,
    operation: &'static str,
    outcome: &TenantChangeOutcome,
) {
    let view = &outcome.view;
    let tier = view
        .record
        .as_ref()
        .and_then(|r| r.tier.as_ref())
        .map(ToString::to_string);
    let created = joined(&outcome.created);
    let changed = joined(&outcome.changed);
    let retired = joined(outcome.retired.iter().map(|b| &b.key.bucket));
    tracing::info!(
        operation,
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tenant = %view.tenant,
        tier = tier.as_deref(),
        created = %created,
        changed = %changed,
        retired = %retired,
        "{caller} changed tenant {}: tier {}, buckets created [{created}], changed [{changed}], retired [{retired}]",
        view.tenant,
        tier.as_deref().unwrap_or("(none)"),
    );
    tombstone_removed(caller, operation, &view.tenant, outcome.revived.as_ref());
    bucket_retired(caller, operation, &outcome.retired);
}

/// Names separated by commas.
fn joined<T: fmt::Display>(names: impl IntoIterator<Item = T>) -> String {
    names
        .into_iter()
        .map(|name| name.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Logs what each retired bucket was when it went: every cumulative
/// total, exactly, as its closed record in the store keeps them.
fn bucket_retired(caller: &Caller, operation: &'static str, retired: &[BucketSnapshot]) {
    for bucket in retired {
        let totals = &bucket.head.totals;
        let c = &totals.consumption;
        tracing::info!(
            operation,
            peer = %peer(caller),
            operator = caller.operator.as_deref(),
            actor = caller.actor(),
            actor_note = caller.actor_note(),
            tenant = %bucket.key.tenant,
            bucket = %bucket.key.bucket,
            before.granted_tokens = totals.granted_tokens,
            before.request_units = totals.consumption.request_units(),
            before.request_unit_micros = c.request_unit_micros,
            before.read_batches = c.read_batches,
            before.read_requests = c.read_requests,
            before.read_bytes = c.read_bytes,
            before.write_batches = c.write_batches,
            before.write_requests = c.write_requests,
            before.write_bytes = c.write_bytes,
            before.cpu_micros = c.cpu_micros,
            before.egress_bytes = c.egress_bytes,
            before.live_instances = bucket.head.members.live_instances,
            "{caller} retired {}: granted {:.1} tokens, consumed {:.1} request units",
            describe(&bucket.key),
            totals.granted_tokens,
            totals.consumption.request_units(),
        );
    }
}

/// Logs a tier's new definition and the tenants it changed.
pub(super) fn tier_put(caller: &Caller, name: &TierName, outcome: &PutTierOutcome) {
    tracing::info!(
        operation = "put_tier",
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tier = %name,
        created = outcome.created,
        buckets = outcome.tier.buckets.len(),
        tables = outcome.tier.tables.len(),
        tenants_updated = outcome.tenants.len(),
        "{caller} {} tier {name}: {} buckets, {} tables, {} tenants updated",
        if outcome.created { "created" } else { "replaced" },
        outcome.tier.buckets.len(),
        outcome.tier.tables.len(),
        outcome.tenants.len(),
    );
    for tenant in &outcome.tenants {
        tenant_changed(caller, "put_tier", tenant);
    }
}

/// Logs a tier's deletion.
pub(super) fn tier_deleted(caller: &Caller, name: &TierName) {
    tracing::info!(
        operation = "delete_tier",
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        tier = %name,
        "{caller} deleted tier {name}"
    );
}

/// Logs a change of the tree of organisations.
pub(super) fn tree_changed(
    caller: &Caller,
    operation: &'static str,
    change: &tollgate_core::organisation::TreeChange,
) {
    use tollgate_core::organisation::TreeChange;
    let what = match change {
        TreeChange::Create { organisation, .. } => format!("created organisation {organisation}"),
        TreeChange::Join {
            organisation,
            member,
            guaranteed,
        } => format!("put {member} into organisation {organisation} (guaranteed {guaranteed:?})"),
        TreeChange::Leave { member } => format!("took {member} out of its organisation"),
        TreeChange::Delete { organisation } => format!("deleted organisation {organisation}"),
    };
    tracing::info!(
        operation,
        peer = %peer(caller),
        operator = caller.operator.as_deref(),
        actor = caller.actor(),
        actor_note = caller.actor_note(),
        "{caller} {what}"
    );
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::*;

    fn caller_with(actor: Option<MetadataValue<tonic::metadata::Ascii>>) -> Caller {
        let mut request = Request::new(());
        if let Some(value) = actor {
            request.metadata_mut().insert(ACTOR_METADATA, value);
        }
        Caller::of(&request)
    }

    #[test]
    fn a_printable_actor_is_named() {
        let caller = caller_with(Some(MetadataValue::from_static("alice@ops")));
        assert_eq!(caller.actor(), Some("alice@ops"));
        assert_eq!(caller.actor_note(), None);
        assert_eq!(caller.to_string(), "alice@ops at an unknown peer");
    }

    #[test]
    fn no_actor_leaves_the_address_alone() {
        let caller = caller_with(None);
        assert_eq!((caller.actor(), caller.actor_note()), (None, None));
        assert_eq!(caller.to_string(), "an unknown peer");
    }

    #[test]
    fn unprintable_long_or_empty_actors_are_ignored_with_a_note() {
        let longest = "a".repeat(MAX_ACTOR_LEN);
        assert_eq!(actor(longest.as_bytes()), Actor::Named(longest.clone()));
        let too_long = format!("{longest}a");
        for (value, why) in [
            (too_long.as_bytes(), "longer than 128"),
            (b"tab\there".as_slice(), "not printable"),
            (b"caf\xc3\xa9".as_slice(), "not printable"),
            (b"\x7f".as_slice(), "not printable"),
            (b"".as_slice(), "empty"),
        ] {
            match actor(value) {
                Actor::Ignored(note) => assert!(note.contains(why), "{value:?}: {note}"),
                other => panic!("{value:?} accepted as {other:?}"),
            }
        }
        let caller = caller_with(Some(
            MetadataValue::try_from(too_long.as_str()).expect("ASCII"),
        ));
        assert_eq!(caller.actor(), None);
        assert!(caller.actor_note().is_some());
    }
}
