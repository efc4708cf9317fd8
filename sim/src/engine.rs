//! The discrete-event simulation of one tenant, or of an organisation's
//! tenants: their pods' local buckets and the global buckets, in virtual
//! time.
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
//! The server's store is the stores' transaction script over rows in
//! memory: `Batch` loads each request's window and writes back with
//! `BucketWrite::apply_to`. For an organisation ([`simulate_tree`]) the
//! store holds every node's head row and the tree's `Node` rows (made by
//! `organisation::apply`, as the server makes them), and each request runs
//! the whole script the embedded store runs: `join_tree`, then
//! `parents_due` / `open_parents` until nothing more is due, `draw`, and
//! `serve`; so members draw on their organisation exactly as on the
//! server, once per draw period, in their pods' transactions. A lone
//! tenant runs the same script with no tree rows, which draws nothing.
//! The event queue (`Events`: virtual time, ties in scheduling order)
//! serves the partition engine too.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::ops::Range;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate_core::budget::BucketBudget;
use tollgate_core::global_bucket::{
    self, BucketRow, GlobalBucketConfig, Grant, InstanceId, InstanceState, InstanceWindow, Limits,
    TokenBucketRequest,
};
use tollgate_core::local_bucket::{Admission, LocalBucket, WaiterId};
use tollgate_core::organisation::{self, Node, TreeChange, TreeRows};
use tollgate_core::time::Timestamp;
use tollgate_core::transaction::{Answer, Batch, UnconfiguredTenants};
use tollgate_core::{BucketKey, BucketName, TenantId};

use crate::SimError;
use crate::ideal;
use crate::ideal::tree::IdealTree;
use crate::record::{BudgetOutcome, Record, TreeRecord};
use crate::workload::{Demand, LimitsSpec, PodSpec, Tree, Workload};

/// The grant policies compared: the core's own.
pub use tollgate_core::global_bucket::GrantPolicy as Policy;

fn at(d: Duration) -> Timestamp {
    Timestamp::EPOCH.saturating_add(d)
}

fn secs(t: Timestamp) -> f64 {
    t.seconds_since(Timestamp::EPOCH)
}

/// The buckets' rows and the tree of organisations, kept the way a store
/// keeps them, and served by the stores' transaction script ([`Batch`]):
/// a request loads only the rows of its window (and, when its bucket must
/// draw, its organisations' heads and its windows in them) and writes back
/// what changed.
#[derive(Debug)]
struct Store {
    heads: BTreeMap<BucketKey, BucketRow>,
    instances: BTreeMap<BucketKey, BTreeMap<InstanceId, InstanceState>>,
    nodes: BTreeMap<TenantId, Node>,
    config: GlobalBucketConfig,
}

impl Store {
    fn new(config: GlobalBucketConfig) -> Store {
        Store {
            heads: BTreeMap::new(),
            instances: BTreeMap::new(),
            nodes: BTreeMap::new(),
            config,
        }
    }

    /// Loads `key`'s instance rows of `window` into `batch`.
    fn load(&self, batch: &mut Batch, key: &BucketKey, window: &InstanceWindow) {
        if let Some(rows) = self.instances.get(key) {
            batch.load(key, window.select(rows).into_values());
        }
    }

    /// The head rows of `keys` that exist.
    fn heads(&self, keys: &[BucketKey]) -> BTreeMap<BucketKey, BucketRow> {
        keys.iter()
            .filter_map(|k| Some((k.clone(), self.heads.get(k)?.clone())))
            .collect()
    }

    /// One pod request, by the script of `tollgate_core::transaction`, as
    /// the embedded store runs it (one writer: no row is ever busy).
    fn request(
        &mut self,
        key: &BucketKey,
        request: &TokenBucketRequest,
        now: Timestamp,
    ) -> Result<Grant, global_bucket::RequestError> {
        let plan = Batch::plan([(key, request.instance_id)], self.config.cleanup_window);
        let heads = self.heads(&plan.lock);
        let states = BTreeMap::new();
        let mut batch = Batch::open(plan.lock, heads, &states, &UnconfiguredTenants::Reject, now);
        for window in &plan.windows {
            self.load(&mut batch, key, window);
        }
        batch.join_tree(&self.nodes);
        loop {
            let parents = batch.parents_due(now, &self.config);
            if parents.is_empty() {
                break;
            }
            let heads = self.heads(&parents.lock);
            batch.open_parents(
                parents.lock.iter().cloned(),
                heads,
                &BTreeSet::new(),
                &states,
                &self.nodes,
            );
            for (parent, window) in &parents.windows {
                self.load(&mut batch, parent, window);
            }
        }
        batch.draw([(key, request.requested_tokens)], now, &self.config);
        let answer = batch.serve(key, request, now, &self.config);
        for write in batch.writes() {
            let head = self
                .heads
                .entry(write.key.clone())
                .or_insert_with(|| write.head.clone());
            let instances = self.instances.entry(write.key.clone()).or_default();
            write.apply_to(head, instances);
        }
        match answer {
            Answer::Granted(grant) => Ok(grant),
            Answer::Refused(e) => Err(e),
            Answer::NotFound | Answer::TenantRefused(_) | Answer::Deferred => Err(
                global_bucket::RequestError::Inconsistent(format!("a lone request got {answer:?}")),
            ),
        }
    }

