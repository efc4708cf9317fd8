//! `tollgate tier …`: tiers (free, pro, …), the named sets of bucket
//! definitions that give every tenant on them its buckets' limits (and
//! its tables' per-partition limits), managed through a running server's
//! `Admin` service.
//!
//! - `create` and `update` define one tier's buckets from `--bucket`
//!   flags; `create` refuses a tier that exists and `update` one that does
//!   not, so a typo in a name never silently replaces or adds a tier.
//!   `update` keeps the tier's table limits and budgets: only a tiers
//!   file sets those.
//! - `list`, `show` and `delete`.
//! - `apply -f FILE` makes the server's tiers those of a TOML file
//!   (`file`): it reads them all, plans the difference (`plan`) and sends
//!   only what differs, so it can run on every commit of the file: one
//!   `PutTier` per tier that differs, and a `DeleteTier` for each tier the
//!   file lacks with `--prune`. It stops at the first failure, naming what
//!   it had already done.
//! - `update` and `apply` first send each change as a dry run: when it
//!   would retire buckets (a bucket left out of a tier, or misspelt), they
//!   list each tenant and bucket with its totals and need `--yes` or a
//!   typed confirmation (`closing`); `delete` asks for the tier's name.
//!
//! Names and limits are checked here with the core's rules before anything
//! is sent (`definition`).

mod definition;
mod file;
mod plan;

pub use file::DEFAULT_BASELINE_BURST_SECONDS;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use serde::Serialize;
use tollgate_core::TierName;
use tollgate_core::tier::BucketKind;
use tollgate_core::validate;
use tollgate_proto::v1;

use crate::closing::{self, ClosedJson, RetireArgs};
use crate::output::{self, Table, field, rfc3339};
use crate::preview::{self, PreviewArgs};
use crate::remote::{ActorArg, AdminConnection, AdminServerArg, rpc_error};
use definition::{
    BucketFlag, PartitionLimits, TierDefinition, buckets_from_flags, budget_bucket_text,
    budget_text, tier_from_proto, tier_to_proto,
};
use plan::{Action, AddedBudget, BucketChanges, Plan, TierChange};
use tollgate_server::service::budget_at;

#[derive(Debug, Args)]
pub struct TierArgs {
    #[command(flatten)]
    server: AdminServerArg,

    #[command(subcommand)]
    command: TierCommand,
}

#[derive(Debug, Subcommand)]
enum TierCommand {
    /// Create a tier from its buckets' definitions; refused if it exists.
    Create(PutArgs),
    /// Replace an existing tier's bucket definitions
    ///
    /// Every tenant on the tier gets them at once: tokens carried over
    /// (capped at the new burst), buckets added created, buckets dropped
    /// retired. The tier's table limits are kept. Buckets it would retire
    /// are listed with their totals first, and the tier's name must be
    /// typed again (or --yes given); their totals are kept as closed
    /// records.
    Update(UpdateArgs),
    /// List every tier, its buckets and its table limits.
    List {
        /// Print JSON instead of a table: a list of tiers.
        #[arg(long)]
        json: bool,
    },
    /// Show a tier's buckets and table limits.
    Show {
        #[arg(long, value_parser = parse_tier_name)]
        tier: TierName,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tier. Refused (FailedPrecondition) while tenants are on it
    ///
    /// Asks for the tier's name to be typed again unless --yes is given;
    /// without a terminal to ask on, refuses without --yes.
    Delete {
        #[arg(long, value_parser = parse_tier_name)]
        tier: TierName,
        /// Delete without asking.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Make the server's tiers those a TOML file declares
    ///
    /// Reads the server's tiers, compares them with the file's and sends
    /// only what differs: each tier is created, changed (buckets or tables
    /// added, removed, limits changed) or unchanged. Running it again
    /// changes nothing. The file is the truth for each tier it declares: a
    /// bucket or a table it leaves out is removed from the tier, and
    /// retired from every tenant on it: such buckets are listed with their
    /// totals first, and the file's name must be typed again (or --yes
    /// given); their totals are kept as closed records. The whole file is
    /// checked first; a file with any error changes nothing. The file:
    ///
    ///   [tiers.pro.buckets.schedule-email]
    ///   refill_rate = 10        # tokens per second
    ///   burst_limit = 100
    ///   initial_tokens = 100    # optional, default: burst_limit
    ///
    ///   [tiers.pro.buckets.invoke-doc-summary-ai]
    ///   refill_rate = 1
    ///   burst_limit = 20
    ///
    ///   [tiers.pro.tables.orders]      # per-partition limits
    ///   max_reads_per_second = 500     # optional; at least one of the two
    ///   max_writes_per_second = 100    # optional
    #[command(verbatim_doc_comment)]
    Apply(ApplyArgs),
}

#[derive(Debug, Args)]
struct PutArgs {
    #[arg(long, value_parser = parse_tier_name)]
    tier: TierName,
    /// A bucket of the tier: its name, refill rate (tokens/s), burst limit
    /// and optionally the tokens a new bucket starts with (default: the
    /// burst limit), e.g. schedule-email=10/100. Repeat for each bucket.
    #[arg(
        long = "bucket",
        value_name = "NAME=RATE/BURST[/INITIAL]",
        required = true,
        value_parser = BucketFlag::parse
    )]
    buckets: Vec<BucketFlag>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
}

