//! Conversions between the wire contract (`tollgate_proto::v1`) and the
//! core's domain types, with the validation of every field.
//!
//! A request's `tenant_id` and `bucket` make its `BucketKey` (the empty
//! bucket is the request-unit bucket); a `Tier` is checked by the core's
//! rules (`Tier::from_definitions` for `tier.buckets`, the table limits
//! for `tier.tables`); a bucket goes back as a `Tenant` view, a tenant on a
//! tier as a `TenantTier`.

use std::time::Duration;

use tollgate_core::validate::{self, DEFAULT_TARGET_REQUEST_PERIOD};
use tollgate_core::{
    BucketKey, BucketName, Consumption, Grant, InstanceState, InvalidInput, Limits, LimitsMask,
    LimitsUpdate, TenantId, Timestamp, TokenBucketRequest,
};
use tollgate_proto::v1;

use tollgate_core::key_bucket::{CallAnswer, KeyReading};
use tollgate_core::partition::TableLimits;
use tollgate_core::rate_window::WindowRates;
use tollgate_core::tier::{
    BucketDefinition, BucketKind, CloseReason, ClosedBucket, DefinedBy, Tier, table_limits,
};
use tollgate_core::{TableName, TenantState, TierName};

use crate::store::{BucketSnapshot, KeyBucketSnapshot, TenantView};

mod budget;
pub use budget::*;

/// The latest timestamp accepted (9999-12-31T23:59:59Z), as in RFC 3339.
const MAX_TIMESTAMP_SECONDS: i64 = 253_402_300_799;

pub fn tenant_id(id: &str) -> Result<TenantId, InvalidInput> {
    TenantId::parse("tenant_id", id)
}

/// The bucket named by a request's `tenant_id` and `bucket` fields.
pub fn bucket_key(tenant: &str, bucket: &str) -> Result<BucketKey, InvalidInput> {
    Ok(BucketKey::new(
        tenant_id(tenant)?,
        BucketName::parse("bucket", bucket)?,
    ))
}

pub fn token_bucket_request(
    req: v1::TokenBucketRequest,
) -> Result<(BucketKey, TokenBucketRequest), InvalidInput> {
    let key = bucket_key(&req.tenant_id, &req.bucket)?;
    let target_request_period = match req.target_request_period {
        None => DEFAULT_TARGET_REQUEST_PERIOD,
        Some(d) => duration("target_request_period", d)?,
    };
    let request = TokenBucketRequest {
        instance_id: req.instance_id,
        lease: req.instance_lease,
        seq: req.seq,
        requested_tokens: req.requested_tokens,
        shares: req.shares,
        target_request_period,
        consumption: req
            .consumption_since_last_request
            .map(Consumption::try_from)
            .transpose()
            .map_err(|e| e.within("consumption_since_last_request"))?
            .unwrap_or_default(),
        next_live_instance_id: req.next_live_instance_id,
        returned_tokens: req.returned_tokens,
        held_tokens: req.held_tokens,
        fallback_tokens: req.fallback_tokens,
        fallback_duration: req
            .fallback_duration
            .map(|d| duration("fallback_duration", d))
            .transpose()?
            .unwrap_or_default(),
    };
    request.validate()?;
    Ok((key, request))
}

pub fn limits_update(
    req: v1::UpdateTenantResourceLimitsRequest,
) -> Result<(BucketKey, LimitsUpdate), InvalidInput> {
    let key = bucket_key(&req.tenant_id, &req.bucket)?;
    let update = LimitsUpdate {
        available_tokens: req.available_tokens,
        limits: Limits {
            refill_rate: req.refill_rate,
            burst_limit: req.burst_limit,
        },
        as_of: req.as_of.map(|t| timestamp("as_of", t)).transpose()?,
        as_of_consumed_tokens: req.as_of_consumed_tokens,
        mask: limits_mask(req.update_mask)?,
    };
    update.validate()?;
    Ok((key, update))
}

