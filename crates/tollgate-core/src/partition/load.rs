//! The server's side of coordinated hot partitions: what a tenant's pods
//! reported lately, and the exchange that records a pod's report and
//! answers with its limits and shares.
//!
//! A tenant's [`PartitionReports`] hold each reporting pod's latest report
//! until it goes stale (twice the pod's reporting period, so a pod that
//! stops reporting, or dies, stops counting by itself: nothing has to
//! notice it left). A new report replaces the pod's previous one whole, so
//! a retried or duplicated exchange changes nothing more than the first.
//! The reports are kept in the store, one row per tenant, so every server
//! replica adds up the same pods.
//!
//! A tenant's row is bounded: at most [`MAX_TENANT_REPORTED`] partitions in
//! all its pods' reports, the reports closest to going stale dropped first.
//! [`exchange`] is the whole of the server's side, run by both stores and
//! the simulator: it records the pod's report, answers the tenant's limits
//! when the version the pod holds is old, and the pod's shares.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    MAX_REPORTED_PARTITIONS, Op, ReportedPartition, TableLimitSet, limits_version, shares,
};
use crate::time::Timestamp;
use crate::validate::{self, InvalidInput};

/// The most reported partitions a tenant keeps, all its pods' reports
/// together (its row stays under about 400 KB): beyond it, the reports
/// closest to going stale are dropped first (never the one just made).
pub const MAX_TENANT_REPORTED: usize = 4096;
/// The highest rate a report may give, operations per second.
pub const MAX_REPORTED_RATE: f64 = 1e12;

/// One pod's latest report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodReport {
    /// When the report goes stale.
    pub until: Timestamp,
    pub partitions: Vec<ReportedPartition>,
}

/// A tenant's pods' fresh reports, by pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartitionReports {
    pub pods: BTreeMap<u32, PodReport>,
}

impl PartitionReports {
    /// True if no pod's report is kept (the store may drop the row).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Drops the reports stale at `now`.
    pub fn prune(&mut self, now: Timestamp) {
        self.pods.retain(|_, report| report.until > now);
    }
}

/// A pod's exchange: its report, and the version of the limits it has.
#[derive(Clone, Debug, PartialEq)]
pub struct Exchange {
    /// The pod: unique among the tenant's live pods.
    pub pod: u32,
    /// Its hottest partitions, at most [`MAX_REPORTED_PARTITIONS`], each
    /// once.
    pub partitions: Vec<ReportedPartition>,
    /// How often it reports: its report stays fresh for twice this.
    pub period: Duration,
    /// The version of the limits it applies (0: none yet).
    pub known_version: u64,
}

impl Exchange {
    /// Checks a report as a client sent it; `field` names the list.
    pub fn validate_partitions(
        field: &str,
        partitions: &[ReportedPartition],
    ) -> Result<(), InvalidInput> {
        if partitions.len() > MAX_REPORTED_PARTITIONS {
            return Err(InvalidInput::new(
                field,
                format!(
                    "at most {MAX_REPORTED_PARTITIONS} partitions, got {}",
                    partitions.len()
                ),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in partitions.iter().enumerate() {
            validate::non_negative(&format!("{field}[{i}].rate"), p.rate, MAX_REPORTED_RATE)?;
            if !seen.insert((&p.table, p.op, p.partition)) {
                return Err(InvalidInput::new(
                    format!("{field}[{i}]"),
                    format!(
                        "partition {:#018x} of table {} ({}) is listed twice",
                        p.partition,
                        validate::quote(p.table.as_str()),
                        p.op
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a pod is told.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeAnswer {
    /// The version of the tenant's limits now.
    pub version: u64,
    /// The limits, when the pod's version differs.
    pub limits: Option<TableLimitSet>,
    /// The pod's share of each reported partition's limit, where other
    /// pods see the partition too (left out: a whole share).
    pub shares: Vec<(ReportedPartition, f64)>,
}

/// Records `exchange` in `reports` and answers it, given the tenant's
/// limits now. Partitions of tables or operations without a limit (the
/// pod's limits are older than the tenant's) are not recorded.
pub fn exchange(
    reports: &mut PartitionReports,
    limits: &TableLimitSet,
    exchange: &Exchange,
    now: Timestamp,
) -> ExchangeAnswer {
    reports.prune(now);
    let limited = |table, op: Op| {
        limits
            .get(table)
            .is_some_and(|l: &super::TableLimits| l.limit(op).is_some())
    };
    let mine: Vec<ReportedPartition> = exchange
        .partitions
        .iter()
        .filter(|p| limited(&p.table, p.op))
        .cloned()
        .collect();
    if mine.is_empty() {
        reports.pods.remove(&exchange.pod);
    } else {
        let until = now.saturating_add(exchange.period.saturating_mul(2));
        reports.pods.insert(
            exchange.pod,
            PodReport {
                until,
                partitions: mine,
            },
        );
        let mut kept: usize = reports.pods.values().map(|r| r.partitions.len()).sum();
        while kept > MAX_TENANT_REPORTED {
            let oldest = reports
                .pods
                .iter()
                .filter(|(pod, _)| **pod != exchange.pod)
                .min_by_key(|(_, report)| report.until)
                .map(|(pod, _)| *pod);
            match oldest.and_then(|pod| reports.pods.remove(&pod)) {
                Some(dropped) => kept -= dropped.partitions.len(),
                None => break,
            }
        }
    }
    let shares = match reports.pods.get(&exchange.pod) {
        Some(report) => shares(
            &report.partitions,
            reports.pods.values().map(|r| r.partitions.as_slice()),
            |p| limits.get(&p.table)?.limit(p.op),
        ),
        None => Vec::new(),
    };
    let version = limits_version(limits);
    ExchangeAnswer {
        version,
        limits: (version != exchange.known_version).then(|| limits.clone()),
        shares,
    }
}
