//! Tiers: named sets of bucket definitions that set each rate-limited
//! action's limits for every tenant on them.
//!
//! A SaaS limits each action of each tenant (`schedule-email`,
//! `invoke-doc-summary-ai`) with its own bucket, and sells plans (free,
//! pro) that set those buckets' rates. A [`Tier`] is such a plan; a
//! tenant's [`TenantRecord`] says which tier it is on and which buckets it
//! overrides. The buckets a tenant should have are its tier's, with its
//! overrides on top ([`wanted_buckets`]); [`change_tenant`] turns one
//! operator change (onboarding, a tier switch, setting or clearing an
//! override, a tier's new definition) into the rows to write, so every
//! store applies the same rules in one transaction:
//!
//! - a bucket the tenant already has keeps its tokens, refilled to now at
//!   its old limits and capped at the new burst limit;
//! - a bucket it lacks is created holding its definition's initial tokens;
//! - a bucket tiers provisioned (the previous tier's or an override's)
//!   that is no longer wanted is retired: its row is deleted and a
//!   [`ClosedBucket`] keeps its last limits and exact totals
//!   ([`close_bucket`], also what deleting a tenant keeps of each of its
//!   buckets). Buckets an operator made by hand and the request-unit
//!   bucket are not the tiers' to retire.
//!
//! A tier also sets its tables' per-partition limits ([`TableLimits`]),
//! which a tenant overrides table by table the same way: [`tenant_limits`]
//! is what its pods apply, and [`partition_load`] the whole of one pod's
//! exchange on the rows a store loaded. Tiers sit above the limits they
//! set (a bucket's [`Limits`], a table's), which know nothing of tiers.
//!
//! # The rules in detail
//!
//! A store loads the tenant's record, the tiers the change needs
//! ([`TenantChange::tier_to_load`], and the previous tier, since only
//! buckets it or an override provisioned are retired) and the head rows
//! of all the tenant's buckets, calls [`change_tenant`] and writes the
//! [`TenantEdit`] it returns, in one transaction.
//!
//! - A bucket the tenant has is refilled to now at its old limits, then
//!   given the new ones, its tokens (and `tokens_avg`) capped at the new
//!   burst limit; its pods, leases and totals stay. A configured bucket
//!   that already has the wanted limits is not written.
//! - A bucket it lacks is created holding its definition's
//!   `initial_tokens` (the burst limit if unset), configured, with no pods
//!   (a store deletes stray instance rows of its key first).
//! - A retired bucket's head and instance rows are deleted and its closed
//!   record (last limits, exact totals, when, why, by whom) written in the
//!   same transaction; closed records are only ever appended. A named
//!   bucket an operator made by hand that no tier or override ever defined
//!   is left alone, while limits set by hand on a bucket a tier or override
//!   does define are set back at the tenant's next change (and at every
//!   `PutTier` of its tier).
//! - The request-unit bucket is never changed or retired by a change, and
//!   created only to hold a budget (with the server's default limits,
//!   unconfigured, as its pods would have made it); neither tiers nor
//!   overrides may name it, but budgets may.
//! - Budgets ([`wanted_budgets`]): a tenant's own replaces its tier's for
//!   that bucket; each bucket the tenant has once the change is written
//!   gets the budget wanted for it (a new one starts now, a changed one
//!   applies to what remains of its cycle, a removed one closes its
//!   cycle). A tenant's own budget of a bucket it lacks, or of a per-key
//!   one, is refused; a tier's is not applied to a tenant whose override
//!   made the bucket per-key. A tier's request-unit budget is refused by
//!   [`may_put_tier`] on a server that does not create request-unit
//!   buckets.
//! - Definitions of [`BucketKind::PerKey`] provision nothing (keys start
//!   full, [`crate::key_bucket`]): [`wanted_buckets`] counts shared ones
//!   only, [`definitions`] all.
//! - Refusals: `Create` of a tenant that exists (a record or any bucket,
//!   a request-unit bucket its pods created on first use included) is
//!   [`TierError::TenantExists`]; `SetTier` creates the tenant if needed;
//!   both need the tier ([`TierError::TierNotFound`]). `SetOverride`
//!   creates the record (and so the tenant) if needed; `ClearOverride`
//!   needs the tenant and the override ([`TierError::TenantNotFound`],
//!   [`TierError::OverrideNotFound`]); `Reapply`, what `PutTier` runs for
//!   each tenant on the tier, needs the tenant.
//! - A valid tier ([`Tier::from_definitions`], and `table_limits` for its
//!   tables, both by one walk of a named list): bucket names valid and not
//!   empty, each defined once, at most [`MAX_TIER_BUCKETS`] (1 000), numbers
//!   in the wire contract's ranges; a refusal names the field as the
//!   request does (`tier.buckets[1].bucket`).
//! - `PutTier` stores the tier stamped ([`stamp_tier`]) and re-applies it
//!   to every tenant whose record names it, in the transaction that writes
//!   the tier (the store finds those tenants); a tier is deleted only if it
//!   exists and no record names it ([`may_delete_tier`]:
//!   [`TierError::TierInUse`], with the count and up to three of its
//!   tenants).
//! - What a change retires and leaves ([`TenantEdit::retirements`],
//!   [`TenantEdit::buckets_after`]) is computed here too, so both stores
//!   answer a change alike without reading their rows again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::budget::{BucketBudget, Budget, CycleRecord, Quota};
use crate::global_bucket::{BucketRow, Limits, Totals};
use crate::partition::{
    self, Exchange, ExchangeAnswer, MAX_TABLES, PartitionReports, TableLimitSet, TableLimits,
};
use crate::tenant_state::{self, TenantRefused, TenantState};
use crate::time::Timestamp;
use crate::validate::{
    self, BucketKey, BucketName, InvalidInput, MAX_TOKENS, TableName, TenantId, TierName,
};

