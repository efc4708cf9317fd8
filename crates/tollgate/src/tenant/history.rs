//! `tollgate tenant history`: a bucket's usage over time from the usage
//! history (`Admin/GetHistory`): one row per step in which the bucket used
//! anything, with the request units and granted tokens per second, and
//! their totals over the span, which are exactly what billing counts. A
//! per-key bucket's history is its checks per step (summed over the
//! server replicas that answered them) and its busiest keys.
//! `--since` and `--until` take a time ago (`24h`) or an RFC 3339 time.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tollgate_proto::v1;

use crate::budget::bucket_label;
use crate::output::{self, Table, amount, rfc3339, seconds};
use crate::remote::{AdminConnection, rpc_error};

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[arg(long)]
    tenant: String,
    /// The bucket ("" for the request-unit bucket).
    #[arg(long, default_value = "")]
    bucket: String,
    /// The start: a time ago (`24h`, `7days`) or an RFC 3339 time.
    #[arg(long, default_value = "1h", value_parser = parse_time)]
    since: SystemTime,
    /// The end: a time ago or an RFC 3339 time [default: now].
    #[arg(long, value_parser = parse_time)]
    until: Option<SystemTime>,
    /// The step wanted (the server reads the finest kept resolution at
    /// most this fine: a minute for 14 days, an hour for 13 months).
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    step: Duration,
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV (a header, then a row per point) instead of a table.
    #[arg(long)]
    csv: bool,
}

/// `24h` (that long ago) or an RFC 3339 time.
pub(crate) fn parse_time(text: &str) -> Result<SystemTime, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text} ago is before the epoch"));
    }
    humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!(
            "{text:?}: neither a time ago (24h, 7days) nor an RFC 3339 time (2026-01-02T03:04:05Z)"
        )
    })
}

pub(crate) fn to_proto(t: SystemTime) -> anyhow::Result<prost_types::Timestamp> {
    let d = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .context("a time before 1970")?;
    Ok(prost_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).context("a time too far ahead")?,
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    })
}

/// The history as printed, and as `--json` writes it.
#[derive(Debug, Serialize)]
struct HistoryView {
    tenant_id: String,
    bucket: String,
    step_seconds: f64,
    request_units: f64,
    granted_tokens: f64,
    points: Vec<PointView>,
    /// A per-key bucket's checks over the span.
    checks: u64,
    refusals: u64,
    shadow_refusals: u64,
    check_points: Vec<CheckPointView>,
    busiest_keys: Vec<CheckedKeyView>,
}

#[derive(Debug, Serialize)]
struct CheckPointView {
    from: Option<String>,
    to: Option<String>,
    checks: u64,
    refusals: u64,
    shadow_refusals: u64,
    checks_per_second: f64,
    refusals_per_second: f64,
    shadow_refusals_per_second: f64,
    replicas: u32,
}

#[derive(Debug, Serialize)]
struct CheckedKeyView {
    key: String,
    checks_at_least: u64,
}

#[derive(Debug, Serialize)]
struct PointView {
    from: Option<String>,
    to: Option<String>,
    request_units: f64,
    request_unit_micros: u64,
    request_units_per_second: f64,
    granted_tokens: f64,
    granted_tokens_per_second: f64,
    throttled_pod_seconds: f64,
    throttled_pods: f64,
    /// Tokens in the bucket at `to`, as sampled; `null` where not known.
    level: Option<f64>,
    read_batches: u64,
    read_requests: u64,
    read_bytes: u64,
    write_batches: u64,
    write_requests: u64,
    write_bytes: u64,
    cpu_micros: u64,
    egress_bytes: u64,
}

impl PointView {
    fn of(p: &v1::HistoryPoint) -> Self {
        let used = p.consumption.unwrap_or_default();
        PointView {
            from: rfc3339(p.from),
            to: rfc3339(p.to),
            request_units: used.request_unit_micros as f64 / 1e6,
            request_unit_micros: used.request_unit_micros,
            request_units_per_second: p.request_units_per_second,
            granted_tokens: p.granted_tokens,
            granted_tokens_per_second: p.granted_tokens_per_second,
            throttled_pod_seconds: p.throttled_pod_seconds,
            throttled_pods: p.throttled_pods,
            level: p.level,
            read_batches: used.read_batches,
            read_requests: used.read_requests,
            read_bytes: used.read_bytes,
            write_batches: used.write_batches,
            write_requests: used.write_requests,
            write_bytes: used.write_bytes,
            cpu_micros: (used.cpu_seconds * 1e6).round() as u64,
            egress_bytes: used.egress_bytes,
        }
    }
}