/// An update mask's paths as the values they name; none (or no mask) is
/// all of them.
fn limits_mask(mask: Option<prost_types::FieldMask>) -> Result<LimitsMask, InvalidInput> {
    let paths = mask.map(|m| m.paths).unwrap_or_default();
    if paths.is_empty() {
        return Ok(LimitsMask::ALL);
    }
    let mut set = LimitsMask {
        available_tokens: false,
        refill_rate: false,
        burst_limit: false,
    };
    for (i, path) in paths.iter().enumerate() {
        let named = match path.as_str() {
            "available_tokens" => &mut set.available_tokens,
            "refill_rate" => &mut set.refill_rate,
            "burst_limit" => &mut set.burst_limit,
            other => {
                return Err(InvalidInput::new(
                    format!("update_mask.paths[{i}]"),
                    format!(
                        "{:?} is not one of available_tokens, refill_rate, burst_limit",
                        other.chars().take(64).collect::<String>()
                    ),
                ));
            }
        };
        *named = true;
    }
    Ok(set)
}

fn duration(field: &str, d: prost_types::Duration) -> Result<Duration, InvalidInput> {
    validate::wire_duration(field, d.seconds, d.nanos)
}

fn timestamp(field: &str, t: prost_types::Timestamp) -> Result<Timestamp, InvalidInput> {
    if !(0..1_000_000_000).contains(&t.nanos) || !(0..=MAX_TIMESTAMP_SECONDS).contains(&t.seconds) {
        return Err(InvalidInput::new(
            field,
            format!(
                "must be between 1970-01-01 and 9999-12-31 with nanos in [0, 1e9), got {}s {}ns",
                t.seconds, t.nanos
            ),
        ));
    }
    Ok(Timestamp::from_unix_micros(
        t.seconds * 1_000_000 + i64::from(t.nanos / 1_000),
    ))
}

/// The longest span a history may be asked for.
pub const MAX_HISTORY_SPAN: Duration = Duration::from_secs(400 * 86_400);
/// The largest step a history may be asked in.
pub const MAX_HISTORY_STEP: Duration = Duration::from_secs(86_400);

/// A history request's span, checked, with `until` unset read as now
/// (this replica's clock).
pub(crate) struct HistorySpan {
    pub since: Timestamp,
    pub until: Timestamp,
    pub step: Duration,
    pub read_at: Timestamp,
}

pub(crate) fn history_span(req: &v1::GetHistoryRequest) -> Result<HistorySpan, InvalidInput> {
    let read_at = Timestamp::from_system_time(std::time::SystemTime::now());
    let since = timestamp(
        "since",
        req.since
            .ok_or_else(|| InvalidInput::new("since", "required: the start of the span"))?,
    )?;
    let until = req.until.map_or(Ok(read_at), |t| timestamp("until", t))?;
    if until < since {
        return Err(InvalidInput::new("until", "must not be before since"));
    }
    if until.duration_since(since) > MAX_HISTORY_SPAN {
        return Err(InvalidInput::new(
            "since",
            format!(
                "the span from since to until must be at most {} days",
                MAX_HISTORY_SPAN.as_secs() / 86_400
            ),
        ));
    }
    let step = req
        .step
        .map_or(Ok(Duration::from_secs(60)), |d| duration("step", d))?;
    if step < tollgate_core::history::MIN_STEP || step > MAX_HISTORY_STEP {
        return Err(InvalidInput::new("step", "must be from 1s to 1 day"));
    }
    Ok(HistorySpan {
        since,
        until,
        step,
        read_at,
    })
}

