//! Workloads: what the simulated pods want, read from YAML.
//!
//! A workload names a tenant's limits, the network between pods and server,
//! the server's outages, and groups of pods whose demand is a sum of terms
//! (tokens per second as a function of virtual time). Everything has a
//! default except the duration, the limits and the pods, so a workload file
//! says only what makes it different. Unknown fields are errors: a typo must
//! not silently run a different experiment.
//!
//! A workload may instead (or as well) give a per-partition limit
//! (`partitions:`, see [`partitions`]) and each pod group's operations on
//! hot and cold partitions; it then runs through the partition engine.
//!
//! A workload may instead give an organisation (`organisation:`, see
//! [`organisation`]): member tenants, each with its limits and its pods,
//! drawing on the organisation's bucket.
//!
//! The same structs write workloads ([`Workload::to_yaml`]): generated
//! workloads are built as values and written with serde, so these
//! definitions are the one statement of the format. A field that holds its
//! default is left out of what is written, and read back as that default.

use std::path::Path;
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use tollgate_core::local_bucket::LocalBucketConfig;

use crate::SimError;

pub mod organisation;
pub mod partitions;

pub use organisation::{MemberSpec, OrganisationSpec, Tree};
pub use partitions::{PartitionSpec, PodPartitions};

/// The longest virtual time a workload may run.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most pods a workload may have.
const MAX_PODS: usize = 100_000;

#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    #[serde(default, skip_serializing_if = "is_default")]
    pub description: String,
    /// Virtual time simulated.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Seeds demand noise, lost messages and retry jitter.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Pods' demand arrives as one acquisition per pod per tick.
    #[serde(default = "default_tick", with = "humantime_serde")]
    pub tick: Duration,
    /// The resolution of the recorded series and of every windowed measure.
    #[serde(default = "default_sample", with = "humantime_serde")]
    pub sample: Duration,
    /// Work waiting longer than this gives up, in the ideal bucket too.
    #[serde(default = "default_max_wait", with = "humantime_serde")]
    pub max_wait: Duration,
    /// The tenant's token bucket: runs the pods' local buckets against it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: Option<LimitsSpec>,
    /// A per-partition limit: runs the pods' partition counters.
    #[serde(default, skip_serializing_if = "is_default")]
    pub partitions: Option<PartitionSpec>,
    /// An organisation of tenants: runs its members' buckets drawing on
    /// its bucket, each member with its own pods.
    #[serde(default, skip_serializing_if = "is_default")]
    pub organisation: Option<OrganisationSpec>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub network: Network,
    #[serde(default, skip_serializing_if = "is_default")]
    pub outages: Vec<Outage>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub client: ClientSpec,
    /// The tenant's pods (an organisation's are under its members).
    #[serde(default, skip_serializing_if = "is_default")]
    pub pods: Vec<PodGroup>,
    /// Overrides of the goal thresholds, each with its reason.
    #[serde(default, skip_serializing_if = "is_default")]
    pub thresholds: ThresholdOverrides,
}

/// Whether `value` is what `#[serde(default)]` gives: such a field is
/// not written, since reading it back without it gives the same value.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn default_seed() -> u64 {
    1
}
fn default_tick() -> Duration {
    Duration::from_millis(100)
}
fn default_sample() -> Duration {
    Duration::from_secs(1)
}
fn default_max_wait() -> Duration {
    Duration::from_secs(10)
}

/// The tenant's limits.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// Tokens in the bucket at the start [default: `burst_limit`].
    #[serde(default, skip_serializing_if = "is_default")]
    pub initial_tokens: Option<f64>,
    /// A budget on the bucket, in a daily cycle from the start (virtual
    /// time starts at a UTC midnight): the grants of the server are cut to
    /// it, in the same code the stores run.
    #[serde(default, skip_serializing_if = "is_default")]
    pub budget: Option<BudgetSpec>,
}

/// A budget of the simulated bucket.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// Tokens the cycle may grant.
    pub amount: f64,
    /// `stop`, `notify`, or `throttle` with `baseline_rate` (and
    /// `baseline_burst`, default ten seconds of it).
    pub at_limit: String,
    #[serde(default, skip_serializing_if = "is_default")]
    pub baseline_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub baseline_burst: Option<f64>,
}

impl BudgetSpec {
    /// The core's budget: daily, in UTC, the default thresholds.
    pub fn budget(&self) -> Result<tollgate_core::budget::Budget, String> {
        use tollgate_core::budget::{AtLimit, Budget, CycleRule, Period};
        let at_limit = match (self.at_limit.as_str(), self.baseline_rate) {
            ("stop", None) => AtLimit::Stop,
            ("notify", None) => AtLimit::Notify,
            ("throttle", Some(rate)) => AtLimit::Throttle {
                baseline: tollgate_core::Limits {
                    refill_rate: rate,
                    burst_limit: self.baseline_burst.unwrap_or(rate * 10.0),
                },
            },
            (other, rate) => {
                return Err(format!(
                    "budget.at_limit {other:?} with baseline_rate {rate:?}: stop or notify without one, throttle with one"
                ));
            }
        };
        Budget::new(self.amount, CycleRule::utc(Period::Daily), at_limit)
            .validated()
            .map_err(|e| format!("budget.{}: {}", e.field, e.reason))
    }
}

