//! The discrete-event simulation of one tenant: its pods' local buckets and
//! the global bucket, in virtual time.
//!
//! The pods run `tollgate-core`'s [`LocalBucket`] and the server runs
//! [`global_bucket::request`] — the code the client and the server run —
//! with a store that loads the same rows a real store loads per request.
//! Between them is a network with a round-trip time, lost messages and
//! outages. Events (ticks of demand, pod wake-ups, messages) are processed in
//! time order, ties in the order they were scheduled, and all randomness
//! comes from generators seeded by the workload: one seed, one result.
//!
//! Every `tick`, each running pod acquires the tokens its demand asks for in
//! that tick (one acquisition), after cancelling acquisitions that waited
//! `max_wait`. Between ticks a pod is polled when it asked to be (its
//! `wake_at`), or when an answer or a failure reaches it.
//!
//! The server's store is the stores' transaction script over one bucket's
//! rows in memory: `Batch` loads each request's window and writes back
//! with `BucketWrite::apply_to`. The event queue (`Events`: virtual time,
//! ties in scheduling order) serves the partition engine too.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate_core::budget::BucketBudget;
use tollgate_core::global_bucket::{
    self, BucketRow, GlobalBucketConfig, Grant, InstanceId, InstanceState, Limits,
    TokenBucketRequest,
};
use tollgate_core::local_bucket::{Admission, LocalBucket, WaiterId};
use tollgate_core::time::Timestamp;
use tollgate_core::transaction::{Answer, Batch, UnconfiguredTenants};
use tollgate_core::{BucketKey, TenantId};

use crate::SimError;
use crate::ideal::IdealBucket;
use crate::record::{BudgetOutcome, Record};
use crate::workload::{Demand, LimitsSpec, PodSpec, Workload};

/// The grant policies compared: the core's own.
pub use tollgate_core::global_bucket::GrantPolicy as Policy;

fn at(d: Duration) -> Timestamp {
    Timestamp::EPOCH.saturating_add(d)
}

fn secs(t: Timestamp) -> f64 {
    t.seconds_since(Timestamp::EPOCH)
}

/// The tenant's rows, kept the way a store keeps them, and served by the
/// stores' transaction script ([`Batch`]): a request loads only the rows of
/// its window and writes back what changed.
#[derive(Debug)]
struct Store {
    key: BucketKey,
    head: BucketRow,
    instances: BTreeMap<InstanceId, InstanceState>,
    config: GlobalBucketConfig,
}

impl Store {
    fn request(
        &mut self,
        request: &TokenBucketRequest,
        now: Timestamp,
    ) -> Result<Grant, global_bucket::RequestError> {
        let plan = Batch::plan(
            [(&self.key, request.instance_id)],
            self.config.cleanup_window,
        );
        let heads = BTreeMap::from([(self.key.clone(), self.head.clone())]);
        let mut batch = Batch::open(
            plan.lock,
            heads,
            &BTreeMap::new(),
            &UnconfiguredTenants::Reject,
            now,
        );
        for window in &plan.windows {
            batch.load(&self.key, window.select(&self.instances).into_values());
        }
        let answer = batch.serve(&self.key, request, now, &self.config);
        for write in batch.writes() {
            write.apply_to(&mut self.head, &mut self.instances);
        }
        match answer {
            Answer::Granted(grant) => Ok(grant),
            Answer::Refused(e) => Err(e),
            Answer::NotFound | Answer::TenantRefused(_) | Answer::Deferred => Err(
                global_bucket::RequestError::Inconsistent(format!("a lone request got {answer:?}")),
            ),
        }
    }
}

#[derive(Debug)]
enum Kind {
    Tick(u64),
    Wake(usize),
    /// A request reaches the server.
    Arrive(usize, Box<TokenBucketRequest>),
    /// The answer to `seq` reaches the pod.
    Answer(usize, u64, Grant),
    /// The pod learns that request `seq` failed.
    Fail(usize, u64),
    End,
}

/// Something that happens at `at` in virtual time; events at the same
/// time happen in the order they were scheduled (`order`).
#[derive(Debug)]
pub(crate) struct Event<K> {
    pub(crate) at: Timestamp,
    order: u64,
    pub(crate) kind: K,
}

/// The events still to happen, earliest first: both engines' queue.
#[derive(Debug)]
pub(crate) struct Events<K> {
    heap: BinaryHeap<Reverse<Event<K>>>,
    order: u64,
}

impl<K> Events<K> {
    pub(crate) fn new() -> Self {
        Events {
            heap: BinaryHeap::new(),
            order: 0,
        }
    }

    /// Schedules `kind` at `at`, after anything already scheduled then.
    pub(crate) fn schedule(&mut self, at: Timestamp, kind: K) {
        self.order += 1;
        self.heap.push(Reverse(Event {
            at,
            order: self.order,
            kind,
        }));
    }

