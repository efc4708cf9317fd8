//! A tier as the CLI holds it: its bucket definitions and its tables'
//! per-partition limits, validated names and limits, read from `--bucket
//! NAME=RATE/BURST[/INITIAL]` flags, a tiers file or the server's answers,
//! and turned back into the wire's `Tier`.
//!
//! The bounds are the wire contract's (`BucketDefinition` and
//! `TableLimits` in `admin.proto`), checked with the core's `validate` and
//! `TableLimits::validate` so that the CLI refuses exactly what the server
//! would, before anything is sent.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Serialize;
use tollgate_core::budget::{AtLimit, Budget, Period, Quota};
use tollgate_core::partition::{TableLimitSet, TableLimits};
use tollgate_core::tier::BucketKind;
use tollgate_core::validate::{self, InvalidInput, MAX_REFILL_RATE, MAX_TOKENS};
use tollgate_core::{BucketName, TableName, TierName};
use tollgate_proto::v1;
use tollgate_server::service::{budget_at, budget_to_proto, quota_from_proto, quota_to_proto};

/// The most buckets one tier defines (`Tier.buckets` in `admin.proto`).
pub const MAX_TIER_BUCKETS: usize = 1000;

/// One bucket's limits as a tier (or an override) defines them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketLimits {
    /// Tokens added per second.
    pub refill_rate: f64,
    /// Refill pauses at this many tokens.
    pub burst_limit: f64,
    /// Tokens a newly provisioned bucket starts with; `burst_limit` if unset.
    pub initial_tokens: Option<f64>,
    /// Shared by the tenant's pods, or one bucket per key.
    pub kind: BucketKind,
    /// A calendar quota on top of the rate (per key for a per-key bucket).
    pub quota: Option<Quota>,
    /// False: shadow mode (decided and counted as if enforced, refusing
    /// and throttling nothing).
    pub enforce: bool,
}

impl BucketLimits {
    /// What a new bucket starts with: `initial_tokens`, else the burst.
    pub fn effective_initial_tokens(&self) -> f64 {
        self.initial_tokens.unwrap_or(self.burst_limit)
    }

    /// Whether the two give a tenant the same bucket. An unset
    /// `initial_tokens` equals one set to the burst limit, so a server that
    /// fills in the default does not make every tier look changed.
    pub fn same_as(&self, other: &BucketLimits) -> bool {
        self.refill_rate == other.refill_rate
            && self.burst_limit == other.burst_limit
            && self.effective_initial_tokens() == other.effective_initial_tokens()
            && self.kind == other.kind
            && self.quota == other.quota
            && self.enforce == other.enforce
    }

    /// The limits as text: `refill_rate 10, burst_limit 100` (and
    /// `initial_tokens N` when set).
    pub fn text(&self) -> String {
        let mut text = format!(
            "refill_rate {}, burst_limit {}",
            validate::number(self.refill_rate),
            validate::number(self.burst_limit)
        );
        if let Some(initial) = self.initial_tokens {
            text.push_str(&format!(", initial_tokens {}", validate::number(initial)));
        }
        if self.kind != BucketKind::Shared {
            text.push_str(&format!(", kind {}", self.kind.name()));
        }
        if let Some(quota) = &self.quota {
            text.push_str(&format!(", quota {}", quota_text(quota)));
        }
        if !self.enforce {
            text.push_str(", enforce false (shadow mode)");
        }
        text
    }
}

/// A quota in text: `100000 monthly on day 1 (UTC)`.
pub fn quota_text(quota: &Quota) -> String {
    format!(
        "{} {} ({})",
        validate::number(quota.amount),
        cycle_text(&quota.cycle.period),
        quota.cycle.time_zone
    )
}

/// A cycle's period in text: `monthly on day 1`, `weekly on monday`, `daily`.
fn cycle_text(period: &Period) -> String {
    match period {
        Period::Monthly { anchor_day } => format!("monthly on day {anchor_day}"),
        Period::Weekly { anchor_weekday } => format!("weekly on {}", anchor_weekday.name()),
        Period::Daily => "daily".to_owned(),
    }
}

/// A tier's buckets, by name.
pub type Buckets = BTreeMap<BucketName, BucketLimits>;

/// A tier's per-partition limits, by table (the core's checked type).
pub type Tables = TableLimitSet;

