//! Impact preview: the buckets a proposed change touches, their recorded
//! usage, and what the current and the proposed limits would have done to
//! it (`Admin/PreviewLimits`, and the console's "try a limit").
//!
//! This module only reads: which buckets a change touches (one bucket, or
//! every tenant on a tier that does not override the bucket), their
//! limits and budget now, and their history. The replay itself is
//! `tollgate_core::impact`, the same ideal bucket the simulator measures
//! against.

use std::collections::BTreeSet;
use std::time::Duration;

use tollgate_core::budget::Budget;
use tollgate_core::global_bucket::Limits;
use tollgate_core::history;
use tollgate_core::impact::{self, Impact, Plan, SpendLimit};
use tollgate_core::tier::{BucketKind, Tier};
use tollgate_core::time::Timestamp;
use tollgate_core::{BucketKey, InvalidInput, TenantId, TierName};

use crate::store::{Store, StoreError};
use crate::telemetry::metrics::read_buckets;

/// How far back a preview looks unless asked otherwise: a day, so the
/// daily peak is in it.
pub const DEFAULT_LOOKBACK: Duration = Duration::from_secs(24 * 3600);
/// The longest look-back: the minute rows kept by default.
pub const MAX_LOOKBACK: Duration = Duration::from_secs(14 * 24 * 3600);
/// How long replayed demand waits before it gives up, unless asked.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(5);
pub const MAX_MAX_WAIT: Duration = Duration::from_secs(600);
/// The slot demand is read in: the history's minute rows.
const STEP: Duration = Duration::from_secs(60);

/// What is replayed, and for how long demand waits.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub since: Timestamp,
    pub until: Timestamp,
    pub max_wait: Duration,
}

impl Span {
    /// The `lookback` up to `until`.
    pub fn back_from(until: Timestamp, lookback: Duration, max_wait: Duration) -> Span {
        Span {
            since: until.saturating_sub(lookback),
            until,
            max_wait,
        }
    }
}

/// The span a budget's preview replays: its cycle at `until`, from the
/// cycle's start (the spend starts at 0 there).
pub fn budget_span(
    budget: &Budget,
    until: Timestamp,
    max_wait: Duration,
) -> Result<Span, InvalidInput> {
    let cycle = budget
        .cycle
        .cycle_at(until)
        .map_err(|e| InvalidInput::new("budget.cycle", e.to_string()))?;
    Ok(Span {
        since: cycle.start,
        until,
        max_wait,
    })
}

/// One bucket's preview.
#[derive(Clone, Debug)]
pub struct BucketPreview {
    pub key: BucketKey,
    pub current_limits: Limits,
    pub proposed_limits: Limits,
    /// In shadow mode now, and as proposed: throttling nothing, so that
    /// the replay says what its shadow counts would, not what its pods
    /// feel.
    pub current_shadow: bool,
    pub proposed_shadow: bool,
    pub current: Impact,
    pub proposed: Impact,
}

/// One side of a preview: the plan replayed, and whether it would be
/// enforced.
struct Side {
    plan: Plan,
    enforce: bool,
}

impl Side {
    fn limits(limits: Limits, enforce: bool) -> Side {
        Side {
            plan: Plan::limits(limits),
            enforce,
        }
    }
}

/// `key`'s history over `span` replayed under its limits now and under
/// `proposed`. `TenantNotFound` / `BucketNotFound` if it does not exist.
pub async fn bucket(
    store: &dyn Store,
    key: &BucketKey,
    proposed: Limits,
    span: Span,
) -> Result<BucketPreview, StoreError> {
    // Its own limits: a budget's throttle keeps them aside.
    let head = store.get_bucket(key).await?.head;
    replay_plans(
        store,
        key.clone(),
        Side::limits(head.own_limits(), head.enforce),
        Side::limits(proposed, head.enforce),
        span,
    )
    .await
}

/// Every shared bucket whose limits or shadow mode `tier` (as `name`
/// would be defined) changes, of every tenant on `name` that does not
/// override it, with its preview; in tenant and bucket order.
pub async fn tier(
    store: &dyn Store,
    name: &TierName,
    tier: &Tier,
    span: Span,
) -> Result<Vec<BucketPreview>, StoreError> {
    // Each shared bucket of the tier's, with what it defines and the
    // bucket's own limits now.
    let candidates: Vec<(BucketKey, Side, Side)> = read_buckets(store, usize::MAX)
        .await?
        .into_iter()
        .filter_map(|b| {
            let defined = tier
                .buckets
                .get(&b.key.bucket)
                .filter(|d| d.kind == BucketKind::Shared)?;
            Some((
                b.key,
                Side::limits(b.head.own_limits(), b.head.enforce),
                Side::limits(defined.limits, tier.in_force(defined).enforce),
            ))
        })
        .collect();
    let tenants: Vec<TenantId> = candidates
        .iter()
        .map(|(key, _, _)| key.tenant.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let records = store.tenant_records(&tenants).await?;
    let mut previews = Vec::new();
    for (key, current, proposed) in candidates {
        let Some(record) = records.get(&key.tenant) else {
            continue;
        };
        if record.tier.as_ref() != Some(name)
            || record.overrides.contains_key(&key.bucket)
            || (proposed.plan == current.plan && proposed.enforce == current.enforce)
        {
            continue;
        }
        previews.push(replay_plans(store, key, current, proposed, span).await?);
    }
    Ok(previews)
}

/// `key` with budget `proposed` (the whole of it, as `SetBudget` sets
/// it), beside its budget now, over `span` (the proposed cycle so far:
/// the spend starts at 0), both under the bucket's own limits.
pub async fn budget(
    store: &dyn Store,
    key: &BucketKey,
    proposed: &Budget,
    span: Span,
) -> Result<BucketPreview, StoreError> {
    let head = store.get_bucket(key).await?.head;
    let limits = head.own_limits();
    let spend_limit = |b: &Budget| SpendLimit {
        amount: b.amount,
        at_limit: b.action(),
    };
    // A budget in shadow mode stops nothing; nor does a bucket in it.
    let current = Side {
        plan: Plan {
            limits,
            budget: head.budget.as_ref().map(|b| spend_limit(&b.budget)),
        },
        enforce: head.enforce && head.budget.as_ref().is_none_or(|b| b.budget.enforce),
    };
    let proposed = Side {
        plan: Plan {
            limits,
            budget: Some(spend_limit(proposed)),
        },
        enforce: head.enforce && proposed.enforce,
    };
    replay_plans(store, key.clone(), current, proposed, span).await
}

async fn replay_plans(
    store: &dyn Store,
    key: BucketKey,
    current: Side,
    proposed: Side,
    span: Span,
) -> Result<BucketPreview, StoreError> {
    let rows = store.history(&key, span.since, span.until, STEP).await?;
    // The spans between rows, as recorded: a row is the last sample of its
    // slot, and a bucket waking from idle gets a row closing the idle
    // stretch first, so each span's demand fell within it.
    let usage = history::usage(&rows.samples);
    Ok(BucketPreview {
        current: impact::replay(&usage, &current.plan, span.max_wait),
        proposed: impact::replay(&usage, &proposed.plan, span.max_wait),
        key,
        current_limits: current.plan.limits,
        proposed_limits: proposed.plan.limits,
        current_shadow: !current.enforce,
        proposed_shadow: !proposed.enforce,
    })
}
