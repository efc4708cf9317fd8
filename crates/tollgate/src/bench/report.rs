//! The result of a run: the pods' counts merged, printed as tables or as
//! one JSON object.
//!
//! Throughput and latency cover the measured window only: requests started
//! (or, in open loop, due) after the warmup and before the end. Everything
//! else covers the whole run, warmup and the final drain included, because
//! the server counted all of it: the per-tenant sums are meant to be
//! compared with `tollgate tenant show`.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;
use tollgate_proto::v1;

use tollgate_core::Consumption;

use super::Plan;
use super::pod::PodReport;
use crate::output::{Table, field};

#[derive(Debug, Serialize)]
pub(super) struct Report {
    /// `closed_loop` or `open_loop`.
    mode: &'static str,
    /// Requests per second asked for in open loop; `null` in closed loop.
    target_rate: Option<f64>,
    /// Open loop with every pod's first request at the start (`--herd`).
    herd: bool,
    servers: Vec<String>,
    connections_per_server: usize,
    pods: usize,
    warmup_seconds: f64,
    measured_seconds: f64,
    /// Answers (new requests and duplicates) per second to the requests
    /// due (open loop) or sent (closed loop) in the measured window.
    requests_per_second: f64,
    /// New requests answered per second while the window was open,
    /// whenever they were due: what the server got done. Past capacity in
    /// open loop, requests fall behind their schedule, and this is the
    /// measure of throughput.
    goodput_per_second: f64,
    measured: Counts,
    /// Latency of the answers in the measured window, in microseconds: from
    /// when each request was due (open loop) or sent (closed loop), retries
    /// and their waits included.
    latency_us: Latency,
    /// Latency of the attempts that were answered, from when each was sent:
    /// what the server took, without the pauses of refused attempts.
    answered_attempt_latency_us: Latency,
    total: Totals,
    /// Keyed by tenant id.
    tenants: BTreeMap<String, TenantReport>,
    /// The tenants in the order they were numbered, for the table.
    #[serde(skip)]
    tenant_order: Vec<String>,
}

/// Answers, of new requests and of duplicates.
#[derive(Debug, Default, Serialize)]
struct Counts {
    answers: u64,
    requests: u64,
    duplicates: u64,
}

/// Latency percentiles, in microseconds.
#[derive(Debug, Serialize)]
pub(super) struct Latency {
    count: u64,
    mean: f64,
    p50: u64,
    p90: u64,
    p99: u64,
    p99_9: u64,
    max: u64,
}

impl Latency {
    pub(super) fn of(latency: &Histogram<u64>) -> Latency {
        Latency {
            count: latency.len(),
            mean: if latency.is_empty() {
                0.0
            } else {
                latency.mean()
            },
            p50: latency.value_at_quantile(0.5),
            p90: latency.value_at_quantile(0.9),
            p99: latency.value_at_quantile(0.99),
            p99_9: latency.value_at_quantile(0.999),
            max: latency.max(),
        }
    }

    /// `p50 … max`, or `no answers`.
    pub(super) fn text(&self) -> String {
        if self.count == 0 {
            "no answers".to_owned()
        } else {
            format!(
                "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
                micros(self.p50),
                micros(self.p90),
                micros(self.p99),
                micros(self.p99_9),
                micros(self.max)
            )
        }
    }
}

/// The whole run.
#[derive(Debug, Default, Serialize)]
struct Totals {
    answers: u64,
    requests: u64,
    duplicates: u64,
    /// Duplicates whose answer differed from the first: a server bug.
    duplicate_mismatches: u64,
    /// Failed attempts that were retried, by gRPC code.
    retried: BTreeMap<String, u64>,
    /// Requests refused with a code that is not retried, by gRPC code; the
    /// pod moved on to a new seq.
    errors: BTreeMap<String, u64>,
    /// The first message seen for each code in `errors` and `retried`.
    error_messages: BTreeMap<String, String>,
    /// Requests still being retried when the run ended.
    abandoned: u64,
    /// Pods that crashed and came back as a new incarnation (`--restarts`).
    restarts: u64,
    /// Attempts of an older incarnation refused because a newer one had
    /// taken the instance over.
    superseded: u64,
}

#[derive(Debug, Default, Serialize)]
struct TenantReport {
    /// New requests answered (each once, however often it was sent).
    requests: u64,
    duplicates: u64,
    /// Tokens granted to new requests (duplicates get the same grant again
    /// and take nothing).
    granted_tokens: f64,
    /// Consumption reported in answered new requests: what the server must
    /// have added to the tenant's totals.
    #[serde(serialize_with = "as_wire")]
    consumption: Consumption,
    /// Consumption reported in abandoned requests, which the server may or
    /// may not have applied.
    #[serde(serialize_with = "as_wire")]
    unconfirmed: Consumption,
}

/// Consumption as the wire's `Consumption` message shows it (units and
/// exact micro-units), so the report reads like `tollgate tenant show`.
fn as_wire<S: serde::Serializer>(c: &Consumption, serializer: S) -> Result<S::Ok, S::Error> {
    v1::Consumption::from(c).serialize(serializer)
}

fn merge(into: &mut BTreeMap<String, u64>, from: BTreeMap<String, u64>) {
    for (code, count) in from {
        *into.entry(code).or_default() += count;
    }
}