/// The most buckets one tier defines.
pub const MAX_TIER_BUCKETS: usize = 1000;

/// What a bucket definition makes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BucketKind {
    /// One bucket the tenant's pods share: provisioned for every tenant on
    /// the tier.
    #[default]
    Shared,
    /// One exact bucket per caller-chosen key ([`crate::key_bucket`]):
    /// nothing is provisioned, a key is full until it first takes tokens.
    PerKey,
}

impl BucketKind {
    /// The kind's name in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BucketKind::Shared => "shared",
            BucketKind::PerKey => "per-key",
        }
    }
}

/// One bucket as a tier or an override defines it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketDefinition {
    pub limits: Limits,
    /// Tokens a newly provisioned bucket starts with; the burst limit if
    /// unset. Unset for a per-key bucket.
    pub initial_tokens: Option<f64>,
    #[serde(default)]
    pub kind: BucketKind,
    /// A calendar quota on top of the rate (per key, for a per-key
    /// bucket): `budget::quota`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// False: shadow mode: decided and counted as if enforced, but
    /// refusing nothing (per key: `key_bucket`; shared: the head row's
    /// `enforce`, `global_bucket`).
    #[serde(
        default = "crate::budget::enforced",
        skip_serializing_if = "crate::budget::is_enforced"
    )]
    pub enforce: bool,
}

impl BucketDefinition {
    /// Checks the numbers; `field` is the definition's place in the
    /// request, prefixed to each field name.
    pub fn validate(&self, field: &str) -> Result<(), InvalidInput> {
        self.limits.validate().map_err(|e| e.within(field))?;
        if let Some(quota) = &self.quota {
            quota.validate().map_err(|e| e.within(field))?;
        }
        if let Some(initial) = self.initial_tokens {
            if self.kind == BucketKind::PerKey {
                return Err(InvalidInput::new(
                    "initial_tokens",
                    "must be unset for a per-key bucket: keys start full",
                )
                .within(field));
            }
            validate::non_negative("initial_tokens", initial, MAX_TOKENS)
                .map_err(|e| e.within(field))?;
        }
        Ok(())
    }

    pub fn initial(&self) -> f64 {
        self.initial_tokens.unwrap_or(self.limits.burst_limit)
    }
}

/// A tier: its buckets by name, and its tables' per-partition limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    pub buckets: BTreeMap<BucketName, BucketDefinition>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tables: TableLimitSet,
    /// Budgets per billing cycle of its tenants' buckets, by bucket name
    /// (the request-unit bucket's under the empty name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub budgets: BTreeMap<BucketName, Budget>,
    /// False: the whole tier in shadow mode: each of its buckets and
    /// budgets acts as if it said `enforce = false` ([`Tier::in_force`]).
    /// A tenant's own overrides and budgets keep their own.
    #[serde(
        default = "crate::budget::enforced",
        skip_serializing_if = "crate::budget::is_enforced"
    )]
    pub enforce: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Tier {
    /// The tier's definition of a bucket as it applies: in shadow mode
    /// if the definition or the whole tier is.
    pub fn in_force(&self, definition: &BucketDefinition) -> BucketDefinition {
        BucketDefinition {
            enforce: definition.enforce && self.enforce,
            ..definition.clone()
        }
    }

    /// The tier's budget as it applies: in shadow mode if the budget or
    /// the whole tier is.
    pub fn budget_in_force(&self, budget: &Budget) -> Budget {
        Budget {
            enforce: budget.enforce && self.enforce,
            ..budget.clone()
        }
    }

    /// A tier from definitions as a request lists them, checked: bucket
    /// names valid, not empty and each named once, at most
    /// [`MAX_TIER_BUCKETS`], numbers in range. `field` names the list. It
    /// has no tables; a request's are checked with [`table_limits`].
    pub fn from_definitions<'a>(
        field: &str,
        definitions: impl IntoIterator<Item = (&'a str, BucketDefinition)>,
        now: Timestamp,
    ) -> Result<Tier, InvalidInput> {
        Ok(Tier {
            buckets: named_set(field, definitions)?,
            tables: TableLimitSet::new(),
            budgets: BTreeMap::new(),
            enforce: true,
            created_at: now,
            updated_at: now,
        })
    }
}

