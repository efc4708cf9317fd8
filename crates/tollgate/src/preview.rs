//! `--preview` of `tenant set-limits`, `tier apply` and `budget set`: what
//! the proposed limits or budget would have done to the recorded usage of
//! every bucket they touch, beside what the current ones did
//! (`Admin/PreviewLimits`), and nothing changed. The server replays each bucket's history through the
//! ideal token bucket; this module asks and prints.

use std::time::{Duration, SystemTime};

use clap::Args;
use serde::Serialize;
use tollgate_proto::v1;

use crate::output::{self, Table, amount, rfc3339, seconds};
use crate::remote::{AdminConnection, rpc_error};
use crate::tenant::history::{parse_time, to_proto};

/// How a preview replays the history.
#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// Change nothing: replay the recorded usage of every bucket the
    /// change touches under the current and the proposed limits, and print
    /// what each would have throttled, the busiest hour and the longest
    /// wait.
    #[arg(long)]
    pub preview: bool,
    /// How far back the preview replays, at most 14 days [default: 24h]
    /// (a budget's preview replays its cycle so far, and refuses it).
    #[arg(long, value_parser = humantime::parse_duration, requires = "preview")]
    lookback: Option<Duration>,
    /// The end of the span replayed: a time ago or an RFC 3339 time
    /// [default: now].
    #[arg(long = "preview-until", value_parser = parse_time, requires = "preview")]
    until: Option<SystemTime>,
    /// How long replayed demand waits for tokens before it gives up
    /// (counted as throttled).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, requires = "preview")]
    max_wait: Duration,
}

/// A preview as printed, and as `--json` writes it.
#[derive(Debug, Serialize)]
pub struct PreviewView {
    since: Option<String>,
    until: Option<String>,
    max_wait_seconds: f64,
    buckets: Vec<BucketView>,
}

#[derive(Debug, Serialize)]
struct BucketView {
    tenant_id: String,
    bucket: String,
    current_refill_rate: f64,
    current_burst_limit: f64,
    proposed_refill_rate: f64,
    proposed_burst_limit: f64,
    /// In shadow mode (throttling nothing: the figures are what its shadow
    /// counts would say).
    current_shadow: bool,
    proposed_shadow: bool,
    current: ImpactView,
    proposed: ImpactView,
}

#[derive(Debug, Serialize)]
struct ImpactView {
    demand_tokens: f64,
    throttled_tokens: f64,
    delayed_tokens: f64,
    longest_wait_seconds: f64,
    busiest_hour: Option<String>,
    busiest_hour_demand_tokens: f64,
    busiest_hour_throttled_tokens: f64,
    recorded_throttled_pod_seconds: f64,
    budget_reached: Option<String>,
}

impl ImpactView {
    fn of(i: Option<v1::LimitsImpact>) -> Self {
        let i = i.unwrap_or_default();
        ImpactView {
            demand_tokens: i.demand_tokens,
            throttled_tokens: i.throttled_tokens,
            delayed_tokens: i.delayed_tokens,
            longest_wait_seconds: seconds(i.longest_wait),
            busiest_hour: rfc3339(i.busiest_hour),
            busiest_hour_demand_tokens: i.busiest_hour_demand_tokens,
            busiest_hour_throttled_tokens: i.busiest_hour_throttled_tokens,
            recorded_throttled_pod_seconds: i.recorded_throttled_pod_seconds,
            budget_reached: rfc3339(i.budget_reached),
        }
    }
}

