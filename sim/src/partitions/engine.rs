//! The run of one mode: each pod's counters and operations, and in the
//! coordinated mode the server and the exchanges, in virtual time.
//!
//! Each pod is `tollgate-core`'s [`PodLimiter`], as in `tollgate-client`:
//! the same counters, the same exchanges, the same cadence (the next
//! exchange within a period of an answer, soon after a failure, whole
//! shares after two periods without an answer). The server answers with
//! [`partition::exchange`] over one [`PartitionReports`], as the stores
//! do. A pod's first exchange goes out when it starts; until the first
//! answer it knows no limit and admits everything. A failure is learnt
//! after `request_timeout` for a lost message, one round trip with the
//! server down.
//!
//! Operations are processed pod by pod up to the next event (an exchange
//! sent, arriving or answered, a pod joining or leaving), so each report
//! counts exactly the operations before it, and each answer applies to the
//! operations after it. Everything random is seeded by the workload.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate_core::TableName;
use tollgate_core::partition::{
    self, Exchange, ExchangeAnswer, Op, PartitionReports, PodLimiter, PodVerdict, TableLimitSet,
    TableLimits,
};
use tollgate_core::time::Timestamp;

use super::traffic::{Destination, Source, Target, cold_target};
use crate::SimError;
use crate::engine::Events;
use crate::workload::Workload;
use crate::workload::partitions::{ColdSpec, HotSpot};

/// Width of the recorded bins, seconds.
pub const BIN_SECS: f64 = 0.1;
/// Partitions a pod reports per exchange: the client's default `top_k`.
pub const TOP_K: usize = 8;
/// The one table the simulated tenant limits, and the operation.
const TABLE: &str = "simulated";
const OP: Op = Op::Write;
/// Partitions offered from this fraction of the limit up (and below it)
/// are *warm*: their false positives are counted apart too.
pub const WARM_FRACTION: f64 = 0.5;
/// Stream tags of the admission draws and of the network's generator.
const DRAW_STREAM: u64 = 2 << 62;
const NETWORK_STREAM: u64 = u64::MAX - 1;

/// How the pods apply the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Each pod applies the whole limit to what it sees, from the start,
    /// with no server: ScyllaDB's per-replica rule.
    Local,
    /// The client as it is: exchanges with the server, shares.
    Coordinated,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Local, Mode::Coordinated];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Coordinated => "coordinated",
        }
    }
}

/// Operations on one hot spot, per bin, all pods together.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpotSeries {
    pub offered: Vec<u32>,
    pub accepted: Vec<u32>,
}

/// What one mode's run recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionRecord {
    pub bin_secs: f64,
    /// Per hot spot of the workload, in its order.
    pub spots: Vec<SpotSeries>,
    pub operations: u64,
    pub rejected: u64,
    /// Operations on partitions offered below the limit (by every pod
    /// together), and how many of those were rejected.
    pub under_operations: u64,
    pub under_rejected: u64,
    /// Of those, the operations on warm partitions (offered from
    /// [`WARM_FRACTION`] of the limit), and their rejections.
    pub warm_operations: u64,
    pub warm_rejected: u64,
    /// Operations a pod admitted before it knew the limit.
    pub unlimited: u64,
    /// Exchanges answered, and failed at the pod.
    pub exchanges: u64,
    pub failed_exchanges: u64,
    /// Times a pod went back to whole shares for want of an answer, and
    /// the pod-seconds it then spent until the next answer.
    pub fallbacks: u64,
    pub fallback_secs: f64,
    /// Pod-seconds of pods running.
    pub pod_secs: f64,
}

#[derive(Debug, PartialEq)]
enum PodState {
    Waiting,
    Running,
    Gone,
}

#[derive(Debug)]
struct Pod {
    join: Duration,
    leave: Option<Duration>,
    state: PodState,
    sources: Vec<Source>,
    /// The client's limiter itself.
    limiter: PodLimiter,
    draws: ChaCha8Rng,
    /// Since when its shares are whole for want of an answer.
    fallback_since: Option<Timestamp>,
}

#[derive(Debug)]
enum Kind {
    Join(usize),
    Leave(usize),
    Send(usize),
    /// An exchange reaches the server; sent at the timestamp.
    Arrive(usize, Box<Exchange>, Timestamp),
    Answer(usize, Box<ExchangeAnswer>),
    /// The pod learns its exchange failed.
    Fail(usize),
    End,
}

/// How close to the limit the running pods together offer a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Load {
    /// Below [`WARM_FRACTION`] of the limit.
    Cold,
    /// From [`WARM_FRACTION`] of the limit, below the limit.
    Warm,
    /// At or over the limit: rejections are not false positives.
    Over,
}