/// Whether tier `name` may carry its budgets on a server that creates
/// request-unit buckets with `request_units` (`None`: it does not): a
/// request-unit budget could not apply to a tenant whose pods have not
/// made that bucket yet, so it is refused rather than left unapplied.
pub fn may_put_tier(
    name: &TierName,
    tier: &Tier,
    request_units: Option<(Limits, f64)>,
) -> Result<(), TierError> {
    if request_units.is_none() && tier.budgets.contains_key(&BucketName::REQUEST_UNITS) {
        return Err(TierError::NoBucketForBudget(format!(
            "tier {} has a request-unit budget, but this server does not create request-unit buckets (--require-configured-tenants), so it could not apply to tenants without one: give those tenants their own budgets (SetBudget) once their limits are set",
            validate::quote(name.as_str())
        )));
    }
    Ok(())
}

/// A tier's budgets as a request lists them (each already checked),
/// checked together: each names the request-unit bucket or a shared
/// bucket the tier defines, at most once. `field` names the list.
pub fn tier_budgets(
    tier: &Tier,
    field: &str,
    budgets: impl IntoIterator<Item = (BucketName, Budget)>,
) -> Result<BTreeMap<BucketName, Budget>, InvalidInput> {
    let mut all = BTreeMap::new();
    for (i, (bucket, budget)) in budgets.into_iter().enumerate() {
        let at = format!("{field}[{i}].bucket");
        let shared = tier
            .buckets
            .get(&bucket)
            .is_some_and(|d| d.kind == BucketKind::Shared);
        if !bucket.is_request_units() && !shared {
            let why = if tier.buckets.contains_key(&bucket) {
                "is a per-key bucket of the tier: a budget applies to a shared bucket"
            } else {
                "is not a bucket of the tier: a tier's budget names the request-unit bucket (empty) or one of the tier's shared buckets"
            };
            return Err(InvalidInput::new(
                at,
                format!("{} {why}", validate::quote(bucket.as_str())),
            ));
        }
        if all.insert(bucket.clone(), budget).is_some() {
            return Err(InvalidInput::new(
                at,
                format!("{} has two budgets", validate::quote(bucket.as_str())),
            ));
        }
    }
    Ok(all)
}

/// A tier's or a tenant's table limits as a request lists them, checked:
/// names valid and each named once, at most [`MAX_TABLES`], numbers in
/// range. `field` names the list.
pub fn table_limits<'a>(
    field: &str,
    tables: impl IntoIterator<Item = (&'a str, TableLimits)>,
) -> Result<TableLimitSet, InvalidInput> {
    named_set(field, tables)
}

/// An entry of a list a request names its entries in (a tier's buckets,
/// a tier's tables): how its name is parsed and its value checked, so
/// that [`named_set`] holds the rules every such list shares.
trait Named: Sized {
    type Name: Ord;
    /// The name's field within an entry: `bucket`, `table`.
    const NAME_FIELD: &'static str;
    /// The most entries a list holds, and what the refusal calls them.
    const MAX: usize;
    const MAX_WHAT: &'static str;

    /// `field` is the name's place in the request (`tier.buckets[3].bucket`).
    fn parse_name(field: &str, name: &str) -> Result<Self::Name, InvalidInput>;
    /// `field` is the entry's place in the request (`tier.buckets[3]`).
    fn check(&self, field: &str) -> Result<(), InvalidInput>;
}

impl Named for BucketDefinition {
    type Name = BucketName;
    const NAME_FIELD: &'static str = "bucket";
    const MAX: usize = MAX_TIER_BUCKETS;
    const MAX_WHAT: &'static str = "buckets per tier";

    fn parse_name(field: &str, name: &str) -> Result<BucketName, InvalidInput> {
        if name.is_empty() {
            return Err(InvalidInput::new(
                field,
                "must not be empty: tiers define named buckets, not the request-unit bucket",
            ));
        }
        BucketName::parse(field, name)
    }

    fn check(&self, field: &str) -> Result<(), InvalidInput> {
        self.validate(field)
    }
}

impl Named for TableLimits {
    type Name = TableName;
    const NAME_FIELD: &'static str = "table";
    const MAX: usize = MAX_TABLES;
    const MAX_WHAT: &'static str = "tables";

    fn parse_name(field: &str, name: &str) -> Result<TableName, InvalidInput> {
        TableName::parse(field, name)
    }

    fn check(&self, field: &str) -> Result<(), InvalidInput> {
        self.validate(field)
    }
}

/// The entries of the list `field` names, checked in order: each name
/// parsed, each value checked, no name twice, at most `T::MAX` entries.
/// The first fault is refused, naming the entry's field (`field[i].…`).
fn named_set<'a, T: Named>(
    field: &str,
    entries: impl IntoIterator<Item = (&'a str, T)>,
) -> Result<BTreeMap<T::Name, T>, InvalidInput> {
    let mut all = BTreeMap::new();
    for (i, (name, value)) in entries.into_iter().enumerate() {
        let at = format!("{field}[{i}]");
        let name_field = format!("{at}.{}", T::NAME_FIELD);
        let key = T::parse_name(&name_field, name)?;
        value.check(&at)?;
        if all.insert(key, value).is_some() {
            return Err(InvalidInput::new(
                name_field,
                format!("{} is listed twice", validate::quote(name)),
            ));
        }
        if all.len() > T::MAX {
            return Err(InvalidInput::new(
                field,
                format!("at most {} {}", T::MAX, T::MAX_WHAT),
            ));
        }
    }
    Ok(all)
}