    /// Tokens in `key`'s bucket at `now` (0 if it has no row).
    fn level(&self, key: &BucketKey, now: Timestamp) -> f64 {
        self.heads
            .get(key)
            .map_or(0.0, |head| head.state.tokens_at(now))
    }
}

#[derive(Debug)]
enum Kind {
    Tick(u64),
    Wake(usize),
    /// A request reaches the server; the pod gives it up at the time given
    /// if no answer has come by then.
    Arrive(usize, Box<TokenBucketRequest>, Timestamp),
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
    /// Its tenant: an index of `Sim::tenants`.
    tenant: usize,
    demand: Demand,
    state: PodState,
    bucket: Option<LocalBucket>,
    /// Queued acquisitions, oldest first: `(id, tokens, arrived)`.
    waiters: VecDeque<(WaiterId, f64, Timestamp)>,
    wake: Option<Timestamp>,
    started: Timestamp,
    stopped: Option<Timestamp>,
}

/// A tenant's bucket, its pods (consecutive indices of `Sim::pods`) and
/// what they did.
#[derive(Debug)]
struct Tenant {
    key: BucketKey,
    pods: Range<usize>,
    record: Record,
    /// The outage under way, as far as this tenant's pods went.
    outage: Option<OutageWatch>,
}

/// What a tenant's pods did during one outage ([`Record::outage_excess`]).
#[derive(Debug, Default)]
struct OutageWatch {
    seconds: f64,
    /// The most the running pods' fallback rates summed to.
    fallback_rate: f64,
    /// Initial allowances of the pods that started during it.
    allowances: f64,
}

struct Sim<'w> {
    workload: &'w Workload,
    store: Store,
    pods: Vec<Pod>,
    tenants: Vec<Tenant>,
    /// Buckets whose level is sampled beside the tenants' (an
    /// organisation's), and their series.
    watched: Vec<(BucketKey, Vec<f64>)>,
    events: Events<Kind>,
    rng: ChaCha8Rng,
    sample_demand: Vec<f64>,
    sample_admitted: Vec<f64>,
    rtt: Duration,
    half_rtt: Duration,
    max_wait: f64,
}

fn tenant_id(name: &str) -> Result<TenantId, SimError> {
    TenantId::parse("tenant_id", name).map_err(|e| SimError::Invalid(e.to_string()))
}

fn head_row(spec: &LimitsSpec, initial: f64) -> BucketRow {
    let limits = Limits {
        refill_rate: spec.refill_rate,
        burst_limit: spec.burst_limit,
    };
    BucketRow::new(limits, initial, true, Timestamp::EPOCH)
}

impl<'w> Sim<'w> {
    /// A simulation of `specs` (the pods, in order), each tenant of
    /// `tenants` owning a run of them, against `store`.
    fn new(
        workload: &'w Workload,
        specs: Vec<PodSpec>,
        tenants: Vec<(BucketKey, Range<usize>)>,
        watched: Vec<BucketKey>,
        store: Store,
    ) -> Sim<'w> {
        let n = specs.len();
        let tenant_of = |p: usize| {
            tenants
                .iter()
                .position(|(_, r)| r.contains(&p))
                .unwrap_or(0)
        };
        let pods = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| Pod {
                demand: Demand::new(&spec.demand, workload.seed, i),
                spec,
                tenant: tenant_of(i),
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
        let tenants = tenants
            .into_iter()
            .map(|(key, pods)| Tenant {
                key,
                record: Record::new(
                    pods.len(),
                    workload.sample.as_secs_f64(),
                    workload.max_wait.as_secs_f64(),
                ),
                pods,
                outage: None,
            })
            .collect();
        Sim {
            workload,
            store,
            pods,
            tenants,
            watched: watched.into_iter().map(|k| (k, Vec::new())).collect(),
            events: Events::new(),
            rng,
            sample_demand: vec![0.0; n],
            sample_admitted: vec![0.0; n],
            rtt: workload.network.rtt,
            half_rtt: workload.network.rtt / 2,
            max_wait: workload.max_wait.as_secs_f64(),
        }
    }

