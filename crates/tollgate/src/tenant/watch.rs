//! `tollgate tenant watch`: a live view in the terminal, as `top` is for
//! processes. Every interval it lists the buckets (every tenant's, or one
//! tenant's) and shows the busiest first: limits, level, request units
//! and granted tokens per second (differences of the exact totals between
//! two listings), live pods. Per-key buckets follow in a table of their
//! own, the most checked first: keys stored, checks and refusals per
//! second (the server replica's own, over the window it names) and the
//! busiest keys. On a terminal each frame replaces the last; otherwise
//! frames follow each other, each under its time.
//!
//! A server that stops answering (a restart, a network cut) does not end
//! the view: each failed listing shows `server unreachable since …,
//! retrying`, and frames resume once it answers. Only a definitive answer
//! (a refusal, an unknown tenant at the first listing) ends it.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;
use tollgate_proto::v1;

use super::per_key::{self, KeyBucketJson};
use super::{bucket_label, list_or_status, tenant_not_found};
use crate::output::Table;
use crate::remote::{AdminConnection, rpc_error};

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only this tenant's buckets [default: every tenant's].
    #[arg(long)]
    tenant: Option<String>,
    /// Time between two listings (at least 1s).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Show this many buckets, the busiest first.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Stop after this many frames [default: until interrupted].
    #[arg(long)]
    count: Option<u64>,
}

/// A bucket's totals at one listing.
#[derive(Clone, Copy)]
struct Totals {
    request_unit_micros: u64,
    granted_tokens: f64,
}

type Key = (String, String);

pub async fn watch(client: &mut AdminConnection, args: WatchArgs) -> anyhow::Result<()> {
    if args.interval < Duration::from_secs(1) {
        anyhow::bail!("--interval: at least 1s, got {:?}", args.interval);
    }
    let terminal = std::io::stdout().is_terminal();
    let mut previous: Option<(Instant, HashMap<Key, Totals>)> = None;
    let mut frames = 0u64;
    let mut ticks = tokio::time::interval(args.interval);
    // A listing that outlasts the interval delays the next, rather than
    // bunching them up.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unreachable_since: Option<std::time::SystemTime> = None;
    loop {
        ticks.tick().await;
        let listed = match list_or_status(client, args.tenant.as_deref().unwrap_or("")).await {
            Ok(listed) => {
                unreachable_since = None;
                listed
            }
            Err(status) if unreachable(&status) => {
                let since = *unreachable_since.get_or_insert_with(std::time::SystemTime::now);
                let mut out = std::io::stdout().lock();
                if terminal {
                    // Over the last frame, which is out of date.
                    write!(out, "\x1b[H\x1b[2J")?;
                }
                writeln!(
                    out,
                    "{}  server unreachable since {}, retrying every {}: {}",
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
                    humantime::format_rfc3339_seconds(since),
                    humantime::format_duration(args.interval),
                    status.message()
                )?;
                out.flush()?;
                continue;
            }
            Err(status) => return Err(rpc_error(status)),
        };
        // Read right after the shared buckets; a server gone in between
        // shows in the next listing.
        let key_buckets: Vec<KeyBucketJson> =
            match per_key::list(client, args.tenant.as_deref().unwrap_or(""), 3).await {
                Ok(found) => found.iter().map(per_key::key_bucket_json).collect(),
                Err(_) if frames > 0 => continue,
                Err(e) => return Err(e),
            };
        if frames == 0
            && listed.is_empty()
            && key_buckets.is_empty()
            && let Some(tenant) = &args.tenant
        {
            // As `tenant show` says it, rather than empty frames forever.
            return Err(tenant_not_found(tenant));
        }
        let taken = Instant::now();
        let totals: HashMap<Key, Totals> = listed
            .iter()
            .map(|b| {
                let c = b.consumption.unwrap_or_default();
                (
                    (b.tenant_id.clone(), b.bucket.clone()),
                    Totals {
                        request_unit_micros: c.request_unit_micros,
                        granted_tokens: b.granted_tokens,
                    },
                )
            })
            .collect();
        let frame = match (listed.is_empty(), key_buckets.is_empty()) {
            // Only per-key buckets: no empty table of shared ones above.
            (true, false) => render_key_buckets(key_buckets, args.top),
            (_, true) => render(&listed, &totals, previous.as_ref(), taken, args.top),
            (false, false) => format!(
                "{}\n\n{}",
                render(&listed, &totals, previous.as_ref(), taken, args.top),
                render_key_buckets(key_buckets, args.top)
            ),
        };
        let mut out = std::io::stdout().lock();
        if terminal {
            // Home and clear, then the frame: the view updates in place.
            write!(out, "\x1b[H\x1b[2J")?;
        } else if frames > 0 {
            writeln!(out)?;
        }
        let when = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        writeln!(out, "{when}  {frame}")?;
        out.flush()?;
        frames += 1;
        if args.count.is_some_and(|count| frames >= count) {
            return Ok(());
        }
        previous = Some((taken, totals));
    }
}

