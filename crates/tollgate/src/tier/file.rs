//! The file `tollgate tier apply -f FILE` reads: every tier, as TOML.
//!
//! ```toml
//! [tiers.pro.buckets.schedule-email]
//! refill_rate = 10        # tokens per second
//! burst_limit = 100
//! initial_tokens = 100    # optional, default: burst_limit
//!
//! [tiers.pro.tables.orders]      # per-partition limits of a table
//! max_reads_per_second = 500     # optional; at least one of the two
//! max_writes_per_second = 100    # optional
//!
//! [tiers.pro.buckets.schedule-email.budget]   # see `budget`
//! amount = 100_000
//! cycle = "daily"
//! at_limit = "stop"
//! ```
//!
//! The file is the truth for each tier it declares: a bucket, a table or
//! a budget it leaves out is removed from the tier.
//!
//! The whole file is checked before anything is sent, so a file with any
//! error changes nothing. Every error names the file, the line and column
//! and the field's path as TOML writes it (`tiers.pro.buckets.schedule-email.refill_rate`),
//! and every error in the values is reported, not only the first. Keys the
//! format does not know are errors (a misspelt `burst_limt` would otherwise
//! leave a limit unset), and so are the syntax errors TOML itself refuses,
//! duplicate keys among them.
//!
//! Serde does the shape (types, unknown and missing keys); the values are
//! checked afterwards with the core's rules. Serde's errors carry a byte
//! span but no usable path, so the path is found by looking the span up in
//! the document's own spanned tree (`toml::de::DeTable`).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use tollgate_core::partition::{MAX_TABLES, TableLimits};
use tollgate_core::tier::BucketKind;
use tollgate_core::validate::InvalidInput;
use tollgate_core::{BucketName, TableName, TierName};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::tier::definition::{
    self, BucketLimits, Buckets, Budgets, MAX_TIER_BUCKETS, Tables, TierDefinition,
};

mod budget;

pub use self::budget::DEFAULT_BASELINE_BURST_SECONDS;
use self::budget::{BudgetToml, QuotaToml};

/// A valid tiers file: every tier it declares, by name.
#[derive(Debug, Default, PartialEq)]
pub struct TierFile {
    pub tiers: BTreeMap<TierName, TierDefinition>,
}

/// The document's shape. `tiers` is required: an empty file is more likely
/// a mistake than a wish to have no tiers (which `--prune` would act on).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    tiers: BTreeMap<Spanned<String>, TierToml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TierToml {
    /// A tier may define no bucket at all (`[tiers.suspended]`).
    #[serde(default)]
    buckets: BTreeMap<Spanned<String>, BucketToml>,
    /// Per-partition limits, by table; none if absent.
    #[serde(default)]
    tables: BTreeMap<Spanned<String>, TableToml>,
    /// The request-unit bucket's budget, if any.
    budget: Option<Spanned<BudgetToml>>,
    /// `false`: the whole tier in shadow mode (each of its buckets and
    /// budgets as if it said `enforce = false`). Enforced if left out.
    enforce: Option<bool>,
}

/// One bucket's limits. TOML integers are accepted for the numbers
/// (`refill_rate = 10`), and so are `nan` and `inf`, which the checks refuse.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketToml {
    refill_rate: Spanned<f64>,
    burst_limit: Spanned<f64>,
    initial_tokens: Option<Spanned<f64>>,
    /// `shared` (the default) or `per-key`.
    kind: Option<Spanned<String>>,
    /// The bucket's budget, if any (a shared bucket's only).
    budget: Option<Spanned<BudgetToml>>,
    /// The bucket's calendar quota, if any (per key for a per-key bucket).
    quota: Option<Spanned<QuotaToml>>,
    /// `false`: shadow mode (decided and counted as if enforced, refusing
    /// and throttling nothing). Enforced if left out.
    enforce: Option<bool>,
}

/// One table's per-partition limits, operations per second. Each is
/// optional, but not both: a table without limits is left out.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableToml {
    max_reads_per_second: Option<Spanned<f64>>,
    max_writes_per_second: Option<Spanned<f64>>,
}

