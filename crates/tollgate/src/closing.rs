//! Closed buckets on the command line: what `tenant show --closed` prints,
//! and the question every command that retires buckets asks first.
//!
//! A bucket retired by a tier change, a tier's new definition or a cleared
//! override, or deleted with its tenant, is gone, but the server keeps its
//! last limits and exact totals as a closed record (`ListClosedBuckets`).
//! `tier apply`, `tier update`, `tenant set-tier` and `tenant override
//! clear` first ask the server for a dry run; when it would retire any
//! bucket, they list each tenant and bucket with its totals and go on only
//! with `--yes` or a typed confirmation at a terminal ([`confirm`], the
//! question `tenant delete` asks too). Without either they change nothing
//! and fail.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;
use serde::Serialize;
use tollgate_proto::v1;

use crate::output::{Table, rfc3339};

/// What the output says of every list of buckets a change retires.
pub const KEPT_NOTE: &str =
    "their totals are kept as closed records (`tollgate tenant show --tenant TENANT --closed`)";

/// How a command that may retire buckets asks first.
#[derive(Debug, Args)]
pub struct RetireArgs {
    /// Retire buckets without asking (their totals are kept as closed
    /// records either way).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print what would change, the buckets that would be retired and
    /// their totals, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// A closed bucket as `--json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ClosedJson {
    pub tenant_id: String,
    pub bucket: String,
    pub closed_at: Option<String>,
    /// `tier-change`, `tier-redefined`, `override-cleared` or
    /// `tenant-deleted`.
    pub reason: &'static str,
    /// Who asked: the `--actor` sent, the operator of the admin token, the
    /// client's address; `null` when unknown.
    pub actor: Option<String>,
    pub operator: Option<String>,
    pub peer: Option<String>,
    pub refill_rate: f64,
    pub burst_limit: f64,
    pub granted_tokens: f64,
    /// Exact in `request_unit_micros` and `cpu_micros`.
    pub consumption: v1::Consumption,
    pub created_at: Option<String>,
}

impl ClosedJson {
    pub fn new(c: &v1::ClosedBucket) -> Self {
        let limits = c.limits.unwrap_or_default();
        let known = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        ClosedJson {
            tenant_id: c.tenant_id.clone(),
            bucket: c.bucket.clone(),
            closed_at: rfc3339(c.closed_at),
            reason: reason_name(c.reason()),
            actor: known(&c.actor),
            operator: known(&c.operator),
            peer: known(&c.peer),
            refill_rate: limits.refill_rate,
            burst_limit: limits.burst_limit,
            granted_tokens: c.granted_tokens,
            consumption: c.consumption.unwrap_or_default(),
            created_at: rfc3339(c.created_at),
        }
    }

    /// `alice at 127.0.0.1:53110`, as the audit log names a caller.
    fn by(&self) -> String {
        let mut by = String::new();
        if let Some(operator) = &self.operator {
            by.push_str(&format!("operator {operator} "));
        }
        if let Some(actor) = &self.actor {
            by.push_str(&format!("{actor} at "));
        }
        by.push_str(self.peer.as_deref().unwrap_or("an unknown peer"));
        by
    }
}

pub fn closed_json(closed: &[v1::ClosedBucket]) -> Vec<ClosedJson> {
    closed.iter().map(ClosedJson::new).collect()
}

fn reason_name(reason: v1::CloseReason) -> &'static str {
    match reason {
        v1::CloseReason::TierChange => "tier-change",
        v1::CloseReason::TierRedefined => "tier-redefined",
        v1::CloseReason::OverrideCleared => "override-cleared",
        v1::CloseReason::TenantDeleted => "tenant-deleted",
        v1::CloseReason::Unspecified => "unknown",
    }
}

/// Request units from their exact micro-units, every digit kept:
/// `1234.5`, `0.000001`, `7`.
pub fn exact_units(micros: u64) -> String {
    let (whole, fraction) = (micros / 1_000_000, micros % 1_000_000);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// The buckets a change retires (or would), one row each with its totals.
pub fn retiring_table(closed: &[ClosedJson]) -> Table {
    let mut table = Table::with_header(&[
        "TENANT",
        "BUCKET",
        "REQUEST UNITS",
        "GRANTED TOKENS",
        "CPU SECONDS",
        "CREATED",
    ]);
    for c in closed {
        table.push(vec![
            c.tenant_id.clone(),
            c.bucket.clone(),
            exact_units(c.consumption.request_unit_micros),
            c.granted_tokens.to_string(),
            exact_units(c.consumption.cpu_micros),
            c.created_at.clone().unwrap_or_default(),
        ]);
    }
    table
}

/// `would retire 2 buckets of 1 tenant (…kept…):` and the table.
pub fn retiring_text(verb: &str, closed: &[ClosedJson]) -> String {
    let mut tenants: Vec<&str> = closed.iter().map(|c| c.tenant_id.as_str()).collect();
    tenants.sort_unstable();
    tenants.dedup();
    format!(
        "{verb} {} bucket{} of {} tenant{}; {KEPT_NOTE}:\n{}",
        closed.len(),
        if closed.len() == 1 { "" } else { "s" },
        tenants.len(),
        if tenants.len() == 1 { "" } else { "s" },
        retiring_table(closed)
    )
}

/// A tenant's closed buckets in close order, as `tenant show --closed`
/// prints them.
pub fn closed_text(tenant: &str, closed: &[ClosedJson]) -> String {
    if closed.is_empty() {
        return format!("tenant {tenant} has no closed buckets");
    }
    let mut table = Table::with_header(&[
        "BUCKET",
        "CLOSED",
        "REASON",
        "BY",
        "REFILL/S",
        "BURST",
        "REQUEST UNITS",
        "GRANTED TOKENS",
        "CPU SECONDS",
        "CREATED",
    ]);
    for c in closed {
        table.push(vec![
            c.bucket.clone(),
            c.closed_at.clone().unwrap_or_default(),
            c.reason.to_owned(),
            c.by(),
            c.refill_rate.to_string(),
            c.burst_limit.to_string(),
            exact_units(c.consumption.request_unit_micros),
            c.granted_tokens.to_string(),
            exact_units(c.consumption.cpu_micros),
            c.created_at.clone().unwrap_or_default(),
        ]);
    }
    format!("closed buckets of tenant {tenant}, in the order they were closed:\n{table}")
}

/// Goes on if `yes`; else asks on the terminal for `expected` to be typed
/// (after `question`), and refuses when the answer differs or there is
/// no terminal to ask on. `action` names what is not done
/// (`applying tiers.toml`); `what` says what it would do.
pub fn confirm(action: &str, what: &str, expected: &str, yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        anyhow::bail!(
            "not {action} without confirmation: pass --yes (there is no terminal to ask on). It {what}"
        );
    }
    let mut stderr = std::io::stderr();
    write!(
        stderr,
        "It {what}\nType {expected} to confirm, anything else to change nothing: "
    )?;
    stderr.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if answer.trim() != expected {
        anyhow::bail!("not {action}: the answer was not {expected:?}; nothing changed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_units_keep_every_digit() {
        assert_eq!(exact_units(0), "0");
        assert_eq!(exact_units(7_000_000), "7");
        assert_eq!(exact_units(1_234_500_000), "1234.5");
        assert_eq!(exact_units(1), "0.000001");
        assert_eq!(exact_units(u64::MAX), "18446744073709.551615");
    }
}
