//! Budgets and quotas in the tiers file: a budget for the request-unit
//! bucket under the tier, a shared bucket's under the bucket; a quota under
//! any bucket (per key, for a per-key bucket):
//!
//! ```toml
//! [tiers.pro.buckets.api-calls.quota]   # each key 10 000 calls a month
//! amount = 10_000
//! cycle = "monthly"                     # the same keys as a budget's cycle
//! ```
//!
//! Budgets:
//!
//! ```toml
//! [tiers.free.budget]                  # the request-unit bucket's
//! amount = 50_000_000                  # tokens per cycle
//! cycle = "monthly"                    # monthly, weekly or daily
//! anchor_day = 1                       # monthly: 1 to 31 (default 1)
//! time_zone = "UTC"                    # IANA name (default UTC)
//! at_limit = "throttle"                # notify, throttle or stop
//! baseline_rate = 100                  # throttle: tokens per second
//! baseline_burst = 1000                # optional, default 10 s of the rate
//!
//! [tiers.pro.buckets.schedule-email.budget]
//! amount = 100_000
//! cycle = "weekly"
//! anchor_weekday = "monday"            # weekly (default monday)
//! at_limit = "stop"
//! thresholds = [50, 90, "forecast:100"]  # default 50, 75, 90, 100
//! price_per_million_tokens = 0.2       # with currency, for display
//! currency = "USD"
//! ```
//!
//! A budget is built as the wire's `Budget` and checked by the server's
//! own rules (`tollgate_server::service::budget_at`), so the file refuses
//! exactly what `PutTier` would; each refusal points at the key at fault.

use serde::Deserialize;
use std::ops::Range;
use tollgate_core::BucketName;
use tollgate_core::budget::{Budget, Quota};
use tollgate_core::validate::InvalidInput;
use tollgate_proto::v1;

use toml::Spanned;

use super::{FileError, Source, toml_key};

/// Seconds of the baseline rate a throttle's burst holds unless told
/// (`tollgate budget set --baseline-burst` has the same default).
pub const DEFAULT_BASELINE_BURST_SECONDS: f64 = 10.0;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetToml {
    amount: Spanned<f64>,
    cycle: Spanned<String>,
    anchor_day: Option<Spanned<u32>>,
    anchor_weekday: Option<Spanned<String>>,
    time_zone: Option<Spanned<String>>,
    at_limit: Spanned<String>,
    baseline_rate: Option<Spanned<f64>>,
    baseline_burst: Option<Spanned<f64>>,
    thresholds: Option<Spanned<Vec<ThresholdToml>>>,
    price_per_million_tokens: Option<Spanned<f64>>,
    currency: Option<Spanned<String>>,
    /// `false`: shadow mode (throttle and stop only alert).
    enforce: Option<bool>,
}

/// A bucket's calendar quota: `[tiers.T.buckets.B.quota]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QuotaToml {
    amount: Spanned<f64>,
    cycle: Spanned<String>,
    anchor_day: Option<Spanned<u32>>,
    anchor_weekday: Option<Spanned<String>>,
    time_zone: Option<Spanned<String>>,
}

/// A threshold: a percentage of the spend (`75`), or a label (`"75"`,
/// `"forecast:100"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ThresholdToml {
    Percent(u32),
    Label(String),
}

/// A text the file may leave out: empty if it does.
fn text(value: Option<&Spanned<String>>) -> String {
    value.map(|v| v.get_ref().clone()).unwrap_or_default()
}

/// The keys a budget and a quota share: the amount and the cycle.
struct CycleKeys<'a> {
    amount: &'a Spanned<f64>,
    cycle: &'a Spanned<String>,
    anchor_day: Option<&'a Spanned<u32>>,
    anchor_weekday: Option<&'a Spanned<String>>,
    time_zone: Option<&'a Spanned<String>>,
}

impl BudgetToml {
    fn cycle_keys(&self) -> CycleKeys<'_> {
        CycleKeys {
            amount: &self.amount,
            cycle: &self.cycle,
            anchor_day: self.anchor_day.as_ref(),
            anchor_weekday: self.anchor_weekday.as_ref(),
            time_zone: self.time_zone.as_ref(),
        }
    }
}