/// The load of each partition the running pods send to.
#[derive(Debug, Default)]
struct Loads {
    spots: Vec<Load>,
    /// Cold ranks below these are over, and warm (cold weights never grow
    /// with rank).
    cold_over: u64,
    cold_warm: u64,
}

impl Loads {
    fn of(&self, destination: Destination) -> Load {
        match destination {
            Destination::Hot { spot, .. } => self.spots[spot],
            Destination::Cold { rank } if rank < self.cold_over => Load::Over,
            Destination::Cold { rank } if rank < self.cold_warm => Load::Warm,
            Destination::Cold { .. } => Load::Cold,
        }
    }
}

struct Sim<'w> {
    workload: &'w Workload,
    mode: Mode,
    limit: f64,
    limits: TableLimitSet,
    reports: PartitionReports,
    pods: Vec<Pod>,
    spots: usize,
    loads: Loads,
    events: Events<Kind>,
    network: ChaCha8Rng,
    record: PartitionRecord,
    hot_seed: u64,
    cold_seed: u64,
    /// The limited table's seed, as pods look it up.
    table_seed: u64,
}

fn at(d: Duration) -> Timestamp {
    Timestamp::EPOCH.saturating_add(d)
}

fn secs(t: Timestamp) -> f64 {
    t.seconds_since(Timestamp::EPOCH)
}

/// Runs the partition part of `workload` in `mode`.
pub fn simulate(workload: &Workload, mode: Mode) -> Result<PartitionRecord, SimError> {
    let spec = workload.partitions.as_ref().ok_or_else(|| {
        SimError::Invalid("partitions: the workload has no partition limit".into())
    })?;
    let spots: Vec<HotSpot> = workload.hot_spots().map_err(SimError::Invalid)?;
    let table = TableName::parse("table", TABLE).map_err(|e| SimError::Invalid(e.to_string()))?;
    let limits = TableLimitSet::from([(
        table,
        TableLimits {
            max_reads_per_second: None,
            max_writes_per_second: Some(spec.limit),
        },
    )]);
    let specs = workload.pod_specs();
    // One normaliser per group: a Zipf spread's takes a million terms.
    let normalisers: Vec<Option<f64>> = workload
        .pods
        .iter()
        .map(|g| Some(g.partitions.as_ref()?.cold.as_ref()?.normaliser()))
        .collect();
    let mut pods = Vec::with_capacity(specs.len());
    for (p, pod) in specs.iter().enumerate() {
        let start = pod.join.as_secs_f64();
        let mut sources = Vec::new();
        if let Some(ops) = &pod.partitions {
            for hot in &ops.hot {
                let on = HotSpot::of(hot);
                let spot = spots.iter().position(|s| *s == on).unwrap_or(0);
                let index = sources.len();
                sources.push(Source::new(
                    Target::Hot { spot, on },
                    hot.rate,
                    spec.arrivals,
                    workload.seed,
                    p,
                    index,
                    start,
                ));
            }
            if let (Some(cold), Some(norm)) = (&ops.cold, normalisers[pod.group]) {
                let index = sources.len();
                sources.push(Source::new(
                    cold_target(cold, norm),
                    cold.rate,
                    spec.arrivals,
                    workload.seed,
                    p,
                    index,
                    start,
                ));
            }
        }
        let mut draws = ChaCha8Rng::seed_from_u64(workload.seed);
        draws.set_stream(DRAW_STREAM | p as u64);
        pods.push(Pod {
            join: pod.join,
            leave: pod.leave,
            state: PodState::Waiting,
            sources,
            limiter: PodLimiter::new(partition::DEFAULT_CAPACITY, workload.report_period(), TOP_K),
            draws,
            fallback_since: None,
        });
    }
    let bins = (workload.duration.as_secs_f64() / BIN_SECS).ceil() as usize;
    let mut network = ChaCha8Rng::seed_from_u64(workload.seed);
    network.set_stream(NETWORK_STREAM);
    let mut sim = Sim {
        workload,
        mode,
        limit: spec.limit,
        limits,
        reports: PartitionReports::default(),
        pods,
        spots: spots.len(),
        loads: Loads::default(),
        events: Events::new(),
        network,
        record: PartitionRecord {
            bin_secs: BIN_SECS,
            spots: vec![
                SpotSeries {
                    offered: vec![0; bins],
                    accepted: vec![0; bins],
                };
                spots.len()
            ],
            operations: 0,
            rejected: 0,
            under_operations: 0,
            under_rejected: 0,
            warm_operations: 0,
            warm_rejected: 0,
            unlimited: 0,
            exchanges: 0,
            failed_exchanges: 0,
            fallbacks: 0,
            fallback_secs: 0.0,
            pod_secs: 0.0,
        },
        hot_seed: partition::table_seed("hot"),
        cold_seed: partition::table_seed("cold"),
        table_seed: partition::table_seed(TABLE),
    };
    sim.run();
    Ok(sim.record)
}