/// What a tenant is on: its tier and its overrides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub tier: Option<TierName>,
    pub overrides: BTreeMap<BucketName, BucketDefinition>,
    /// Per-partition limits of its own, each replacing its tier's for that
    /// table.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub table_overrides: TableLimitSet,
    /// Budgets of its own, each replacing its tier's for that bucket.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub budgets: BTreeMap<BucketName, Budget>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// One operator change to a tenant's tier or overrides.
#[derive(Clone, Debug, PartialEq)]
pub enum TenantChange {
    /// Onboard a new tenant on a tier.
    Create { tier: TierName },
    /// Move a tenant (new or not) to a tier.
    SetTier { tier: TierName },
    /// Override one bucket's definition.
    SetOverride {
        bucket: BucketName,
        definition: BucketDefinition,
    },
    /// Remove an override.
    ClearOverride { bucket: BucketName },
    /// Set a table's per-partition limits for this tenant.
    SetTableLimits {
        table: TableName,
        limits: TableLimits,
    },
    /// Remove the tenant's own limits of a table (its tier's apply again).
    ClearTableLimits { table: TableName },
    /// Give one of the tenant's buckets a budget of its own (validated).
    SetBudget { bucket: BucketName, budget: Budget },
    /// Remove the tenant's own budget of a bucket (its tier's, if any,
    /// applies again).
    ClearBudget { bucket: BucketName },
    /// Bring the tenant's buckets in line with its tier's new definition;
    /// `previous` is the tier's definition before (what it provisioned).
    Reapply { previous: Option<Tier> },
}

impl TenantChange {
    /// The tier a store must load for this change, given the tenant's
    /// record.
    pub fn tier_to_load(&self, record: Option<&TenantRecord>) -> Option<TierName> {
        match self {
            TenantChange::Create { tier } | TenantChange::SetTier { tier } => Some(tier.clone()),
            TenantChange::SetOverride { .. }
            | TenantChange::ClearOverride { .. }
            | TenantChange::SetTableLimits { .. }
            | TenantChange::ClearTableLimits { .. }
            | TenantChange::SetBudget { .. }
            | TenantChange::ClearBudget { .. }
            | TenantChange::Reapply { .. } => record.and_then(|r| r.tier.clone()),
        }
    }

    /// The tier whose buckets the tenant has now, which a store must load
    /// too (as [`LoadedTenant::previous_tier`]): the record's, unless the
    /// change carries it.
    pub fn previous_tier_to_load(&self, record: Option<&TenantRecord>) -> Option<TierName> {
        match self {
            TenantChange::Reapply { .. } => None,
            _ => record.and_then(|r| r.tier.clone()),
        }
    }

    /// Whether this change creates the tenant again if it was deleted (an
    /// operator's explicit re-creation). A budget does not: it is refused
    /// for a deleted tenant ([`crate::tenant_state::refuse_deleted`]).
    pub fn recreates(&self) -> bool {
        !matches!(
            self,
            TenantChange::SetBudget { .. } | TenantChange::ClearBudget { .. }
        )
    }

    /// Why the buckets this change retires are closed.
    pub fn close_reason(&self) -> CloseReason {
        match self {
            TenantChange::Reapply { .. } => CloseReason::TierRedefined,
            TenantChange::ClearOverride { .. } => CloseReason::OverrideCleared,
            _ => CloseReason::TierChange,
        }
    }

