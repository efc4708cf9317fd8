//! Hot-partition limits in virtual time: the pods' counters and the
//! server's shares, run as the client and the server run them, in two
//! modes side by side.
//!
//! A workload's `partitions:` section gives the per-partition limit; its
//! pod groups give each pod's operations on hot spots (a partition, or one
//! that moves) and on cold partitions. [`run`] plays the same operations
//! (same seeds) in [`Mode::Local`], each pod applying the whole limit on
//! its own as ScyllaDB's replicas do, and in [`Mode::Coordinated`], the
//! client as it is, exchanging reports and shares with the server through
//! the network and outages of the workload. [`measures`] says how close
//! each came to the limit, how fast the coordinated pods reacted to a
//! moved hot spot, and how many operations on partitions below the limit
//! were rejected.

pub mod engine;
pub mod measures;
pub mod traffic;

pub use engine::{BIN_SECS, Mode, PartitionRecord, SpotSeries, TOP_K, simulate};
pub use measures::{PartitionMeasures, SpotMeasures};

use crate::SimError;
use crate::workload::Workload;
use crate::workload::partitions::HotSpot;

/// One mode's run and its measures.
#[derive(Debug)]
pub struct ModeRun {
    pub mode: Mode,
    pub record: PartitionRecord,
    pub measures: PartitionMeasures,
}

/// A workload's partition part, run in each mode.
#[derive(Debug)]
pub struct PartitionRun {
    pub spots: Vec<HotSpot>,
    pub runs: Vec<ModeRun>,
}

impl PartitionRun {
    pub fn mode(&self, mode: Mode) -> Option<&ModeRun> {
        self.runs.iter().find(|r| r.mode == mode)
    }
}

/// Runs the partition part of `workload` in each of `modes`.
pub fn run(workload: &Workload, modes: &[Mode]) -> Result<PartitionRun, SimError> {
    let spots = workload.hot_spots().map_err(SimError::Invalid)?;
    let mut runs = Vec::new();
    for &mode in modes {
        let record = simulate(workload, mode)?;
        let measures = measures::measure(workload, &spots, &record);
        runs.push(ModeRun {
            mode,
            record,
            measures,
        });
    }
    Ok(PartitionRun { spots, runs })
}
