//! Tollgate's simulator: the real algorithms in virtual time, measured
//! against an ideal token bucket and against per-partition limits.
//!
//! A [`Workload`](workload::Workload) describes a tenant, its pods' demand
//! and the network. [`engine::simulate`] runs it with `tollgate-core`'s local
//! and global buckets under one grant policy; [`engine::simulate_ideal`] runs
//! the same demand through one instantly synchronised bucket. [`measures`]
//! compares the two, [`check`] holds the measures to their thresholds, and
//! [`report`] writes the markdown summary and the plots. A workload with a
//! per-partition limit runs through [`partitions`] too: the pods' partition
//! counters, alone and coordinated by the server's shares. A workload with
//! an organisation runs through [`organisation`]: member tenants drawing
//! on the organisation's bucket, against an ideal hierarchical bucket.
//! [`fuzz`] draws workloads from seeds and sums a corpus of them up.
//!
//! Runs are deterministic: the same workload and seed give the same report,
//! byte for byte.

pub mod check;
pub mod engine;
pub mod fuzz;
pub mod ideal;
pub mod measures;
pub mod organisation;
pub mod partitions;
pub mod plot;
pub mod record;
pub mod report;
pub mod workload;

use std::path::{Path, PathBuf};

use engine::Policy;
use ideal::delayed::OutageSplit;
use measures::Measures;
use record::Record;
use workload::{LimitsSpec, Workload};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid workload: {0}")]
    Invalid(String),
    #[error("cannot write workload {name} as YAML: {source}")]
    Yaml {
        name: String,
        source: serde_norway::Error,
    },
    #[error("server refused a request of {pod} at {at:.3} s: {message}")]
    Server {
        pod: String,
        at: f64,
        message: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot draw {path}: {message}")]
    Plot { path: PathBuf, message: String },
}

impl SimError {
    /// Names the workload file in a validation error.
    fn in_file(self, path: &Path) -> SimError {
        match self {
            SimError::Invalid(msg) => SimError::Invalid(format!("{}: {msg}", path.display())),
            other => other,
        }
    }
}

/// One policy's run of a workload and its measures.
#[derive(Debug)]
pub struct PolicyRun {
    pub policy: Policy,
    pub record: Record,
    pub measures: Measures,
}

/// The delayed ideal through a workload's outages, measured with each
/// [`OutageSplit`].
#[derive(Debug)]
pub struct UnderOutages {
    pub fallback: Measures,
    pub foresight: Measures,
}

/// A workload run under every policy, the ideal and the delayed ideal.
#[derive(Debug)]
pub struct WorkloadRun {
    pub workload: Workload,
    /// The bucket's limits (the workload's `limits`).
    pub limits: LimitsSpec,
    pub ideal: Record,
    /// The ideal measured against itself: its overshoot and waits.
    pub ideal_measures: Measures,
    /// The delayed ideal ([`ideal::delayed`]): the best a protocol whose
    /// pods learn their rate once a period can do, measured against the
    /// ideal as a policy is.
    pub delayed: Record,
    pub delayed_measures: Measures,
    /// The delayed ideal run through the workload's outages
    /// ([`ideal::delayed::simulate_delayed_under_outages`]) with each
    /// split, where it has any.
    pub under_outages: Option<UnderOutages>,
    pub runs: Vec<PolicyRun>,
}

impl WorkloadRun {
    /// Measures each policy's `records` of `workload` against its `ideal`
    /// and the delayed ideal run from it.
    pub fn new(
        workload: Workload,
        limits: LimitsSpec,
        ideal: Record,
        records: Vec<(Policy, Record)>,
    ) -> WorkloadRun {
        let delayed = ideal::delayed::simulate_delayed(&workload, &limits, &ideal);
        let measure =
            |record: &Record| measures::measure(&workload, &limits, record, &ideal, &delayed);
        let ideal_measures = measure(&ideal);
        let delayed_measures = measure(&delayed);
        let under = |split| {
            measure(&ideal::delayed::simulate_delayed_under_outages(
                &workload, &limits, &ideal, split,
            ))
        };
        let under_outages = (!workload.outages.is_empty()).then(|| UnderOutages {
            fallback: under(OutageSplit::Fallback),
            foresight: under(OutageSplit::Foresight),
        });
        let runs = records
            .into_iter()
            .map(|(policy, record)| PolicyRun {
                policy,
                measures: measure(&record),
                record,
            })
            .collect();
        WorkloadRun {
            workload,
            limits,
            ideal,
            ideal_measures,
            delayed,
            delayed_measures,
            under_outages,
            runs,
        }
    }

    pub fn policy(&self, policy: Policy) -> Option<&PolicyRun> {
        self.runs.iter().find(|r| r.policy == policy)
    }
}

/// Runs `workload`'s token bucket under each of `policies` and against the
/// ideal.
pub fn run_workload(workload: Workload, policies: &[Policy]) -> Result<WorkloadRun, SimError> {
    let limits = workload.limits.clone().ok_or_else(|| {
        SimError::Invalid(format!(
            "{}: no limits, so no token bucket to run",
            workload.name
        ))
    })?;
    let ideal = engine::simulate_ideal(&workload, &limits);
    let records = policies
        .iter()
        .map(|&policy| Ok((policy, engine::simulate(&workload, &limits, policy)?)))
        .collect::<Result<Vec<_>, SimError>>()?;
    Ok(WorkloadRun::new(workload, limits, ideal, records))
}

/// A duration as people write it: `10ms`, `5m`, `1h 30m`.
pub fn humantime_short(d: std::time::Duration) -> String {
    humantime::format_duration(d).to_string()
}