    /// Checks what a client sent.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        match self {
            TenantChange::SetOverride { bucket, definition } => {
                if bucket.is_request_units() {
                    return Err(InvalidInput::new(
                        "bucket.bucket",
                        "must not be empty: set the request-unit bucket's limits with UpdateTenantResourceLimits",
                    ));
                }
                definition.validate("bucket")
            }
            TenantChange::SetTableLimits { limits, .. } => limits.validate(""),
            TenantChange::SetBudget { budget, .. } => budget.clone().validated().map(|_| ()),
            TenantChange::ClearOverride { bucket } if bucket.is_request_units() => {
                Err(InvalidInput::new(
                    "bucket",
                    "must not be empty: the request-unit bucket has no override",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// What a store read, under lock, for a [`TenantChange`].
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedTenant {
    pub record: Option<TenantRecord>,
    /// The tenant's buckets' head rows, by name.
    pub buckets: BTreeMap<BucketName, BucketRow>,
    /// The tier [`TenantChange::tier_to_load`] named, if it exists.
    pub tier: Option<Tier>,
    /// The tier [`TenantChange::previous_tier_to_load`] named, if any.
    pub previous_tier: Option<Tier>,
    /// The limits and initial tokens a request-unit bucket is created
    /// with by default (`None`: this server does not create them), for a
    /// budget on a tenant's request-unit bucket before its pods made it.
    pub request_units: Option<(Limits, f64)>,
}

/// The rows a [`TenantChange`] writes.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantEdit {
    pub record: TenantRecord,
    /// New buckets' head rows.
    pub created: BTreeMap<BucketName, BucketRow>,
    /// Existing buckets' head rows with new limits.
    pub changed: BTreeMap<BucketName, BucketRow>,
    /// Buckets to delete, with their instances.
    pub retired: Vec<BucketName>,
    /// Budget cycles the change closed (a budget removed or given a new
    /// cycle, a retired bucket's): records to append.
    pub closed_cycles: Vec<(BucketName, CycleRecord)>,
}

impl TenantEdit {
    /// True if it writes nothing but the record.
    pub fn changes_no_bucket(&self) -> bool {
        self.created.is_empty() && self.changed.is_empty() && self.retired.is_empty()
    }

    /// The buckets it retires that `loaded` holds, each with the closed
    /// record that keeps its last limits and exact totals
    /// ([`close_bucket`]), in the order of `retired`. A store deletes every
    /// retired bucket's rows and writes these records in the same
    /// transaction.
    pub fn retirements(
        &self,
        tenant: &TenantId,
        loaded: &LoadedTenant,
        reason: CloseReason,
        by: &ClosedBy,
        now: Timestamp,
    ) -> Vec<Retirement> {
        self.retired
            .iter()
            .filter_map(|name| {
                let head = loaded.buckets.get(name)?;
                let key = BucketKey::new(tenant.clone(), name.clone());
                Some(Retirement {
                    closed: close_bucket(&key, head, reason, by, now),
                    name: name.clone(),
                    head: head.clone(),
                })
            })
            .collect()
    }

    /// The tenant's head rows once the edit is written: `loaded`'s, with
    /// the created and changed ones, without the retired.
    pub fn buckets_after(&self, loaded: &LoadedTenant) -> BTreeMap<BucketName, BucketRow> {
        let mut after = loaded.buckets.clone();
        after.extend(self.created.clone());
        after.extend(self.changed.clone());
        for name in &self.retired {
            after.remove(name);
        }
        after
    }
}

/// A bucket a [`TenantEdit`] retires: its head row as it was, and its
/// closed record.
#[derive(Clone, Debug, PartialEq)]
pub struct Retirement {
    pub name: BucketName,
    pub head: BucketRow,
    pub closed: ClosedBucket,
}

/// Why a tenant change was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TierError {
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    #[error("tier \"{0}\" not found")]
    TierNotFound(TierName),
    #[error("tenant \"{0}\" already exists; move it to a tier with SetTenantTier")]
    TenantExists(TenantId),
    #[error("tenant \"{0}\" not found")]
    TenantNotFound(TenantId),
    #[error("tenant \"{tenant}\" has no override of bucket \"{bucket}\"")]
    OverrideNotFound {
        tenant: TenantId,
        bucket: BucketName,
    },
    #[error("tenant \"{tenant}\" has no limits of its own for table \"{table}\"")]
    TableLimitsNotFound { tenant: TenantId, table: TableName },
    #[error("tenant \"{tenant}\" has no budget of its own for bucket \"{bucket}\"")]
    BudgetNotFound {
        tenant: TenantId,
        bucket: BucketName,
    },
    /// A budget names a bucket the tenant does not have (or a per-key one).
    #[error("{0}")]
    NoBucketForBudget(String),
    #[error(
        "tier \"{tier}\" is in use by {count} tenant(s), for example {}; move them to another tier first",
        examples.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(", ")
    )]
    TierInUse {
        tier: TierName,
        count: u64,
        examples: Vec<TenantId>,
    },
}

/// Why a bucket was closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CloseReason {
    /// The tenant moved to a tier without the bucket.
    TierChange,
    /// The tenant's tier was redefined without the bucket.
    TierRedefined,
    /// The override that provisioned the bucket was cleared.
    OverrideCleared,
    /// The tenant was deleted.
    TenantDeleted,
}

impl CloseReason {
    /// The reason's name in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CloseReason::TierChange => "tier-change",
            CloseReason::TierRedefined => "tier-redefined",
            CloseReason::OverrideCleared => "override-cleared",
            CloseReason::TenantDeleted => "tenant-deleted",
        }
    }
}

/// Who asked for the change that closed a bucket, as the audit log names
/// them: what the client claims (`x-tollgate-actor`), the operator its
/// admin token authenticated, and its address. Each is `None` when unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedBy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
}

impl std::fmt::Display for ClosedBy {
    /// As the audit log names a caller: `operator oncall alice at
    /// 10.0.0.7:51234`, `alice at 10.0.0.7:51234`, or the parts known
    /// (`unknown` when none is).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(operator) = &self.operator {
            parts.push(format!("operator {operator}"));
        }
        if let Some(actor) = &self.actor {
            parts.push(actor.clone());
        }
        if let Some(peer) = &self.peer {
            parts.push(format!("at {peer}"));
        }
        if parts.is_empty() {
            f.write_str("unknown")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// What is kept of a bucket once it is retired or its tenant deleted:
/// its last limits and its exact totals, so that billing never depends on
/// the bucket still existing. Never changed nor deleted once written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClosedBucket {
    pub tenant: TenantId,
    pub bucket: BucketName,
    /// The store's clock in the transaction that closed it.
    pub closed_at: Timestamp,
    pub reason: CloseReason,
    pub closed_by: ClosedBy,
    /// Its limits when it was closed.
    pub limits: Limits,
    /// Its totals when it was closed, exact (the head row's units).
    pub totals: Totals,
    /// When the bucket was created.
    pub created_at: Timestamp,
}