/// Why a table with neither limit is refused. (The core's message speaks
/// of clearing, which a file does by leaving the table out.)
const NO_TABLE_LIMIT: &str = "set max_reads_per_second, max_writes_per_second or both \
                              (to remove the table's limits, leave the table out)";

/// One thing wrong with a tiers file, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// The file as the operator named it.
    pub file: String,
    /// 1-based, as editors count.
    pub line: usize,
    pub column: usize,
    /// The field's path (`tiers.pro.buckets.schedule-email.refill_rate`),
    /// when the error is about one.
    pub path: Option<String>,
    pub message: String,
}

/// `tiers.toml:4:15: tiers.pro.buckets.schedule-email.refill_rate: must be >= 0, got -1`
impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if let Some(path) = &self.path {
            write!(f, "{path}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Everything wrong with a tiers file, in the order of the file; one
/// error per line.
#[derive(Debug, PartialEq, Eq)]
pub struct FileErrors(pub Vec<FileError>);

impl fmt::Display for FileErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FileErrors {}

/// Parses and checks `text`, the contents of the file `file` names.
pub fn parse(file: &str, text: &str) -> Result<TierFile, FileErrors> {
    let source = Source { file, text };
    let root = DeTable::parse(text).map_err(|e| FileErrors(vec![source.syntax_error(&e)]))?;
    let document = FileToml::deserialize(toml::de::Deserializer::from(root.clone()))
        .map_err(|e| FileErrors(vec![source.shape_error(root.get_ref(), &e)]))?;
    source.check(document)
}

/// The file being read, for turning byte offsets into lines and columns.
struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn error(&self, span: &Range<usize>, path: Option<String>, message: String) -> FileError {
        let (line, column) = line_and_column(self.text, span.start);
        FileError {
            file: self.file.to_owned(),
            line,
            column,
            path,
            message,
        }
    }

    /// A document TOML refuses (a duplicate key, an unclosed table…). The
    /// parser gives no path, so the message quotes the line it is on.
    fn syntax_error(&self, error: &toml::de::Error) -> FileError {
        let span = error.span().unwrap_or(0..0);
        let line = self
            .text
            .get(line_start(self.text, span.start)..)
            .and_then(|rest| rest.lines().next())
            .map(str::trim)
            .unwrap_or_default();
        let message = if line.is_empty() {
            error.message().to_owned()
        } else {
            format!("{}: `{line}`", error.message())
        };
        self.error(&span, None, message)
    }

    /// A document of the wrong shape: a wrong type, an unknown key, a
    /// missing one.
    fn shape_error(&self, root: &DeTable<'_>, error: &toml::de::Error) -> FileError {
        let span = error.span().unwrap_or(0..0);
        let path = path_of_span(root, &span).map(|keys| toml_path(&keys));
        self.error(&span, path, error.message().to_owned())
    }

    /// Checks every name and value, collecting every error.
    fn check(&self, document: FileToml) -> Result<TierFile, FileErrors> {
        let mut errors = Vec::new();
        let mut tiers = BTreeMap::new();
        for (tier_key, tier) in document.tiers {
            let tier_path = toml_path(&["tiers", tier_key.get_ref()]);
            let name = TierName::parse(&tier_path, tier_key.get_ref());
            let name = self.keep(&mut errors, tier_key.span(), name);
            let buckets_path = format!("{tier_path}.buckets");
            if tier.buckets.len() > MAX_TIER_BUCKETS {
                errors.push(self.error(
                    &tier_key.span(),
                    Some(buckets_path.clone()),
                    format!(
                        "at most {MAX_TIER_BUCKETS} buckets per tier, got {}",
                        tier.buckets.len()
                    ),
                ));
            }
            let mut buckets = Buckets::new();
            let mut budgets = Budgets::new();
            if let Some(budget) = &tier.budget {
                let ru = BucketName::REQUEST_UNITS;
                let path = format!("{tier_path}.budget");
                if let Some(budget) = self.budget(&mut errors, &path, &ru, budget) {
                    budgets.insert(ru, budget);
                }
            }
            for (bucket_key, bucket) in tier.buckets {
                let bucket_path = format!("{buckets_path}.{}", toml_key(bucket_key.get_ref()));
                let bucket_name = definition::tier_bucket_name(&bucket_path, bucket_key.get_ref());
                let bucket_name = self.keep(&mut errors, bucket_key.span(), bucket_name);
                let field = |name: &str| format!("{bucket_path}.{name}");
                let refill_rate = self.keep(
                    &mut errors,
                    bucket.refill_rate.span(),
                    definition::refill_rate(&field("refill_rate"), *bucket.refill_rate.get_ref()),
                );
                let burst_limit = self.keep(
                    &mut errors,
                    bucket.burst_limit.span(),
                    definition::tokens(&field("burst_limit"), *bucket.burst_limit.get_ref()),
                );
                let initial_tokens = match &bucket.initial_tokens {
                    None => Some(None),
                    Some(initial) => self
                        .keep(
                            &mut errors,
                            initial.span(),
                            definition::tokens(&field("initial_tokens"), *initial.get_ref()),
                        )
                        .map(Some),
                };
                let kind = match &bucket.kind {
                    None => Some(BucketKind::Shared),
                    Some(kind) => self.keep(
                        &mut errors,
                        kind.span(),
                        definition::kind(&field("kind"), kind.get_ref()),
                    ),
                };
                if let (Some(BucketKind::PerKey), Some(initial)) = (kind, &bucket.initial_tokens) {
                    self.keep::<()>(
                        &mut errors,
                        initial.span(),
                        Err(InvalidInput::new(
                            field("initial_tokens"),
                            "must be unset for a per-key bucket: keys start full",
                        )),
                    );
                }
                let budget = match (&bucket.budget, kind, &bucket_name) {
                    (None, _, _) => None,
                    (Some(budget), Some(BucketKind::PerKey), _) => {
                        errors.push(self.error(
                            &budget.span(),
                            Some(field("budget")),
                            "must not be set for a per-key bucket: a budget caps a bucket the tenant's pods share".to_owned(),
                        ));
                        None
                    }
                    (Some(budget), _, Some(name)) => {
                        self.budget(&mut errors, &field("budget"), name, budget)
                    }
                    (Some(_), _, None) => None,
                };
                if let (Some(budget), Some(name)) = (budget, &bucket_name) {
                    budgets.insert(name.clone(), budget);
                }
                let quota = match &bucket.quota {
                    None => Some(None),
                    Some(quota) => self.quota(&mut errors, &field("quota"), quota).map(Some),
                };
                if let (
                    Some(bucket_name),
                    Some(refill_rate),
                    Some(burst_limit),
                    Some(initial_tokens),
                    Some(kind),
                    Some(quota),
                ) = (
                    bucket_name,
                    refill_rate,
                    burst_limit,
                    initial_tokens,
                    kind,
                    quota,
                ) {
                    buckets.insert(
                        bucket_name,
                        BucketLimits {
                            quota,
                            refill_rate,
                            burst_limit,
                            initial_tokens,
                            kind,
                            enforce: bucket.enforce.unwrap_or(true),
                        },
                    );
                }
            }
            let tables = self.tables(&mut errors, &tier_path, &tier_key, tier.tables);
            if let Some(name) = name {
                tiers.insert(
                    name,
                    TierDefinition {
                        buckets,
                        tables,
                        budgets,
                        shadow: tier.enforce == Some(false),
                    },
                );
            }
        }
        if errors.is_empty() {
            Ok(TierFile { tiers })
        } else {
            errors.sort_by_key(|e| (e.line, e.column));
            Err(FileErrors(errors))
        }
    }

    /// A tier's tables, checked with the core's rules (`TableName::parse`,
    /// `TableLimits::validate`), each value's error at its own place.
    fn tables(
        &self,
        errors: &mut Vec<FileError>,
        tier_path: &str,
        tier_key: &Spanned<String>,
        declared: BTreeMap<Spanned<String>, TableToml>,
    ) -> Tables {
        let tables_path = format!("{tier_path}.tables");
        if declared.len() > MAX_TABLES {
            errors.push(self.error(
                &tier_key.span(),
                Some(tables_path.clone()),
                format!(
                    "at most {MAX_TABLES} tables per tier, got {}",
                    declared.len()
                ),
            ));
        }
        let mut tables = Tables::new();
        for (table_key, table) in declared {
            let table_path = format!("{tables_path}.{}", toml_key(table_key.get_ref()));
            let name = TableName::parse(&table_path, table_key.get_ref());
            let name = self.keep(errors, table_key.span(), name);
            let limits = TableLimits {
                max_reads_per_second: table.max_reads_per_second.as_ref().map(|l| *l.get_ref()),
                max_writes_per_second: table.max_writes_per_second.as_ref().map(|l| *l.get_ref()),
            };
            let mut valid = true;
            if limits.max_reads_per_second.is_none() && limits.max_writes_per_second.is_none() {
                valid = false;
                let message = NO_TABLE_LIMIT.to_owned();
                errors.push(self.error(&table_key.span(), Some(table_path.clone()), message));
            }
            // Each limit on its own, so that its error points at its value.
            let one_by_one = [
                (
                    &table.max_reads_per_second,
                    TableLimits {
                        max_writes_per_second: None,
                        ..limits
                    },
                ),
                (
                    &table.max_writes_per_second,
                    TableLimits {
                        max_reads_per_second: None,
                        ..limits
                    },
                ),
            ];
            for (value, alone) in one_by_one {
                if let Some(value) = value {
                    valid &= self
                        .keep(errors, value.span(), alone.validate(&table_path))
                        .is_some();
                }
            }
            if let (Some(name), true) = (name, valid) {
                tables.insert(name, limits);
            }
        }
        tables
    }

    /// The value if it is valid; else records the error at `span` (the
    /// error's field is the path) and gives `None`.
    fn keep<T>(
        &self,
        errors: &mut Vec<FileError>,
        span: Range<usize>,
        checked: Result<T, InvalidInput>,
    ) -> Option<T> {
        match checked {
            Ok(value) => Some(value),
            Err(e) => {
                errors.push(self.error(&span, Some(e.field), e.reason));
                None
            }
        }
    }
}

/// The keys leading to the entry whose key or value is exactly `span`,
/// the deepest such; failing that, the deepest entry whose key or value
/// contains the span's start. (A table's own span is its header line, so
/// "contains" alone would miss most errors inside tables.)
fn path_of_span(root: &DeTable<'_>, span: &Range<usize>) -> Option<Vec<String>> {
    fn walk(
        table: &DeTable<'_>,
        path: &mut Vec<String>,
        matches: &dyn Fn(&Range<usize>) -> bool,
    ) -> Option<Vec<String>> {
        for (key, value) in table.iter() {
            path.push(key.get_ref().to_string());
            if let DeValue::Table(inner) = value.get_ref()
                && let Some(found) = walk(inner, path, matches)
            {
                return Some(found);
            }
            if matches(&key.span()) || matches(&value.span()) {
                return Some(path.clone());
            }
            path.pop();
        }
        None
    }
    walk(root, &mut Vec::new(), &|s| s == span)
        .or_else(|| walk(root, &mut Vec::new(), &|s| s.contains(&span.start)))
}

/// Keys as TOML writes a dotted key: bare where it may be, else quoted
/// (`tiers.pro.buckets."a.b"`).
fn toml_path<S: AsRef<str>>(keys: &[S]) -> String {
    keys.iter()
        .map(|k| toml_key(k.as_ref()))
        .collect::<Vec<_>>()
        .join(".")
}

fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare {
        key.to_owned()
    } else {
        // TOML's basic strings escape like Rust's debug format for the
        // characters names may hold; anything else is quoted readably.
        format!("{key:?}")
    }
}

fn line_start(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |newline| newline + 1)
}

/// 1-based line and column (in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let bytes = &text.as_bytes()[..offset];
    let line = bytes.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = line_start(text, offset);
    let column = String::from_utf8_lossy(&bytes[start..]).chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