impl LimitsSpec {
    pub fn initial(&self) -> f64 {
        self.initial_tokens.unwrap_or(self.burst_limit)
    }
}

/// The network between the pods and the server.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Round-trip time of a request and its answer.
    #[serde(default = "default_rtt", with = "humantime_serde")]
    pub rtt: Duration,
    /// Probability that a message (a request, or its answer) is lost.
    #[serde(default, skip_serializing_if = "is_default")]
    pub loss: f64,
    /// The longest a pod waits for an answer before it gives the attempt
    /// up and retries; it gives up sooner once it has measured answers
    /// (`LocalBucket::attempt_timeout`).
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
}

fn default_rtt() -> Duration {
    Duration::from_millis(10)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Default for Network {
    fn default() -> Self {
        Network {
            rtt: default_rtt(),
            loss: 0.0,
            request_timeout: default_request_timeout(),
        }
    }
}

/// A time the server is unreachable: requests fail after one round trip.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    #[serde(with = "humantime_serde")]
    pub start: Duration,
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
}

impl Outage {
    pub fn covers(&self, t: Duration) -> bool {
        t >= self.start && t < self.start + self.duration
    }
}

/// Overrides of the pods' local bucket configuration; unset knobs keep
/// the client's defaults.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    #[serde(default, skip_serializing_if = "is_default", with = "humantime_serde")]
    pub target_request_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub initial_tokens: Option<f64>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub buffer_tokens: Option<f64>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub backlog_factor: Option<f64>,
}

impl ClientSpec {
    pub fn config(&self) -> LocalBucketConfig {
        let mut config = LocalBucketConfig::default();
        if let Some(period) = self.target_request_period {
            config.target_request_period = period;
            config.report_interval = period;
        }
        if let Some(initial) = self.initial_tokens {
            config.initial_tokens = initial;
        }
        if let Some(buffer) = self.buffer_tokens {
            config.buffer_tokens = buffer;
        }
        if let Some(factor) = self.backlog_factor {
            config.backlog_factor = factor;
        }
        config
    }
}

/// `count` pods with the same demand.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PodGroup {
    /// Names the pods in plots: `name-0`, `name-1`… [default: `pod`].
    #[serde(default = "default_group_name")]
    pub name: String,
    #[serde(default = "default_count")]
    pub count: usize,
    /// When the group's first pod starts.
    #[serde(default, skip_serializing_if = "is_default", with = "humantime_serde")]
    pub join: Duration,
    /// The group's pods start evenly spread over this long after `join`.
    #[serde(default, skip_serializing_if = "is_default", with = "humantime_serde")]
    pub join_spread: Duration,
    /// When the group's pods shut down [default: never].
    #[serde(default, skip_serializing_if = "is_default", with = "humantime_serde")]
    pub leave: Option<Duration>,
    /// Tokens per second wanted: the sum of these terms, never below zero.
    /// Each term is a one-key map, `{ constant: 100 }`. Needs `limits`.
    #[serde(
        default,
        skip_serializing_if = "is_default",
        with = "serde_norway::with::singleton_map_recursive"
    )]
    pub demand: Vec<Term>,
    /// Operations on partitions, per pod. Needs `partitions`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub partitions: Option<PodPartitions>,
}

impl PodGroup {
    /// `count` pods named after `name`, there from the start to the end,
    /// wanting nothing yet.
    pub fn new(name: impl Into<String>, count: usize) -> PodGroup {
        PodGroup {
            name: name.into(),
            count,
            join: Duration::ZERO,
            join_spread: Duration::ZERO,
            leave: None,
            demand: Vec::new(),
            partitions: None,
        }
    }
}

fn default_group_name() -> String {
    "pod".into()
}
fn default_count() -> usize {
    1
}

/// One term of a pod's demand, in tokens per second.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Term {
    /// Always this rate.
    Constant(f64),
    /// Grows linearly by `by` between `start` and `end`, then holds.
    Ramp {
        #[serde(with = "humantime_serde")]
        start: Duration,
        #[serde(with = "humantime_serde")]
        end: Duration,
        by: f64,
    },
    /// Changes by `by` at `at`.
    Step {
        #[serde(with = "humantime_serde")]
        at: Duration,
        by: f64,
    },
    /// `amplitude × sin(2π (t / period + phase))`.
    Sine {
        amplitude: f64,
        #[serde(with = "humantime_serde")]
        period: Duration,
        #[serde(default, skip_serializing_if = "is_default")]
        phase: f64,
    },
    /// A gaussian bump of `height` centred on `at`, `width` its standard deviation.
    Bump {
        #[serde(with = "humantime_serde")]
        at: Duration,
        #[serde(with = "humantime_serde")]
        width: Duration,
        height: f64,
    },
    /// Gaussian noise of `stddev`, drawn anew every `every` (per pod).
    Noise {
        stddev: f64,
        #[serde(default = "default_noise_every", with = "humantime_serde")]
        every: Duration,
    },
    /// `rate` while on, nothing while off, starting on at `start`.
    OnOff {
        #[serde(with = "humantime_serde")]
        on: Duration,
        #[serde(with = "humantime_serde")]
        off: Duration,
        rate: f64,
        #[serde(default, skip_serializing_if = "is_default", with = "humantime_serde")]
        start: Duration,
    },
}