/// The closed record of the bucket `key`, whose head row was `row` when
/// it was retired or deleted `now` for `reason`.
pub fn close_bucket(
    key: &BucketKey,
    row: &BucketRow,
    reason: CloseReason,
    by: &ClosedBy,
    now: Timestamp,
) -> ClosedBucket {
    ClosedBucket {
        tenant: key.tenant.clone(),
        bucket: key.bucket.clone(),
        closed_at: now,
        reason,
        closed_by: by.clone(),
        limits: row.own_limits(),
        totals: row.totals.clone(),
        created_at: row.state.created_at,
    }
}

/// The definitions of a tenant on `tier` with `overrides`: its tier's,
/// with its overrides on top.
pub fn definitions(
    tier: Option<&Tier>,
    overrides: &BTreeMap<BucketName, BucketDefinition>,
) -> BTreeMap<BucketName, BucketDefinition> {
    let mut all: BTreeMap<BucketName, BucketDefinition> = tier
        .map(|t| {
            t.buckets
                .iter()
                .map(|(name, d)| (name.clone(), t.in_force(d)))
                .collect()
        })
        .unwrap_or_default();
    all.extend(overrides.iter().map(|(name, d)| (name.clone(), d.clone())));
    all
}

/// The per-partition limits of a tenant whose tier has `tier` tables and
/// who sets `overrides`: its tier's tables, with its own overrides (each
/// replacing a table's limits whole) on top.
pub fn effective_limits(tier: Option<&TableLimitSet>, overrides: &TableLimitSet) -> TableLimitSet {
    let mut all = tier.cloned().unwrap_or_default();
    all.extend(
        overrides
            .iter()
            .map(|(name, limits)| (name.clone(), *limits)),
    );
    all
}

/// The per-partition limits of a tenant with `record` (if it has one) on
/// `tier` (if any): what its pods apply ([`crate::partition`]). A tenant
/// without a record has none.
pub fn tenant_limits(record: Option<&TenantRecord>, tier: Option<&Tier>) -> TableLimitSet {
    match record {
        Some(record) => effective_limits(tier.map(|t| &t.tables), &record.table_overrides),
        None => TableLimitSet::new(),
    }
}

/// One pod's partition-load exchange on the rows a store read under
/// lock: refused, changing nothing, for a deleted or suspended tenant
/// (`state`); otherwise [`crate::partition::exchange`] run on the
/// tenant's `reports` under its limits ([`tenant_limits`] of `record` on
/// `tier`). The store then writes `reports` back, or removes their row
/// once it is empty (no report is fresh).
pub fn partition_load(
    tenant: &TenantId,
    state: Option<&TenantState>,
    record: Option<&TenantRecord>,
    tier: Option<&Tier>,
    reports: &mut PartitionReports,
    exchange: &Exchange,
    now: Timestamp,
) -> Result<ExchangeAnswer, TenantRefused> {
    tenant_state::admit(tenant, state)?;
    let limits = tenant_limits(record, tier);
    Ok(partition::exchange(reports, &limits, exchange, now))
}

/// Where a tenant's definition of a bucket comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefinedBy {
    /// Its tier's definition.
    Tier,
    /// The tenant's own override, whatever its tier says.
    Override,
}

/// The per-key buckets of a tenant on `tier` with `overrides`, in name
/// order: each definition in force (an override wins over the tier) and
/// where it comes from.
pub fn key_buckets(
    tier: Option<&Tier>,
    overrides: &BTreeMap<BucketName, BucketDefinition>,
) -> Vec<(BucketName, BucketDefinition, DefinedBy)> {
    definitions(tier, overrides)
        .into_iter()
        .filter(|(_, d)| d.kind == BucketKind::PerKey)
        .map(|(name, d)| {
            let by = if overrides.contains_key(&name) {
                DefinedBy::Override
            } else {
                DefinedBy::Tier
            };
            (name, d, by)
        })
        .collect()
}

/// The shared buckets a tenant on `tier` with `overrides` should have rows
/// for (per-key definitions provision nothing).
pub fn wanted_buckets(
    tier: Option<&Tier>,
    overrides: &BTreeMap<BucketName, BucketDefinition>,
) -> BTreeMap<BucketName, BucketDefinition> {
    let mut wanted = definitions(tier, overrides);
    wanted.retain(|_, d| d.kind == BucketKind::Shared);
    wanted
}