    /// The record of pod `p`'s tenant.
    fn record(&mut self, p: usize) -> &mut Record {
        &mut self.tenants[self.pods[p].tenant].record
    }
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
    let mut head = head_row(spec, spec.initial());
    if let Some(budget) = &spec.budget {
        let budget = budget.budget().map_err(SimError::Invalid)?;
        head.budget = Some(Box::new(
            BucketBudget::start(budget, Timestamp::EPOCH)
                .map_err(|e| SimError::Invalid(e.to_string()))?,
        ));
    }
    let key = BucketKey::request_units(tenant_id("simulated")?);
    let mut store = Store::new(GlobalBucketConfig {
        policy,
        ..GlobalBucketConfig::default()
    });
    store.heads.insert(key.clone(), head);
    let mut sim = Sim::new(
        workload,
        specs,
        vec![(key.clone(), 0..n)],
        Vec::new(),
        store,
    );
    sim.run()?;
    let end = at(workload.duration);
    let mut record = sim.tenants.swap_remove(0).record;
    if let Some(head) = sim.store.heads.get(&key) {
        record.budget = head.budget.as_ref().map(|b| {
            let view = b.view(&head.state, end);
            BudgetOutcome {
                amount: view.budget.amount,
                granted: view.usage.granted_tokens,
                spend: view.usage.spend(),
                reached_at: view.limit_reached_at.map(secs),
            }
        });
    }
    Ok(record)
}