/// A `PreviewLimits` request's span: the look-back up to now and the
/// replay's wait, checked.
pub(crate) fn preview_span(
    req: &v1::PreviewLimitsRequest,
    now: Timestamp,
) -> Result<crate::preview::Span, InvalidInput> {
    use crate::preview::{DEFAULT_LOOKBACK, DEFAULT_MAX_WAIT, MAX_LOOKBACK, MAX_MAX_WAIT};
    let lookback = req
        .lookback
        .map_or(Ok(DEFAULT_LOOKBACK), |d| duration("lookback", d))?;
    if lookback < Duration::from_secs(60) || lookback > MAX_LOOKBACK {
        return Err(InvalidInput::new(
            "lookback",
            format!(
                "must be from 1 minute to {} days (the minute rows kept by default)",
                MAX_LOOKBACK.as_secs() / 86_400
            ),
        ));
    }
    let max_wait = req
        .max_wait
        .map_or(Ok(DEFAULT_MAX_WAIT), |d| duration("max_wait", d))?;
    if max_wait > MAX_MAX_WAIT {
        return Err(InvalidInput::new(
            "max_wait",
            format!("must be at most {} s", MAX_MAX_WAIT.as_secs()),
        ));
    }
    let until = req.until.map_or(Ok(now), |t| timestamp("until", t))?;
    Ok(crate::preview::Span::back_from(until, lookback, max_wait))
}

/// A bucket's preview on the wire.
pub(crate) fn bucket_impact_to_proto(p: &crate::preview::BucketPreview) -> v1::BucketImpact {
    let limits = |l: &tollgate_core::global_bucket::Limits| v1::ResourceLimits {
        refill_rate: l.refill_rate,
        burst_limit: l.burst_limit,
    };
    let impact = |i: &tollgate_core::impact::Impact| v1::LimitsImpact {
        demand_tokens: i.demand,
        throttled_tokens: i.throttled,
        delayed_tokens: i.delayed,
        longest_wait: Some(tollgate_proto::duration(Duration::from_secs_f64(
            i.longest_wait_seconds,
        ))),
        busiest_hour: i.busiest_hour.map(|h| timestamp_to_proto(h.start)),
        busiest_hour_demand_tokens: i.busiest_hour.map_or(0.0, |h| h.demand),
        busiest_hour_throttled_tokens: i.busiest_hour.map_or(0.0, |h| h.throttled),
        recorded_throttled_pod_seconds: i.recorded_throttled_seconds,
        budget_reached: i.budget_reached.map(timestamp_to_proto),
    };
    v1::BucketImpact {
        tenant_id: p.key.tenant.as_str().to_owned(),
        bucket: p.key.bucket.as_str().to_owned(),
        current_limits: Some(limits(&p.current_limits)),
        proposed_limits: Some(limits(&p.proposed_limits)),
        current: Some(impact(&p.current)),
        proposed: Some(impact(&p.proposed)),
        current_shadow: p.current_shadow,
        proposed_shadow: p.proposed_shadow,
    }
}

/// The busiest keys a `GetHistory` answer lists.
pub const HISTORY_BUSIEST_KEYS: usize = 10;

/// A bucket's history rows, and its per-key check rows, as the points of
/// a `GetHistory` answer.
pub(crate) fn history_to_proto(
    rows: &crate::store::HistoryRows,
    checks: &crate::store::CheckHistoryRows,
    read_at: Timestamp,
) -> v1::GetHistoryResponse {
    use tollgate_core::history::checks;
    let check_points = checks::per_slot(&checks.rows, checks.resolution.step, read_at)
        .iter()
        .map(|slot| v1::CheckPoint {
            from: Some(timestamp_to_proto(slot.from)),
            to: Some(timestamp_to_proto(slot.to)),
            checks: slot.checks,
            refusals: slot.refusals,
            shadow_refusals: slot.shadow_refusals,
            checks_per_second: slot.per_second(slot.checks),
            refusals_per_second: slot.per_second(slot.refusals),
            shadow_refusals_per_second: slot.per_second(slot.shadow_refusals),
            replicas: u32::try_from(slot.replicas).unwrap_or(u32::MAX),
        })
        .collect();
    let busiest_keys = checks::busiest(&checks.rows, HISTORY_BUSIEST_KEYS)
        .into_iter()
        .map(|k| v1::CheckedKey {
            key: k.key,
            checks_at_least: k.checks,
        })
        .collect();
    let points = tollgate_core::history::usage(&rows.samples)
        .iter()
        .filter(|u| {
            u.consumption != tollgate_core::Consumption::default()
                || u.granted_tokens > 0.0
                || u.throttled_micros > 0
        })
        .map(|u| v1::HistoryPoint {
            from: Some(timestamp_to_proto(u.from)),
            to: Some(timestamp_to_proto(u.to)),
            consumption: Some(v1::Consumption::from(&u.consumption)),
            granted_tokens: u.granted_tokens,
            request_units_per_second: u.request_units_per_second(),
            granted_tokens_per_second: u.granted_per_second(),
            throttled_pod_seconds: u.throttled_micros as f64 / 1e6,
            throttled_pods: u.throttled_pods(),
            level: u.level,
        })
        .collect();
    v1::GetHistoryResponse {
        step: Some(tollgate_proto::duration(rows.resolution.step)),
        points,
        read_at: Some(timestamp_to_proto(read_at)),
        check_points,
        busiest_keys,
    }
}