/// Turns `change` into the rows to write, from what the store loaded.
pub fn change_tenant(
    tenant: &TenantId,
    change: &TenantChange,
    loaded: &LoadedTenant,
    now: Timestamp,
) -> Result<TenantEdit, TierError> {
    change.validate()?;
    let exists = loaded.record.is_some() || !loaded.buckets.is_empty();
    let mut record = loaded.record.clone().unwrap_or(TenantRecord {
        tier: None,
        overrides: BTreeMap::new(),
        table_overrides: TableLimitSet::new(),
        budgets: BTreeMap::new(),
        created_at: now,
        updated_at: now,
    });
    match change {
        TenantChange::Create { tier } | TenantChange::SetTier { tier } => {
            if matches!(change, TenantChange::Create { .. }) && exists {
                return Err(TierError::TenantExists(tenant.clone()));
            }
            if loaded.tier.is_none() {
                return Err(TierError::TierNotFound(tier.clone()));
            }
            record.tier = Some(tier.clone());
        }
        TenantChange::SetOverride { bucket, definition } => {
            record.overrides.insert(bucket.clone(), definition.clone());
        }
        TenantChange::ClearOverride { bucket } => {
            if !exists {
                return Err(TierError::TenantNotFound(tenant.clone()));
            }
            if record.overrides.remove(bucket).is_none() {
                return Err(TierError::OverrideNotFound {
                    tenant: tenant.clone(),
                    bucket: bucket.clone(),
                });
            }
        }
        TenantChange::SetTableLimits { table, limits } => {
            record.table_overrides.insert(table.clone(), *limits);
            if record.table_overrides.len() > MAX_TABLES {
                return Err(InvalidInput::new(
                    "table",
                    format!("a tenant sets at most {MAX_TABLES} tables' limits"),
                )
                .into());
            }
        }
        TenantChange::ClearTableLimits { table } => {
            if !exists {
                return Err(TierError::TenantNotFound(tenant.clone()));
            }
            if record.table_overrides.remove(table).is_none() {
                return Err(TierError::TableLimitsNotFound {
                    tenant: tenant.clone(),
                    table: table.clone(),
                });
            }
        }
        TenantChange::SetBudget { bucket, budget } => {
            record.budgets.insert(bucket.clone(), budget.clone());
        }
        TenantChange::ClearBudget { bucket } => {
            if !exists {
                return Err(TierError::TenantNotFound(tenant.clone()));
            }
            if record.budgets.remove(bucket).is_none() {
                return Err(TierError::BudgetNotFound {
                    tenant: tenant.clone(),
                    bucket: bucket.clone(),
                });
            }
        }
        TenantChange::Reapply { .. } => {
            if !exists {
                return Err(TierError::TenantNotFound(tenant.clone()));
            }
        }
    }
    record.updated_at = now;
    let wanted = wanted_buckets(loaded.tier.as_ref(), &record.overrides);
    let mut edit = TenantEdit {
        record,
        created: BTreeMap::new(),
        changed: BTreeMap::new(),
        retired: Vec::new(),
        closed_cycles: Vec::new(),
    };
    for (name, definition) in &wanted {
        match loaded.buckets.get(name) {
            Some(row) => {
                if let Some(changed) = redefined(row, definition, now) {
                    edit.changed.insert(name.clone(), changed);
                }
            }
            None => {
                let mut row = BucketRow::new(definition.limits, definition.initial(), true, now);
                row.enforce = definition.enforce;
                edit.created.insert(name.clone(), row);
            }
        }
    }
    // Only what tiers provisioned is theirs to retire.
    let previous = match change {
        TenantChange::Reapply { previous } => previous.as_ref(),
        _ => loaded.previous_tier.as_ref(),
    };
    let no_overrides = BTreeMap::new();
    let before = wanted_buckets(
        previous,
        loaded
            .record
            .as_ref()
            .map_or(&no_overrides, |r| &r.overrides),
    );
    edit.retired = loaded
        .buckets
        .keys()
        .filter(|name| before.contains_key(*name) && !wanted.contains_key(*name))
        .cloned()
        .collect();
    apply_budgets(tenant, loaded, &mut edit, now)?;
    Ok(edit)
}

/// The budgets a tenant with `record` on `tier` has, by bucket: the
/// quotas of its shared buckets' definitions (each a budget that stops at
/// its amount, without alerts: [`Quota::as_budget`]), its tier's budgets
/// on top, and its own on top of those.
pub fn wanted_budgets(tier: Option<&Tier>, record: &TenantRecord) -> BTreeMap<BucketName, Budget> {
    let mut wanted: BTreeMap<BucketName, Budget> = definitions(tier, &record.overrides)
        .into_iter()
        .filter(|(_, d)| d.kind == BucketKind::Shared)
        .filter_map(|(name, d)| {
            let mut budget = d.quota?.as_budget();
            budget.enforce = d.enforce;
            Some((name, budget))
        })
        .collect();
    if let Some(tier) = tier {
        wanted.extend(
            tier.budgets
                .iter()
                .map(|(name, b)| (name.clone(), tier.budget_in_force(b))),
        );
    }
    wanted.extend(record.budgets.clone());
    wanted
}