/// `tier update`: the tier's new buckets, and what to do about buckets
/// it retires.
#[derive(Debug, Args)]
struct UpdateArgs {
    #[command(flatten)]
    put: PutArgs,
    #[command(flatten)]
    retire: RetireArgs,
}

#[derive(Debug, Args)]
struct ApplyArgs {
    /// The TOML file of tiers.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// Print what would change, the buckets that would be retired and
    /// their totals, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Retire buckets without asking (their totals are kept as closed
    /// records either way).
    #[arg(long, short = 'y')]
    yes: bool,
    /// Also delete the server's tiers that the file does not declare.
    #[arg(long)]
    prune: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
    #[command(flatten)]
    preview: PreviewArgs,
}

/// `--tier`: a tier name as the core checks it.
pub fn parse_tier_name(name: &str) -> Result<TierName, String> {
    TierName::parse("tier", name).map_err(|e| e.reason)
}

pub async fn run(args: TierArgs) -> anyhow::Result<()> {
    match args.command {
        // The file is checked before the server is contacted.
        TierCommand::Apply(a) => apply(&args.server, a).await,
        TierCommand::Create(a) => put(&mut args.server.admin().await?, a, None).await,
        TierCommand::Update(a) => put(&mut args.server.admin().await?, a.put, Some(a.retire)).await,
        TierCommand::List { json } => {
            let tiers = args
                .server
                .admin()
                .await?
                .list_tiers(v1::ListTiersRequest {})
                .await
                .map_err(rpc_error)?
                .into_inner()
                .tiers;
            let views: Vec<TierJson> = tiers.iter().map(tier_json).collect();
            output::print(json, &views, |views| list_text(views))
        }
        TierCommand::Show { tier, json } => {
            let tier = args
                .server
                .admin()
                .await?
                .get_tier(v1::GetTierRequest {
                    name: tier.as_str().to_owned(),
                })
                .await
                .map_err(rpc_error)?
                .into_inner()
                .tier
                .unwrap_or_default();
            output::print(json, &tier_json(&tier), tier_text)
        }
        TierCommand::Delete {
            tier,
            yes,
            json,
            actor,
        } => {
            closing::confirm(
                &format!("deleting tier {tier}"),
                &format!("deletes tier {tier} (refused while tenants are on it)."),
                tier.as_str(),
                yes,
            )?;
            args.server
                .admin()
                .await?
                .delete_tier(actor.request(v1::DeleteTierRequest {
                    name: tier.as_str().to_owned(),
                }))
                .await
                .map_err(rpc_error)?;
            let deleted = DeletedTierJson {
                name: tier.as_str().to_owned(),
                deleted: true,
            };
            output::print(json, &deleted, |d| format!("deleted tier {}", d.name))
        }
    }
}

/// The tier, or `None` if the server has no such tier.
async fn get_tier(
    client: &mut AdminConnection,
    name: &TierName,
) -> anyhow::Result<Option<v1::Tier>> {
    match client
        .get_tier(v1::GetTierRequest {
            name: name.as_str().to_owned(),
        })
        .await
    {
        Ok(response) => Ok(Some(response.into_inner().tier.unwrap_or_default())),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
        Err(status) => Err(rpc_error(status)),
    }
}