impl QuotaToml {
    fn cycle_keys(&self) -> CycleKeys<'_> {
        CycleKeys {
            amount: &self.amount,
            cycle: &self.cycle,
            anchor_day: self.anchor_day.as_ref(),
            anchor_weekday: self.anchor_weekday.as_ref(),
            time_zone: self.time_zone.as_ref(),
        }
    }
}

impl CycleKeys<'_> {
    /// The wire's cycle of `period`, the anchors and the zone.
    fn to_proto(&self, period: v1::BudgetPeriod) -> v1::BudgetCycle {
        v1::BudgetCycle {
            period: period.into(),
            anchor_day: self.anchor_day.map_or(0, |d| *d.get_ref()),
            anchor_weekday: text(self.anchor_weekday),
            time_zone: text(self.time_zone),
        }
    }

    /// The file's key a refusal of `wire` (a field of the wire's budget or
    /// quota, its prefix taken off) is about, and where it is written (none
    /// if it is not); `None` if it is not one of these keys.
    fn key_of(&self, wire: &str) -> Option<(&'static str, Option<Range<usize>>)> {
        Some(match wire {
            "amount" => ("amount", Some(self.amount.span())),
            "cycle.period" => ("cycle", Some(self.cycle.span())),
            "cycle.anchor_day" => ("anchor_day", self.anchor_day.map(Spanned::span)),
            "cycle.anchor_weekday" => ("anchor_weekday", self.anchor_weekday.map(Spanned::span)),
            "cycle.time_zone" => ("time_zone", self.time_zone.map(Spanned::span)),
            _ => return None,
        })
    }
}

/// The path of `key` in the table at `path`; the table's own for none.
fn key_path(path: &str, key: &str) -> String {
    if key.is_empty() {
        path.to_owned()
    } else {
        format!("{path}.{}", toml_key(key))
    }
}

