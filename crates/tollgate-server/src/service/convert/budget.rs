//! Budgets on the wire: a `Budget` checked field by field into the core's
//! `Budget` (each refusal names the wire's field, `budget.cycle.time_zone`),
//! and a bucket's budget, cycles and standing back as the wire's messages.

use tollgate_core::budget::{
    AtLimit, Budget, BudgetView, CycleRecord, CycleRule, CycleUsage, DEFAULT_THRESHOLDS, Period,
    Price, Quota, Threshold, Weekday,
};
use tollgate_core::{BucketName, InvalidInput, Limits, Timestamp};
use tollgate_proto::v1;

use super::timestamp_to_proto;

/// The bucket and budget a request carries, checked.
pub fn budget_from_proto(wire: Option<&v1::Budget>) -> Result<(BucketName, Budget), InvalidInput> {
    let wire = wire.ok_or_else(|| InvalidInput::new("budget", "must be set"))?;
    checked_budget(wire)
}

/// A budget at `field` of a request (`tier.budgets[2]`), checked; its
/// refusals name the field under it.
pub fn budget_at(field: &str, wire: &v1::Budget) -> Result<(BucketName, Budget), InvalidInput> {
    checked_budget(wire).map_err(|e| {
        e.renamed(|name| match name.strip_prefix("budget") {
            Some(rest) => format!("{field}{rest}"),
            None => name.to_owned(),
        })
    })
}

fn checked_budget(wire: &v1::Budget) -> Result<(BucketName, Budget), InvalidInput> {
    let bucket = BucketName::parse("budget.bucket", &wire.bucket)?;
    let cycle = cycle_from_proto(wire.cycle.as_ref())?;
    let at_limit = match (wire.at_limit(), wire.baseline.as_ref()) {
        (v1::BudgetAtLimit::Unspecified, _) => {
            return Err(InvalidInput::new(
                "budget.at_limit",
                "must be set: NOTIFY, THROTTLE or STOP",
            ));
        }
        (v1::BudgetAtLimit::Throttle, Some(b)) => AtLimit::Throttle {
            baseline: Limits {
                refill_rate: b.refill_rate,
                burst_limit: b.burst_limit,
            },
        },
        (v1::BudgetAtLimit::Throttle, None) => {
            return Err(InvalidInput::new(
                "budget.baseline",
                "must be set under THROTTLE: the limits the bucket runs at past the amount",
            ));
        }
        (_, Some(_)) => {
            return Err(InvalidInput::new(
                "budget.baseline",
                "is only for THROTTLE: NOTIFY and STOP have no baseline",
            ));
        }
        (v1::BudgetAtLimit::Notify, None) => AtLimit::Notify,
        (v1::BudgetAtLimit::Stop, None) => AtLimit::Stop,
    };
    let thresholds = if wire.thresholds.is_empty() {
        DEFAULT_THRESHOLDS.map(Threshold::spend).to_vec()
    } else {
        wire.thresholds
            .iter()
            .enumerate()
            .map(|(i, label)| Threshold::parse(&format!("budget.thresholds[{i}]"), label))
            .collect::<Result<_, _>>()?
    };
    let price = match (wire.price_per_million_tokens, wire.currency.as_str()) {
        (0.0, "") => None,
        (p, "") => {
            return Err(InvalidInput::new(
                "budget.currency",
                format!("must be set with a price ({p} per million tokens)"),
            ));
        }
        (per_million_tokens, currency) => Some(Price {
            per_million_tokens,
            currency: currency.to_owned(),
        }),
    };
    let budget = Budget {
        amount: wire.amount,
        cycle,
        at_limit,
        thresholds,
        price,
        enforce: tollgate_proto::enforce_from_wire(wire.enforce),
    }
    .validated()
    .map_err(|e| {
        e.renamed(|field| match field {
            "anchor_day" | "time_zone" => format!("budget.cycle.{field}"),
            "price.per_million_tokens" => "budget.price_per_million_tokens".to_owned(),
            "price.currency" => "budget.currency".to_owned(),
            other => format!("budget.{other}"),
        })
    })?;
    Ok((bucket, budget))
}

fn cycle_from_proto(wire: Option<&v1::BudgetCycle>) -> Result<CycleRule, InvalidInput> {
    let wire = wire.ok_or_else(|| InvalidInput::new("budget.cycle", "must be set"))?;
    let only_for = |field: &str, period: &str| {
        InvalidInput::new(
            format!("budget.cycle.{field}"),
            format!("is only for {period} cycles"),
        )
    };
    let period = match wire.period() {
        v1::BudgetPeriod::Unspecified => {
            return Err(InvalidInput::new(
                "budget.cycle.period",
                "must be set: MONTHLY, WEEKLY or DAILY",
            ));
        }
        v1::BudgetPeriod::Monthly => {
            if !wire.anchor_weekday.is_empty() {
                return Err(only_for("anchor_weekday", "WEEKLY"));
            }
            let day = match u8::try_from(wire.anchor_day) {
                Ok(0) => 1,
                Ok(day) if day <= 31 => day,
                _ => {
                    return Err(InvalidInput::new(
                        "budget.cycle.anchor_day",
                        format!(
                            "must be a day of the month from 1 to 31, got {}",
                            wire.anchor_day
                        ),
                    ));
                }
            };
            Period::Monthly { anchor_day: day }
        }
        v1::BudgetPeriod::Weekly => {
            if wire.anchor_day != 0 {
                return Err(only_for("anchor_day", "MONTHLY"));
            }
            let anchor_weekday = if wire.anchor_weekday.is_empty() {
                Weekday::Monday
            } else {
                Weekday::parse(&wire.anchor_weekday).ok_or_else(|| {
                    InvalidInput::new(
                        "budget.cycle.anchor_weekday",
                        format!(
                            "{:?} is not a day of the week: monday to sunday",
                            wire.anchor_weekday
                        ),
                    )
                })?
            };
            Period::Weekly { anchor_weekday }
        }
        v1::BudgetPeriod::Daily => {
            if wire.anchor_day != 0 {
                return Err(only_for("anchor_day", "MONTHLY"));
            }
            if !wire.anchor_weekday.is_empty() {
                return Err(only_for("anchor_weekday", "WEEKLY"));
            }
            Period::Daily
        }
    };
    let time_zone = if wire.time_zone.is_empty() {
        "UTC".to_owned()
    } else {
        wire.time_zone.clone()
    };
    Ok(CycleRule { period, time_zone })
}