/// `tier create` (no `retire`) and `tier update`: `GetTier` to check the
/// tier is (or is not) there and to know what changes, then `PutTier`
/// with the flags' buckets and the tier's tables as they were (for an
/// update, a dry run first, confirmed if it would retire buckets).
async fn put(
    client: &mut AdminConnection,
    a: PutArgs,
    retire: Option<RetireArgs>,
) -> anyhow::Result<()> {
    let must_exist = retire.is_some();
    let mut buckets = buckets_from_flags(a.buckets)?;
    let before = match (get_tier(client, &a.tier).await?, must_exist) {
        (Some(_), false) => anyhow::bail!(
            "tier {} already exists (`tollgate tier update` replaces its buckets)",
            a.tier
        ),
        (None, true) => anyhow::bail!(
            "tier {} does not exist (`tollgate tier create` creates it)",
            a.tier
        ),
        (Some(existing), true) => tier_from_proto(&existing)?.1,
        (None, false) => TierDefinition::default(),
    };
    // A bucket the flags keep keeps its quota (the flags cannot set one);
    // the tier's tables and budgets stay as they were (a budget goes with
    // its bucket, if the flags leave the bucket out).
    for (name, limits) in &mut buckets {
        if let Some(old) = before.buckets.get(name) {
            limits.quota.clone_from(&old.quota);
        }
    }
    let budgets = before
        .budgets
        .iter()
        .filter(|(bucket, _)| bucket.as_str().is_empty() || buckets.contains_key(*bucket))
        .map(|(bucket, budget)| (bucket.clone(), budget.clone()))
        .collect();
    let after = TierDefinition {
        buckets,
        tables: before.tables.clone(),
        budgets,
        shadow: before.shadow,
    };
    let request = |dry_run| {
        a.actor.request(v1::PutTierRequest {
            tier: Some(tier_to_proto(&a.tier, &after)),
            dry_run,
        })
    };
    let dry_run = retire.as_ref().is_some_and(|r| r.dry_run);
    if let Some(retire) = &retire {
        let would = client
            .put_tier(request(true))
            .await
            .map_err(rpc_error)?
            .into_inner();
        if dry_run || would.closed.is_empty() {
            // Nothing to ask: a dry run prints what it found.
        } else {
            closing::confirm(
                &format!("updating tier {}", a.tier),
                &closing::retiring_text("would retire", &closing::closed_json(&would.closed)),
                a.tier.as_str(),
                retire.yes,
            )?;
        }
        if dry_run {
            let view = PutTierJson {
                tier: tier_json(&would.tier.unwrap_or_default()),
                dry_run: true,
                created: would.created,
                tenants_updated: would.tenants_updated,
                changes: BucketChanges::between(&before.buckets, &after.buckets),
                retired: closing::closed_json(&would.closed),
            };
            return output::print(a.json, &view, put_text);
        }
    }
    let response = client
        .put_tier(request(false))
        .await
        .map_err(rpc_error)?
        .into_inner();
    if response.created == must_exist {
        // Someone else created or deleted it between the two calls.
        eprintln!(
            "warning: tier {} was {} meanwhile by someone else",
            a.tier,
            if must_exist { "deleted" } else { "created" }
        );
    }
    let view = PutTierJson {
        tier: tier_json(&response.tier.unwrap_or_default()),
        dry_run: false,
        created: response.created,
        tenants_updated: response.tenants_updated,
        changes: BucketChanges::between(&before.buckets, &after.buckets),
        retired: closing::closed_json(&response.closed),
    };
    output::print(a.json, &view, put_text)
}

