//! Where a store's time goes. A slow answer is either a request waiting
//! for its turn (its worker busy with the transaction before it) or a
//! transaction taking long (connection, round trips, the commit's flush);
//! the cure differs, so each stage is timed apart and exported as the
//! histogram `tollgate_store_stage_seconds{stage}`.
//!
//! Lock-free fixed buckets, written by the store's workers and read at
//! scrape time; the same bounds for every stage, so stages compare.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds of the histogram buckets, in seconds: 50 µs to 1 s.
pub const STAGE_BOUNDS: [f64; 13] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A stage of serving a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A request waiting in its worker's queue until its transaction
    /// begins (once per request).
    Queued,
    /// Taking a connection from the pool (PostgreSQL) or opening the write
    /// transaction (embedded).
    Begin,
    /// PostgreSQL: one round trip of BEGIN, the lock on the batch's head
    /// rows and the reads of its rows.
    Read,
    /// Serving the batch on the rows read: PostgreSQL in memory, the
    /// embedded store into its write transaction.
    Write,
    /// Until durable: PostgreSQL one round trip of the writes and COMMIT,
    /// the embedded store its commit.
    Commit,
}

impl Stage {
    /// Every stage, in the order a write goes through them.
    pub const ALL: [Stage; 5] = [
        Stage::Queued,
        Stage::Begin,
        Stage::Read,
        Stage::Write,
        Stage::Commit,
    ];

    /// The stage's `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Queued => "queued",
            Stage::Begin => "begin",
            Stage::Read => "read",
            Stage::Write => "write",
            Stage::Commit => "commit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One stage's histogram at a moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageHistogram {
    /// Per bound of [`STAGE_BOUNDS`], how many took at most that long
    /// (cumulative, as Prometheus counts them).
    pub cumulative: [u64; STAGE_BOUNDS.len()],
    /// How many were timed.
    pub count: u64,
    /// Their total time, in nanoseconds.
    pub sum_nanos: u64,
}

impl StageHistogram {
    /// The total time, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }
}

/// Every stage's histogram at a moment, indexed as [`Stage::ALL`].
pub type StageHistograms = [StageHistogram; Stage::ALL.len()];

/// The live histograms of every stage.
#[derive(Debug, Default)]
pub(crate) struct StageTimes {
    stages: [Recorder; Stage::ALL.len()],
}

#[derive(Debug, Default)]
struct Recorder {
    /// Per bound, how many fell in (bound before, bound]; the last counts
    /// those past every bound.
    buckets: [AtomicU64; STAGE_BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl StageTimes {
    /// Records that `stage` took `took`.
    pub(crate) fn record(&self, stage: Stage, took: Duration) {
        let recorder = &self.stages[stage.index()];
        let seconds = took.as_secs_f64();
        let bucket = STAGE_BOUNDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(STAGE_BOUNDS.len());
        recorder.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        recorder.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Records `stage` once per duration (one per request of a batch).
    pub(crate) fn record_all(&self, stage: Stage, took: impl IntoIterator<Item = Duration>) {
        for took in took {
            self.record(stage, took);
        }
    }

    pub(crate) fn snapshot(&self) -> StageHistograms {
        self.stages.each_ref().map(|recorder| {
            let mut histogram = StageHistogram {
                sum_nanos: recorder.sum_nanos.load(Ordering::Relaxed),
                ..StageHistogram::default()
            };
            let mut running = 0u64;
            for (i, bucket) in recorder.buckets.iter().enumerate() {
                running += bucket.load(Ordering::Relaxed);
                if let Some(slot) = histogram.cumulative.get_mut(i) {
                    *slot = running;
                }
            }
            histogram.count = running;
            histogram
        })
    }
}

/// Times the stages of a transaction, one after another.
pub(crate) struct Stopwatch<'a> {
    times: &'a StageTimes,
    since: Instant,
}

impl<'a> Stopwatch<'a> {
    pub(crate) fn new(times: &'a StageTimes) -> Self {
        Self {
            times,
            since: Instant::now(),
        }
    }

    /// Records the time since the last lap (or the start) as `stage`'s.
    pub(crate) fn lap(&mut self, stage: Stage) {
        let now = Instant::now();
        self.times.record(stage, now.duration_since(self.since));
        self.since = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_fall_in_cumulative_buckets_and_sum() {
        let times = StageTimes::default();
        times.record(Stage::Commit, Duration::from_micros(40));
        times.record(Stage::Commit, Duration::from_micros(700));
        times.record(Stage::Commit, Duration::from_secs(3));
        times.record_all(Stage::Queued, [Duration::from_millis(2); 4]);
        let snapshot = times.snapshot();

        let commit = snapshot[Stage::Commit.index()];
        assert_eq!(commit.count, 3);
        assert_eq!(commit.cumulative[0], 1, "≤ 50 µs");
        assert_eq!(commit.cumulative[3], 1, "≤ 500 µs");
        assert_eq!(commit.cumulative[4], 2, "≤ 1 ms");
        assert_eq!(
            commit.cumulative[12], 2,
            "≤ 1 s: the 3 s one is past every bound"
        );
        assert_eq!(commit.sum_nanos, 3_000_740_000);

        let queued = snapshot[Stage::Queued.index()];
        assert_eq!((queued.count, queued.cumulative[5]), (4, 4), "≤ 2.5 ms");
        assert_eq!(snapshot[Stage::Read.index()], StageHistogram::default());
    }
}