pub async fn history(client: &mut AdminConnection, args: HistoryArgs) -> anyhow::Result<()> {
    let answer = client
        .get_history(v1::GetHistoryRequest {
            tenant_id: args.tenant.clone(),
            bucket: args.bucket.clone(),
            since: Some(to_proto(args.since)?),
            until: args.until.map(to_proto).transpose()?,
            step: Some(tollgate_proto::duration(args.step)),
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    let points: Vec<PointView> = answer.points.iter().map(PointView::of).collect();
    let check_points: Vec<CheckPointView> = answer
        .check_points
        .iter()
        .map(|p| CheckPointView {
            from: rfc3339(p.from),
            to: rfc3339(p.to),
            checks: p.checks,
            refusals: p.refusals,
            shadow_refusals: p.shadow_refusals,
            checks_per_second: p.checks_per_second,
            refusals_per_second: p.refusals_per_second,
            shadow_refusals_per_second: p.shadow_refusals_per_second,
            replicas: p.replicas,
        })
        .collect();
    let view = HistoryView {
        tenant_id: args.tenant.clone(),
        bucket: args.bucket.clone(),
        step_seconds: seconds(answer.step),
        request_units: points.iter().map(|p| p.request_unit_micros).sum::<u64>() as f64 / 1e6,
        granted_tokens: points.iter().map(|p| p.granted_tokens).sum(),
        points,
        checks: check_points.iter().map(|p| p.checks).sum(),
        refusals: check_points.iter().map(|p| p.refusals).sum(),
        shadow_refusals: check_points.iter().map(|p| p.shadow_refusals).sum(),
        check_points,
        busiest_keys: answer
            .busiest_keys
            .into_iter()
            .map(|k| CheckedKeyView {
                key: k.key,
                checks_at_least: k.checks_at_least,
            })
            .collect(),
    };
    if args.csv {
        return output::print(false, &view, |v| {
            if v.points.is_empty() && !v.check_points.is_empty() {
                checks_csv(&v.check_points)
            } else {
                csv(&v.points)
            }
        });
    }
    output::print(args.json, &view, |v| {
        let label = bucket_label(&v.tenant_id, &v.bucket);
        let step = humantime::format_duration(Duration::from_secs_f64(v.step_seconds));
        let mut parts = Vec::new();
        if !v.points.is_empty() {
            parts.push(format!(
                "{}\n{label}: {} request units, {} tokens granted, in steps of {step}",
                table(&v.points),
                amount(v.request_units),
                amount(v.granted_tokens),
            ));
        }
        if !v.check_points.is_empty() {
            parts.push(checks_text(v, &label, &step.to_string()));
        }
        if parts.is_empty() {
            return format!(
                "{label} used nothing in the span (or has no history there: the history keeps a row per minute for 14 days and per hour for 13 months by default)"
            );
        }
        parts.join("\n\n")
    })
}

/// A per-key bucket's checks: a row per step, the totals, the busiest keys.
fn checks_text(v: &HistoryView, label: &str, step: &str) -> String {
    let mut table = Table::with_header(&[
        "FROM",
        "TO",
        "CHECKS/S",
        "REFUSED/S",
        "SHADOW-REFUSED/S",
        "CHECKS",
        "REFUSED",
        "REPLICAS",
    ]);
    for p in &v.check_points {
        table.push(vec![
            p.from.clone().unwrap_or_default(),
            p.to.clone().unwrap_or_default(),
            amount(p.checks_per_second),
            amount(p.refusals_per_second),
            amount(p.shadow_refusals_per_second),
            p.checks.to_string(),
            p.refusals.to_string(),
            p.replicas.to_string(),
        ]);
    }
    let mut text = format!(
        "{table}\n{label}: {} checks, {} refused, {} allowed only in shadow mode, in steps of {step}",
        v.checks, v.refusals, v.shadow_refusals
    );
    if !v.busiest_keys.is_empty() {
        let keys: Vec<String> = v
            .busiest_keys
            .iter()
            .map(|k| format!("{} (at least {})", k.key, k.checks_at_least))
            .collect();
        text.push_str(&format!("\nbusiest keys: {}", keys.join(", ")));
    }
    text
}

fn checks_csv(points: &[CheckPointView]) -> String {
    let mut lines = vec![
        "from,to,checks,refusals,shadow_refusals,checks_per_second,refusals_per_second,\
         shadow_refusals_per_second,replicas"
            .to_owned(),
    ];
    for p in points {
        lines.push(format!(
            "{},{},{},{},{},{},{},{},{}",
            p.from.clone().unwrap_or_default(),
            p.to.clone().unwrap_or_default(),
            p.checks,
            p.refusals,
            p.shadow_refusals,
            p.checks_per_second,
            p.refusals_per_second,
            p.shadow_refusals_per_second,
            p.replicas,
        ));
    }
    lines.join("\n")
}

fn table(points: &[PointView]) -> Table {
    let mut table = Table::with_header(&[
        "FROM",
        "TO",
        "RU/S",
        "GRANTED/S",
        "THROTTLED PODS",
        "LEVEL",
        "REQUEST UNITS",
        "GRANTED",
    ]);
    for p in points {
        table.push(vec![
            p.from.clone().unwrap_or_default(),
            p.to.clone().unwrap_or_default(),
            amount(p.request_units_per_second),
            amount(p.granted_tokens_per_second),
            amount(p.throttled_pods),
            p.level.map_or_else(|| "-".to_owned(), amount),
            amount(p.request_units),
            amount(p.granted_tokens),
        ]);
    }
    table
}

fn csv(points: &[PointView]) -> String {
    let mut lines = vec![
        "from,to,request_unit_micros,granted_tokens,request_units_per_second,\
         granted_tokens_per_second,throttled_pod_seconds,throttled_pods,read_batches,read_requests,read_bytes,write_batches,\
         write_requests,write_bytes,cpu_micros,egress_bytes,level"
            .to_owned(),
    ];
    for p in points {
        lines.push(format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            p.from.clone().unwrap_or_default(),
            p.to.clone().unwrap_or_default(),
            p.request_unit_micros,
            p.granted_tokens,
            p.request_units_per_second,
            p.granted_tokens_per_second,
            p.throttled_pod_seconds,
            p.throttled_pods,
            p.read_batches,
            p.read_requests,
            p.read_bytes,
            p.write_batches,
            p.write_requests,
            p.write_bytes,
            p.cpu_micros,
            p.egress_bytes,
            p.level.map_or_else(String::new, |l| l.to_string()),
        ));
    }
    lines.join("\n")
}