/// `tier apply`: check the file, read the server's tiers, plan, and
/// (unless `--dry-run`) send what differs.
async fn apply(server: &AdminServerArg, a: ApplyArgs) -> anyhow::Result<()> {
    let name = a.file.display().to_string();
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("read {name}"))?;
    let declared = file::parse(&name, &text)?;

    let mut client = server.admin().await?;
    let listed = client
        .list_tiers(v1::ListTiersRequest {})
        .await
        .map_err(rpc_error)
        .context("list the server's tiers")?
        .into_inner()
        .tiers;
    let current = listed
        .iter()
        .map(tier_from_proto)
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    let plan = Plan::new(&current, &declared.tiers, a.prune);
    if a.preview.preview {
        // Each changed tier, against its tenants' recorded usage.
        let mut views = Vec::new();
        for change in plan.tiers.iter().filter(|c| c.action == Action::Changed) {
            let name = &change.name;
            let defined = declared
                .tiers
                .get(name)
                .ok_or_else(|| anyhow!("tier {name} is not in {}", a.file.display()))?;
            let tier = v1::preview_limits_request::Change::Tier(tier_to_proto(name, defined));
            // A tier's preview reads every tenant's history: seconds for
            // thousands of tenants. Say so where the result does not go.
            eprintln!("previewing tier {name}: replaying its tenants' recorded usage…");
            let started = std::time::Instant::now();
            let view = preview::preview(&mut client, &a.preview, tier)
                .await
                .with_context(|| format!("preview the change of tier {name}"))?;
            eprintln!(
                "previewed tier {name}: {} buckets in {:.1} s",
                view.buckets(),
                started.elapsed().as_secs_f64()
            );
            views.push(view);
        }
        return preview::print(a.json, &views);
    }

    let mut report = ApplyJson {
        file: name,
        dry_run: a.dry_run,
        prune: a.prune,
        changes: plan.changes(),
        tiers: plan
            .tiers
            .into_iter()
            .map(|change| AppliedTier {
                change,
                tenants_updated: None,
            })
            .collect(),
        retired: Vec::new(),
    };
    // Each change of a tier in use, as a dry run: what it would retire.
    for tier in &report.tiers {
        if tier.change.action != Action::Changed {
            continue;
        }
        let name = &tier.change.name;
        let defined = declared
            .tiers
            .get(name)
            .ok_or_else(|| anyhow!("tier {name} is not in {}", report.file))?;
        let would = client
            .put_tier(a.actor.request(v1::PutTierRequest {
                tier: Some(tier_to_proto(name, defined)),
                dry_run: true,
            }))
            .await
            .map_err(rpc_error)
            .with_context(|| format!("try the change of tier {name}"))?
            .into_inner();
        report.retired.extend(closing::closed_json(&would.closed));
    }
    if !a.dry_run && !report.retired.is_empty() {
        closing::confirm(
            &format!("applying {}", report.file),
            &closing::retiring_text("would retire", &report.retired),
            &report.file,
            a.yes,
        )?;
        report.retired.clear();
    }
    if !a.dry_run {
        let mut done = Vec::new();
        for tier in &mut report.tiers {
            let name = &tier.change.name;
            let action = tier.change.action;
            let step = match action {
                Action::Created | Action::Changed => {
                    let defined = declared
                        .tiers
                        .get(name)
                        .ok_or_else(|| anyhow!("tier {name} is not in {}", report.file))?;
                    client
                        .put_tier(a.actor.request(v1::PutTierRequest {
                            tier: Some(tier_to_proto(name, defined)),
                            dry_run: false,
                        }))
                        .await
                        .map(|r| {
                            let r = r.into_inner();
                            tier.tenants_updated = Some(r.tenants_updated);
                            report.retired.extend(closing::closed_json(&r.closed));
                        })
                }
                Action::Deleted => client
                    .delete_tier(a.actor.request(v1::DeleteTierRequest {
                        name: name.as_str().to_owned(),
                    }))
                    .await
                    .map(drop),
                Action::Unchanged | Action::NotInFile => continue,
            };
            let verb = action_verb(action);
            step.map_err(|status| {
                let context = if done.is_empty() {
                    format!("{verb} tier {name}")
                } else {
                    format!("{verb} tier {name} (already done: {})", done.join(", "))
                };
                rpc_error(status).context(context)
            })?;
            done.push(format!("{verb} {name}"));
        }
    }
    output::print(a.json, &report, apply_text)
}

/// A tier as `--json` prints it.
#[derive(Debug, Serialize)]
struct TierJson {
    name: String,
    buckets: Vec<BucketJson>,
    /// Per-partition limits of the tenants on the tier, by table.
    tables: Vec<TableLimitsJson>,
    /// Budgets of the tenants on the tier, by bucket (empty: request
    /// units), as the server checked them.
    budgets: Vec<AddedBudget>,
    /// The whole tier in shadow mode (`enforce = false`).
    shadow: bool,
    created_at: Option<String>,
    updated_at: Option<String>,
}

/// One table's per-partition limits, of a tier or of a tenant's own;
/// `null` means not limited.
#[derive(Debug, Serialize)]
pub struct TableLimitsJson {
    pub table: String,
    #[serde(flatten)]
    pub limits: PartitionLimits,
}

impl TableLimitsJson {
    pub fn new(t: &v1::TableLimits) -> Self {
        TableLimitsJson {
            table: t.table.clone(),
            limits: PartitionLimits {
                max_reads_per_second: t.max_reads_per_second,
                max_writes_per_second: t.max_writes_per_second,
            },
        }
    }