/// Runs the organisation `tree` of `workload` under `policy`: each
/// tenant's pods against its bucket, each member's bucket drawing on its
/// organisation's, every draw period (the tree's), through the stores'
/// script. The pods are `tree.pod_groups()`'s, in order.
pub fn simulate_tree(
    workload: &Workload,
    tree: &Tree,
    policy: Policy,
) -> Result<TreeRecord, SimError> {
    let mut store = Store::new(GlobalBucketConfig {
        policy,
        draw_period: tree.draw_period,
        ..GlobalBucketConfig::default()
    });
    let mut keys = Vec::new();
    for (i, node) in tree.nodes.iter().enumerate() {
        let key = BucketKey::request_units(tenant_id(&node.name)?);
        // A member's bucket starts empty at its first draw whatever it
        // holds; the organisation at the top starts with its initial
        // tokens.
        let initial = if i == 0 { node.limits.initial() } else { 0.0 };
        store
            .heads
            .insert(key.clone(), head_row(&node.limits, initial));
        keys.push(key);
    }
    // The tree's rows, made by the operators' changes the server applies:
    // every organisation created, then every member joined, top down.
    let changes = tree
        .nodes
        .iter()
        .filter(|n| !n.is_tenant())
        .map(|n| (n, None))
        .chain(tree.nodes.iter().filter_map(|n| Some((n, Some(n.parent?)))));
    for (node, parent) in changes {
        let id = tenant_id(&node.name)?;
        let change = match parent {
            None => TreeChange::Create {
                organisation: id,
                display_name: String::new(),
            },
            Some(parent) => TreeChange::Join {
                organisation: tenant_id(&tree.nodes[parent].name)?,
                member: id,
                guaranteed: BTreeMap::from([(BucketName::REQUEST_UNITS, node.guaranteed)]),
            },
        };
        let rows = TreeRows {
            nodes: store.nodes.clone(),
            ..TreeRows::default()
        };
        let writes = organisation::apply(&change, &rows, Timestamp::EPOCH)
            .map_err(|e| SimError::Invalid(format!("organisation: {e}")))?;
        store.nodes.extend(writes);
    }
    let tenants: Vec<usize> = tree.tenants().collect();
    let view = tree.view(workload, 0);
    let specs = view.pod_specs();
    let sim_tenants = tenants
        .iter()
        .map(|&t| (keys[t].clone(), tree.nodes[t].pods.clone()))
        .collect();
    let mut sim = Sim::new(workload, specs, sim_tenants, keys.clone(), store);
    sim.run()?;
    let draws = keys
        .iter()
        .map(|k| {
            sim.store
                .heads
                .get(k)
                .and_then(|h| h.draw.as_ref())
                .map_or(0, |d| d.draws)
        })
        .collect();
    Ok(TreeRecord {
        tenants: tenants
            .into_iter()
            .zip(sim.tenants.into_iter().map(|t| t.record))
            .collect(),
        levels: sim.watched.into_iter().map(|(_, l)| l).collect(),
        draws,
    })
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
                Kind::Arrive(p, request, give_up) => self.arrive(p, &request, give_up, now)?,
                Kind::Answer(p, seq, grant) => {
                    if let Some(bucket) = self.pods[p].bucket.as_mut() {
                        bucket.on_response(seq, &grant, now);
                        self.poll(p, now);
                    }
                }
                Kind::Fail(p, seq) => {
                    self.record(p).failed_requests += 1;
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
        let down = self.workload.outage_at(t);
        for p in 0..self.pods.len() {
            let pod = &mut self.pods[p];
            match pod.state {
                PodState::NotStarted if pod.spec.join <= t => {
                    let lease = format!("{}@{}", pod.spec.name, now.unix_micros()).into_bytes();
                    let instance = u32::try_from(p + 1).unwrap_or(u32::MAX);
                    let bucket =
                        LocalBucket::new(self.workload.client.config(), instance, lease, now)
                            .map_err(|e| SimError::Invalid(format!("client: {e}")))?;
                    if down && let Some(tenant) = self.tenants.get_mut(pod.tenant) {
                        tenant.outage.get_or_insert_default().allowances +=
                            bucket.config().initial_tokens;
                    }
                    pod.bucket = Some(bucket);
                    pod.state = PodState::Running;
                    pod.started = now;
                }
                PodState::Running if pod.spec.leave.is_some_and(|leave| leave <= t) => {
                    if let Some(bucket) = pod.bucket.as_mut() {
                        bucket.close();
                    }
                    let refused: f64 = pod.waiters.drain(..).map(|w| w.1).sum();
                    self.tenants[pod.tenant].record.timed_out += refused;
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
                self.tenants[pod.tenant].record.timed_out += tokens;
            }
            let amount = pod.demand.rate(t) * dt;
            if amount > 0.0 {
                self.sample_demand[p] += amount;
                match bucket.acquire(amount, now) {
                    Ok(Admission::Admitted) => {
                        self.sample_admitted[p] += amount;
                        self.tenants[pod.tenant].record.waits.record(0.0, amount);
                    }
                    Ok(Admission::Queued(id)) => pod.waiters.push_back((id, amount, now)),
                    Ok(Admission::Closed) => self.tenants[pod.tenant].record.timed_out += amount,
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
        self.watch_outage(down, dt);
        let next = now.saturating_add(tick);
        if next < at(self.workload.duration) {
            self.events.schedule(next, Kind::Tick(k + 1));
        }
        Ok(())
    }

    /// Follows each tenant's pods through an outage, and once it is over
    /// adds what it allows to the tenant's [`Record::outage_excess`].
    fn watch_outage(&mut self, down: bool, dt: f64) {
        for tenant in &mut self.tenants {
            if down {
                let rate: f64 = self.pods[tenant.pods.clone()]
                    .iter()
                    .filter(|pod| pod.state == PodState::Running)
                    .filter_map(|pod| pod.bucket.as_ref())
                    .map(|bucket| bucket.status().fallback_rate)
                    .sum();
                let watch = tenant.outage.get_or_insert_default();
                watch.seconds += dt;
                watch.fallback_rate = watch.fallback_rate.max(rate);
            } else if let Some(watch) = tenant.outage.take() {
                let refill_rate = self
                    .store
                    .heads
                    .get(&tenant.key)
                    .map_or(0.0, |head| head.state.limits.refill_rate);
                tenant.record.outage_excess += outage_excess(&watch, refill_rate);
            }
        }
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
                    self.tenants[pod.tenant]
                        .record
                        .waits
                        .record(now.seconds_since(since), tokens);
                    break;
                }
            }
        }
        if pod.state == PodState::Closing && bucket.is_finished() {
            pod.state = PodState::Done;
            self.tenants[pod.tenant].record.fallback_tokens += bucket.status().fallback_tokens;
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
            return;
        }
        let longest = self.workload.network.request_timeout;
        let timeout = self.pods[p]
            .bucket
            .as_ref()
            .map_or(longest, |bucket| bucket.attempt_timeout(longest));
        let give_up = now.saturating_add(timeout);
        if self.lost() {
            self.events.schedule(give_up, Kind::Fail(p, seq));
        } else {
            self.events.schedule(
                now.saturating_add(self.half_rtt),
                Kind::Arrive(p, Box::new(request), give_up),
            );
        }
    }

    fn arrive(
        &mut self,
        p: usize,
        request: &TokenBucketRequest,
        give_up: Timestamp,
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
        let key = &self.tenants[self.pods[p].tenant].key;
        let grant = self
            .store
            .request(key, request, now)
            .map_err(|e| SimError::Server {
                pod: self.pods[p].spec.name.clone(),
                at: secs(now),
                message: e.to_string(),
            })?;
        self.record(p).server_requests += 1;
        let answered = now.saturating_add(self.half_rtt);
        if self.lost() || answered > give_up {
            // The answer is lost, or would come after the pod gave the
            // attempt up: it sends the request again.
            self.events.schedule(give_up.max(now), Kind::Fail(p, seq));
        } else {
            self.events.schedule(answered, Kind::Answer(p, seq, grant));
        }
        Ok(())
    }

    fn flush_sample(&mut self, now: Timestamp) {
        for tenant in &mut self.tenants {
            let level = self.store.level(&tenant.key, now);
            tenant.record.push_sample(
                secs(now),
                &mut self.sample_demand[tenant.pods.clone()],
                &mut self.sample_admitted[tenant.pods.clone()],
                level,
            );
        }
        for (key, series) in &mut self.watched {
            series.push(self.store.level(key, now));
        }
    }

    fn finish(&mut self, end: Timestamp) {
        self.flush_sample(end);
        self.watch_outage(false, 0.0);
        for pod in &self.pods {
            if pod.state == PodState::NotStarted {
                continue;
            }
            let stopped = pod.stopped.unwrap_or(end).min(end);
            let record = &mut self.tenants[pod.tenant].record;
            record.pod_minutes += stopped.seconds_since(pod.started) / 60.0;
            if pod.state != PodState::Done
                && let Some(bucket) = &pod.bucket
            {
                record.fallback_tokens += bucket.status().fallback_tokens;
            }
        }
    }
}

/// `(F − R)⁺ · L + n · A` of one outage.
fn outage_excess(watch: &OutageWatch, refill_rate: f64) -> f64 {
    (watch.fallback_rate - refill_rate).max(0.0) * watch.seconds + watch.allowances
}

/// Runs `workload` against the ideal bucket with `limits`.
/// Pods (by index) each with an amount: tokens asked for, or minutes run.
type PodAmounts = Vec<(usize, f64)>;

/// Which pods of an ideal run have joined and not left, tick by tick.
struct PodSchedule {
    /// When each pod joined, seconds.
    started: Vec<Option<f64>>,
    running: Vec<bool>,
}

impl PodSchedule {
    fn new(pods: usize) -> Self {
        PodSchedule {
            started: vec![None; pods],
            running: vec![false; pods],
        }
    }

    /// The tick at `t` (`dt` seconds long): pods join and leave as `specs`
    /// say; what each running pod's demand asks for in it (added to
    /// `sample_demand`), and the pods that left, with their minutes run.
    fn tick(
        &mut self,
        specs: &[PodSpec],
        demand: &mut [Demand],
        t: Duration,
        dt: f64,
        sample_demand: &mut [f64],
    ) -> (PodAmounts, PodAmounts) {
        let now = t.as_secs_f64();
        let mut arrivals = Vec::new();
        let mut gone = Vec::new();
        for (p, spec) in specs.iter().enumerate() {
            if self.started[p].is_none() && spec.join <= t {
                self.started[p] = Some(now);
                self.running[p] = true;
            }
            if self.running[p] && spec.leave.is_some_and(|leave| leave <= t) {
                self.running[p] = false;
                gone.push((p, (now - self.started[p].unwrap_or(now)) / 60.0));
            }
            if self.running[p] {
                let amount = demand[p].rate(t) * dt;
                if amount > 0.0 {
                    sample_demand[p] += amount;
                    arrivals.push((p, amount));
                }
            }
        }
        (arrivals, gone)
    }

    /// The pods still running at `end` (seconds), with their minutes run.
    fn still_running(&self, end: f64) -> impl Iterator<Item = (usize, f64)> + '_ {
        (0..self.running.len())
            .filter(|&p| self.running[p])
            .map(move |p| (p, (end - self.started[p].unwrap_or(end)) / 60.0))
    }
}

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
    let mut bucket = ideal::bucket(workload, limits);
    let mut sample_demand = vec![0.0; n];
    let mut sample_admitted = vec![0.0; n];
    let tick = workload.tick;
    let dt = tick.as_secs_f64();
    let per_sample = workload.sample.as_micros() / tick.as_micros();
    let ticks = workload.duration.as_micros().div_ceil(tick.as_micros());
    let mut schedule = PodSchedule::new(n);
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
        let (arrivals, gone) = schedule.tick(&specs, &mut demand, t, dt, &mut sample_demand);
        for &(_, minutes) in &gone {
            record.pod_minutes += minutes;
        }
        let gone: Vec<usize> = gone.into_iter().map(|(p, _)| p).collect();
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
    for (_, minutes) in schedule.still_running(end) {
        record.pod_minutes += minutes;
    }
    record
}