fn default_noise_every() -> Duration {
    Duration::from_secs(1)
}

/// A threshold a workload loosens or tightens, with the reason why.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    pub limit: f64,
    pub reason: String,
}

/// The goal thresholds a workload overrides (see `crate::check`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ThresholdOverrides {
    #[serde(default, skip_serializing_if = "is_default")]
    pub cumulative_divergence: Option<Override>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub overshoot_60s: Option<Override>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub convergence_periods: Option<Override>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub jain_index: Option<Override>,
}

/// One simulated pod, as expanded from its group.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSpec {
    pub name: String,
    pub group: usize,
    pub join: Duration,
    pub leave: Option<Duration>,
    pub demand: Vec<Term>,
    pub partitions: Option<PodPartitions>,
}

impl Workload {
    /// A workload of `pods` for `duration` with every other field at the
    /// default a file that leaves it out gets.
    pub fn new(name: impl Into<String>, duration: Duration, pods: Vec<PodGroup>) -> Workload {
        Workload {
            name: name.into(),
            description: String::new(),
            duration,
            seed: default_seed(),
            tick: default_tick(),
            sample: default_sample(),
            max_wait: default_max_wait(),
            limits: None,
            partitions: None,
            organisation: None,
            network: Network::default(),
            outages: Vec::new(),
            client: ClientSpec::default(),
            pods,
            thresholds: ThresholdOverrides::default(),
        }
    }