    /// `orders: reads 500/s, writes unlimited per partition`.
    pub fn text(&self) -> String {
        let limit = |l: Option<f64>| l.map_or("unlimited".to_owned(), |l| format!("{l}/s"));
        format!(
            "{}: reads {}, writes {} per partition",
            self.table,
            limit(self.limits.max_reads_per_second),
            limit(self.limits.max_writes_per_second)
        )
    }

    /// The `READS/S` and `WRITES/S` cells.
    fn limit_cells(&self) -> Vec<String> {
        self.limits
            .fields()
            .into_iter()
            .map(|(_, limit)| PartitionLimits::limit_text(limit))
            .collect()
    }
}

/// A bucket as a tier or an override defines it.
#[derive(Debug, Serialize)]
pub struct BucketJson {
    pub bucket: String,
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// `null` when unset: a new bucket starts at its burst limit.
    pub initial_tokens: Option<f64>,
    /// `shared` or `per-key`.
    pub kind: BucketKind,
    /// False: shadow mode.
    pub enforce: bool,
}

impl BucketJson {
    pub fn new(b: &v1::BucketDefinition) -> Self {
        BucketJson {
            bucket: b.bucket.clone(),
            refill_rate: b.refill_rate,
            burst_limit: b.burst_limit,
            initial_tokens: b.initial_tokens,
            // The server sends only kinds it knows, as this client does.
            kind: definition::kind_from_proto(b.kind).unwrap_or_default(),
            enforce: tollgate_proto::enforce_from_wire(b.enforce),
        }
    }

    /// `refill_rate 10, burst_limit 100` (and `initial_tokens N` when set).
    pub fn limits_text(&self) -> String {
        definition::BucketLimits {
            quota: None,
            refill_rate: self.refill_rate,
            burst_limit: self.burst_limit,
            initial_tokens: self.initial_tokens,
            kind: self.kind,
            enforce: self.enforce,
        }
        .text()
    }

    /// The `INITIAL` column: the value, or what it defaults to.
    fn initial_text(&self) -> String {
        self.initial_tokens
            .map_or_else(|| "(burst limit)".to_owned(), validate::number)
    }
}

/// What `tier create` and `tier update` print: the tier as stored, and how
/// its buckets changed.
#[derive(Debug, Serialize)]
struct PutTierJson {
    tier: TierJson,
    /// True if nothing changed (`tier update --dry-run`).
    dry_run: bool,
    /// False if the tier existed and was replaced.
    created: bool,
    /// Tenants on the tier whose buckets changed to match it.
    tenants_updated: u32,
    #[serde(flatten)]
    changes: BucketChanges,
    /// The closed record of each bucket retired from the tier's tenants
    /// (that would be, in a dry run): their totals.
    retired: Vec<ClosedJson>,
}

/// What `tier delete --json` prints (`DeleteTier` answers nothing else).
#[derive(Debug, Serialize)]
struct DeletedTierJson {
    name: String,
    /// Always true: a failed delete prints nothing on stdout.
    deleted: bool,
}

/// What `tier apply` prints: the plan, and what applying it did.
#[derive(Debug, Serialize)]
struct ApplyJson {
    file: String,
    /// True if nothing was sent: the plan is what a real run would do.
    dry_run: bool,
    prune: bool,
    /// Tiers created, changed or deleted (or that would be, in a dry run).
    changes: usize,
    tiers: Vec<AppliedTier>,
    /// The closed record of each bucket retired from the tiers' tenants
    /// (that would be, in a dry run): their totals.
    retired: Vec<ClosedJson>,
}

#[derive(Debug, Serialize)]
struct AppliedTier {
    #[serde(flatten)]
    change: TierChange,
    /// From `PutTier`; `null` for tiers not put, and in a dry run.
    tenants_updated: Option<u32>,
}

fn tier_json(t: &v1::Tier) -> TierJson {
    TierJson {
        name: t.name.clone(),
        buckets: t.buckets.iter().map(BucketJson::new).collect(),
        tables: t.tables.iter().map(TableLimitsJson::new).collect(),
        // The server checked them; one it sends that does not check here
        // is left out rather than shown wrong.
        budgets: t
            .budgets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| budget_at(&format!("budgets[{i}]"), b).ok())
            .map(|(bucket, budget)| AddedBudget { bucket, budget })
            .collect(),
        shadow: !tollgate_proto::enforce_from_wire(t.enforce),
        created_at: rfc3339(t.created_at),
        updated_at: rfc3339(t.updated_at),
    }
}