pub(crate) fn timestamp_to_proto(t: Timestamp) -> prost_types::Timestamp {
    let micros = t.unix_micros();
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: i32::try_from(micros.rem_euclid(1_000_000) * 1_000).unwrap_or(0),
    }
}

pub fn grant_to_proto(g: &Grant) -> v1::TokenBucketResponse {
    v1::TokenBucketResponse {
        granted_tokens: g.granted_tokens,
        trickle_duration: Some(tollgate_proto::duration(g.trickle_duration)),
        max_burst_tokens: g.max_burst_tokens,
        fallback_rate: g.fallback_rate,
        fallback_charged_tokens: g.fallback_charged,
        initial_allowance: g.initial_allowance,
    }
}

fn instance_to_proto(snapshot: &BucketSnapshot, i: &InstanceState) -> v1::Instance {
    v1::Instance {
        instance_id: i.instance_id,
        next_instance_id: i.next_instance_id,
        lease: i.lease.clone(),
        seq: i.seq,
        shares: i.shares,
        last_update: Some(timestamp_to_proto(i.last_update)),
        silent_for: Some(tollgate_proto::duration(snapshot.silent_for(i))),
    }
}

/// A bucket as the wire's `Tenant` view (one per bucket of a tenant).
pub fn bucket_to_proto(snapshot: &BucketSnapshot) -> v1::Tenant {
    let (state, members, totals) = (
        &snapshot.head.state,
        &snapshot.head.members,
        &snapshot.head.totals,
    );
    v1::Tenant {
        tenant_id: snapshot.key.tenant.to_string(),
        bucket: snapshot.key.bucket.to_string(),
        limits: Some(v1::ResourceLimits {
            refill_rate: state.limits.refill_rate,
            burst_limit: state.limits.burst_limit,
        }),
        configured: state.configured,
        current_tokens: snapshot.current_tokens(),
        share_sum: members.share_sum,
        consumption: Some((&totals.consumption).into()),
        instances: snapshot
            .instances
            .iter()
            .map(|i| instance_to_proto(snapshot, i))
            .collect(),
        live_instances: snapshot.live_instances(),
        created_at: Some(timestamp_to_proto(state.created_at)),
        updated_at: Some(timestamp_to_proto(state.updated_at)),
        granted_tokens: totals.granted_tokens,
        state: None,
        throttled_micros: totals.throttled_micros,
        shadow: !snapshot.head.enforce,
        shadow_throttled_tokens: snapshot.head.shadow.throttled_tokens,
        shadow_throttled_micros: snapshot.head.shadow.throttled_micros,
    }
}

/// A tenant's state (tombstone or suspension) as the wire carries it.
pub fn tenant_state_to_proto(state: &TenantState) -> v1::TenantState {
    v1::TenantState {
        kind: state.kind.name().to_owned(),
        since: Some(timestamp_to_proto(state.since)),
        actor: state.actor.clone(),
        reason: state.reason.clone(),
    }
}