/// A tier's budgets, by bucket (the empty name: the request-unit
/// bucket), as the core checked them.
pub type Budgets = BTreeMap<BucketName, Budget>;

/// A tier: what `PutTier` sends, and what `apply` compares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TierDefinition {
    pub buckets: Buckets,
    pub tables: Tables,
    pub budgets: Budgets,
    /// The whole tier in shadow mode (`enforce = false` at the tier's
    /// level): each of its buckets and budgets acts as if it said so.
    pub shadow: bool,
}

/// A budget in a line of text: `50000000 tokens monthly on day 1 (UTC),
/// then throttle to 100/s (burst 1000); alerts at 50, 75, 90, 100`.
pub fn budget_text(budget: &Budget) -> String {
    let cycle = cycle_text(&budget.cycle.period);
    let at_limit = match budget.at_limit {
        AtLimit::Throttle { baseline } => format!(
            "throttle to {}/s (burst {})",
            validate::number(baseline.refill_rate),
            validate::number(baseline.burst_limit)
        ),
        other => other.name().to_owned(),
    };
    let thresholds: Vec<String> = budget.thresholds.iter().map(|t| t.label()).collect();
    let mut text = format!(
        "{} tokens {cycle} ({}), then {at_limit}; alerts at {}",
        validate::number(budget.amount),
        budget.cycle.time_zone,
        thresholds.join(", ")
    );
    if let Some(price) = &budget.price {
        text.push_str(&format!(
            "; {} {} per million tokens",
            validate::number(price.per_million_tokens),
            price.currency
        ));
    }
    text
}

/// A budget's bucket in text: its name, or `(request units)`.
pub fn budget_bucket_text(bucket: &BucketName) -> String {
    if bucket.as_str().is_empty() {
        "(request units)".to_owned()
    } else {
        bucket.to_string()
    }
}

/// One table's per-partition limits as the CLI prints them: `null` in
/// JSON, "unlimited" in text, where an operation is not limited.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PartitionLimits {
    pub max_reads_per_second: Option<f64>,
    pub max_writes_per_second: Option<f64>,
}

impl PartitionLimits {
    /// Each limit with its field's name, `None` where unlimited.
    pub fn fields(&self) -> [(&'static str, Option<f64>); 2] {
        [
            ("max_reads_per_second", self.max_reads_per_second),
            ("max_writes_per_second", self.max_writes_per_second),
        ]
    }

    /// The limits that are set: `max_reads_per_second 100, max_writes_per_second 5`.
    pub fn text(&self) -> String {
        self.fields()
            .into_iter()
            .filter_map(|(name, limit)| Some(format!("{name} {}", validate::number(limit?))))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A limit in a table cell or a diff: its value, or `unlimited`.
    pub fn limit_text(limit: Option<f64>) -> String {
        limit.map_or_else(|| "unlimited".to_owned(), validate::number)
    }
}

impl From<TableLimits> for PartitionLimits {
    fn from(l: TableLimits) -> Self {
        PartitionLimits {
            max_reads_per_second: l.max_reads_per_second,
            max_writes_per_second: l.max_writes_per_second,
        }
    }
}

/// A bucket kind by its name in files: `shared` or `per-key`.
pub fn kind(field: &str, name: &str) -> Result<BucketKind, InvalidInput> {
    [BucketKind::Shared, BucketKind::PerKey]
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            InvalidInput::new(
                field,
                format!(
                    "must be \"shared\" or \"per-key\", got {}",
                    validate::quote(name)
                ),
            )
        })
}

/// The wire's number for a kind, and back.
fn kind_to_proto(kind: BucketKind) -> i32 {
    match kind {
        BucketKind::Shared => v1::BucketKind::Shared.into(),
        BucketKind::PerKey => v1::BucketKind::PerKey.into(),
    }
}

pub fn kind_from_proto(kind: i32) -> Option<BucketKind> {
    match v1::BucketKind::try_from(kind).ok()? {
        v1::BucketKind::Shared => Some(BucketKind::Shared),
        v1::BucketKind::PerKey => Some(BucketKind::PerKey),
    }
}

/// Checks a refill rate (tokens per second) against the wire's bounds.
pub fn refill_rate(field: &str, value: f64) -> Result<f64, InvalidInput> {
    validate::non_negative(field, value, MAX_REFILL_RATE).map(|()| value)
}