impl PreviewView {
    /// How many buckets the preview covers.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// Asks the server to preview `change`.
pub async fn preview(
    client: &mut AdminConnection,
    args: &PreviewArgs,
    change: v1::preview_limits_request::Change,
) -> anyhow::Result<PreviewView> {
    let answer = client
        .preview_limits(v1::PreviewLimitsRequest {
            change: Some(change),
            lookback: args.lookback.map(tollgate_proto::duration),
            max_wait: Some(tollgate_proto::duration(args.max_wait)),
            until: args.until.map(to_proto).transpose()?,
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    Ok(PreviewView {
        since: rfc3339(answer.since),
        until: rfc3339(answer.until),
        max_wait_seconds: seconds(answer.max_wait),
        buckets: answer
            .impacts
            .into_iter()
            .map(|b| {
                let now = b.current_limits.unwrap_or_default();
                let proposed = b.proposed_limits.unwrap_or_default();
                BucketView {
                    tenant_id: b.tenant_id,
                    bucket: b.bucket,
                    current_refill_rate: now.refill_rate,
                    current_burst_limit: now.burst_limit,
                    proposed_refill_rate: proposed.refill_rate,
                    proposed_burst_limit: proposed.burst_limit,
                    current_shadow: b.current_shadow,
                    proposed_shadow: b.proposed_shadow,
                    current: ImpactView::of(b.current),
                    proposed: ImpactView::of(b.proposed),
                }
            })
            .collect(),
    })
}

/// Prints `views` (one per previewed change) as JSON or as text.
pub fn print(json: bool, views: &[PreviewView]) -> anyhow::Result<()> {
    if json {
        return output::print(true, &views, |_| "");
    }
    output::print(false, &views, |views| {
        views.iter().map(text).collect::<Vec<_>>().join("\n\n")
    })
}

fn limits(refill_rate: f64, burst_limit: f64) -> String {
    format!("{}/s, burst {}", amount(refill_rate), amount(burst_limit))
}

fn text(view: &PreviewView) -> String {
    let span = format!(
        "{} to {}",
        view.since.as_deref().unwrap_or("?"),
        view.until.as_deref().unwrap_or("?")
    );
    if view.buckets.is_empty() {
        return format!(
            "Preview ({span}): the change touches no bucket's limits. Nothing was changed."
        );
    }
    let budgets = view
        .buckets
        .iter()
        .any(|b| b.current.budget_reached.is_some() || b.proposed.budget_reached.is_some());
    let mut header = vec![
        "TENANT/BUCKET",
        "LIMITS NOW",
        "PROPOSED",
        "DEMAND",
        "THROTTLED NOW",
        "THROTTLED PROPOSED",
        "LONGEST WAIT",
        "BUSIEST HOUR",
        "ITS THROTTLED",
    ];
    if budgets {
        header.extend(["BUDGET REACHED NOW", "BUDGET REACHED PROPOSED"]);
    }
    let mut table = Table::with_header(&header);
    let mut notes = Vec::new();
    let or_dash = |t: &Option<String>| t.clone().unwrap_or_else(|| "-".into());
    for b in &view.buckets {
        // Short: the table is wide already.
        let label = if b.bucket.is_empty() {
            b.tenant_id.clone()
        } else {
            format!("{}/{}", b.tenant_id, b.bucket)
        };
        let mode = |shadow: bool| if shadow { " (shadow)" } else { "" };
        let mut row = vec![
            label.clone(),
            limits(b.current_refill_rate, b.current_burst_limit) + mode(b.current_shadow),
            limits(b.proposed_refill_rate, b.proposed_burst_limit) + mode(b.proposed_shadow),
            amount(b.proposed.demand_tokens),
            amount(b.current.throttled_tokens),
            amount(b.proposed.throttled_tokens),
            format!("{} s", amount(b.proposed.longest_wait_seconds)),
            or_dash(&b.proposed.busiest_hour),
            amount(b.proposed.busiest_hour_throttled_tokens),
        ];
        if budgets {
            row.extend([
                or_dash(&b.current.budget_reached),
                or_dash(&b.proposed.budget_reached),
            ]);
        }
        table.push(row);
        if b.current_shadow || b.proposed_shadow {
            notes.push(format!(
                "note: {label} is {} in shadow mode: there it throttles nothing, and its THROTTLED \
                 figure is what its shadow counts would say, not what its pods would feel",
                match (b.current_shadow, b.proposed_shadow) {
                    (true, true) => "now and as proposed",
                    (true, false) => "now (not as proposed)",
                    _ => "as proposed (not now)",
                }
            ));
        }
        if b.current.recorded_throttled_pod_seconds > 0.0 {
            notes.push(format!(
                "note: {label} was throttled for {} pod-seconds in the span: its demand there was \
                 more than the history recorded, and the preview under-states what a lower limit \
                 throttles",
                amount(b.current.recorded_throttled_pod_seconds)
            ));
        }
    }
    let mut lines = vec![
        format!(
            "Preview: the recorded usage from {span} replayed through the ideal bucket under \
             each bucket's limits (and budget) now and as proposed; demand waiting over {} s gives up \
             (throttled). Nothing was changed.",
            amount(view.max_wait_seconds)
        ),
        table.to_string(),
    ];
    lines.extend(notes);
    lines.join("\n")
}