/// A table of `rows` under `header`.
fn table_with(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> Table {
    let mut table = Table::with_header(header);
    for row in rows {
        table.push(row);
    }
    table
}

fn bucket_row(b: &BucketJson) -> Vec<String> {
    vec![
        b.bucket.clone(),
        validate::number(b.refill_rate),
        validate::number(b.burst_limit),
        b.initial_text(),
    ]
}

/// The header of a table of per-partition limits, after `first` columns.
fn tables_header<'a>(first: &[&'a str]) -> Vec<&'a str> {
    [first, &["READS/S", "WRITES/S"][..]].concat()
}

/// A tier as a key-value table, then its buckets as a table, then its
/// tables' per-partition limits, if it has any.
fn tier_text(view: &TierJson) -> String {
    let mode = if view.shadow {
        "shadow: every bucket and budget decided as if enforced, refusing and throttling nothing"
    } else {
        "enforced"
    };
    let fields = Table::new([
        field("tier", view.name.clone()),
        field("mode", mode.to_owned()),
        field("created", view.created_at.clone().unwrap_or_default()),
        field("updated", view.updated_at.clone().unwrap_or_default()),
    ]);
    let mut text = if view.buckets.is_empty() {
        format!("{fields}\n\nno buckets")
    } else {
        let buckets = table_with(
            &["BUCKET", "REFILL/S", "BURST", "INITIAL"],
            view.buckets.iter().map(bucket_row),
        );
        format!("{fields}\n\n{buckets}")
    };
    if !view.tables.is_empty() {
        let tables = table_with(
            &tables_header(&["TABLE"]),
            view.tables
                .iter()
                .map(|t| [vec![t.table.clone()], t.limit_cells()].concat()),
        );
        let _ = write!(text, "\n\n{tables}");
    }
    for b in &view.budgets {
        let _ = write!(
            text,
            "\n\nbudget {}: {}",
            budget_bucket_text(&b.bucket),
            budget_text(&b.budget)
        );
    }
    text
}

/// One row per bucket of each tier; then, if any tier has table limits,
/// one row per table of each tier.
fn list_text(views: &[TierJson]) -> String {
    let rows = views.iter().flat_map(|t| {
        let name = t.name.clone();
        let rows: Vec<Vec<String>> = if t.buckets.is_empty() {
            vec![vec![name, "(no buckets)".to_owned()]]
        } else {
            t.buckets
                .iter()
                .map(|b| [vec![name.clone()], bucket_row(b)].concat())
                .collect()
        };
        rows
    });
    let mut text =
        table_with(&["TIER", "BUCKET", "REFILL/S", "BURST", "INITIAL"], rows).to_string();
    if views.iter().any(|t| !t.tables.is_empty()) {
        let rows = views.iter().flat_map(|t| {
            t.tables.iter().map(|table| {
                [
                    vec![t.name.clone(), table.table.clone()],
                    table.limit_cells(),
                ]
                .concat()
            })
        });
        let tables = table_with(&tables_header(&["TIER", "TABLE"]), rows);
        let _ = write!(text, "\n\n{tables}");
    }
    text
}

fn put_text(view: &PutTierJson) -> String {
    let mut text = if view.dry_run {
        format!(
            "would update tier {} ({} tenants to update; dry run: nothing changed)",
            view.tier.name, view.tenants_updated
        )
    } else if view.created {
        format!("created tier {}", view.tier.name)
    } else {
        format!(
            "updated tier {} ({} tenants updated)",
            view.tier.name, view.tenants_updated
        )
    };
    if view.changes.is_empty() && !view.created {
        text.push_str("\nno bucket changed");
    }
    for line in view.changes.lines() {
        text.push('\n');
        text.push_str(&line);
    }
    if !view.retired.is_empty() {
        let verb = if view.dry_run {
            "would retire"
        } else {
            "retired"
        };
        text.push('\n');
        text.push_str(&closing::retiring_text(verb, &view.retired));
    }
    text
}

/// The past-tense verb of an action.
fn action_verb(action: Action) -> &'static str {
    match action {
        Action::Created => "created",
        Action::Changed => "changed",
        Action::Deleted => "deleted",
        Action::Unchanged => "left unchanged",
        Action::NotInFile => "kept",
    }
}