    /// The next event to happen.
    pub(crate) fn pop(&mut self) -> Option<Event<K>> {
        self.heap.pop().map(|Reverse(event)| event)
    }
}

impl<K> PartialEq for Event<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl<K> Eq for Event<K> {}
impl<K> PartialOrd for Event<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Event<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

#[derive(Debug, PartialEq)]
enum PodState {
    NotStarted,
    Running,
    /// Shut down; sending its final report.
    Closing,
    Done,
}

#[derive(Debug)]
struct Pod {
    spec: PodSpec,
    demand: Demand,
    state: PodState,
    bucket: Option<LocalBucket>,
    /// Queued acquisitions, oldest first: `(id, tokens, arrived)`.
    waiters: VecDeque<(WaiterId, f64, Timestamp)>,
    wake: Option<Timestamp>,
    started: Timestamp,
    stopped: Option<Timestamp>,
}

struct Sim<'w> {
    workload: &'w Workload,
    store: Store,
    pods: Vec<Pod>,
    events: Events<Kind>,
    rng: ChaCha8Rng,
    record: Record,
    sample_demand: Vec<f64>,
    sample_admitted: Vec<f64>,
    rtt: Duration,
    half_rtt: Duration,
    max_wait: f64,
}

/// Runs `workload` against the bucket `spec` (its `limits`) under `policy`
/// and records what the pods admitted.
pub fn simulate(
    workload: &Workload,
    spec: &LimitsSpec,
    policy: Policy,
) -> Result<Record, SimError> {
    let specs = workload.pod_specs();
    let n = specs.len();
    let limits = Limits {
        refill_rate: spec.refill_rate,
        burst_limit: spec.burst_limit,
    };
    let mut head = BucketRow::new(limits, spec.initial(), true, Timestamp::EPOCH);
    if let Some(budget) = &spec.budget {
        let budget = budget.budget().map_err(SimError::Invalid)?;
        head.budget = Some(Box::new(
            BucketBudget::start(budget, Timestamp::EPOCH)
                .map_err(|e| SimError::Invalid(e.to_string()))?,
        ));
    }
    let store = Store {
        key: BucketKey::request_units(
            TenantId::parse("tenant_id", "simulated")
                .map_err(|e| SimError::Invalid(e.to_string()))?,
        ),
        head,
        instances: BTreeMap::new(),
        config: GlobalBucketConfig {
            policy,
            ..GlobalBucketConfig::default()
        },
    };
    let pods = specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| Pod {
            demand: Demand::new(&spec.demand, workload.seed, i),
            spec,
            state: PodState::NotStarted,
            bucket: None,
            waiters: VecDeque::new(),
            wake: None,
            started: Timestamp::EPOCH,
            stopped: None,
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(workload.seed);
    // The network's generator is a stream of its own, apart from demand noise.
    rng.set_stream(u64::MAX);
    let mut sim = Sim {
        workload,
        store,
        pods,
        events: Events::new(),
        rng,
        record: Record::new(
            n,
            workload.sample.as_secs_f64(),
            workload.max_wait.as_secs_f64(),
        ),
        sample_demand: vec![0.0; n],
        sample_admitted: vec![0.0; n],
        rtt: workload.network.rtt,
        half_rtt: workload.network.rtt / 2,
        max_wait: workload.max_wait.as_secs_f64(),
    };
    sim.run()?;
    let end = at(workload.duration);
    sim.record.budget = sim.store.head.budget.as_ref().map(|b| {
        let view = b.view(&sim.store.head.state, end);
        BudgetOutcome {
            amount: view.budget.amount,
            granted: view.usage.granted_tokens,
            spend: view.usage.spend(),
            reached_at: view.limit_reached_at.map(secs),
        }
    });
    Ok(sim.record)
}

impl Sim<'_> {
    fn run(&mut self) -> Result<(), SimError> {
        let end = at(self.workload.duration);
        self.events.schedule(end, Kind::End);
        self.events.schedule(Timestamp::EPOCH, Kind::Tick(0));
        while let Some(event) = self.events.pop() {
            let now = event.at;
            match event.kind {
                Kind::End => break,
                Kind::Tick(k) => self.tick(k, now)?,
                Kind::Wake(p) => {
                    if self.pods[p].wake == Some(now) {
                        self.pods[p].wake = None;
                        self.poll(p, now);
                    }
                }
                Kind::Arrive(p, request) => self.arrive(p, &request, now)?,
                Kind::Answer(p, seq, grant) => {
                    if let Some(bucket) = self.pods[p].bucket.as_mut() {
                        bucket.on_response(seq, &grant, now);
                        self.poll(p, now);
                    }
                }
                Kind::Fail(p, seq) => {
                    self.record.failed_requests += 1;
                    let jitter = self.rng.random::<f64>();
                    if let Some(bucket) = self.pods[p].bucket.as_mut() {
                        bucket.on_failure(seq, now, jitter, None);
                        self.poll(p, now);
                    }
                }
            }
        }
        self.finish(end);
        Ok(())
    }

    fn tick(&mut self, k: u64, now: Timestamp) -> Result<(), SimError> {
        let tick = self.workload.tick;
        let per_sample = (self.workload.sample.as_micros() / tick.as_micros()) as u64;
        if k > 0 && k.is_multiple_of(per_sample) {
            self.flush_sample(now);
        }
        let t = now.duration_since(Timestamp::EPOCH);
        let dt = tick.as_secs_f64();
        for p in 0..self.pods.len() {
            let pod = &mut self.pods[p];
            match pod.state {
                PodState::NotStarted if pod.spec.join <= t => {
                    let lease = format!("{}@{}", pod.spec.name, now.unix_micros()).into_bytes();
                    let instance = u32::try_from(p + 1).unwrap_or(u32::MAX);
                    let bucket =
                        LocalBucket::new(self.workload.client.config(), instance, lease, now)
                            .map_err(|e| SimError::Invalid(format!("client: {e}")))?;
                    pod.bucket = Some(bucket);
                    pod.state = PodState::Running;
                    pod.started = now;
                }
                PodState::Running if pod.spec.leave.is_some_and(|leave| leave <= t) => {
                    if let Some(bucket) = pod.bucket.as_mut() {
                        bucket.close();
                    }
                    let refused: f64 = pod.waiters.drain(..).map(|w| w.1).sum();
                    self.record.timed_out += refused;
                    pod.state = PodState::Closing;
                    pod.stopped = Some(now);
                    self.poll(p, now);
                    continue;
                }
                _ => {}
            }
            let pod = &mut self.pods[p];
            if pod.state != PodState::Running {
                continue;
            }
            let Some(bucket) = pod.bucket.as_mut() else {
                continue;
            };
            while let Some(&(id, tokens, since)) = pod.waiters.front() {
                if now.seconds_since(since) + 1e-9 < self.max_wait {
                    break;
                }
                bucket.cancel(id);
                pod.waiters.pop_front();
                self.record.timed_out += tokens;
            }
            let amount = pod.demand.rate(t) * dt;
            if amount > 0.0 {
                self.sample_demand[p] += amount;
                match bucket.acquire(amount, now) {
                    Ok(Admission::Admitted) => {
                        self.sample_admitted[p] += amount;
                        self.record.waits.record(0.0, amount);
                    }
                    Ok(Admission::Queued(id)) => pod.waiters.push_back((id, amount, now)),
                    Ok(Admission::Closed) => self.record.timed_out += amount,
                    Err(e) => {
                        return Err(SimError::Invalid(format!(
                            "{}: demand of {amount} tokens in one tick refused: {e}",
                            pod.spec.name
                        )));
                    }
                }
            }
            self.poll(p, now);
        }
        let next = now.saturating_add(tick);
        if next < at(self.workload.duration) {
            self.events.schedule(next, Kind::Tick(k + 1));
        }
        Ok(())
    }

    fn poll(&mut self, p: usize, now: Timestamp) {
        let pod = &mut self.pods[p];
        let Some(bucket) = pod.bucket.as_mut() else {
            return;
        };
        let outcome = bucket.poll(now);
        for id in outcome.admitted {
            // Admissions come oldest first, as the waiters were queued.
            while let Some((waiter, tokens, since)) = pod.waiters.pop_front() {
                if waiter == id {
                    self.sample_admitted[p] += tokens;
                    self.record.waits.record(now.seconds_since(since), tokens);
                    break;
                }
            }
        }
        if pod.state == PodState::Closing && bucket.is_finished() {
            pod.state = PodState::Done;
            self.record.fallback_tokens += bucket.status().fallback_tokens;
            pod.wake = None;
            return;
        }
        if let Some(wake) = outcome.wake_at
            && pod.wake.is_none_or(|w| wake < w || w <= now)
        {
            pod.wake = Some(wake);
            self.events.schedule(wake, Kind::Wake(p));
        }
        if let Some(request) = outcome.request {
            self.send(p, request, now);
        }
    }

    fn lost(&mut self) -> bool {
        let loss = self.workload.network.loss;
        loss > 0.0 && self.rng.random::<f64>() < loss
    }

    fn send(&mut self, p: usize, request: TokenBucketRequest, now: Timestamp) {
        let seq = request.seq;
        if self
            .workload
            .outage_at(now.duration_since(Timestamp::EPOCH))
        {
            // Refused at once: the pod hears of it after a round trip.
            self.events
                .schedule(now.saturating_add(self.rtt), Kind::Fail(p, seq));
        } else if self.lost() {
            let timeout = self.workload.network.request_timeout;
            self.events
                .schedule(now.saturating_add(timeout), Kind::Fail(p, seq));
        } else {
            self.events.schedule(
                now.saturating_add(self.half_rtt),
                Kind::Arrive(p, Box::new(request)),
            );
        }
    }

    fn arrive(
        &mut self,
        p: usize,
        request: &TokenBucketRequest,
        now: Timestamp,
    ) -> Result<(), SimError> {
        let seq = request.seq;
        if self
            .workload
            .outage_at(now.duration_since(Timestamp::EPOCH))
        {
            self.events
                .schedule(now.saturating_add(self.half_rtt), Kind::Fail(p, seq));
            return Ok(());
        }
        let grant = self
            .store
            .request(request, now)
            .map_err(|e| SimError::Server {
                pod: self.pods[p].spec.name.clone(),
                at: secs(now),
                message: e.to_string(),
            })?;
        self.record.server_requests += 1;
        if self.lost() {
            // The answer is lost: the pod times out and sends the request again.
            let sent = now.saturating_sub(self.half_rtt);
            let timeout = self.workload.network.request_timeout;
            self.events
                .schedule(sent.saturating_add(timeout), Kind::Fail(p, seq));
        } else {
            self.events.schedule(
                now.saturating_add(self.half_rtt),
                Kind::Answer(p, seq, grant),
            );
        }
        Ok(())
    }

    fn flush_sample(&mut self, now: Timestamp) {
        let level = self.store.head.state.tokens_at(now);
        self.record.push_sample(
            secs(now),
            &mut self.sample_demand,
            &mut self.sample_admitted,
            level,
        );
    }

    fn finish(&mut self, end: Timestamp) {
        self.flush_sample(end);
        for pod in &self.pods {
            if pod.state == PodState::NotStarted {
                continue;
            }
            let stopped = pod.stopped.unwrap_or(end).min(end);
            self.record.pod_minutes += stopped.seconds_since(pod.started) / 60.0;
            if pod.state != PodState::Done
                && let Some(bucket) = &pod.bucket
            {
                self.record.fallback_tokens += bucket.status().fallback_tokens;
            }
        }
    }
}