/// Checks a burst limit or an initial level (tokens) against the wire's bounds.
pub fn tokens(field: &str, value: f64) -> Result<f64, InvalidInput> {
    validate::non_negative(field, value, MAX_TOKENS).map(|()| value)
}

/// A bucket name a tier may define: a `BucketName` that is not empty
/// (the request-unit bucket is not managed by tiers).
pub fn tier_bucket_name(field: &str, name: &str) -> Result<BucketName, InvalidInput> {
    if name.is_empty() {
        return Err(InvalidInput::new(
            field,
            "must not be empty (tiers do not define the request-unit bucket)",
        ));
    }
    BucketName::parse(field, name)
}

/// One `--bucket NAME=RATE/BURST[/INITIAL]` flag.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketFlag {
    pub name: BucketName,
    pub limits: BucketLimits,
}

impl BucketFlag {
    /// Parses and checks the flag's value; the message says which part is wrong.
    pub fn parse(value: &str) -> Result<BucketFlag, String> {
        let expected = || {
            format!(
                "expected NAME=RATE/BURST[/INITIAL], got {}",
                validate::quote(value)
            )
        };
        let (name, numbers) = value.split_once('=').ok_or_else(expected)?;
        let name = tier_bucket_name("bucket name", name).map_err(|e| e.to_string())?;
        let numbers: Vec<&str> = numbers.split('/').collect();
        let (rate, burst, initial) = match numbers[..] {
            [rate, burst] => (rate, burst, None),
            [rate, burst, initial] => (rate, burst, Some(initial)),
            _ => return Err(expected()),
        };
        let number = |field: &str, text: &str| {
            text.trim()
                .parse::<f64>()
                .map_err(|_| format!("{field}: expected a number, got {}", validate::quote(text)))
        };
        let limits = BucketLimits {
            quota: None,
            refill_rate: refill_rate("refill_rate", number("refill_rate", rate)?)
                .map_err(|e| e.to_string())?,
            burst_limit: tokens("burst_limit", number("burst_limit", burst)?)
                .map_err(|e| e.to_string())?,
            initial_tokens: initial
                .map(|initial| {
                    tokens("initial_tokens", number("initial_tokens", initial)?)
                        .map_err(|e| e.to_string())
                })
                .transpose()?,
            kind: BucketKind::Shared,
            enforce: true,
        };
        Ok(BucketFlag { name, limits })
    }
}

/// The buckets the `--bucket` flags define: each named once, at most
/// [`MAX_TIER_BUCKETS`].
pub fn buckets_from_flags(flags: Vec<BucketFlag>) -> anyhow::Result<Buckets> {
    if flags.len() > MAX_TIER_BUCKETS {
        anyhow::bail!(
            "--bucket: at most {MAX_TIER_BUCKETS} buckets per tier, got {}",
            flags.len()
        );
    }
    let mut buckets = Buckets::new();
    for flag in flags {
        let name = flag.name.clone();
        if buckets.insert(flag.name, flag.limits).is_some() {
            anyhow::bail!("--bucket: bucket {name} is given twice");
        }
    }
    Ok(buckets)
}

/// The wire's definition of one bucket.
pub fn to_proto(name: &BucketName, limits: &BucketLimits) -> v1::BucketDefinition {
    v1::BucketDefinition {
        bucket: name.as_str().to_owned(),
        refill_rate: limits.refill_rate,
        burst_limit: limits.burst_limit,
        initial_tokens: limits.initial_tokens,
        kind: kind_to_proto(limits.kind),
        quota: limits.quota.as_ref().map(quota_to_proto),
        enforce: tollgate_proto::enforce_to_wire(limits.enforce),
    }
}

/// The wire's limits of one table.
pub fn table_to_proto(table: &TableName, limits: &TableLimits) -> v1::TableLimits {
    v1::TableLimits {
        table: table.as_str().to_owned(),
        max_reads_per_second: limits.max_reads_per_second,
        max_writes_per_second: limits.max_writes_per_second,
    }
}

/// A tier as `PutTier` sends it (the server sets the timestamps).
pub fn tier_to_proto(name: &TierName, tier: &TierDefinition) -> v1::Tier {
    v1::Tier {
        name: name.as_str().to_owned(),
        buckets: tier
            .buckets
            .iter()
            .map(|(name, limits)| to_proto(name, limits))
            .collect(),
        created_at: None,
        updated_at: None,
        tables: tier
            .tables
            .iter()
            .map(|(table, limits)| table_to_proto(table, limits))
            .collect(),
        budgets: tier
            .budgets
            .iter()
            .map(|(bucket, budget)| budget_to_proto(bucket, budget))
            .collect(),
        enforce: tollgate_proto::enforce_to_wire(!tier.shadow),
    }
}

