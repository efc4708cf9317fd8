//! `tollgate budget set | show | clear` and `tollgate usage`: a bucket's
//! budget per billing cycle and its per-cycle billing record, through the
//! server's `Admin` service (`SetBudget`, `GetBudget`, `ClearBudget`,
//! `GetUsage`).
//!
//! The CLI checks nothing the server checks: a bad field comes back as
//! the server's INVALID_ARGUMENT, naming it as the wire does
//! (`budget.cycle.time_zone`). `--json` prints one document; `usage
//! --csv` one row per cycle with a header, for spreadsheets.

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use tollgate_proto::v1;

use crate::output::{self, Table, amount, field, rfc3339};
use crate::preview::{self, PreviewArgs};
use crate::remote::{ActorArg, AdminServerArg, rpc_error};

#[derive(Debug, Args)]
pub struct BudgetArgs {
    #[command(flatten)]
    server: AdminServerArg,

    #[command(subcommand)]
    command: BudgetCommand,
}

#[derive(Debug, Subcommand)]
enum BudgetCommand {
    /// Give a tenant's bucket a budget per billing cycle (replacing the
    /// one it has; a change mid-cycle applies to what remains of it).
    Set(Box<SetArgs>),
    /// Show a bucket's budget: the cycle, the spend, the forecast, what
    /// remains and whether it is throttled or stopped.
    Show {
        #[command(flatten)]
        bucket: BucketArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a tenant's own budget of a bucket; its current cycle closes
    /// now (its record stays, in `tollgate usage`).
    Clear {
        #[command(flatten)]
        bucket: BucketArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
}

#[derive(Debug, Args)]
struct BucketArgs {
    #[arg(long)]
    tenant: String,
    /// The bucket; the request-unit bucket if not given.
    #[arg(long, default_value = "")]
    bucket: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum CycleArg {
    Monthly,
    Weekly,
    Daily,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AtLimitArg {
    /// Alerts only.
    Notify,
    /// Run at --baseline-rate (and --baseline-burst) until the next cycle.
    Throttle,
    /// No more tokens until the next cycle.
    Stop,
}

#[derive(Debug, Args)]
struct SetArgs {
    #[command(flatten)]
    bucket: BucketArgs,
    /// Tokens per cycle.
    #[arg(long)]
    amount: f64,
    #[arg(long, value_enum)]
    cycle: CycleArg,
    /// Monthly cycles: the day of the month they start (1 to 31; a shorter
    /// month's starts on its last day) [default: 1].
    #[arg(long)]
    anchor_day: Option<u32>,
    /// Weekly cycles: the day of the week they start (monday to sunday)
    /// [default: monday].
    #[arg(long)]
    anchor_weekday: Option<String>,
    /// The IANA time zone the days are counted in (Europe/Paris).
    #[arg(long, default_value = "UTC")]
    time_zone: String,
    /// What happens once the cycle's spend reaches the amount.
    #[arg(long, value_enum)]
    at_limit: AtLimitArg,
    /// Under throttle: the refill rate past the limit, tokens per second.
    #[arg(long, allow_negative_numbers = true)]
    baseline_rate: Option<f64>,
    /// Under throttle: the burst limit past the limit [default: 10 s of
    /// the baseline rate].
    #[arg(long, allow_negative_numbers = true)]
    baseline_burst: Option<f64>,
    /// Alerts, each once per cycle: percentages of the amount on the spend
    /// (75), or on the forecast (forecast:100) [default: 50,75,90,100].
    #[arg(long, value_delimiter = ',')]
    thresholds: Vec<String>,
    /// A price per million tokens, shown beside the spend.
    #[arg(long, requires = "currency")]
    price: Option<f64>,
    /// The price's ISO 4217 currency (USD, EUR).
    #[arg(long, requires = "price")]
    currency: Option<String>,
    /// Shadow mode: past the amount, throttle and stop only alert (as
    /// notify does); `budget show` says what they would have held back.
    #[arg(long)]
    shadow: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
    #[command(flatten)]
    preview: PreviewArgs,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    #[command(flatten)]
    server: AdminServerArg,
    #[command(flatten)]
    bucket: BucketArgs,
    /// Closed cycles to show at most, newest first.
    #[arg(long, default_value_t = 12)]
    cycles: u32,
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV (a header, then a row per cycle) instead of a table.
    #[arg(long)]
    csv: bool,
}

use crate::tier::DEFAULT_BASELINE_BURST_SECONDS;

impl SetArgs {
    fn to_proto(&self) -> anyhow::Result<v1::Budget> {
        let period = match self.cycle {
            CycleArg::Monthly => v1::BudgetPeriod::Monthly,
            CycleArg::Weekly => v1::BudgetPeriod::Weekly,
            CycleArg::Daily => v1::BudgetPeriod::Daily,
        };
        let (at_limit, baseline) = match self.at_limit {
            AtLimitArg::Notify => (v1::BudgetAtLimit::Notify, None),
            AtLimitArg::Stop => (v1::BudgetAtLimit::Stop, None),
            AtLimitArg::Throttle => {
                let rate = self.baseline_rate.ok_or_else(|| {
                    anyhow::anyhow!("--at-limit throttle needs --baseline-rate (tokens per second past the limit)")
                })?;
                let burst = self
                    .baseline_burst
                    .unwrap_or(rate * DEFAULT_BASELINE_BURST_SECONDS);
                (
                    v1::BudgetAtLimit::Throttle,
                    Some(v1::ResourceLimits {
                        refill_rate: rate,
                        burst_limit: burst,
                    }),
                )
            }
        };
        if baseline.is_none() && (self.baseline_rate.is_some() || self.baseline_burst.is_some()) {
            anyhow::bail!("--baseline-rate and --baseline-burst are only for --at-limit throttle");
        }
        Ok(v1::Budget {
            bucket: self.bucket.bucket.clone(),
            amount: self.amount,
            cycle: Some(v1::BudgetCycle {
                period: period.into(),
                anchor_day: self.anchor_day.unwrap_or_default(),
                anchor_weekday: self.anchor_weekday.clone().unwrap_or_default(),
                time_zone: self.time_zone.clone(),
            }),
            at_limit: at_limit.into(),
            baseline,
            thresholds: self.thresholds.clone(),
            price_per_million_tokens: self.price.unwrap_or_default(),
            currency: self.currency.clone().unwrap_or_default(),
            enforce: tollgate_proto::enforce_to_wire(!self.shadow),
        })
    }
}

pub async fn run(args: BudgetArgs) -> anyhow::Result<()> {
    let mut client = args.server.admin().await?;
    match args.command {
        BudgetCommand::Set(a) if a.preview.preview => {
            let change = v1::preview_limits_request::Change::Budget(v1::SetBudgetRequest {
                tenant_id: a.bucket.tenant.clone(),
                budget: Some(a.to_proto()?),
            });
            let view = preview::preview(&mut client, &a.preview, change).await?;
            preview::print(a.json, &[view])
        }
        BudgetCommand::Set(a) => {
            let budget = a.to_proto()?;
            let status = client
                .set_budget(a.actor.request(v1::SetBudgetRequest {
                    tenant_id: a.bucket.tenant.clone(),
                    budget: Some(budget),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner()
                .status
                .unwrap_or_default();
            let view = StatusView::of(&a.bucket.bucket, &status);
            output::print(a.json, &view, |v| {
                format!("set the budget of {}\n\n{v}", v.what())
            })
        }
        BudgetCommand::Show { bucket, json } => {
            let status = client
                .get_budget(v1::GetBudgetRequest {
                    tenant_id: bucket.tenant.clone(),
                    bucket: bucket.bucket.clone(),
                })
                .await
                .map_err(rpc_error)?
                .into_inner()
                .status;
            let Some(status) = status else {
                let what = bucket_label(&bucket.tenant, &bucket.bucket);
                anyhow::bail!("{what} has no budget; give it one with `tollgate budget set`");
            };
            let view = StatusView::of(&bucket.bucket, &status);
            output::print(json, &view, |v| v.to_string())
        }
        BudgetCommand::Clear {
            bucket,
            json,
            actor,
        } => {
            let closed = client
                .clear_budget(actor.request(v1::ClearBudgetRequest {
                    tenant_id: bucket.tenant.clone(),
                    bucket: bucket.bucket.clone(),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner()
                .closed;
            let view = ClearedView {
                tenant_id: bucket.tenant.clone(),
                bucket: bucket.bucket.clone(),
                closed_cycle: closed.as_ref().map(CycleView::of),
            };
            output::print(json, &view, |v| {
                let what = bucket_label(&v.tenant_id, &v.bucket);
                match &v.closed_cycle {
                    Some(c) => format!(
                        "cleared the budget of {what}; its cycle closed with a spend of {}\n\n{}",
                        amount(c.spend),
                        usage_table(std::slice::from_ref(c))
                    ),
                    None => format!("cleared the budget of {what}"),
                }
            })
        }
    }
}

pub async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let mut client = args.server.admin().await?;
    let cycles = client
        .get_usage(v1::GetUsageRequest {
            tenant_id: args.bucket.tenant.clone(),
            bucket: args.bucket.bucket.clone(),
            cycles: args.cycles,
        })
        .await
        .map_err(rpc_error)?
        .into_inner()
        .cycles;
    let view = UsageView {
        tenant_id: args.bucket.tenant.clone(),
        bucket: args.bucket.bucket.clone(),
        cycles: cycles.iter().map(CycleView::of).collect(),
    };
    if args.csv {
        return output::print(false, &view, |v| usage_csv(&v.cycles));
    }
    output::print(args.json, &view, |v| {
        if v.cycles.is_empty() {
            format!(
                "{} has no budget and no closed cycles",
                bucket_label(&v.tenant_id, &v.bucket)
            )
        } else {
            usage_table(&v.cycles).to_string()
        }
    })
}

/// A bucket as sentences name it.
pub(crate) fn bucket_label(tenant: &str, bucket: &str) -> String {
    if bucket.is_empty() {
        format!("the request-unit bucket of tenant {tenant}")
    } else {
        format!("bucket {bucket} of tenant {tenant}")
    }
}

/// A cycle as `usage` and `budget show` print it.
#[derive(Debug, Serialize)]
struct CycleView {
    start: Option<String>,
    end: Option<String>,
    closed: bool,
    amount: f64,
    spend: f64,
    granted_tokens: f64,
    fallback_tokens: f64,
    limit_reached_at: Option<String>,
    request_units: f64,
    request_unit_micros: u64,
    read_batches: u64,
    read_requests: u64,
    read_bytes: u64,
    write_batches: u64,
    write_requests: u64,
    write_bytes: u64,
    cpu_micros: u64,
    egress_bytes: u64,
}

impl CycleView {
    fn of(c: &v1::BudgetCycleUsage) -> Self {
        let used = c.consumption.unwrap_or_default();
        CycleView {
            start: rfc3339(c.start),
            end: rfc3339(c.end),
            closed: c.closed,
            amount: c.amount,
            spend: c.spend,
            granted_tokens: c.granted_tokens,
            fallback_tokens: c.fallback_tokens,
            limit_reached_at: rfc3339(c.limit_reached_at),
            request_units: used.request_units,
            request_unit_micros: used.request_unit_micros,
            read_batches: used.read_batches,
            read_requests: used.read_requests,
            read_bytes: used.read_bytes,
            write_batches: used.write_batches,
            write_requests: used.write_requests,
            write_bytes: used.write_bytes,
            cpu_micros: used.cpu_micros,
            egress_bytes: used.egress_bytes,
        }
    }
}

fn usage_table(cycles: &[CycleView]) -> Table {
    let mut table = Table::with_header(&[
        "START",
        "END",
        "",
        "AMOUNT",
        "SPEND",
        "GRANTED",
        "FALLBACK",
        "REQUEST UNITS",
        "LIMIT REACHED",
    ]);
    for c in cycles {
        table.push(vec![
            c.start.clone().unwrap_or_default(),
            c.end.clone().unwrap_or_default(),
            if c.closed { "closed" } else { "current" }.to_owned(),
            amount(c.amount),
            amount(c.spend),
            amount(c.granted_tokens),
            amount(c.fallback_tokens),
            amount(c.request_units),
            c.limit_reached_at.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    table
}

/// CSV: every field of [`CycleView`], exact numbers; no field holds a
/// comma or a quote (timestamps and numbers only).
fn usage_csv(cycles: &[CycleView]) -> String {
    let mut lines = vec![
        "start,end,closed,amount,spend,granted_tokens,fallback_tokens,limit_reached_at,\
         request_unit_micros,read_batches,read_requests,read_bytes,write_batches,\
         write_requests,write_bytes,cpu_micros,egress_bytes"
            .to_owned(),
    ];
    for c in cycles {
        lines.push(format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            c.start.clone().unwrap_or_default(),
            c.end.clone().unwrap_or_default(),
            c.closed,
            c.amount,
            c.spend,
            c.granted_tokens,
            c.fallback_tokens,
            c.limit_reached_at.clone().unwrap_or_default(),
            c.request_unit_micros,
            c.read_batches,
            c.read_requests,
            c.read_bytes,
            c.write_batches,
            c.write_requests,
            c.write_bytes,
            c.cpu_micros,
            c.egress_bytes,
        ));
    }
    lines.join("\n")
}

#[derive(Debug, Serialize)]
struct UsageView {
    tenant_id: String,
    bucket: String,
    cycles: Vec<CycleView>,
}

#[derive(Debug, Serialize)]
struct ClearedView {
    tenant_id: String,
    bucket: String,
    closed_cycle: Option<CycleView>,
}

/// A budget as `budget show` prints it.
#[derive(Debug, Serialize)]
struct StatusView {
    tenant_id: String,
    bucket: String,
    amount: f64,
    period: String,
    anchor_day: Option<u32>,
    anchor_weekday: Option<String>,
    time_zone: String,
    at_limit: String,
    baseline_refill_rate: Option<f64>,
    baseline_burst_limit: Option<f64>,
    thresholds: Vec<String>,
    price_per_million_tokens: Option<f64>,
    currency: Option<String>,
    /// False: shadow mode.
    enforce: bool,
    state: String,
    /// In shadow mode past the amount: what enforcing would have held
    /// back of the spend.
    shadow_excess: Option<f64>,
    spend: f64,
    forecast: f64,
    spend_rate: f64,
    remaining: Option<f64>,
    fired: Vec<String>,
    own_refill_rate: f64,
    own_burst_limit: f64,
    read_at: Option<String>,
    current_cycle: Option<CycleView>,
}

impl StatusView {
    fn of(bucket: &str, s: &v1::BudgetStatus) -> Self {
        let b = s.budget.clone().unwrap_or_default();
        let cycle = b.cycle.clone().unwrap_or_default();
        let period = cycle.period();
        let own = s.own_limits.unwrap_or_default();
        StatusView {
            tenant_id: s.tenant_id.clone(),
            bucket: bucket.to_owned(),
            amount: b.amount,
            period: match period {
                v1::BudgetPeriod::Monthly => "monthly",
                v1::BudgetPeriod::Weekly => "weekly",
                v1::BudgetPeriod::Daily => "daily",
                v1::BudgetPeriod::Unspecified => "unspecified",
            }
            .to_owned(),
            anchor_day: (period == v1::BudgetPeriod::Monthly).then_some(cycle.anchor_day),
            anchor_weekday: (period == v1::BudgetPeriod::Weekly)
                .then(|| cycle.anchor_weekday.clone()),
            time_zone: cycle.time_zone.clone(),
            at_limit: match b.at_limit() {
                v1::BudgetAtLimit::Notify => "notify",
                v1::BudgetAtLimit::Throttle => "throttle",
                v1::BudgetAtLimit::Stop => "stop",
                v1::BudgetAtLimit::Unspecified => "unspecified",
            }
            .to_owned(),
            baseline_refill_rate: b.baseline.map(|l| l.refill_rate),
            baseline_burst_limit: b.baseline.map(|l| l.burst_limit),
            thresholds: b.thresholds.clone(),
            price_per_million_tokens: (!b.currency.is_empty())
                .then_some(b.price_per_million_tokens),
            currency: (!b.currency.is_empty()).then(|| b.currency.clone()),
            enforce: tollgate_proto::enforce_from_wire(b.enforce),
            state: s.state.clone(),
            shadow_excess: s.shadow_excess,
            spend: s.current.as_ref().map_or(0.0, |c| c.spend),
            forecast: s.forecast,
            spend_rate: s.spend_rate,
            remaining: s.remaining,
            fired: s.fired.clone(),
            own_refill_rate: own.refill_rate,
            own_burst_limit: own.burst_limit,
            read_at: rfc3339(s.read_at),
            current_cycle: s.current.as_ref().map(CycleView::of),
        }
    }

    fn what(&self) -> String {
        bucket_label(&self.tenant_id, &self.bucket)
    }
}

/// A sum of money: up to six decimals, without trailing zeros (a price
/// per million tokens makes small sums).
fn money(x: f64) -> String {
    let text = format!("{x:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A bar of `width` cells, filled by `fraction` (capped at 1).
fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

impl std::fmt::Display for StatusView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cycle = match self.period.as_str() {
            "monthly" => format!("monthly on day {}", self.anchor_day.unwrap_or(1)),
            "weekly" => format!(
                "weekly on {}",
                self.anchor_weekday.clone().unwrap_or_default()
            ),
            other => other.to_owned(),
        };
        let at_limit = match (self.baseline_refill_rate, self.baseline_burst_limit) {
            (Some(rate), Some(burst)) => {
                format!("throttle to {}/s (burst {})", amount(rate), amount(burst))
            }
            _ => self.at_limit.clone(),
        };
        let share = if self.amount > 0.0 {
            self.spend / self.amount
        } else {
            0.0
        };
        let price = |tokens: f64| match (self.price_per_million_tokens, &self.currency) {
            (Some(p), Some(c)) => format!(" ({} {c})", money(tokens / 1e6 * p)),
            _ => String::new(),
        };
        let (start, end) = self
            .current_cycle
            .as_ref()
            .map(|c| (c.start.clone(), c.end.clone()))
            .unwrap_or_default();
        let mut rows = vec![
            field("tenant", self.tenant_id.clone()),
            field(
                "bucket",
                if self.bucket.is_empty() {
                    "(request units)".to_owned()
                } else {
                    self.bucket.clone()
                },
            ),
            field(
                "budget",
                format!(
                    "{} tokens {cycle} ({}), {at_limit} at the limit",
                    amount(self.amount),
                    self.time_zone
                ),
            ),
            field(
                "cycle",
                format!(
                    "{} to {}",
                    start.unwrap_or_default(),
                    end.unwrap_or_default()
                ),
            ),
            field(
                "spend",
                format!(
                    "{} {} {:.1} %{}",
                    bar(share, 20),
                    amount(self.spend),
                    share * 100.0,
                    price(self.spend)
                ),
            ),
            field(
                "forecast",
                format!(
                    "{} at the cycle's end ({}/s recently){}",
                    amount(self.forecast),
                    amount(self.spend_rate),
                    price(self.forecast)
                ),
            ),
            field(
                "remaining",
                self.remaining
                    .map_or_else(|| "no cap (notify)".to_owned(), amount),
            ),
            field(
                "state",
                match (self.enforce, self.shadow_excess) {
                    (true, _) => self.state.clone(),
                    (false, None) => format!(
                        "{} (shadow mode: {} only alerts)",
                        self.state, self.at_limit
                    ),
                    (false, Some(excess)) => format!(
                        "{} (shadow mode: enforcing, {} would have held back {} of the spend)",
                        self.state,
                        self.at_limit,
                        amount(excess)
                    ),
                },
            ),
            field("thresholds", self.thresholds.join(", ")),
            field(
                "fired",
                if self.fired.is_empty() {
                    "-".to_owned()
                } else {
                    self.fired.join(", ")
                },
            ),
        ];
        if self.state == "throttled" {
            rows.push(field(
                "own limits",
                format!(
                    "{}/s, burst {} (back at the next cycle)",
                    amount(self.own_refill_rate),
                    amount(self.own_burst_limit)
                ),
            ));
        }
        write!(f, "{}", Table::new(rows))
    }
}