impl Report {
    pub fn new(
        plan: &Plan,
        pods: Vec<PodReport>,
        goodput: u64,
        latency: Histogram<u64>,
        attempt_latency: Histogram<u64>,
    ) -> Self {
        let mut measured = Counts::default();
        let mut total = Totals::default();
        let mut tenants: Vec<TenantReport> = plan
            .tenants
            .iter()
            .map(|_| TenantReport::default())
            .collect();
        for pod in pods {
            measured.requests += pod.measured.requests;
            measured.duplicates += pod.measured.duplicates;
            total.requests += pod.total.requests;
            total.duplicates += pod.total.duplicates;
            total.duplicate_mismatches += pod.duplicate_mismatches;
            total.abandoned += pod.abandoned;
            total.restarts += pod.restarts;
            total.superseded += pod.superseded;
            merge(&mut total.retried, pod.retried);
            merge(&mut total.errors, pod.errors);
            for (code, message) in pod.error_messages {
                total.error_messages.entry(code).or_insert(message);
            }
            let tenant = &mut tenants[pod.tenant];
            tenant.requests += pod.total.requests;
            tenant.duplicates += pod.total.duplicates;
            tenant.granted_tokens += pod.granted_tokens;
            tenant.consumption.add(&pod.consumption);
            tenant.unconfirmed.add(&pod.unconfirmed);
        }
        measured.answers = measured.requests + measured.duplicates;
        total.answers = total.requests + total.duplicates;
        let measured_seconds = plan.duration.as_secs_f64();
        Report {
            mode: plan.load.name(),
            target_rate: plan.load.target_rate(),
            herd: plan.herd,
            servers: plan.servers.clone(),
            connections_per_server: plan.connections,
            pods: plan.pods,
            warmup_seconds: plan.warmup.as_secs_f64(),
            measured_seconds,
            requests_per_second: measured.answers as f64 / measured_seconds,
            goodput_per_second: goodput as f64 / measured_seconds,
            measured,
            latency_us: Latency::of(&latency),
            answered_attempt_latency_us: Latency::of(&attempt_latency),
            total,
            tenants: plan.tenants.iter().cloned().zip(tenants).collect(),
            tenant_order: plan.tenants.clone(),
        }
    }

    /// The summary, the first message of each error code, and the
    /// per-tenant table.
    pub fn text(&self) -> String {
        let mode = match self.target_rate {
            None => "closed loop".to_owned(),
            Some(rate) if self.herd => {
                format!("open loop at {rate} requests/s, every pod's first at the start")
            }
            Some(rate) => format!("open loop at {rate} requests/s"),
        };
        let servers = self.servers.len();
        let l = &self.latency_us;
        let t = &self.total;
        let mut text = Table::new([
            field(
                "load",
                format!(
                    "{mode}, {} pods ({} tenant{} × {}), {servers} server{} × {} connection{}",
                    self.pods,
                    self.tenants.len(),
                    plural(self.tenants.len()),
                    self.pods / self.tenants.len().max(1),
                    plural(servers),
                    self.connections_per_server,
                    plural(self.connections_per_server),
                ),
            ),
            field(
                "measured",
                format!(
                    "{:.1} s after a {:.1} s warmup",
                    self.measured_seconds, self.warmup_seconds
                ),
            ),
            field("requests/s", format!("{:.1}", self.requests_per_second)),
            field("goodput/s", format!("{:.1}", self.goodput_per_second)),
            field(
                "answers",
                format!(
                    "{} ({} new, {} duplicates)",
                    self.measured.answers, self.measured.requests, self.measured.duplicates
                ),
            ),
            field("latency", l.text()),
            field("answered attempts", self.answered_attempt_latency_us.text()),
            field(
                "whole run",
                format!(
                    "{} answers ({} new, {} duplicates)",
                    t.answers, t.requests, t.duplicates
                ),
            ),
            field("duplicate mismatches", t.duplicate_mismatches.to_string()),
            field("retried", codes(&t.retried)),
            field("errors", codes(&t.errors)),
            field("abandoned", t.abandoned.to_string()),
        ])
        .to_string();
        for (code, message) in &t.error_messages {
            text.push_str(&format!("\n  {code}: {message}"));
        }
        let mut table = Table::with_header(&[
            "TENANT",
            "REQUESTS",
            "DUPLICATES",
            "GRANTED",
            "REQUEST UNITS",
            "READS B/R/BYTES",
            "WRITES B/R/BYTES",
            "CPU S",
            "EGRESS BYTES",
            "UNCONFIRMED RU",
        ]);
        for id in &self.tenant_order {
            let Some(tenant) = self.tenants.get(id) else {
                continue;
            };
            let c = &tenant.consumption;
            table.push(vec![
                id.clone(),
                tenant.requests.to_string(),
                tenant.duplicates.to_string(),
                format!("{:.0}", tenant.granted_tokens),
                format!("{:.0}", c.request_units()),
                format!("{}/{}/{}", c.read_batches, c.read_requests, c.read_bytes),
                format!("{}/{}/{}", c.write_batches, c.write_requests, c.write_bytes),
                format!("{:.3}", c.cpu_seconds()),
                c.egress_bytes.to_string(),
                format!("{:.0}", tenant.unconfirmed.request_units()),
            ]);
        }
        format!("{text}\n\n{table}")
    }
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `Unavailable 3, DeadlineExceeded 1`, or `none`.
pub(super) fn codes(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".to_owned();
    }
    counts
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A latency in microseconds, in the unit that reads best.
fn micros(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        1_000..1_000_000 => format!("{:.2} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}