/// A tier the server sent, as names and limits to compare with a file's.
/// The server validated what it stored; a name that does not parse here
/// means client and server disagree, which is worth an error, not a guess.
pub fn tier_from_proto(tier: &v1::Tier) -> anyhow::Result<(TierName, TierDefinition)> {
    let name = TierName::parse("name", &tier.name)
        .with_context(|| format!("the server's tier {}", validate::quote(&tier.name)))?;
    let mut buckets = Buckets::new();
    for b in &tier.buckets {
        let bucket = BucketName::parse("bucket", &b.bucket)
            .with_context(|| format!("the server's tier {name}"))?;
        let kind = kind_from_proto(b.kind).with_context(|| {
            format!(
                "the server's tier {name}: bucket {} has kind {}, which this client does not know",
                validate::quote(&b.bucket),
                b.kind
            )
        })?;
        let quota = b
            .quota
            .as_ref()
            .map(|q| quota_from_proto("quota", q))
            .transpose()
            .with_context(|| format!("the server's tier {name}: bucket {}", b.bucket))?;
        let limits = BucketLimits {
            refill_rate: b.refill_rate,
            burst_limit: b.burst_limit,
            initial_tokens: b.initial_tokens,
            kind,
            quota,
            enforce: tollgate_proto::enforce_from_wire(b.enforce),
        };
        if buckets.insert(bucket, limits).is_some() {
            anyhow::bail!(
                "the server's tier {name} lists bucket {} twice",
                validate::quote(&b.bucket)
            );
        }
    }
    let mut tables = Tables::new();
    for t in &tier.tables {
        let table = TableName::parse("table", &t.table)
            .with_context(|| format!("the server's tier {name}"))?;
        let limits = TableLimits {
            max_reads_per_second: t.max_reads_per_second,
            max_writes_per_second: t.max_writes_per_second,
        };
        if tables.insert(table, limits).is_some() {
            anyhow::bail!(
                "the server's tier {name} lists table {} twice",
                validate::quote(&t.table)
            );
        }
    }
    let mut budgets = Budgets::new();
    for (i, b) in tier.budgets.iter().enumerate() {
        let (bucket, budget) = budget_at(&format!("budgets[{i}]"), b)
            .with_context(|| format!("the server's tier {name}"))?;
        if budgets.insert(bucket, budget).is_some() {
            anyhow::bail!(
                "the server's tier {name} lists a budget of bucket {} twice",
                validate::quote(&b.bucket)
            );
        }
    }
    Ok((
        name,
        TierDefinition {
            buckets,
            tables,
            budgets,
            shadow: !tollgate_proto::enforce_from_wire(tier.enforce),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(value: &str) -> Result<BucketFlag, String> {
        BucketFlag::parse(value)
    }

    #[test]
    fn a_bucket_flag_gives_name_rate_burst_and_optional_initial_tokens() {
        let two = flag("schedule-email=10/100").expect("valid");
        assert_eq!(two.name.as_str(), "schedule-email");
        assert_eq!(
            two.limits,
            BucketLimits {
                quota: None,
                refill_rate: 10.0,
                burst_limit: 100.0,
                initial_tokens: None,
                kind: BucketKind::Shared,
                enforce: true,
            }
        );
        let three = flag("invoke-doc-summary-ai=0.5/20/5").expect("valid");
        assert_eq!(three.limits.refill_rate, 0.5);
        assert_eq!(three.limits.initial_tokens, Some(5.0));
    }

    #[test]
    fn a_bad_bucket_flag_names_the_part_that_is_wrong() {
        for (value, reason) in [
            ("schedule-email", "expected NAME=RATE/BURST[/INITIAL]"),
            ("a=1", "expected NAME=RATE/BURST[/INITIAL]"),
            ("a=1/2/3/4", "expected NAME=RATE/BURST[/INITIAL]"),
            ("=1/2", "bucket name: must not be empty"),
            ("a b=1/2", "bucket name: may contain only"),
            ("a=x/2", "refill_rate: expected a number, got \"x\""),
            ("a=-1/2", "refill_rate: must be >= 0, got -1"),
            ("a=NaN/2", "refill_rate: must be a number, got NaN"),
            ("a=1/inf", "burst_limit: must be finite"),
            ("a=1/2e15", "burst_limit: must be <= 1e15"),
            ("a=1e13/2", "refill_rate: must be <= 1e12"),
            ("a=1/2/-3", "initial_tokens: must be >= 0, got -3"),
        ] {
            let error = flag(value).expect_err(value);
            assert!(error.contains(reason), "{value}: {error}");
        }
    }

    #[test]
    fn flags_naming_a_bucket_twice_are_refused() {
        let flags = vec![flag("a=1/2").expect("valid"), flag("a=3/4").expect("valid")];
        let error = buckets_from_flags(flags).expect_err("twice");
        assert_eq!(error.to_string(), "--bucket: bucket a is given twice");
    }

    #[test]
    fn more_than_a_thousand_flags_are_refused() {
        let flags = (0..=MAX_TIER_BUCKETS)
            .map(|i| flag(&format!("b{i}=1/2")).expect("valid"))
            .collect();
        let error = buckets_from_flags(flags).expect_err("too many");
        assert!(
            error
                .to_string()
                .contains("at most 1000 buckets per tier, got 1001")
        );
    }

    #[test]
    fn an_unset_initial_level_is_the_same_as_one_at_the_burst_limit() {
        let unset = BucketLimits {
            quota: None,
            refill_rate: 1.0,
            burst_limit: 20.0,
            initial_tokens: None,
            kind: BucketKind::Shared,
            enforce: true,
        };
        let at_burst = BucketLimits {
            initial_tokens: Some(20.0),
            kind: BucketKind::Shared,
            ..unset.clone()
        };
        let lower = BucketLimits {
            initial_tokens: Some(5.0),
            kind: BucketKind::Shared,
            ..unset.clone()
        };
        assert!(unset.same_as(&at_burst));
        assert!(!unset.same_as(&lower));
        assert_eq!(
            lower.text(),
            "refill_rate 1, burst_limit 20, initial_tokens 5"
        );
    }

    #[test]
    fn server_tiers_convert_to_names_and_limits_and_back() {
        let tier = v1::Tier {
            name: "pro".into(),
            buckets: vec![v1::BucketDefinition {
                quota: None,
                bucket: "schedule-email".into(),
                refill_rate: 10.0,
                burst_limit: 100.0,
                initial_tokens: Some(50.0),
                kind: v1::BucketKind::PerKey.into(),
                enforce: None,
            }],
            created_at: None,
            updated_at: None,
            tables: vec![v1::TableLimits {
                table: "orders".into(),
                max_reads_per_second: Some(100.0),
                max_writes_per_second: None,
            }],
            budgets: Vec::new(),
            enforce: None,
        };
        let (name, defined) = tier_from_proto(&tier).expect("valid");
        assert_eq!(tier_to_proto(&name, &defined), tier);
        assert_eq!(
            defined.tables[&TableName::parse("table", "orders").expect("valid")],
            TableLimits {
                max_reads_per_second: Some(100.0),
                max_writes_per_second: None,
            }
        );

        let twice = v1::Tier {
            buckets: vec![tier.buckets[0].clone(), tier.buckets[0].clone()],
            ..tier.clone()
        };
        let error = tier_from_proto(&twice).expect_err("twice");
        assert!(
            error
                .to_string()
                .contains("lists bucket \"schedule-email\" twice")
        );
        let twice = v1::Tier {
            tables: vec![tier.tables[0].clone(), tier.tables[0].clone()],
            ..tier
        };
        let error = tier_from_proto(&twice).expect_err("twice");
        assert!(error.to_string().contains("lists table \"orders\" twice"));
    }

    #[test]
    fn partition_limits_show_the_set_ones_by_name() {
        let reads = PartitionLimits {
            max_reads_per_second: Some(100.0),
            max_writes_per_second: None,
        };
        assert_eq!(reads.text(), "max_reads_per_second 100");
        let both = PartitionLimits {
            max_writes_per_second: Some(2.5),
            ..reads
        };
        assert_eq!(
            both.text(),
            "max_reads_per_second 100, max_writes_per_second 2.5"
        );
        assert_eq!(PartitionLimits::limit_text(None), "unlimited");
    }
}