/// A closed record as the wire's `ClosedBucket`.
pub fn closed_to_proto(closed: &ClosedBucket) -> v1::ClosedBucket {
    let by = &closed.closed_by;
    v1::ClosedBucket {
        tenant_id: closed.tenant.to_string(),
        bucket: closed.bucket.to_string(),
        closed_at: Some(timestamp_to_proto(closed.closed_at)),
        reason: match closed.reason {
            CloseReason::TierChange => v1::CloseReason::TierChange,
            CloseReason::TierRedefined => v1::CloseReason::TierRedefined,
            CloseReason::OverrideCleared => v1::CloseReason::OverrideCleared,
            CloseReason::TenantDeleted => v1::CloseReason::TenantDeleted,
        }
        .into(),
        actor: by.actor.clone().unwrap_or_default(),
        operator: by.operator.clone().unwrap_or_default(),
        peer: by.peer.clone().unwrap_or_default(),
        limits: Some(v1::ResourceLimits {
            refill_rate: closed.limits.refill_rate,
            burst_limit: closed.limits.burst_limit,
        }),
        consumption: Some((&closed.totals.consumption).into()),
        granted_tokens: closed.totals.granted_tokens,
        created_at: Some(timestamp_to_proto(closed.created_at)),
    }
}

/// A tier as a request carries it, checked field by field: its buckets
/// (`tier.buckets`), then its tables (`tier.tables`).
pub fn tier_from_proto(tier: Option<v1::Tier>) -> Result<(TierName, Tier), InvalidInput> {
    let wire = tier.ok_or_else(|| InvalidInput::new("tier", "must be set"))?;
    let name = TierName::parse("tier.name", &wire.name)?;
    let definitions = wire
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            Ok((
                b.bucket.as_str(),
                definition_from_proto(&format!("tier.buckets[{i}]"), b)?,
            ))
        })
        .collect::<Result<Vec<_>, InvalidInput>>()?;
    // The store sets the timestamps.
    let mut tier = Tier::from_definitions("tier.buckets", definitions, Timestamp::EPOCH)?;
    tier.tables = table_limits(
        "tier.tables",
        wire.tables
            .iter()
            .map(|t| (t.table.as_str(), table_limits_from_proto(t))),
    )?;
    let budgets = wire
        .budgets
        .iter()
        .enumerate()
        .map(|(i, b)| budget_at(&format!("tier.budgets[{i}]"), b))
        .collect::<Result<Vec<_>, InvalidInput>>()?;
    tier.budgets = tollgate_core::tier::tier_budgets(&tier, "tier.budgets", budgets)?;
    tier.enforce = tollgate_proto::enforce_from_wire(wire.enforce);
    Ok((name, tier))
}

/// A table's limits as a request carries them (checked where used).
pub fn table_limits_from_proto(t: &v1::TableLimits) -> TableLimits {
    TableLimits {
        max_reads_per_second: t.max_reads_per_second,
        max_writes_per_second: t.max_writes_per_second,
    }
}

pub fn table_limits_to_proto(table: &TableName, limits: &TableLimits) -> v1::TableLimits {
    v1::TableLimits {
        table: table.to_string(),
        max_reads_per_second: limits.max_reads_per_second,
        max_writes_per_second: limits.max_writes_per_second,
    }
}

/// A bucket definition: its kind checked here (an unknown number is
/// refused, naming `field.kind`), its numbers where it is used.
pub fn definition_from_proto(
    field: &str,
    b: &v1::BucketDefinition,
) -> Result<BucketDefinition, InvalidInput> {
    let kind = match v1::BucketKind::try_from(b.kind) {
        Ok(v1::BucketKind::Shared) => BucketKind::Shared,
        Ok(v1::BucketKind::PerKey) => BucketKind::PerKey,
        Err(_) => {
            return Err(InvalidInput::new(
                format!("{field}.kind"),
                format!(
                    "must be BUCKET_KIND_SHARED (0) or BUCKET_KIND_PER_KEY (1), got {}",
                    b.kind
                ),
            ));
        }
    };
    let quota = b
        .quota
        .as_ref()
        .map(|q| quota_from_proto(&format!("{field}.quota"), q))
        .transpose()?;
    Ok(BucketDefinition {
        quota,
        limits: Limits {
            refill_rate: b.refill_rate,
            burst_limit: b.burst_limit,
        },
        initial_tokens: b.initial_tokens,
        kind,
        enforce: tollgate_proto::enforce_from_wire(b.enforce),
    })
}

