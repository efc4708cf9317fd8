//! What `tollgate tier apply` does: the difference between the tiers a
//! file declares and the tiers the server has, tier by tier, bucket by
//! bucket and table by table.
//!
//! The plan is a pure function of the two, so applying the same file twice
//! plans nothing the second time, and `--dry-run` shows exactly what a real
//! run would do. Limits are compared as a tenant would feel them
//! ([`BucketLimits::same_as`]). The file is the truth for each tier it
//! declares: buckets and tables it leaves out are removed.

use std::collections::BTreeMap;

use serde::Serialize;
use tollgate_core::validate;
use tollgate_core::{BucketName, TableName, TierName};

use tollgate_core::budget::Budget;

use crate::tier::definition::{
    BucketLimits, Buckets, Budgets, PartitionLimits, Tables, TierDefinition, budget_bucket_text,
    budget_text,
};

/// How two maps differ, entry by entry, in key order: the entries only
/// `after` has, the keys only `before` has, and the entries both have that
/// `same` tells apart (key, before, after). Buckets, tables and budgets are
/// compared by it.
struct Diff<K, V, A, C>
where
    A: Iterator<Item = (K, V)>,
    C: Iterator<Item = (K, V, V)>,
{
    added: A,
    removed: Vec<K>,
    changed: C,
}

fn diff<'a, K: Ord + Clone, V: Clone>(
    before: &'a BTreeMap<K, V>,
    after: &'a BTreeMap<K, V>,
    same: impl Fn(&V, &V) -> bool + 'a,
) -> Diff<K, V, impl Iterator<Item = (K, V)> + 'a, impl Iterator<Item = (K, V, V)> + 'a> {
    Diff {
        added: after
            .iter()
            .filter(|(key, _)| !before.contains_key(*key))
            .map(|(key, value)| (key.clone(), value.clone())),
        removed: before
            .keys()
            .filter(|key| !after.contains_key(*key))
            .cloned()
            .collect(),
        changed: after.iter().filter_map(move |(key, value)| {
            let old = before.get(key)?;
            (!same(old, value)).then(|| (key.clone(), old.clone(), value.clone()))
        }),
    }
}

/// What happens to one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// In the file, not on the server: `PutTier`.
    Created,
    /// On both, defined differently: `PutTier`.
    Changed,
    /// On both, the same: nothing.
    Unchanged,
    /// On the server, not in the file, with `--prune`: `DeleteTier`.
    Deleted,
    /// On the server, not in the file, without `--prune`: left alone.
    NotInFile,
}

impl Action {
    /// Whether the action changes the server.
    pub fn changes(self) -> bool {
        matches!(self, Action::Created | Action::Changed | Action::Deleted)
    }
}

/// One bucket as a change adds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddedBucket {
    pub bucket: BucketName,
    #[serde(flatten)]
    pub limits: BucketLimits,
}

/// One bucket defined on both sides, differently.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangedBucket {
    pub bucket: BucketName,
    pub before: BucketLimits,
    pub after: BucketLimits,
}

impl ChangedBucket {
    /// What changed, field by field: `refill_rate 10 -> 5, burst_limit 100 -> 50`.
    ///
    /// `initial_tokens` is shown only when one side sets it: while neither
    /// does, it follows the burst limit, whose change is shown already.
    pub fn text(&self) -> String {
        let (before, after) = (&self.before, &self.after);
        let mut parts = Vec::new();
        let mut show = |field: &str, from: f64, to: f64| {
            if from != to {
                parts.push(format!(
                    "{field} {} -> {}",
                    validate::number(from),
                    validate::number(to)
                ));
            }
        };
        show("refill_rate", before.refill_rate, after.refill_rate);
        show("burst_limit", before.burst_limit, after.burst_limit);
        if before.initial_tokens.is_some() || after.initial_tokens.is_some() {
            show(
                "initial_tokens",
                before.effective_initial_tokens(),
                after.effective_initial_tokens(),
            );
        }
        parts.join(", ")
    }
}

/// How one tier's buckets differ between the server (before) and the
/// file (after).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BucketChanges {
    pub added: Vec<AddedBucket>,
    pub removed: Vec<BucketName>,
    pub changed: Vec<ChangedBucket>,
}