/// Runs the organisation `tree` of `workload` against the ideal
/// hierarchical bucket ([`IdealTree`]): the same pods and demand as
/// [`simulate_tree`], in the same order.
pub fn simulate_ideal_tree(workload: &Workload, tree: &Tree) -> TreeRecord {
    let specs = tree.view(workload, 0).pod_specs();
    let n = specs.len();
    let mut demand: Vec<Demand> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Demand::new(&spec.demand, workload.seed, i))
        .collect();
    let tenants: Vec<usize> = tree.tenants().collect();
    let mut records: Vec<Record> = tenants
        .iter()
        .map(|&t| {
            Record::new(
                tree.nodes[t].pods.len(),
                workload.sample.as_secs_f64(),
                workload.max_wait.as_secs_f64(),
            )
        })
        .collect();
    let tenant_of: Vec<usize> = (0..n)
        .map(|p| {
            tenants
                .iter()
                .position(|&t| tree.nodes[t].pods.contains(&p))
                .unwrap_or(0)
        })
        .collect();
    let mut levels = vec![Vec::new(); tree.nodes.len()];
    let mut ideal = IdealTree::new(workload, tree);
    let mut sample_demand = vec![0.0; n];
    let mut sample_admitted = vec![0.0; n];
    let mut push = |now: f64,
                    records: &mut [Record],
                    demand: &mut [f64],
                    admitted: &mut [f64],
                    ideal: &IdealTree| {
        for (record, &t) in records.iter_mut().zip(&tenants) {
            let pods = tree.nodes[t].pods.clone();
            let level = ideal.levels().nth(t).unwrap_or(0.0);
            record.push_sample(now, &mut demand[pods.clone()], &mut admitted[pods], level);
        }
        for (series, level) in levels.iter_mut().zip(ideal.levels()) {
            series.push(level);
        }
    };
    let tick = workload.tick;
    let dt = tick.as_secs_f64();
    let per_sample = workload.sample.as_micros() / tick.as_micros();
    let ticks = workload.duration.as_micros().div_ceil(tick.as_micros());
    let mut schedule = PodSchedule::new(n);
    for k in 0..ticks {
        let t = tick * u32::try_from(k).unwrap_or(u32::MAX);
        let now = t.as_secs_f64();
        if k > 0 && k.is_multiple_of(per_sample) {
            push(
                now,
                &mut records,
                &mut sample_demand,
                &mut sample_admitted,
                &ideal,
            );
        }
        let (arrivals, gone) = schedule.tick(&specs, &mut demand, t, dt, &mut sample_demand);
        for &(p, minutes) in &gone {
            records[tenant_of[p]].pod_minutes += minutes;
        }
        let gone: Vec<usize> = gone.into_iter().map(|(p, _)| p).collect();
        let out = ideal.tick(now, arrivals, &gone);
        for (p, tokens, wait) in out.admitted {
            sample_admitted[p] += tokens;
            records[tenant_of[p]].waits.record(wait, tokens);
        }
        for (p, tokens) in out.timed_out {
            records[tenant_of[p]].timed_out += tokens;
        }
    }
    let end = workload.duration.as_secs_f64();
    push(
        end,
        &mut records,
        &mut sample_demand,
        &mut sample_admitted,
        &ideal,
    );
    for (p, minutes) in schedule.still_running(end) {
        records[tenant_of[p]].pod_minutes += minutes;
    }
    TreeRecord {
        tenants: tenants.into_iter().zip(records).collect(),
        levels,
        draws: vec![0; tree.nodes.len()],
    }
}