/// Gives each of the tenant's buckets (once `edit` is written) the budget
/// its tier and record want: a new budget starts in the cycle of `now`, a
/// changed one applies to what remains of its cycle, a removed one (or a
/// retired bucket's) closes its cycle now, into `edit.closed_cycles`.
/// A budget for a bucket the tenant does not have, or a per-key one, is
/// refused (a request-unit bucket is created for it when `loaded` says
/// with which limits).
fn apply_budgets(
    tenant: &TenantId,
    loaded: &LoadedTenant,
    edit: &mut TenantEdit,
    now: Timestamp,
) -> Result<(), TierError> {
    let mut wanted = wanted_budgets(loaded.tier.as_ref(), &edit.record);
    let mut after = edit.buckets_after(loaded);
    let names: Vec<BucketName> = wanted.keys().cloned().collect();
    for name in &names {
        if after.contains_key(name) {
            continue;
        }
        let defaults = loaded.request_units.filter(|_| name.is_request_units());
        // A tier's budget of a named bucket the tenant does not have (its
        // override made it per-key) does not apply to it: the tenant's
        // own definition wins, as it does for limits.
        if defaults.is_none() && !name.is_request_units() && !edit.record.budgets.contains_key(name)
        {
            wanted.remove(name);
            continue;
        }
        let Some(defaults) = defaults else {
            let per_key = definitions(loaded.tier.as_ref(), &edit.record.overrides)
                .get(name)
                .is_some_and(|d| d.kind == BucketKind::PerKey);
            let what = if name.is_request_units() {
                "the request-unit bucket".to_owned()
            } else {
                format!("bucket {}", validate::quote(name.as_str()))
            };
            let why = if per_key {
                "is per-key: a budget applies to a shared bucket".to_owned()
            } else if name.is_request_units() {
                "does not exist yet and this server does not create request-unit buckets by default: set the tenant's request-unit limits first".to_owned()
            } else {
                "does not exist: define it in the tenant's tier or an override first".to_owned()
            };
            return Err(TierError::NoBucketForBudget(format!(
                "tenant {}: {what} {why}",
                validate::quote(tenant.as_str())
            )));
        };
        let row = BucketRow::new(defaults.0, defaults.1, false, now);
        edit.created.insert(name.clone(), row.clone());
        after.insert(name.clone(), row);
    }
    for (name, row) in after {
        let want = wanted.get(&name);
        let have = row.budget.as_ref().map(|b| &b.budget);
        if want == have {
            continue;
        }
        let mut row = row;
        for record in set_budget(&mut row, want.cloned(), now) {
            edit.closed_cycles.push((name.clone(), record));
        }
        match edit.created.get_mut(&name) {
            Some(created) => *created = row,
            None => {
                edit.changed.insert(name, row);
            }
        }
    }
    for name in &edit.retired {
        if let Some(row) = loaded.buckets.get(name) {
            for record in closed_cycles(row, now) {
                edit.closed_cycles.push((name.clone(), record));
            }
        }
    }
    Ok(())
}

/// The budget cycles a bucket closed at `now` leaves (it is retired, or
/// its tenant deleted): the one it was in and one already over, oldest
/// first; none without a budget.
pub fn closed_cycles(row: &BucketRow, now: Timestamp) -> Vec<CycleRecord> {
    match &row.budget {
        Some(budget) => (**budget).clone().end(&mut row.state.clone(), now),
        None => Vec::new(),
    }
}

/// Sets a head row's budget to `want` at `now`; returns the cycles it
/// closed (one already over, a changed cycle rule, a budget removed).
fn set_budget(row: &mut BucketRow, want: Option<Budget>, now: Timestamp) -> Vec<CycleRecord> {
    match (row.budget.take(), want) {
        (None, Some(budget)) => {
            row.budget = BucketBudget::start(budget, now).ok().map(Box::new);
            Vec::new()
        }
        (Some(mut current), Some(budget)) => {
            let closed = current
                .change(&mut row.state, budget, now)
                .unwrap_or_default();
            row.budget = Some(current);
            closed
        }
        (Some(current), None) => current.end(&mut row.state, now),
        (None, None) => Vec::new(),
    }
}

/// A bucket's head row under a new definition, or `None` if it already
/// has it: tokens refilled to `now` at the old limits, then capped at the
/// new burst limit.
/// How many tenants a refusal to delete a tier in use names.
pub const TIER_IN_USE_EXAMPLES: usize = 3;

/// A tier as a put stores it: `tier`, created when first put (`before`
/// is what it replaces, if anything) and updated `now`.
pub fn stamp_tier(tier: &Tier, before: Option<&Tier>, now: Timestamp) -> Tier {
    let mut stored = tier.clone();
    stored.created_at = before.map_or(now, |b| b.created_at);
    stored.updated_at = now;
    stored
}

/// Whether tier `name` may be deleted: it must exist, and no tenant's
/// record may name it. `users` is how many records do, `examples` the
/// first of them in id order (the refusal names up to
/// [`TIER_IN_USE_EXAMPLES`]).
pub fn may_delete_tier(
    name: &TierName,
    exists: bool,
    users: u64,
    examples: impl IntoIterator<Item = TenantId>,
) -> Result<(), TierError> {
    if !exists {
        return Err(TierError::TierNotFound(name.clone()));
    }
    if users > 0 {
        return Err(TierError::TierInUse {
            tier: name.clone(),
            count: users,
            examples: examples.into_iter().take(TIER_IN_USE_EXAMPLES).collect(),
        });
    }
    Ok(())
}

fn redefined(row: &BucketRow, definition: &BucketDefinition, now: Timestamp) -> Option<BucketRow> {
    let same_limits = row.state.configured && row.own_limits() == definition.limits;
    if same_limits && row.enforce == definition.enforce {
        return None;
    }
    let mut row = row.clone();
    // Into or out of shadow mode, the state is the enforced one either
    // way, and is kept.
    row.enforce = definition.enforce;
    if !same_limits {
        row.state
            .refill(now, crate::validate::DEFAULT_TARGET_REQUEST_PERIOD);
        row.set_own_limits(definition.limits);
        row.state.configured = true;
        row.state.tokens = row.state.tokens.min(definition.limits.burst_limit);
        row.state.tokens_avg = row.state.tokens_avg.min(definition.limits.burst_limit);
    }
    row.state.updated_at = now;
    Some(row)
}

#[cfg(test)]
mod tests;