/// Whether a failed listing may succeed if tried again: the server is
/// down, restarting or out of reach, rather than refusing.
fn unreachable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
    )
}

/// One frame: a line of totals, then the busiest buckets.
fn render(
    listed: &[v1::Tenant],
    totals: &HashMap<Key, Totals>,
    previous: Option<&(Instant, HashMap<Key, Totals>)>,
    taken: Instant,
    top: usize,
) -> String {
    // Per bucket: request units and granted tokens per second since the
    // last listing (None on the first, or for a bucket new since).
    let rates = |key: &Key| -> Option<(f64, f64)> {
        let (at, before) = previous?;
        let seconds = taken.duration_since(*at).as_secs_f64();
        let (then, now) = (before.get(key)?, totals.get(key)?);
        (seconds > 0.0).then(|| {
            (
                now.request_unit_micros
                    .saturating_sub(then.request_unit_micros) as f64
                    / 1e6
                    / seconds,
                (now.granted_tokens - then.granted_tokens).max(0.0) / seconds,
            )
        })
    };
    let mut rows: Vec<(&v1::Tenant, Option<(f64, f64)>)> = listed
        .iter()
        .map(|b| (b, rates(&(b.tenant_id.clone(), b.bucket.clone()))))
        .collect();
    // Busiest first; before rates exist, by tenant id as listed.
    rows.sort_by(|a, b| {
        let ru = |r: &Option<(f64, f64)>| r.map_or(0.0, |(ru, _)| ru);
        ru(&b.1).total_cmp(&ru(&a.1))
    });
    let tenants = {
        let mut ids: Vec<&str> = listed.iter().map(|b| b.tenant_id.as_str()).collect();
        ids.dedup();
        ids.len()
    };
    let total_ru: f64 = rows.iter().filter_map(|(_, r)| r.map(|(ru, _)| ru)).sum();
    let in_debt = listed.iter().filter(|b| b.current_tokens < 0.0).count();
    let header = format!(
        "{tenants} tenants, {} buckets, {} request units/s in all, {in_debt} in debt{}",
        listed.len(),
        match previous {
            // The rates cover the time since the last listing.
            Some((at, _)) => format!(
                "{total_ru:.1} over the last {:.3} s",
                taken.duration_since(*at).as_secs_f64()
            ),
            None => "–".to_owned(),
        },
        if listed.len() > top {
            format!(" (the {top} busiest shown)")
        } else {
            String::new()
        }
    );
    let mut table = Table::with_header(&[
        "TENANT",
        "BUCKET",
        "REFILL/S",
        "BURST",
        "TOKENS",
        "RU/S",
        "GRANTED/S",
        "LIVE PODS",
    ]);
    let shown = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"));
    for (b, rate) in rows.iter().take(top) {
        let limits = b.limits.unwrap_or_default();
        table.push(vec![
            b.tenant_id.clone(),
            bucket_label(&b.bucket).to_owned(),
            limits.refill_rate.to_string(),
            limits.burst_limit.to_string(),
            format!("{:.1}", b.current_tokens),
            shown(rate.map(|(ru, _)| ru)),
            shown(rate.map(|(_, granted)| granted)),
            b.live_instances.to_string(),
        ]);
    }
    format!("{header}\n\n{table}")
}

/// The per-key buckets, the most checked first (then in tenant and bucket
/// order), at most `top`, and whose rates they are.
fn render_key_buckets(mut buckets: Vec<KeyBucketJson>, top: usize) -> String {
    let total = buckets.len();
    buckets.sort_by(|a, b| b.checks_per_second.total_cmp(&a.checks_per_second));
    let note = per_key::rates_note(&buckets);
    buckets.truncate(top);
    let shown = if total > top {
        format!(" (the {top} most checked shown)")
    } else {
        String::new()
    };
    format!(
        "{total} per-key buckets{shown}\n\n{}\n\n{note}",
        per_key::table(&buckets, true)
    )
}