    pub fn load(path: &Path) -> Result<Workload, SimError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Read {
            path: path.to_owned(),
            source,
        })?;
        Workload::parse(&text).map_err(|e| e.in_file(path))
    }

    pub fn parse(text: &str) -> Result<Workload, SimError> {
        let workload: Workload =
            serde_norway::from_str(text).map_err(|e| SimError::Invalid(e.to_string()))?;
        workload.validate()?;
        Ok(workload)
    }

    /// The workload as YAML, which [`Workload::parse`] reads back equal.
    pub fn to_yaml(&self) -> Result<String, SimError> {
        serde_norway::to_string(self).map_err(|source| SimError::Yaml {
            name: self.name.clone(),
            source,
        })
    }

    /// Checks what serde cannot: ranges, orders, and that the run fits.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |msg: String| Err(SimError::Invalid(msg));
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad(format!(
                "name: {:?} must be non-empty letters, digits, '-' or '_' (it names output files)",
                self.name
            ));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return bad(format!(
                "duration: must be more than zero and at most {}",
                humantime::format_duration(MAX_DURATION)
            ));
        }
        if self.tick < Duration::from_millis(1) || self.tick > Duration::from_secs(1) {
            return bad("tick: must be between 1ms and 1s".into());
        }
        if self.sample < self.tick
            || !self
                .sample
                .as_micros()
                .is_multiple_of(self.tick.as_micros())
        {
            return bad("sample: must be a whole multiple of tick".into());
        }
        if self.max_wait < self.tick {
            return bad("max_wait: must be at least one tick".into());
        }
        if let Some(spec) = &self.limits {
            let limits = tollgate_core::global_bucket::Limits {
                refill_rate: spec.refill_rate,
                burst_limit: spec.burst_limit,
            };
            limits
                .validate()
                .map_err(|e| SimError::Invalid(format!("limits.{e}")))?;
            if spec.refill_rate <= 0.0 {
                return bad("limits.refill_rate: must be more than zero".into());
            }
            if let Some(initial) = spec.initial_tokens
                && !(initial.is_finite() && initial >= 0.0)
            {
                return bad("limits.initial_tokens: must be finite and non-negative".into());
            }
        }
        let period = self.client.config().target_request_period;
        if let Some(spec) = &self.partitions {
            spec.validate(period).map_err(SimError::Invalid)?;
        }
        if !(0.0..1.0).contains(&self.network.loss) {
            return bad("network.loss: must be in [0, 1)".into());
        }
        if self.network.request_timeout <= self.network.rtt {
            return bad("network.request_timeout: must be longer than network.rtt".into());
        }
        for (i, outage) in self.outages.iter().enumerate() {
            if outage.duration.is_zero() {
                return bad(format!("outages[{i}].duration: must be more than zero"));
            }
        }
        self.client
            .config()
            .validate()
            .map_err(|e| SimError::Invalid(format!("client.{e}")))?;
        let total = if let Some(org) = &self.organisation {
            org.validate().map_err(SimError::Invalid)?;
            if self.limits.is_some() || self.partitions.is_some() || !self.pods.is_empty() {
                return bad(
                    "organisation: an organisation workload has no limits, partitions or pods of its own (its pods are under its members)".into(),
                );
            }
            if self.thresholds != ThresholdOverrides::default() {
                return bad(
                    "thresholds: an organisation workload is held to the organisation goals (crate::check), which no workload overrides".into(),
                );
            }
            let mut total = 0usize;
            let mut members: Vec<(String, &MemberSpec)> = org
                .members
                .iter()
                .enumerate()
                .map(|(i, m)| (format!("organisation.members[{i}]"), m))
                .collect();
            while let Some((at, member)) = members.pop() {
                total = total.saturating_add(self.validate_groups(&member.pods, &at)?);
                members.extend(
                    member
                        .members
                        .iter()
                        .enumerate()
                        .map(|(i, m)| (format!("{at}.members[{i}]"), m)),
                );
            }
            total
        } else {
            if self.pods.is_empty() {
                return bad("pods: at least one group".into());
            }
            self.validate_groups(&self.pods, "")?
        };
        if total > MAX_PODS {
            return bad(format!("pods: {total} in all, at most {MAX_PODS}"));
        }
        if self.limits.is_none() && self.partitions.is_none() && self.organisation.is_none() {
            return bad(
                "limits: a workload needs limits (a token bucket), partitions, or both (or an organisation)".into(),
            );
        }
        if self.partitions.is_some() {
            self.hot_spots().map_err(SimError::Invalid)?;
            let operations: f64 = self
                .pods
                .iter()
                .filter_map(|g| Some(g.partitions.as_ref()?.rate() * g.count as f64))
                .sum::<f64>()
                * self.duration.as_secs_f64();
            if operations > partitions::MAX_OPERATIONS {
                return bad(format!(
                    "pods: {operations:.3e} operations on partitions in all, at most {:e} (shorten the run or lower the rates)",
                    partitions::MAX_OPERATIONS
                ));
            }
        }
        for (field, o) in [
            (
                "cumulative_divergence",
                &self.thresholds.cumulative_divergence,
            ),
            ("overshoot_60s", &self.thresholds.overshoot_60s),
            ("convergence_periods", &self.thresholds.convergence_periods),
            ("jain_index", &self.thresholds.jain_index),
        ] {
            if let Some(o) = o {
                if !(o.limit.is_finite() && o.limit >= 0.0) {
                    return bad(format!("thresholds.{field}.limit: must be finite and >= 0"));
                }
                if o.reason.trim().is_empty() {
                    return bad(format!(
                        "thresholds.{field}.reason: say why the goal does not apply"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks pod groups (`pods` of the workload, or of a member at
    /// `member`); returns how many pods they have.
    fn validate_groups(&self, groups: &[PodGroup], member: &str) -> Result<usize, SimError> {
        let bad = |msg: String| Err(SimError::Invalid(msg));
        let has_limits = self.limits.is_some() || self.organisation.is_some();
        let mut total = 0usize;
        for (g, group) in groups.iter().enumerate() {
            let at = |field: &str| {
                if member.is_empty() {
                    format!("pods[{g}].{field}")
                } else {
                    format!("{member}.pods[{g}].{field}")
                }
            };
            if group.count == 0 {
                return bad(format!("{}: must be at least 1", at("count")));
            }
            total = total.saturating_add(group.count);
            if let Some(leave) = group.leave
                && leave <= group.join + group.join_spread
            {
                return bad(format!("{}: must be after join + join_spread", at("leave")));
            }
            if has_limits && group.demand.is_empty() {
                return bad(format!("{}: at least one term", at("demand")));
            }
            if !has_limits && !group.demand.is_empty() {
                return bad(format!(
                    "{}: demand is for a token bucket: give the workload limits",
                    at("demand")
                ));
            }
            match (&group.partitions, &self.partitions) {
                (Some(ops), Some(_)) => {
                    ops.validate(&at("partitions")).map_err(SimError::Invalid)?
                }
                (Some(_), None) => {
                    return bad(format!(
                        "{}: operations on partitions need a partitions section (the limit)",
                        at("partitions")
                    ));
                }
                (None, _) => {}
            }
            for (k, term) in group.demand.iter().enumerate() {
                term.validate()
                    .map_err(|msg| SimError::Invalid(format!("{}[{k}]: {msg}", at("demand"))))?;
            }
        }
        Ok(total)
    }

    /// Every pod, in a fixed order (the instance id is the index + 1).
    pub fn pod_specs(&self) -> Vec<PodSpec> {
        let mut pods = Vec::new();
        for (g, group) in self.pods.iter().enumerate() {
            for i in 0..group.count {
                let offset = if group.count > 1 {
                    group.join_spread.mul_f64(i as f64 / group.count as f64)
                } else {
                    Duration::ZERO
                };
                pods.push(PodSpec {
                    name: format!("{}-{i}", group.name),
                    group: g,
                    join: group.join + offset,
                    leave: group.leave,
                    demand: group.demand.clone(),
                    partitions: group.partitions.clone(),
                });
            }
        }
        pods
    }

    /// True if every pod wants the same (noise aside) over the same lifetime.
    pub fn equal_demand(&self) -> bool {
        let Some(first) = self.pods.first() else {
            return true;
        };
        self.pods
            .iter()
            .all(|g| g.demand == first.demand && g.join == first.join && g.leave == first.leave)
            && self.pods.iter().all(|g| g.join_spread.is_zero())
    }

    /// Moments where demand changes abruptly: steps, on/off edges, pods
    /// joining or leaving. Convergence is measured after each. Changes less
    /// than a target request period apart (pods joining one after another)
    /// count as one, at the last of them.
    pub fn demand_changes(&self) -> Vec<Duration> {
        let period = self.client.config().target_request_period;
        let all = self.all_demand_changes();
        let mut merged: Vec<Duration> = Vec::new();
        for t in all {
            match merged.last_mut() {
                Some(last) if t < *last + period => *last = t,
                _ => merged.push(t),
            }
        }
        merged
    }

    fn all_demand_changes(&self) -> Vec<Duration> {
        let mut times = Vec::new();
        for pod in self.pod_specs() {
            if !pod.join.is_zero() {
                times.push(pod.join);
            }
            if let Some(leave) = pod.leave {
                times.push(leave);
            }
            for term in &pod.demand {
                match term {
                    Term::Step { at, .. } => times.push(*at),
                    Term::OnOff { on, off, start, .. } => {
                        let mut t = *start;
                        while t < self.duration {
                            times.push(t);
                            times.push(t + *on);
                            t += *on + *off;
                        }
                    }
                    _ => {}
                }
            }
        }
        times.retain(|t| !t.is_zero() && *t < self.duration);
        times.sort();
        times.dedup();
        times
    }

    pub fn outage_at(&self, t: Duration) -> bool {
        self.outages.iter().any(|o| o.covers(t))
    }

    /// The distinct hot spots the pods' operations go to.
    pub fn hot_spots(&self) -> Result<Vec<partitions::HotSpot>, String> {
        partitions::hot_spots(
            self.pods
                .iter()
                .enumerate()
                .filter_map(|(g, group)| Some((g, group.partitions.as_ref()?))),
        )
    }

    /// How often the pods report their hot partitions.
    pub fn report_period(&self) -> Duration {
        let period = self.client.config().target_request_period;
        self.partitions
            .as_ref()
            .map_or(period, |p| p.report_period(period))
    }
}

impl Term {
    fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be finite"))
            }
        };
        match self {
            Term::Constant(rate) => finite("constant", *rate),
            Term::Ramp { start, end, by } => {
                finite("by", *by)?;
                if end <= start {
                    return Err("ramp end must be after its start".into());
                }
                Ok(())
            }
            Term::Step { by, .. } => finite("by", *by),
            Term::Sine {
                amplitude,
                period,
                phase,
            } => {
                finite("amplitude", *amplitude)?;
                finite("phase", *phase)?;
                if period.is_zero() {
                    return Err("sine period must be more than zero".into());
                }
                Ok(())
            }
            Term::Bump { width, height, .. } => {
                finite("height", *height)?;
                if width.is_zero() {
                    return Err("bump width must be more than zero".into());
                }
                Ok(())
            }
            Term::Noise { stddev, every } => {
                if !(stddev.is_finite() && *stddev >= 0.0) {
                    return Err("noise stddev must be finite and non-negative".into());
                }
                if every.is_zero() {
                    return Err("noise every must be more than zero".into());
                }
                Ok(())
            }
            Term::OnOff { on, off, rate, .. } => {
                finite("rate", *rate)?;
                if on.is_zero() || off.is_zero() {
                    return Err("on_off on and off must be more than zero".into());
                }
                Ok(())
            }
        }
    }
}

/// A pod's demand over time: the terms, with the pod's own noise.
///
/// Noise is drawn from a generator seeded by the workload seed and the pod's
/// index alone, so every policy and the ideal bucket see the same demand.
#[derive(Debug)]
pub struct Demand {
    terms: Vec<Term>,
    noise: Vec<NoiseState>,
}

#[derive(Debug)]
struct NoiseState {
    rng: ChaCha8Rng,
    interval: Option<u128>,
    value: f64,
}

impl Demand {
    pub fn new(terms: &[Term], seed: u64, pod_index: usize) -> Demand {
        let noise = terms
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(t, Term::Noise { .. }))
            .map(|(k, _)| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(((pod_index as u64) << 8) | (k as u64 & 0xff));
                NoiseState {
                    rng,
                    interval: None,
                    value: 0.0,
                }
            })
            .collect();
        Demand {
            terms: terms.to_vec(),
            noise,
        }
    }

    /// Tokens per second wanted at `t` (never negative). Calls must come in
    /// non-decreasing `t` for the noise to be the same in every run.
    pub fn rate(&mut self, t: Duration) -> f64 {
        let secs = t.as_secs_f64();
        let mut noise = self.noise.iter_mut();
        let mut rate = 0.0;
        for term in &self.terms {
            rate += match term {
                Term::Constant(r) => *r,
                Term::Ramp { start, end, by } => {
                    let span = end.as_secs_f64() - start.as_secs_f64();
                    by * ((secs - start.as_secs_f64()) / span).clamp(0.0, 1.0)
                }
                Term::Step { at, by } => {
                    if t >= *at {
                        *by
                    } else {
                        0.0
                    }
                }
                Term::Sine {
                    amplitude,
                    period,
                    phase,
                } => {
                    amplitude
                        * (std::f64::consts::TAU * (secs / period.as_secs_f64() + phase)).sin()
                }
                Term::Bump { at, width, height } => {
                    let z = (secs - at.as_secs_f64()) / width.as_secs_f64();
                    height * (-0.5 * z * z).exp()
                }
                Term::Noise { stddev, every } => match noise.next() {
                    Some(state) => {
                        let interval = t.as_micros() / every.as_micros().max(1);
                        if state.interval != Some(interval) {
                            state.interval = Some(interval);
                            state.value =
                                Normal::new(0.0, *stddev).map_or(0.0, |n| n.sample(&mut state.rng));
                        }
                        state.value
                    }
                    None => 0.0,
                },
                Term::OnOff {
                    on,
                    off,
                    rate,
                    start,
                } => {
                    if t < *start {
                        0.0
                    } else {
                        let cycle = (*on + *off).as_micros();
                        let phase = (t - *start).as_micros() % cycle;
                        if phase < on.as_micros() { *rate } else { 0.0 }
                    }
                }
            };
        }
        rate.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "
name: t
duration: 60s
limits: { refill_rate: 100, burst_limit: 1000 }
pods:
  - count: 2
    demand: [ { constant: 50 } ]
";

    #[test]
    fn defaults_fill_in_what_a_workload_leaves_out() {
        let w = Workload::parse(MINIMAL).expect("valid");
        assert_eq!(w.tick, Duration::from_millis(100));
        assert_eq!(w.network.rtt, Duration::from_millis(10));
        assert_eq!(w.limits.as_ref().map(LimitsSpec::initial), Some(1000.0));
        assert_eq!(w.pod_specs().len(), 2);
        assert!(w.equal_demand());
    }

    #[test]
    fn a_workload_written_as_yaml_reads_back_the_same() {
        let every_field = "
name: every-field
description: Each field set, none at its default.
duration: 10m
seed: 7
tick: 50ms
sample: 2s
max_wait: 5s
limits: { refill_rate: 100.5, burst_limit: 0, initial_tokens: 12.25 }
partitions: { limit: 40, report_period: 5s, arrivals: even }
network: { rtt: 1ms, loss: 0.001, request_timeout: 1s }
outages: [ { start: 1m, duration: 1500ms } ]
client: { target_request_period: 5s, initial_tokens: 3, buffer_tokens: 7, backlog_factor: 0.5 }
pods:
  - name: p
    count: 3
    join: 1s
    join_spread: 2s
    leave: 9m
    demand:
      - constant: 1e-7
      - noise: { stddev: 0.1, every: 250ms }
      - step: { at: 60s, by: -500 }
      - ramp: { start: 10s, end: 40s, by: 300 }
      - sine: { amplitude: 200, period: 60s, phase: 0.25 }
      - bump: { at: 120s, width: 3s, height: 1500 }
      - on_off: { on: 30s, off: 30s, rate: 500, start: 1s }
    partitions:
      hot: [ { rate: 50, partition: 2, moving: { every: 20s, among: 3 } } ]
      cold: { rate: 0.3333, partitions: 1000, zipf: 1.1 }
thresholds:
  cumulative_divergence: { limit: 0.02, reason: \"a\" }
  overshoot_60s: { limit: 0.03, reason: \"b\" }
  convergence_periods: { limit: 3, reason: \"c\" }
  jain_index: { limit: 0.9, reason: \"d\" }
";
        for text in [MINIMAL, PARTITIONS, every_field] {
            let w = Workload::parse(text).expect("valid");
            let yaml = w.to_yaml().expect("writes");
            assert_eq!(Workload::parse(&yaml).expect("reads back"), w, "{yaml}");
        }
        // What holds its default is left out.
        let minimal = Workload::parse(MINIMAL).expect("valid");
        let yaml = minimal.to_yaml().expect("writes");
        for field in [
            "description",
            "outages",
            "client",
            "thresholds",
            "join",
            "leave",
        ] {
            assert!(!yaml.contains(field), "{field} in\n{yaml}");
        }
    }

    #[test]
    fn bad_workloads_are_refused_with_the_field_named() {
        let cases = [
            ("duration: 60s", "duration: 0s", "duration"),
            ("refill_rate: 100", "refill_rate: -1", "refill_rate"),
            ("count: 2", "count: 0", "count"),
            ("{ constant: 50 }", "{ constnt: 50 }", "constnt"),
            ("name: t", "name: a/b", "name"),
            ("count: 2", "count: 2\n    leave: 0s", "leave"),
        ];
        for (from, to, field) in cases {
            let text = MINIMAL.replace(from, to);
            let err = Workload::parse(&text).expect_err(to).to_string();
            assert!(err.contains(field), "{to}: {err}");
        }
        let loosened =
            format!("{MINIMAL}thresholds:\n  jain_index: {{ limit: 0.5, reason: \"\" }}\n");
        let err = Workload::parse(&loosened)
            .expect_err("no reason")
            .to_string();
        assert!(err.contains("reason"), "{err}");
    }

    #[test]
    fn terms_add_up_and_never_go_below_zero() {
        let secs = Duration::from_secs;
        let terms = vec![
            Term::Constant(100.0),
            Term::Step {
                at: secs(10),
                by: -300.0,
            },
            Term::Ramp {
                start: secs(20),
                end: secs(40),
                by: 400.0,
            },
            Term::OnOff {
                on: secs(5),
                off: secs(5),
                rate: 50.0,
                start: secs(100),
            },
        ];
        let mut d = Demand::new(&terms, 1, 0);
        assert_eq!(d.rate(secs(0)), 100.0);
        assert_eq!(d.rate(secs(10)), 0.0);
        assert_eq!(d.rate(secs(30)), 0.0);
        assert_eq!(d.rate(secs(40)), 200.0);
        assert_eq!(d.rate(secs(102)), 250.0);
        assert_eq!(d.rate(secs(107)), 200.0);
        let bump = [Term::Bump {
            at: secs(10),
            width: secs(2),
            height: 80.0,
        }];
        let mut b = Demand::new(&bump, 1, 0);
        assert_eq!(b.rate(secs(10)), 80.0);
        assert!(b.rate(secs(30)) < 1e-6);
    }

    #[test]
    fn noise_depends_on_the_seed_and_the_pod_only() {
        let terms = [
            Term::Constant(1000.0),
            Term::Noise {
                stddev: 100.0,
                every: Duration::from_secs(1),
            },
        ];
        let series = |seed, pod| {
            let mut d = Demand::new(&terms, seed, pod);
            (0..50)
                .map(|i| d.rate(Duration::from_millis(i * 100)))
                .collect::<Vec<_>>()
        };
        assert_eq!(series(7, 3), series(7, 3));
        assert_ne!(series(7, 3), series(7, 4));
        assert_ne!(series(7, 3), series(8, 3));
        // Held for a whole `every`.
        let s = series(7, 3);
        assert_eq!(s[0], s[9]);
        assert_ne!(s[9], s[10]);
    }

    #[test]
    fn demand_changes_list_steps_edges_and_lifetimes() {
        let text = MINIMAL.replace(
            "demand: [ { constant: 50 } ]",
            "join: 5s\n    leave: 50s\n    demand: [ { step: { at: 20s, by: 10 } } ]",
        );
        let w = Workload::parse(&text).expect("valid");
        assert_eq!(
            w.demand_changes(),
            vec![
                Duration::from_secs(5),
                Duration::from_secs(20),
                Duration::from_secs(50)
            ]
        );
    }

    const ORGANISATION: &str = "
name: o
duration: 60s
organisation:
  name: acme
  limits: { refill_rate: 100, burst_limit: 1000 }
  draw_period: 5s
  members:
    - name: acme-prod
      limits: { refill_rate: 1000, burst_limit: 1000 }
      guaranteed: 40
      pods:
        - name: web
          count: 2
          demand: [ { constant: 100 } ]
    - name: labs
      limits: { refill_rate: 80, burst_limit: 800 }
      members:
        - name: labs-ci
          limits: { refill_rate: 500, burst_limit: 500 }
          pods: [ { demand: [ { constant: 30 } ], join: 10s } ]
";

    #[test]
    fn an_organisation_flattens_top_down_with_its_pods_in_order() {
        let w = Workload::parse(ORGANISATION).expect("valid");
        let yaml = w.to_yaml().expect("writes");
        assert_eq!(Workload::parse(&yaml).expect("reads back"), w, "{yaml}");
        let tree = Tree::new(w.organisation.as_ref().expect("organisation"));
        let names: Vec<&str> = tree.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["acme", "acme-prod", "labs", "labs-ci"]);
        assert_eq!(tree.draw_period, Duration::from_secs(5));
        assert_eq!(tree.tenants().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(
            (tree.nodes[0].pods.clone(), tree.nodes[2].pods.clone()),
            (0..3, 2..3)
        );
        assert_eq!(tree.nodes[3].parent, Some(2));
        assert_eq!(tree.nodes[3].depth, 2);
        assert_eq!(tree.tenant_of(2), Some(3));
        assert!(tree.is_below(3, 0) && tree.is_below(3, 2) && !tree.is_below(1, 2));
        // A node's view is a plain workload of the pods below it.
        let view = tree.view(&w, 2);
        assert!(view.organisation.is_none());
        assert_eq!(view.limits.as_ref().map(|l| l.refill_rate), Some(80.0));
        let pods: Vec<String> = view.pod_specs().into_iter().map(|p| p.name).collect();
        assert_eq!(pods, ["labs-ci/pod-0"]);
        assert_eq!(view.demand_changes(), vec![Duration::from_secs(10)]);
        assert_eq!(tree.view(&w, 0).pod_specs().len(), 3);
        // The default draw period is the server's, and is not written.
        let default = ORGANISATION.replace("  draw_period: 5s\n", "");
        let w = Workload::parse(&default).expect("valid");
        assert_eq!(
            w.organisation.as_ref().map(|o| o.draw_period),
            Some(Duration::from_secs(10))
        );
        assert!(!w.to_yaml().expect("writes").contains("draw_period"));
    }

    #[test]
    fn bad_organisations_are_refused_with_the_field_named() {
        let deep = "    - name: labs\n      limits: { refill_rate: 80, burst_limit: 800 }\n      members:\n";
        let nest = |levels: usize| {
            let mut text = String::from(
                "organisation:\n  limits: { refill_rate: 100, burst_limit: 1000 }\n  members:\n",
            );
            for level in 0..levels {
                let pad = "  ".repeat(level * 2);
                text.push_str(&format!(
                    "{pad}    - name: o{level}\n{pad}      limits: {{ refill_rate: 80, burst_limit: 800 }}\n{pad}      members:\n"
                ));
            }
            let pad = "  ".repeat(levels * 2);
            text.push_str(&format!(
                "{pad}    - name: t\n{pad}      limits: {{ refill_rate: 8, burst_limit: 8 }}\n{pad}      pods: [ {{ demand: [ {{ constant: 1 }} ] }} ]\n"
            ));
            format!("name: n\nduration: 60s\n{text}")
        };
        // Four organisations above a tenant are allowed, five are not.
        Workload::parse(&nest(3)).expect("four deep");
        let err = Workload::parse(&nest(4))
            .expect_err("five deep")
            .to_string();
        assert!(err.contains("at most 4"), "{err}");
        let cases = [
            ("name: labs-ci", "name: acme-prod", "used twice"),
            ("name: acme\n", "name: Acme Corp\n", "organisation.name"),
            ("guaranteed: 40", "guaranteed: -1", "members[0].guaranteed"),
            (
                "{ refill_rate: 80, burst_limit: 800 }",
                "{ refill_rate: 0, burst_limit: 800 }",
                "members[1].limits.refill_rate",
            ),
            (
                "{ refill_rate: 500, burst_limit: 500 }",
                "{ refill_rate: 500, burst_limit: 500, initial_tokens: 5 }",
                "starts empty",
            ),
            (
                "count: 2",
                "count: 0",
                "organisation.members[0].pods[0].count",
            ),
            (
                deep,
                "    - name: labs\n      limits: { refill_rate: 80, burst_limit: 800 }\n      pods: [ { demand: [ { constant: 1 } ] } ]\n      members:\n",
                "exactly one",
            ),
            ("draw_period: 5s", "draw_period: 2h", "draw_period"),
            (
                "duration: 60s\n",
                "duration: 60s\nlimits: { refill_rate: 1, burst_limit: 1 }\n",
                "no limits",
            ),
            (
                "duration: 60s\n",
                "duration: 60s\nthresholds:\n  jain_index: { limit: 0.5, reason: x }\n",
                "thresholds",
            ),
            ("constant: 30", "constnt: 30", "constnt"),
        ];
        for (from, to, field) in cases {
            assert!(ORGANISATION.contains(from), "{from}");
            let text = ORGANISATION.replace(from, to);
            let err = Workload::parse(&text).expect_err(to).to_string();
            assert!(err.contains(field), "{to}: {err}");
        }
    }

    const PARTITIONS: &str = "
name: p
duration: 60s
partitions: { limit: 100 }
pods:
  - count: 3
    partitions:
      hot: [ { rate: 50, partition: 2 }, { rate: 10, partition: 5, moving: { every: 20s, among: 3 } } ]
      cold: { rate: 200, partitions: 1000, zipf: 1.0 }
";

    #[test]
    fn a_partition_workload_needs_no_bucket() {
        let w = Workload::parse(PARTITIONS).expect("valid");
        assert!(w.limits.is_none());
        assert_eq!(w.report_period(), Duration::from_secs(10));
        let spots = w.hot_spots().expect("spots");
        assert_eq!(spots.len(), 2);
        assert_eq!(spots[1].partition_at(Duration::from_secs(45)), 7);
        let faster = PARTITIONS.replace("{ limit: 100 }", "{ limit: 100, report_period: 2s }");
        assert_eq!(
            Workload::parse(&faster).expect("valid").report_period(),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn bad_partition_workloads_are_refused_with_the_field_named() {
        let cases = [
            ("{ limit: 100 }", "{ limit: 0 }", "partitions.limit"),
            ("{ limit: 100 }", "{ limit: 100, period: 1s }", "period"),
            (
                "{ limit: 100 }",
                "{ limit: 100, arrivals: bursty }",
                "bursty",
            ),
            (
                "{ limit: 100 }",
                "{ limit: 100, report_period: 1h }",
                "report_period",
            ),
            ("rate: 50,", "rat: 50,", "rat"),
            ("rate: 50,", "rate: -50,", "hot[0].rate"),
            ("among: 3", "among: 1", "moving.among"),
            ("every: 20s", "every: 10ms", "moving.every"),
            ("partitions: 1000,", "partitions: 0,", "cold.partitions"),
            ("zipf: 1.0", "zipf: -1", "cold.zipf"),
            // Another hot spot over partitions another already moves among.
            ("partition: 2 }", "partition: 6 }", "overlap"),
            ("partitions: { limit: 100 }\n", "", "partitions section"),
            (
                "    partitions:\n",
                "    demand: [ { constant: 1 } ]\n    partitions:\n",
                "limits",
            ),
            ("rate: 200,", "rate: 1e9,", "operations"),
        ];
        for (from, to, field) in cases {
            assert!(PARTITIONS.contains(from), "{from}");
            let text = PARTITIONS.replace(from, to);
            let err = Workload::parse(&text).expect_err(to).to_string();
            assert!(err.contains(field), "{to}: {err}");
        }
        let neither = MINIMAL
            .replace("limits: { refill_rate: 100, burst_limit: 1000 }\n", "")
            .replace("    demand: [ { constant: 50 } ]\n", "");
        let err = Workload::parse(&neither)
            .expect_err("nothing to run")
            .to_string();
        assert!(err.contains("needs limits"), "{err}");
    }
}