fn definition_to_proto(bucket: &BucketName, d: &BucketDefinition) -> v1::BucketDefinition {
    let kind = match d.kind {
        BucketKind::Shared => v1::BucketKind::Shared,
        BucketKind::PerKey => v1::BucketKind::PerKey,
    };
    v1::BucketDefinition {
        bucket: bucket.to_string(),
        refill_rate: d.limits.refill_rate,
        burst_limit: d.limits.burst_limit,
        initial_tokens: d.initial_tokens,
        kind: kind.into(),
        quota: d.quota.as_ref().map(quota_to_proto),
        enforce: tollgate_proto::enforce_to_wire(d.enforce),
    }
}

pub fn tier_to_proto(name: &TierName, tier: &Tier) -> v1::Tier {
    v1::Tier {
        name: name.to_string(),
        buckets: tier
            .buckets
            .iter()
            .map(|(bucket, d)| definition_to_proto(bucket, d))
            .collect(),
        created_at: Some(timestamp_to_proto(tier.created_at)),
        updated_at: Some(timestamp_to_proto(tier.updated_at)),
        tables: tier
            .tables
            .iter()
            .map(|(table, limits)| table_limits_to_proto(table, limits))
            .collect(),
        budgets: tier
            .budgets
            .iter()
            .map(|(bucket, budget)| budget_to_proto(bucket, budget))
            .collect(),
        enforce: tollgate_proto::enforce_to_wire(tier.enforce),
    }
}

pub fn tenant_view_to_proto(view: &TenantView) -> v1::TenantTier {
    let record = view.record.as_ref();
    v1::TenantTier {
        tenant_id: view.tenant.to_string(),
        tier: record
            .and_then(|r| r.tier.as_ref())
            .map(ToString::to_string)
            .unwrap_or_default(),
        overrides: record
            .map(|r| {
                r.overrides
                    .iter()
                    .map(|(bucket, d)| definition_to_proto(bucket, d))
                    .collect()
            })
            .unwrap_or_default(),
        buckets: view.buckets.iter().map(bucket_to_proto).collect(),
        table_overrides: record
            .map(|r| {
                r.table_overrides
                    .iter()
                    .map(|(table, limits)| table_limits_to_proto(table, limits))
                    .collect()
            })
            .unwrap_or_default(),
        key_buckets: Vec::new(),
        state: None,
    }
}

/// A per-key bucket as the wire's `KeyBucket`, with this replica's check
/// `rates`: each busy key read at the snapshot's time under the
/// definition in force.
pub fn key_bucket_to_proto(snapshot: &KeyBucketSnapshot, rates: &WindowRates) -> v1::KeyBucket {
    let limits = snapshot.definition.limits;
    v1::KeyBucket {
        tenant_id: snapshot.key.tenant.to_string(),
        bucket: snapshot.key.bucket.to_string(),
        limits: Some(v1::ResourceLimits {
            refill_rate: limits.refill_rate,
            burst_limit: limits.burst_limit,
        }),
        overridden: snapshot.defined_by == DefinedBy::Override,
        keys_stored: snapshot.keys_stored,
        busiest_keys: snapshot
            .busiest
            .iter()
            .map(|(key, stored)| {
                let reading = KeyReading::new(key.clone(), stored, &limits, snapshot.read_at);
                v1::BusyKey {
                    key: reading.key,
                    tokens: reading.tokens,
                    full_in: reading.full_in.map(tollgate_proto::duration),
                }
            })
            .collect(),
        checks_per_second: rates.events_per_second,
        refusals_per_second: rates.refusals_per_second,
        rate_window: Some(tollgate_proto::duration(rates.window)),
        read_at: Some(timestamp_to_proto(snapshot.read_at)),
    }
}