impl Sim<'_> {
    fn run(&mut self) {
        let end = at(self.workload.duration);
        self.events.schedule(end, Kind::End);
        for p in 0..self.pods.len() {
            let pod = &self.pods[p];
            let (join, leave) = (pod.join, pod.leave);
            if join < self.workload.duration {
                self.events.schedule(at(join), Kind::Join(p));
            }
            if let Some(leave) = leave
                && leave < self.workload.duration
            {
                self.events.schedule(at(leave), Kind::Leave(p));
            }
        }
        while let Some(event) = self.events.pop() {
            let now = event.at;
            self.operations_until(secs(now));
            match event.kind {
                Kind::End => break,
                Kind::Join(p) => self.join(p, now),
                Kind::Leave(p) => self.leave(p, now),
                Kind::Send(p) => {
                    if self.pods[p].state == PodState::Running {
                        self.send(p, now);
                    }
                }
                Kind::Arrive(p, exchange, sent) => self.arrive(p, &exchange, sent, now),
                Kind::Answer(p, answer) => self.answer(p, &answer, now),
                Kind::Fail(p) => self.fail(p, now),
            }
        }
        for p in 0..self.pods.len() {
            if self.pods[p].state == PodState::Running {
                self.stop(p, end);
            }
        }
    }

    /// Every running pod's operations before `until` (seconds).
    fn operations_until(&mut self, until: f64) {
        let Sim {
            pods,
            record,
            loads,
            hot_seed,
            cold_seed,
            table_seed,
            ..
        } = self;
        let last_bin = record
            .spots
            .first()
            .map_or(0, |s| s.offered.len().saturating_sub(1));
        for pod in pods.iter_mut().filter(|p| p.state == PodState::Running) {
            loop {
                let mut next = until;
                let mut source = usize::MAX;
                for (i, s) in pod.sources.iter().enumerate() {
                    if s.next < next {
                        next = s.next;
                        source = i;
                    }
                }
                if source == usize::MAX {
                    break;
                }
                let destination = pod.sources[source].take();
                let load = loads.of(destination);
                let (hash, spot) = match destination {
                    Destination::Hot { spot, partition } => (
                        partition::partition_hash(*hot_seed, &partition.to_le_bytes()),
                        Some(spot),
                    ),
                    Destination::Cold { rank } => (
                        partition::partition_hash(*cold_seed, &rank.to_le_bytes()),
                        None,
                    ),
                };
                let verdict = pod.limiter.admit(
                    *table_seed,
                    hash,
                    OP,
                    Timestamp::from_secs_f64(next),
                    pod.draws.random(),
                );
                if verdict == PodVerdict::Unlimited {
                    record.unlimited += 1;
                }
                let accepted = !matches!(verdict, PodVerdict::Rejected(_));
                record.operations += 1;
                record.rejected += u64::from(!accepted);
                if load < Load::Over {
                    record.under_operations += 1;
                    record.under_rejected += u64::from(!accepted);
                }
                if load == Load::Warm {
                    record.warm_operations += 1;
                    record.warm_rejected += u64::from(!accepted);
                }
                if let Some(spot) = spot {
                    let bin = ((next / BIN_SECS) as usize).min(last_bin);
                    let series = &mut record.spots[spot];
                    series.offered[bin] += 1;
                    series.accepted[bin] += u32::from(accepted);
                }
            }
        }
    }

    fn join(&mut self, p: usize, now: Timestamp) {
        self.pods[p].state = PodState::Running;
        self.classify();
        match self.mode {
            Mode::Local => self.pods[p].limiter.set_limits(&self.limits),
            Mode::Coordinated => self.send(p, now),
        }
    }

    fn leave(&mut self, p: usize, now: Timestamp) {
        if self.pods[p].state == PodState::Running {
            self.stop(p, now);
            self.classify();
        }
    }

    fn stop(&mut self, p: usize, now: Timestamp) {
        let pod = &mut self.pods[p];
        pod.state = PodState::Gone;
        self.record.pod_secs += now.seconds_since(at(pod.join));
        if let Some(since) = pod.fallback_since.take() {
            self.record.fallback_secs += now.seconds_since(since);
        }
    }

    /// How close to the limit the running pods offer each partition.
    fn classify(&mut self) {
        let mut totals = vec![0.0; self.spots];
        // Cold spreads over the same partitions by the same law add up.
        let mut cold: Vec<(f64, &ColdSpec, f64)> = Vec::new();
        for pod in self.pods.iter().filter(|p| p.state == PodState::Running) {
            for source in &pod.sources {
                match &source.target {
                    Target::Hot { spot, .. } => totals[*spot] += source.rate,
                    Target::Cold {
                        spec, normaliser, ..
                    } => match cold
                        .iter_mut()
                        .find(|c| c.1.partitions == spec.partitions && c.1.zipf == spec.zipf)
                    {
                        Some(same) => same.0 += source.rate,
                        None => cold.push((source.rate, spec, *normaliser)),
                    },
                }
            }
        }
        let limit = self.limit;
        let expected = |rank: u64| -> f64 {
            cold.iter()
                .map(|(rate, spec, norm)| rate * spec.weight(rank, *norm))
                .sum()
        };
        let ranks = cold.iter().map(|c| c.1.partitions).max().unwrap_or(0);
        // The first rank offered below `rate`: weights never grow with rank.
        let first_below = |rate: f64| {
            let (mut lo, mut hi) = (0u64, ranks);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if expected(mid) >= rate {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let load = |rate: f64| {
            if rate >= limit {
                Load::Over
            } else if rate >= WARM_FRACTION * limit {
                Load::Warm
            } else {
                Load::Cold
            }
        };
        self.loads = Loads {
            spots: totals.into_iter().map(load).collect(),
            cold_over: first_below(limit),
            cold_warm: first_below(WARM_FRACTION * limit),
        };
    }

    fn lost(&mut self) -> bool {
        let loss = self.workload.network.loss;
        loss > 0.0 && self.network.random::<f64>() < loss
    }

    fn outage(&self, now: Timestamp) -> bool {
        self.workload
            .outage_at(now.duration_since(Timestamp::EPOCH))
    }

    fn send(&mut self, p: usize, now: Timestamp) {
        let exchange = self.pods[p]
            .limiter
            .exchange(u32::try_from(p + 1).unwrap_or(u32::MAX), now);
        let network = &self.workload.network;
        if self.outage(now) {
            // Refused at once: the pod hears of it after a round trip.
            self.events
                .schedule(now.saturating_add(network.rtt), Kind::Fail(p));
        } else if self.lost() {
            self.events
                .schedule(now.saturating_add(network.request_timeout), Kind::Fail(p));
        } else {
            self.events.schedule(
                now.saturating_add(network.rtt / 2),
                Kind::Arrive(p, Box::new(exchange), now),
            );
        }
    }

    fn arrive(&mut self, p: usize, exchange: &Exchange, sent: Timestamp, now: Timestamp) {
        let network = &self.workload.network;
        let (half_rtt, timeout) = (network.rtt / 2, network.request_timeout);
        if self.outage(now) {
            self.events
                .schedule(now.saturating_add(half_rtt), Kind::Fail(p));
            return;
        }
        let answer = partition::exchange(&mut self.reports, &self.limits, exchange, now);
        if self.lost() {
            self.events
                .schedule(sent.saturating_add(timeout), Kind::Fail(p));
        } else {
            self.events.schedule(
                now.saturating_add(half_rtt),
                Kind::Answer(p, Box::new(answer)),
            );
        }
    }

    fn answer(&mut self, p: usize, answer: &ExchangeAnswer, now: Timestamp) {
        let pod = &mut self.pods[p];
        if pod.state != PodState::Running {
            return;
        }
        let next = pod.limiter.on_answer(answer, now, pod.draws.random());
        if let Some(since) = pod.fallback_since.take() {
            self.record.fallback_secs += now.seconds_since(since);
        }
        self.record.exchanges += 1;
        self.events
            .schedule(now.saturating_add(next), Kind::Send(p));
    }

    fn fail(&mut self, p: usize, now: Timestamp) {
        let pod = &mut self.pods[p];
        if pod.state != PodState::Running {
            return;
        }
        self.record.failed_exchanges += 1;
        let (next, whole) = pod.limiter.on_failure(now, pod.draws.random(), None);
        if whole && pod.limiter.last_answer().is_some() && pod.fallback_since.is_none() {
            pod.fallback_since = Some(now);
            self.record.fallbacks += 1;
        }
        self.events
            .schedule(now.saturating_add(next), Kind::Send(p));
    }
}