/// Runs `workload` against the ideal bucket with `limits`.
pub fn simulate_ideal(workload: &Workload, limits: &LimitsSpec) -> Record {
    let specs = workload.pod_specs();
    let n = specs.len();
    let mut demand: Vec<Demand> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Demand::new(&spec.demand, workload.seed, i))
        .collect();
    let mut record = Record::new(
        n,
        workload.sample.as_secs_f64(),
        workload.max_wait.as_secs_f64(),
    );
    let mut bucket = IdealBucket::new(workload, limits);
    let mut sample_demand = vec![0.0; n];
    let mut sample_admitted = vec![0.0; n];
    let tick = workload.tick;
    let dt = tick.as_secs_f64();
    let per_sample = workload.sample.as_micros() / tick.as_micros();
    let ticks = workload.duration.as_micros().div_ceil(tick.as_micros());
    let mut started = vec![None; n];
    let mut running = vec![false; n];
    for k in 0..ticks {
        let t = tick * u32::try_from(k).unwrap_or(u32::MAX);
        let now = t.as_secs_f64();
        if k > 0 && k.is_multiple_of(per_sample) {
            record.push_sample(
                now,
                &mut sample_demand,
                &mut sample_admitted,
                bucket.tokens(),
            );
        }
        let mut arrivals = Vec::new();
        let mut gone = Vec::new();
        for (p, spec) in specs.iter().enumerate() {
            if started[p].is_none() && spec.join <= t {
                started[p] = Some(now);
                running[p] = true;
            }
            if running[p] && spec.leave.is_some_and(|leave| leave <= t) {
                running[p] = false;
                gone.push(p);
                record.pod_minutes += (now - started[p].unwrap_or(now)) / 60.0;
            }
            if running[p] {
                let amount = demand[p].rate(t) * dt;
                if amount > 0.0 {
                    sample_demand[p] += amount;
                    arrivals.push((p, amount));
                }
            }
        }
        let out = bucket.tick(now, arrivals, &gone);
        for (p, tokens, wait) in out.admitted {
            sample_admitted[p] += tokens;
            record.waits.record(wait, tokens);
        }
        record.timed_out += out.timed_out.iter().map(|x| x.1).sum::<f64>();
    }
    let end = workload.duration.as_secs_f64();
    record.push_sample(
        end,
        &mut sample_demand,
        &mut sample_admitted,
        bucket.tokens(),
    );
    for p in 0..n {
        if running[p] {
            record.pod_minutes += (end - started[p].unwrap_or(end)) / 60.0;
        }
    }
    record
}