impl Source<'_> {
    /// The quota at `path` (`tiers.pro.buckets.api.quota`), checked by the
    /// server's rules; `None` (its errors recorded) if it is not valid.
    pub(super) fn quota(
        &self,
        errors: &mut Vec<FileError>,
        path: &str,
        table: &Spanned<QuotaToml>,
    ) -> Option<Quota> {
        let keys = table.get_ref().cycle_keys();
        let period = self.period(errors, path, keys.cycle)?;
        let wire = v1::Quota {
            amount: *keys.amount.get_ref(),
            cycle: Some(keys.to_proto(period)),
        };
        match tollgate_server::service::quota_from_proto("quota", &wire) {
            Ok(quota) => Some(quota),
            Err(e) => {
                let wire_field = e.field.strip_prefix("quota.").unwrap_or(&e.field);
                let (key, span) = keys.key_of(wire_field).unwrap_or(("", None));
                let span = span.unwrap_or_else(|| table.span());
                errors.push(self.error(&span, Some(key_path(path, key)), e.reason));
                None
            }
        }
    }

    /// A cycle's period by its name in the file.
    fn period(
        &self,
        errors: &mut Vec<FileError>,
        path: &str,
        cycle: &Spanned<String>,
    ) -> Option<v1::BudgetPeriod> {
        match cycle.get_ref().as_str() {
            "monthly" => Some(v1::BudgetPeriod::Monthly),
            "weekly" => Some(v1::BudgetPeriod::Weekly),
            "daily" => Some(v1::BudgetPeriod::Daily),
            other => {
                errors.push(self.error(
                    &cycle.span(),
                    Some(format!("{path}.cycle")),
                    format!("must be \"monthly\", \"weekly\" or \"daily\", got {other:?}"),
                ));
                None
            }
        }
    }

    /// The budget at `path` (`tiers.free.budget`) of `bucket`, checked;
    /// `None` (its errors recorded) if it is not valid.
    pub(super) fn budget(
        &self,
        errors: &mut Vec<FileError>,
        path: &str,
        bucket: &BucketName,
        table: &Spanned<BudgetToml>,
    ) -> Option<Budget> {
        let toml = table.get_ref();
        let keys = toml.cycle_keys();
        let period = self.period(errors, path, keys.cycle)?;
        let mut refuse = |key: &str, span: Range<usize>, message: String| {
            errors.push(self.error(&span, Some(key_path(path, key)), message));
        };
        let at_limit = match toml.at_limit.get_ref().as_str() {
            "notify" => v1::BudgetAtLimit::Notify,
            "throttle" => v1::BudgetAtLimit::Throttle,
            "stop" => v1::BudgetAtLimit::Stop,
            other => {
                refuse(
                    "at_limit",
                    toml.at_limit.span(),
                    format!("must be \"notify\", \"throttle\" or \"stop\", got {other:?}"),
                );
                return None;
            }
        };
        let rate = toml.baseline_rate.as_ref().map(|r| *r.get_ref());
        let baseline = match (at_limit, rate) {
            (v1::BudgetAtLimit::Throttle, None) => {
                refuse(
                    "at_limit",
                    toml.at_limit.span(),
                    "\"throttle\" needs baseline_rate: the tokens per second past the amount"
                        .to_owned(),
                );
                return None;
            }
            (v1::BudgetAtLimit::Throttle, Some(rate)) => Some(v1::ResourceLimits {
                refill_rate: rate,
                burst_limit: toml
                    .baseline_burst
                    .as_ref()
                    .map_or(rate * DEFAULT_BASELINE_BURST_SECONDS, |b| *b.get_ref()),
            }),
            _ => {
                if let Some(extra) = toml.baseline_rate.as_ref().or(toml.baseline_burst.as_ref()) {
                    let key = if toml.baseline_rate.is_some() {
                        "baseline_rate"
                    } else {
                        "baseline_burst"
                    };
                    refuse(
                        key,
                        extra.span(),
                        "is only for at_limit = \"throttle\"".to_owned(),
                    );
                    return None;
                }
                None
            }
        };
        let wire = v1::Budget {
            bucket: bucket.as_str().to_owned(),
            amount: *keys.amount.get_ref(),
            cycle: Some(keys.to_proto(period)),
            at_limit: at_limit.into(),
            baseline,
            thresholds: toml
                .thresholds
                .as_ref()
                .map(|list| {
                    list.get_ref()
                        .iter()
                        .map(|t| match t {
                            ThresholdToml::Percent(p) => p.to_string(),
                            ThresholdToml::Label(l) => l.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            price_per_million_tokens: toml
                .price_per_million_tokens
                .as_ref()
                .map_or(0.0, |p| *p.get_ref()),
            currency: text(toml.currency.as_ref()),
            enforce: tollgate_proto::enforce_to_wire(toml.enforce.unwrap_or(true)),
        };
        match tollgate_server::service::budget_at("budget", &wire) {
            Ok((_, budget)) => Some(budget),
            Err(e) => {
                let (key, span) = budget_key_of(&e, table);
                refuse(key, span, e.reason);
                None
            }
        }
    }
}

/// The file's key a refusal of the wire's budget is about, and where it
/// is (the table's header if the key is not written).
fn budget_key_of(e: &InvalidInput, table: &Spanned<BudgetToml>) -> (&'static str, Range<usize>) {
    let toml = table.get_ref();
    let wire = e.field.strip_prefix("budget.").unwrap_or(&e.field);
    let span_of = |s: Option<Range<usize>>| s.unwrap_or_else(|| table.span());
    if let Some((key, span)) = toml.cycle_keys().key_of(wire) {
        return (key, span_of(span));
    }
    match wire {
        "baseline.burst_limit" => (
            "baseline_burst",
            span_of(
                toml.baseline_burst
                    .as_ref()
                    .or(toml.baseline_rate.as_ref())
                    .map(Spanned::span),
            ),
        ),
        w if w.starts_with("baseline") => (
            "baseline_rate",
            span_of(toml.baseline_rate.as_ref().map(Spanned::span)),
        ),
        w if w.starts_with("thresholds") => (
            "thresholds",
            span_of(toml.thresholds.as_ref().map(Spanned::span)),
        ),
        "price_per_million_tokens" => (
            "price_per_million_tokens",
            span_of(toml.price_per_million_tokens.as_ref().map(Spanned::span)),
        ),
        "currency" => (
            "currency",
            span_of(
                toml.currency
                    .as_ref()
                    .map(Spanned::span)
                    .or(toml.price_per_million_tokens.as_ref().map(Spanned::span)),
            ),
        ),
        "at_limit" => ("at_limit", toml.at_limit.span()),
        _ => ("", table.span()),
    }
}