/// A line per tier, then its bucket changes, then a summary line.
fn apply_text(report: &ApplyJson) -> String {
    let mut text = String::new();
    for tier in &report.tiers {
        let name = &tier.change.name;
        let action = tier.change.action;
        let line = match (action, report.dry_run) {
            (Action::Unchanged, _) => format!("tier {name} is unchanged"),
            (Action::NotInFile, _) => format!(
                "tier {name} is not in {} (kept; --prune deletes it)",
                report.file
            ),
            (Action::Created, true) => format!("would create tier {name}"),
            (Action::Changed, true) => format!("would change tier {name}"),
            (Action::Deleted, true) => format!("would delete tier {name}"),
            (Action::Changed, false) => format!(
                "changed tier {name} ({} tenants updated)",
                tier.tenants_updated.unwrap_or_default()
            ),
            (Action::Created | Action::Deleted, false) => {
                format!("{} tier {name}", action_verb(action))
            }
        };
        let _ = writeln!(text, "{line}");
        for line in tier.change.lines() {
            let _ = writeln!(text, "{line}");
        }
    }
    let count = |action| {
        report
            .tiers
            .iter()
            .filter(|t| t.change.action == action)
            .count()
    };
    let (created, changed, unchanged, deleted) = (
        count(Action::Created),
        count(Action::Changed),
        count(Action::Unchanged),
        count(Action::Deleted),
    );
    if !report.retired.is_empty() {
        let verb = if report.dry_run {
            "would retire"
        } else {
            "retired"
        };
        let _ = writeln!(text, "{}", closing::retiring_text(verb, &report.retired));
    }
    let file = &report.file;
    let _ = if report.dry_run {
        write!(
            text,
            "{file}: dry run, nothing was changed ({created} to create, {changed} to change, \
             {unchanged} unchanged, {deleted} to delete)"
        )
    } else {
        write!(
            text,
            "{file}: {created} created, {changed} changed, {unchanged} unchanged, {deleted} deleted"
        )
    };
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use definition::{BucketLimits, Buckets};
    use tollgate_core::BucketName;
    use tollgate_core::TableName;
    use tollgate_core::partition::TableLimits;

    fn report(dry_run: bool) -> ApplyJson {
        let pro = TierName::parse("tier", "pro").expect("valid");
        let old = TierName::parse("tier", "old").expect("valid");
        let free = TierName::parse("tier", "free").expect("valid");
        let limits = BucketLimits {
            quota: None,
            refill_rate: 10.0,
            burst_limit: 100.0,
            initial_tokens: None,
            kind: BucketKind::Shared,
            enforce: true,
        };
        let server = BTreeMap::from([
            (old, TierDefinition::default()),
            (free.clone(), TierDefinition::default()),
        ]);
        let file = BTreeMap::from([
            (
                pro,
                TierDefinition {
                    buckets: Buckets::from([(
                        BucketName::parse("bucket", "schedule-email").expect("valid"),
                        limits,
                    )]),
                    tables: BTreeMap::from([(
                        TableName::parse("table", "orders").expect("valid"),
                        TableLimits {
                            max_reads_per_second: Some(500.0),
                            max_writes_per_second: None,
                        },
                    )]),
                    budgets: Default::default(),
                    shadow: false,
                },
            ),
            (free, TierDefinition::default()),
        ]);
        let plan = Plan::new(&server, &file, false);
        ApplyJson {
            file: "tiers.toml".into(),
            dry_run,
            prune: false,
            changes: plan.changes(),
            tiers: plan
                .tiers
                .into_iter()
                .map(|change| AppliedTier {
                    tenants_updated: (!dry_run && change.action == Action::Created).then_some(0),
                    change,
                })
                .collect(),
            retired: Vec::new(),
        }
    }

    #[test]
    fn apply_text_says_what_changed_tier_by_tier_and_sums_it_up() {
        assert_eq!(
            apply_text(&report(false)),
            "tier free is unchanged\n\
             tier old is not in tiers.toml (kept; --prune deletes it)\n\
             created tier pro\n\
             \x20 + schedule-email  refill_rate 10, burst_limit 100\n\
             \x20 + table orders  max_reads_per_second 500\n\
             tiers.toml: 1 created, 0 changed, 1 unchanged, 0 deleted"
        );
    }

    #[test]
    fn a_dry_run_says_what_it_would_do_and_that_nothing_changed() {
        let text = apply_text(&report(true));
        assert!(text.contains("would create tier pro\n"), "{text}");
        assert!(
            text.ends_with(
                "tiers.toml: dry run, nothing was changed \
                 (1 to create, 0 to change, 1 unchanged, 0 to delete)"
            ),
            "{text}"
        );
    }

    #[test]
    fn apply_json_flattens_each_tiers_change() {
        let json = serde_json::to_value(report(false)).expect("json");
        assert_eq!(json["changes"], 1);
        assert_eq!(json["dry_run"], false);
        assert_eq!(json["tiers"][2]["name"], "pro");
        assert_eq!(json["tiers"][2]["action"], "created");
        assert_eq!(json["tiers"][2]["added"][0]["bucket"], "schedule-email");
        assert_eq!(json["tiers"][2]["tables"]["added"][0]["table"], "orders");
        assert_eq!(json["tiers"][2]["tenants_updated"], 0);
        assert_eq!(json["tiers"][0]["tenants_updated"], serde_json::Value::Null);
    }

    #[test]
    fn tier_names_are_checked_before_anything_is_sent() {
        assert!(parse_tier_name("pro").is_ok());
        assert_eq!(parse_tier_name("").expect_err("empty"), "must not be empty");
        assert!(
            parse_tier_name(&"x".repeat(65))
                .expect_err("long")
                .contains("at most 64 characters")
        );
    }

    #[test]
    fn tier_text_and_list_show_the_tables_limits_after_the_buckets() {
        let view = tier_json(&v1::Tier {
            name: "pro".into(),
            buckets: vec![v1::BucketDefinition {
                quota: None,
                bucket: "ai".into(),
                refill_rate: 1.0,
                burst_limit: 20.0,
                initial_tokens: None,
                kind: v1::BucketKind::Shared.into(),
                enforce: None,
            }],
            tables: vec![
                v1::TableLimits {
                    table: "orders".into(),
                    max_reads_per_second: Some(500.0),
                    max_writes_per_second: None,
                },
                v1::TableLimits {
                    table: "users".into(),
                    max_reads_per_second: Some(5.0),
                    max_writes_per_second: Some(0.5),
                },
            ],
            ..v1::Tier::default()
        });
        let text = tier_text(&view);
        assert!(
            text.ends_with(
                "ai      1         20     (burst limit)\n\
                 \n\
                 TABLE   READS/S  WRITES/S\n\
                 orders  500      unlimited\n\
                 users   5        0.5"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["tables"][0]["table"], "orders");
        assert_eq!(json["tables"][0]["max_reads_per_second"], 500.0);
        assert_eq!(
            json["tables"][0]["max_writes_per_second"],
            serde_json::Value::Null
        );

        let bare = tier_json(&v1::Tier {
            name: "free".into(),
            ..v1::Tier::default()
        });
        assert!(!tier_text(&bare).contains("TABLE"));
        assert!(!list_text(std::slice::from_ref(&bare)).contains("TABLE"));
        let list = list_text(&[bare, view]);
        assert!(
            list.ends_with(
                "TIER  TABLE   READS/S  WRITES/S\n\
                 pro   orders  500      unlimited\n\
                 pro   users   5        0.5"
            ),
            "{list}"
        );
    }

    #[test]
    fn tier_text_shows_each_bucket_and_its_initial_level() {
        let view = tier_json(&v1::Tier {
            name: "pro".into(),
            buckets: vec![
                v1::BucketDefinition {
                    quota: None,
                    bucket: "ai".into(),
                    refill_rate: 1.0,
                    burst_limit: 20.0,
                    initial_tokens: Some(5.0),
                    kind: v1::BucketKind::Shared.into(),
                    enforce: None,
                },
                v1::BucketDefinition {
                    quota: None,
                    bucket: "schedule-email".into(),
                    refill_rate: 10.0,
                    burst_limit: 100.0,
                    initial_tokens: None,
                    kind: v1::BucketKind::Shared.into(),
                    enforce: None,
                },
            ],
            ..v1::Tier::default()
        });
        let text = tier_text(&view);
        assert!(text.starts_with("tier     pro\n"), "{text}");
        assert!(
            text.ends_with(
                "BUCKET          REFILL/S  BURST  INITIAL\n\
                 ai              1         20     5\n\
                 schedule-email  10        100    (burst limit)"
            ),
            "{text}"
        );
        let list = list_text(&[
            view,
            tier_json(&v1::Tier {
                name: "empty".into(),
                ..v1::Tier::default()
            }),
        ]);
        assert!(list.contains("pro    schedule-email  10"), "{list}");
        assert!(list.ends_with("empty  (no buckets)"), "{list}");
    }
}