/// A budget as the wire carries it.
pub fn budget_to_proto(bucket: &BucketName, budget: &Budget) -> v1::Budget {
    let (at_limit, baseline) = match budget.at_limit {
        AtLimit::Notify => (v1::BudgetAtLimit::Notify, None),
        AtLimit::Stop => (v1::BudgetAtLimit::Stop, None),
        AtLimit::Throttle { baseline } => (
            v1::BudgetAtLimit::Throttle,
            Some(v1::ResourceLimits {
                refill_rate: baseline.refill_rate,
                burst_limit: baseline.burst_limit,
            }),
        ),
    };
    v1::Budget {
        bucket: bucket.to_string(),
        amount: budget.amount,
        cycle: Some(cycle_to_proto(&budget.cycle)),
        at_limit: at_limit.into(),
        baseline,
        thresholds: budget.thresholds.iter().map(Threshold::label).collect(),
        price_per_million_tokens: budget.price.as_ref().map_or(0.0, |p| p.per_million_tokens),
        currency: budget
            .price
            .as_ref()
            .map_or_else(String::new, |p| p.currency.clone()),
        enforce: tollgate_proto::enforce_to_wire(budget.enforce),
    }
}

/// A quota at `field` of a request (`tier.buckets[0].quota`), checked;
/// its refusals name the field under it.
pub fn quota_from_proto(field: &str, wire: &v1::Quota) -> Result<Quota, InvalidInput> {
    let rename = |e: InvalidInput| {
        e.renamed(|name| match name.strip_prefix("budget.cycle") {
            Some(rest) => format!("{field}.cycle{rest}"),
            None => format!("{field}.{}", name.strip_prefix("quota.").unwrap_or(name)),
        })
    };
    let quota = Quota {
        amount: wire.amount,
        cycle: cycle_from_proto(wire.cycle.as_ref()).map_err(rename)?,
    };
    quota.validate().map_err(rename)?;
    Ok(quota)
}

/// A quota as the wire carries it.
pub fn quota_to_proto(quota: &Quota) -> v1::Quota {
    v1::Quota {
        amount: quota.amount,
        cycle: Some(cycle_to_proto(&quota.cycle)),
    }
}

fn cycle_to_proto(cycle: &CycleRule) -> v1::BudgetCycle {
    let (period, anchor_day, anchor_weekday) = match cycle.period {
        Period::Monthly { anchor_day } => (
            v1::BudgetPeriod::Monthly,
            u32::from(anchor_day),
            String::new(),
        ),
        Period::Weekly { anchor_weekday } => (
            v1::BudgetPeriod::Weekly,
            0,
            anchor_weekday.name().to_owned(),
        ),
        Period::Daily => (v1::BudgetPeriod::Daily, 0, String::new()),
    };
    v1::BudgetCycle {
        period: period.into(),
        anchor_day,
        anchor_weekday,
        time_zone: cycle.time_zone.clone(),
    }
}

/// A cycle's usage as the wire carries it.
pub fn cycle_usage_to_proto(
    cycle: &tollgate_core::budget::Cycle,
    amount: f64,
    usage: &CycleUsage,
    limit_reached_at: Option<Timestamp>,
    closed: bool,
) -> v1::BudgetCycleUsage {
    v1::BudgetCycleUsage {
        start: Some(timestamp_to_proto(cycle.start)),
        end: Some(timestamp_to_proto(cycle.end)),
        amount,
        granted_tokens: usage.granted_tokens,
        fallback_tokens: usage.fallback_tokens,
        spend: usage.spend(),
        consumption: Some((&usage.consumption).into()),
        limit_reached_at: limit_reached_at.map(timestamp_to_proto),
        closed,
    }
}

/// A closed cycle's record as the wire carries it.
pub fn cycle_record_to_proto(record: &CycleRecord) -> v1::BudgetCycleUsage {
    cycle_usage_to_proto(
        &record.cycle,
        record.amount,
        &record.usage,
        record.limit_reached_at,
        true,
    )
}

/// A bucket's budget as it stands, read at `read_at`.
pub fn status_to_proto(
    tenant: &str,
    bucket: &BucketName,
    view: &BudgetView,
    read_at: Timestamp,
) -> v1::BudgetStatus {
    v1::BudgetStatus {
        tenant_id: tenant.to_owned(),
        budget: Some(budget_to_proto(bucket, &view.budget)),
        current: Some(cycle_usage_to_proto(
            &view.cycle,
            view.budget.amount,
            &view.usage,
            view.limit_reached_at,
            false,
        )),
        forecast: view.forecast,
        spend_rate: view.rate,
        remaining: view.remaining,
        state: view.standing.name().to_owned(),
        fired: view.fired.iter().map(Threshold::label).collect(),
        own_limits: Some(v1::ResourceLimits {
            refill_rate: view.own_limits.refill_rate,
            burst_limit: view.own_limits.burst_limit,
        }),
        read_at: Some(timestamp_to_proto(read_at)),
        shadow_excess: view.shadow_excess,
    }
}