/// A check's answer as the wire carries it.
pub fn check_answer(answer: &CallAnswer) -> v1::CheckResponse {
    v1::CheckResponse {
        allowed: answer.allowed,
        answers: answer
            .items
            .iter()
            .map(|item| v1::CheckAnswer {
                allowed: item.answer.allowed,
                remaining_tokens: item.answer.remaining,
                retry_after: item.answer.retry_after.map(tollgate_proto::duration),
                reset_after: item.answer.reset_after.map(tollgate_proto::duration),
                refill_rate: item.limits.refill_rate,
                burst_limit: item.limits.burst_limit,
                replayed: item.replayed,
                quota_remaining: item.answer.quota.map(|q| q.remaining),
                quota_resets_at: item.answer.quota.map(|q| timestamp_to_proto(q.resets_at)),
                shadow_refused: item.answer.shadow_refused,
            })
            .collect(),
    }
}

/// A member of an organisation on the wire, with its buckets' draws.
pub fn member_to_proto(
    id: &TenantId,
    node: &tollgate_core::organisation::Node,
    buckets: &[BucketSnapshot],
) -> v1::OrganizationMember {
    let member = node.member_of.as_ref();
    v1::OrganizationMember {
        member_id: id.to_string(),
        is_organization: node.organisation.is_some(),
        guaranteed_rates: member
            .map(|m| {
                m.guaranteed
                    .iter()
                    .map(|(b, r)| (b.to_string(), *r))
                    .collect()
            })
            .unwrap_or_default(),
        since: member.map(|m| timestamp_to_proto(m.since)),
        buckets: buckets
            .iter()
            .map(|b| member_bucket_to_proto(b, member))
            .collect(),
    }
}

fn member_bucket_to_proto(
    snapshot: &BucketSnapshot,
    member: Option<&tollgate_core::organisation::Member>,
) -> v1::MemberBucket {
    let head = &snapshot.head;
    let draw = head.draw.as_deref();
    let rates = tollgate_core::organisation::MemberRates::of(
        head,
        member,
        &snapshot.key.bucket,
        snapshot.read_at,
    );
    v1::MemberBucket {
        bucket: snapshot.key.bucket.to_string(),
        limits: Some(v1::ResourceLimits {
            refill_rate: head.state.limits.refill_rate,
            burst_limit: head.state.limits.burst_limit,
        }),
        drawing: head.state.drawn.is_some(),
        wanted_rate: rates.wanted,
        drawn_rate: rates.drawn,
        drawn_tokens: draw.map_or(0.0, |d| d.last_granted),
        guaranteed_rate: rates.guaranteed,
        borrowed_rate: rates.borrowed,
        next_draw: draw.map(|d| timestamp_to_proto(d.next)),
        draws: rates.draws,
        consumption: Some((&head.totals.consumption).into()),
        granted_tokens: head.totals.granted_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_at_microsecond_resolution() {
        for micros in [0, 1, 999_999, 1_700_000_000_123_456] {
            let t = Timestamp::from_unix_micros(micros);
            assert_eq!(timestamp("t", timestamp_to_proto(t)).expect("valid"), t);
        }
    }

    #[test]
    fn malformed_timestamps_and_durations_are_refused() {
        let bad = [
            prost_types::Timestamp {
                seconds: -1,
                nanos: 0,
            },
            prost_types::Timestamp {
                seconds: 0,
                nanos: -1,
            },
            prost_types::Timestamp {
                seconds: 0,
                nanos: 1_000_000_000,
            },
            prost_types::Timestamp {
                seconds: MAX_TIMESTAMP_SECONDS + 1,
                nanos: 0,
            },
        ];
        for t in bad {
            assert_eq!(timestamp("as_of", t).expect_err("bad").field, "as_of");
        }
        // Negative, or not normalized the way google.protobuf.Duration
        // requires: refused, not normalized into something else.
        for (seconds, nanos) in [(-5, 0), (1, 2_000_000_000), (1, -1)] {
            let d = prost_types::Duration { seconds, nanos };
            assert!(duration("d", d).is_err(), "{seconds} s {nanos} ns");
        }
    }
}