impl BucketChanges {
    pub fn between(before: &Buckets, after: &Buckets) -> BucketChanges {
        let d = diff(before, after, BucketLimits::same_as);
        BucketChanges {
            added: d
                .added
                .map(|(bucket, limits)| AddedBucket { bucket, limits })
                .collect(),
            removed: d.removed,
            changed: d
                .changed
                .map(|(bucket, before, after)| ChangedBucket {
                    bucket,
                    before,
                    after,
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// One line per bucket, indented: `+ name  limits`, `- name`,
    /// `~ name  refill_rate 10 -> 5`.
    pub fn lines(&self) -> Vec<String> {
        let added = self
            .added
            .iter()
            .map(|b| format!("  + {}  {}", b.bucket, b.limits.text()));
        let removed = self.removed.iter().map(|b| format!("  - {b}"));
        let changed = self
            .changed
            .iter()
            .map(|b| format!("  ~ {}  {}", b.bucket, b.text()));
        added.chain(removed).chain(changed).collect()
    }
}

/// One table as a change adds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddedTable {
    pub table: TableName,
    #[serde(flatten)]
    pub limits: PartitionLimits,
}

/// One table limited on both sides, differently.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangedTable {
    pub table: TableName,
    pub before: PartitionLimits,
    pub after: PartitionLimits,
}

impl ChangedTable {
    /// What changed: `max_reads_per_second 100 -> 200, max_writes_per_second unlimited -> 5`.
    pub fn text(&self) -> String {
        self.before
            .fields()
            .into_iter()
            .zip(self.after.fields())
            .filter(|((_, from), (_, to))| from != to)
            .map(|((field, from), (_, to))| {
                format!(
                    "{field} {} -> {}",
                    PartitionLimits::limit_text(from),
                    PartitionLimits::limit_text(to)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How one tier's table limits differ between the server (before) and
/// the file (after).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TableChanges {
    pub added: Vec<AddedTable>,
    pub removed: Vec<TableName>,
    pub changed: Vec<ChangedTable>,
}

impl TableChanges {
    pub fn between(before: &Tables, after: &Tables) -> TableChanges {
        let d = diff(before, after, PartialEq::eq);
        TableChanges {
            added: d
                .added
                .map(|(table, limits)| AddedTable {
                    table,
                    limits: limits.into(),
                })
                .collect(),
            removed: d.removed,
            changed: d
                .changed
                .map(|(table, before, after)| ChangedTable {
                    table,
                    before: before.into(),
                    after: after.into(),
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// One line per table, indented as bucket lines are: `+ table name
    /// limits`, `- table name`, `~ table name  max_reads_per_second 10 -> 5`.
    pub fn lines(&self) -> Vec<String> {
        let added = self
            .added
            .iter()
            .map(|t| format!("  + table {}  {}", t.table, t.limits.text()));
        let removed = self.removed.iter().map(|t| format!("  - table {t}"));
        let changed = self
            .changed
            .iter()
            .map(|t| format!("  ~ table {}  {}", t.table, t.text()));
        added.chain(removed).chain(changed).collect()
    }
}

/// One budget as a change adds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddedBudget {
    /// Empty for the request-unit bucket.
    pub bucket: BucketName,
    pub budget: Budget,
}

/// One bucket with a budget on both sides, a different one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangedBudget {
    pub bucket: BucketName,
    pub before: Budget,
    pub after: Budget,
}

/// How one tier's budgets differ between the server (before) and the
/// file (after).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BudgetChanges {
    pub added: Vec<AddedBudget>,
    pub removed: Vec<BucketName>,
    pub changed: Vec<ChangedBudget>,
}

impl BudgetChanges {
    pub fn between(before: &Budgets, after: &Budgets) -> BudgetChanges {
        let d = diff(before, after, PartialEq::eq);
        BudgetChanges {
            added: d
                .added
                .map(|(bucket, budget)| AddedBudget { bucket, budget })
                .collect(),
            removed: d.removed,
            changed: d
                .changed
                .map(|(bucket, before, after)| ChangedBudget {
                    bucket,
                    before,
                    after,
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// One line per budget, indented as bucket lines are: `+ budget
    /// bucket  what`, `- budget bucket`, `~ budget bucket  before -> after`.
    pub fn lines(&self) -> Vec<String> {
        let added = self.added.iter().map(|b| {
            format!(
                "  + budget {}  {}",
                budget_bucket_text(&b.bucket),
                budget_text(&b.budget)
            )
        });
        let removed = self
            .removed
            .iter()
            .map(|b| format!("  - budget {}", budget_bucket_text(b)));
        let changed = self.changed.iter().map(|b| {
            format!(
                "  ~ budget {}  {} -> {}",
                budget_bucket_text(&b.bucket),
                budget_text(&b.before),
                budget_text(&b.after)
            )
        });
        added.chain(removed).chain(changed).collect()
    }
}

/// One tier's part of the plan: its buckets' changes at the top, its
/// tables' under `tables`, its budgets' under `budgets`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierChange {
    pub name: TierName,
    pub action: Action,
    #[serde(flatten)]
    pub buckets: BucketChanges,
    pub tables: TableChanges,
    pub budgets: BudgetChanges,
    /// The whole tier into shadow mode (`true`) or out of it (`false`);
    /// `null` if that does not change (a new tier: if it is not in it).
    pub shadow: Option<bool>,
}

impl TierChange {
    /// The whole tier's mode, then the bucket lines, the table lines and
    /// the budget lines.
    pub fn lines(&self) -> Vec<String> {
        let mode = self.shadow.map(|shadow| {
            if shadow {
                "  ~ the whole tier in shadow mode (enforce = false)".to_owned()
            } else {
                "  ~ the whole tier enforced".to_owned()
            }
        });
        [
            mode.into_iter().collect(),
            self.buckets.lines(),
            self.tables.lines(),
            self.budgets.lines(),
        ]
        .concat()
    }
}

/// Every tier on either side, by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub tiers: Vec<TierChange>,
}

impl Plan {
    /// What makes the server's tiers (`server`) the file's (`file`);
    /// with `prune`, tiers the file lacks are deleted, else left alone.
    pub fn new(
        server: &BTreeMap<TierName, TierDefinition>,
        file: &BTreeMap<TierName, TierDefinition>,
        prune: bool,
    ) -> Plan {
        let empty = TierDefinition::default();
        let mut names: Vec<&TierName> = server.keys().chain(file.keys()).collect();
        names.sort();
        names.dedup();
        let tiers = names
            .into_iter()
            .map(|name| {
                let between = |before: &TierDefinition, after: &TierDefinition| {
                    (
                        BucketChanges::between(&before.buckets, &after.buckets),
                        TableChanges::between(&before.tables, &after.tables),
                        BudgetChanges::between(&before.budgets, &after.budgets),
                    )
                };
                let (action, (buckets, tables, budgets), shadow) =
                    match (server.get(name), file.get(name)) {
                        (None, Some(after)) => (
                            Action::Created,
                            between(&empty, after),
                            after.shadow.then_some(true),
                        ),
                        (Some(before), Some(after)) => {
                            let changes = between(before, after);
                            let shadow = (before.shadow != after.shadow).then_some(after.shadow);
                            let action = if changes.0.is_empty()
                                && changes.1.is_empty()
                                && changes.2.is_empty()
                                && shadow.is_none()
                            {
                                Action::Unchanged
                            } else {
                                Action::Changed
                            };
                            (action, changes, shadow)
                        }
                        (Some(_), None) if prune => (Action::Deleted, Default::default(), None),
                        // (None, None) cannot be: every name is on one side.
                        (Some(_), None) | (None, None) => {
                            (Action::NotInFile, Default::default(), None)
                        }
                    };
                TierChange {
                    name: name.clone(),
                    action,
                    buckets,
                    tables,
                    budgets,
                    shadow,
                }
            })
            .collect();
        Plan { tiers }
    }

    /// How many tiers the plan creates, changes or deletes.
    pub fn changes(&self) -> usize {
        self.tiers.iter().filter(|t| t.action.changes()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::partition::TableLimits;

    fn tier(name: &str) -> TierName {
        TierName::parse("tier", name).expect("valid")
    }

    fn bucket(name: &str) -> BucketName {
        BucketName::parse("bucket", name).expect("valid")
    }

    fn limits(refill_rate: f64, burst_limit: f64) -> BucketLimits {
        BucketLimits {
            quota: None,
            refill_rate,
            burst_limit,
            initial_tokens: None,
            kind: tollgate_core::tier::BucketKind::Shared,
            enforce: true,
        }
    }

    fn buckets(defs: &[(&str, BucketLimits)]) -> TierDefinition {
        TierDefinition {
            buckets: defs.iter().map(|(n, l)| (bucket(n), l.clone())).collect(),
            tables: Tables::new(),
            budgets: Budgets::new(),
            shadow: false,
        }
    }

    fn table(name: &str) -> TableName {
        TableName::parse("table", name).expect("valid")
    }

    fn per_partition(reads: Option<f64>, writes: Option<f64>) -> TableLimits {
        TableLimits {
            max_reads_per_second: reads,
            max_writes_per_second: writes,
        }
    }

    fn with_tables(mut tier: TierDefinition, tables: &[(&str, TableLimits)]) -> TierDefinition {
        tier.tables = tables.iter().map(|(n, l)| (table(n), *l)).collect();
        tier
    }

    fn actions(plan: &Plan) -> Vec<(&str, Action)> {
        plan.tiers
            .iter()
            .map(|t| (t.name.as_str(), t.action))
            .collect()
    }

    /// The server has free, pro and legacy; the file has free (the same),
    /// pro (changed) and team (new).
    fn server_and_file() -> (
        BTreeMap<TierName, TierDefinition>,
        BTreeMap<TierName, TierDefinition>,
    ) {
        let free = buckets(&[("schedule-email", limits(1.0, 10.0))]);
        let server = BTreeMap::from([
            (tier("free"), free.clone()),
            (
                tier("pro"),
                buckets(&[
                    ("schedule-email", limits(10.0, 100.0)),
                    ("export", limits(1.0, 1.0)),
                    ("ai", limits(1.0, 20.0)),
                ]),
            ),
            (tier("legacy"), TierDefinition::default()),
        ]);
        let file = BTreeMap::from([
            (tier("free"), free),
            (
                tier("pro"),
                buckets(&[
                    ("schedule-email", limits(20.0, 100.0)),
                    ("ai", limits(1.0, 20.0)),
                    ("invoke-doc-summary-ai", limits(1.0, 20.0)),
                ]),
            ),
            (
                tier("team"),
                buckets(&[("schedule-email", limits(50.0, 500.0))]),
            ),
        ]);
        (server, file)
    }

    #[test]
    fn each_tier_is_created_changed_unchanged_or_left_alone() {
        let (server, file) = server_and_file();
        let plan = Plan::new(&server, &file, false);
        assert_eq!(
            actions(&plan),
            [
                ("free", Action::Unchanged),
                ("legacy", Action::NotInFile),
                ("pro", Action::Changed),
                ("team", Action::Created),
            ]
        );
        assert_eq!(plan.changes(), 2);

        assert!(plan.tiers.iter().all(|t| t.tables.is_empty()));
        let pro = &plan.tiers[2].buckets;
        assert_eq!(
            pro.added,
            [AddedBucket {
                bucket: bucket("invoke-doc-summary-ai"),
                limits: limits(1.0, 20.0)
            }]
        );
        assert_eq!(pro.removed, [bucket("export")]);
        assert_eq!(
            pro.changed,
            [ChangedBucket {
                bucket: bucket("schedule-email"),
                before: limits(10.0, 100.0),
                after: limits(20.0, 100.0),
            }]
        );
        let team = &plan.tiers[3].buckets;
        assert_eq!(team.added.len(), 1);
        assert!(team.removed.is_empty() && team.changed.is_empty());
    }

    #[test]
    fn prune_deletes_the_tiers_the_file_lacks() {
        let (server, file) = server_and_file();
        let plan = Plan::new(&server, &file, true);
        assert_eq!(plan.tiers[1].name.as_str(), "legacy");
        assert_eq!(plan.tiers[1].action, Action::Deleted);
        assert_eq!(plan.changes(), 3);
    }

    #[test]
    fn a_file_matching_the_server_plans_nothing() {
        let (_, file) = server_and_file();
        let plan = Plan::new(&file, &file, true);
        assert!(plan.tiers.iter().all(|t| t.action == Action::Unchanged));
        assert_eq!(plan.changes(), 0);
    }

    #[test]
    fn an_initial_level_the_server_filled_in_is_no_change() {
        let declared = BTreeMap::from([(tier("pro"), buckets(&[("a", limits(1.0, 20.0))]))]);
        let stored = BTreeMap::from([(
            tier("pro"),
            buckets(&[(
                "a",
                BucketLimits {
                    initial_tokens: Some(20.0),
                    ..limits(1.0, 20.0)
                },
            )]),
        )]);
        let plan = Plan::new(&stored, &declared, false);
        assert_eq!(actions(&plan), [("pro", Action::Unchanged)]);
    }

    #[test]
    fn the_limits_diff_shows_each_changed_field_from_and_to() {
        let change = |before, after| {
            ChangedBucket {
                bucket: bucket("a"),
                before,
                after,
            }
            .text()
        };
        assert_eq!(
            change(limits(10.0, 100.0), limits(5.0, 50.0)),
            "refill_rate 10 -> 5, burst_limit 100 -> 50"
        );
        assert_eq!(
            change(limits(10.0, 100.0), limits(10.0, 2e15)),
            "burst_limit 100 -> 2e15"
        );
        // Unset on both sides, the initial level follows the burst: not shown.
        assert_eq!(
            change(limits(1.0, 20.0), limits(1.0, 30.0)),
            "burst_limit 20 -> 30"
        );
        let initial = BucketLimits {
            initial_tokens: Some(5.0),
            ..limits(1.0, 20.0)
        };
        assert_eq!(
            change(limits(1.0, 20.0), initial.clone()),
            "initial_tokens 20 -> 5"
        );
        assert_eq!(
            change(initial, limits(0.5, 20.0)),
            "refill_rate 1 -> 0.5, initial_tokens 5 -> 20"
        );
    }

    #[test]
    fn table_limits_are_added_changed_and_removed_as_the_file_says() {
        let pro = buckets(&[("a", limits(1.0, 2.0))]);
        let server = BTreeMap::from([(
            tier("pro"),
            with_tables(
                pro.clone(),
                &[
                    ("orders", per_partition(Some(100.0), None)),
                    ("users", per_partition(None, Some(5.0))),
                    ("audit", per_partition(Some(1.0), Some(1.0))),
                ],
            ),
        )]);
        let file = BTreeMap::from([(
            tier("pro"),
            with_tables(
                pro.clone(),
                &[
                    ("orders", per_partition(Some(200.0), Some(10.0))),
                    ("audit", per_partition(Some(1.0), Some(1.0))),
                    ("events", per_partition(None, Some(50.0))),
                ],
            ),
        )]);
        let plan = Plan::new(&server, &file, false);
        assert_eq!(actions(&plan), [("pro", Action::Changed)]);
        let change = &plan.tiers[0];
        assert!(change.buckets.is_empty(), "{change:?}");
        assert_eq!(
            change.lines(),
            [
                "  + table events  max_writes_per_second 50",
                "  - table users",
                "  ~ table orders  max_reads_per_second 100 -> 200, \
                 max_writes_per_second unlimited -> 10",
            ]
        );
        let json = serde_json::to_value(change).expect("json");
        assert_eq!(json["tables"]["added"][0]["table"], "events");
        assert_eq!(
            json["tables"]["added"][0]["max_reads_per_second"],
            serde_json::Value::Null
        );
        assert_eq!(json["tables"]["removed"][0], "users");
        assert_eq!(
            json["tables"]["changed"][0]["before"]["max_reads_per_second"],
            100.0
        );
        assert_eq!(
            json["tables"]["changed"][0]["after"]["max_writes_per_second"],
            10.0
        );
        assert_eq!(json["added"], serde_json::json!([]), "no bucket added");

        // A file without tables removes them all; applied, it plans nothing.
        let bare = BTreeMap::from([(tier("pro"), pro)]);
        let plan = Plan::new(&server, &bare, false);
        assert_eq!(actions(&plan), [("pro", Action::Changed)]);
        assert_eq!(
            plan.tiers[0].tables.removed,
            [table("audit"), table("orders"), table("users")]
        );
        assert_eq!(Plan::new(&bare, &bare, false).changes(), 0);
        assert_eq!(Plan::new(&file, &file, false).changes(), 0);
    }

    #[test]
    fn bucket_changes_read_as_added_removed_and_changed_lines() {
        let before = buckets(&[("a", limits(1.0, 2.0)), ("b", limits(1.0, 2.0))]);
        let after = buckets(&[("a", limits(3.0, 2.0)), ("c", limits(4.0, 5.0))]);
        assert_eq!(
            BucketChanges::between(&before.buckets, &after.buckets).lines(),
            [
                "  + c  refill_rate 4, burst_limit 5",
                "  - b",
                "  ~ a  refill_rate 1 -> 3",
            ]
        );
    }

    #[test]
    fn budgets_are_added_changed_and_removed_as_the_file_says() {
        use tollgate_core::budget::{AtLimit, CycleRule, Period};
        let monthly = |amount: f64, at_limit| {
            Budget::new(
                amount,
                CycleRule {
                    period: Period::Monthly { anchor_day: 1 },
                    time_zone: "UTC".into(),
                },
                at_limit,
            )
        };
        let with = |budgets: &[(&str, Budget)]| TierDefinition {
            budgets: budgets
                .iter()
                .map(|(b, budget)| (bucket(b), budget.clone()))
                .collect(),
            ..buckets(&[("a", limits(1.0, 2.0)), ("b", limits(1.0, 2.0))])
        };
        let server = BTreeMap::from([(tier("pro"), with(&[("a", monthly(10.0, AtLimit::Stop))]))]);
        let file = BTreeMap::from([(
            tier("pro"),
            with(&[
                ("", monthly(5e7, AtLimit::Notify)),
                ("a", monthly(20.0, AtLimit::Stop)),
            ]),
        )]);
        let plan = Plan::new(&server, &file, false);
        assert_eq!(actions(&plan), [("pro", Action::Changed)]);
        assert_eq!(
            plan.tiers[0].lines(),
            [
                "  + budget (request units)  5e7 tokens monthly on day 1 (UTC), then notify; alerts at 50, 75, 90, 100",
                "  ~ budget a  10 tokens monthly on day 1 (UTC), then stop; alerts at 50, 75, 90, 100 -> 20 tokens monthly on day 1 (UTC), then stop; alerts at 50, 75, 90, 100",
            ]
        );
        let json = serde_json::to_value(&plan.tiers[0]).expect("json");
        assert_eq!(json["budgets"]["added"][0]["bucket"], "");
        assert_eq!(json["budgets"]["changed"][0]["after"]["amount"], 20.0);
        // A file without budgets removes them; the same file twice plans
        // nothing.
        let bare = BTreeMap::from([(tier("pro"), with(&[]))]);
        let removed = Plan::new(&file, &bare, false);
        assert_eq!(
            removed.tiers[0].budgets.removed,
            [BucketName::REQUEST_UNITS, bucket("a")]
        );
        assert_eq!(Plan::new(&file, &file, false).changes(), 0);
    }

    #[test]
    fn the_plan_serializes_as_snake_case_json() {
        let (server, file) = server_and_file();
        let plan = Plan::new(&server, &file, true);
        let json = serde_json::to_value(&plan.tiers[2]).expect("json");
        assert_eq!(json["name"], "pro");
        assert_eq!(json["action"], "changed");
        assert_eq!(json["added"][0]["bucket"], "invoke-doc-summary-ai");
        assert_eq!(json["added"][0]["refill_rate"], 1.0);
        assert_eq!(json["added"][0]["initial_tokens"], serde_json::Value::Null);
        assert_eq!(json["removed"][0], "export");
        assert_eq!(json["changed"][0]["before"]["refill_rate"], 10.0);
        assert_eq!(json["changed"][0]["after"]["refill_rate"], 20.0);
        let legacy = serde_json::to_value(&plan.tiers[1]).expect("json");
        assert_eq!(legacy["action"], "deleted");
        let kept =
            serde_json::to_value(Plan::new(&server, &file, false).tiers[1].clone()).expect("json");
        assert_eq!(kept["action"], "not_in_file");
    }
}
