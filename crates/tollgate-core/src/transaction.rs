//! The transaction script of a token-bucket request, written once for every
//! store and the simulator.
//!
//! Every store serves pod requests the same way; only how it reads and
//! writes rows differs. One transaction, for one request or a batch:
//!
//! 1. [`Batch::plan`]: which head rows to lock (in key order, so two
//!    transactions never wait on each other in a cycle) and which instance
//!    rows each request needs ([`instance_window`]).
//! 2. The store locks and reads those head rows, then (after the locks)
//!    reads its clock, the state rows of the batch's tenants
//!    ([`Plan::tenants`]) and the windows.
//! 3. [`Batch::open`] decides, per bucket, whether it is served (a deleted
//!    or suspended tenant is refused by [`tenant_state::admit`], head row or
//!    not) and what a missing head row means (the unconfigured-bucket
//!    rule), and [`Batch::load`] takes the loaded instance rows.
//! 4. [`Batch::serve`] runs [`global_bucket::request`] for each request in
//!    turn, on the same in-memory rows, so requests of one bucket see each
//!    other's changes exactly as if they had been separate transactions.
//! 5. The store writes [`Batch::writes`] back and commits.
//! 6. [`Batch::report_removed`] logs the instances removed for being
//!    silent and counts them, once the commit holds.
//!
//! Members of organisations draw on their organisation's buckets
//! ([`crate::organisation`]) in the same transaction, before their pods
//! are served:
//!
//! - After step 3, [`Batch::join_tree`] takes the tree rows of the batch's
//!   tenants (pods of an organisation are refused; a bucket whose tenant
//!   left its organisation goes back to its own limits).
//! - [`Batch::parents_due`] says which organisation buckets the due draws
//!   need: the store locks and reads their head rows (in key order, after
//!   the batch's own), their tenants' state and tree rows and the members'
//!   windows, and hands them to [`Batch::open_parents`] and
//!   [`Batch::load`]; again until nothing more is due (once per level of
//!   the tree, at most [`organisation::MAX_DEPTH`]). In the common case
//!   (no draw due) this costs nothing.
//! - [`Batch::draw`] then makes the draws, an organisation's own before its
//!   members' (from the top down), and step 4 serves the pods.
//! - A store that skipped an organisation's row may make the draws it left
//!   ([`ParentPlan::draws`]) in a later transaction whose plan also locks
//!   the members' buckets ([`Plan::with_draws`]), with requests of its
//!   own or none, run through the same steps. A draw no longer due by
//!   then is not made twice.
//!
//! The stores only read and write rows; every rule about what those rows
//! mean is here or in [`global_bucket`].
//!
//! What a missing head row means: the request-unit bucket of a tenant
//! nobody configured is created or refused as [`UnconfiguredTenants`]
//! says (`UseDefaults` with the server's default limits, or `Reject`); any
//! other bucket does not exist ([`Answer::NotFound`]). Instance rows of a
//! bucket without a head row are strays an older delete left: ignored when
//! loaded, and deleted before a new head row is written. Once a request has
//! removed silent instances of its bucket, the batch's later requests for
//! that bucket are [`Answer::Deferred`] to the next transaction, since the
//! rows they need may no longer all be loaded. [`BucketWrite::apply_to`]
//! writes a bucket back for stores kept in memory (the simulator's, tests).

use std::collections::{BTreeMap, BTreeSet};

use crate::budget::{BudgetEvent, CycleRecord};
use crate::global_bucket::{
    self, BucketRow, BucketRows, GlobalBucketConfig, Grant, InstanceId, InstanceState,
    InstanceWindow, Limits, RequestError, TokenBucketRequest, instance_window,
};
use crate::organisation::{self, Member, Node};
use crate::tenant_state::{self, TenantRefused, TenantState};
use crate::time::Timestamp;
use crate::validate::{BucketKey, TenantId};

/// What a pod request for a tenant's request-unit bucket gets when nobody
/// configured it. (Named buckets exist only once provisioned; a request
/// for one that does not exist is always refused.)
#[derive(Clone, Debug, PartialEq)]
pub enum UnconfiguredTenants {
    /// The bucket is created with these limits.
    UseDefaults(DefaultLimits),
    /// The request is refused as not found.
    Reject,
}

impl UnconfiguredTenants {
    /// The limits and initial tokens a request-unit bucket is created
    /// with, if this server creates them.
    pub fn defaults(&self) -> Option<(Limits, f64)> {
        match self {
            UnconfiguredTenants::UseDefaults(d) => Some((d.limits, d.initial_tokens)),
            UnconfiguredTenants::Reject => None,
        }
    }
}

impl Default for UnconfiguredTenants {
    fn default() -> Self {
        UnconfiguredTenants::UseDefaults(DefaultLimits::default())
    }
}

/// The limits a tenant's request-unit bucket gets before an operator
/// configures it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DefaultLimits {
    pub limits: Limits,
    /// Tokens a new bucket starts with.
    pub initial_tokens: f64,
}

impl Default for DefaultLimits {
    fn default() -> Self {
        DefaultLimits {
            limits: Limits {
                refill_rate: 1_000.0,
                burst_limit: 10_000.0,
            },
            initial_tokens: 10_000.0,
        }
    }
}

/// What a batch's transaction must lock and load.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The head rows to lock, each once, in key order.
    pub lock: Vec<BucketKey>,
    /// Per request, in batch order: the instance rows it needs.
    pub windows: Vec<InstanceWindow>,
}

impl Plan {
    /// Also locks `members`, buckets whose draws are due, so that the
    /// batch makes their draws without requests of their own (the draws
    /// a store's earlier transactions skipped).
    pub fn with_draws(mut self, members: &[BucketKey]) -> Plan {
        let mut lock: BTreeSet<BucketKey> = self.lock.into_iter().collect();
        lock.extend(members.iter().cloned());
        self.lock = lock.into_iter().collect();
        self
    }

    /// The tenants whose state rows to read (after the head-row locks),
    /// each once, in id order.
    pub fn tenants(&self) -> Vec<&TenantId> {
        let mut tenants: Vec<&TenantId> = self.lock.iter().map(|k| &k.tenant).collect();
        tenants.dedup();
        tenants
    }
}

/// The answer to one request of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Granted(Grant),
    /// The state machine refused it; nothing changed.
    Refused(RequestError),
    /// The bucket does not exist (and is not created by default).
    NotFound,
    /// The tenant is deleted or suspended; nothing changed.
    TenantRefused(TenantRefused),
    /// An earlier request of this transaction removed silent instances of
    /// the bucket, so the rows this one needs may not all be loaded: serve
    /// it in the next transaction.
    Deferred,
}

/// One bucket's rows within a transaction, and what its requests changed.
#[derive(Clone, Debug, PartialEq)]
struct BucketWork {
    rows: BucketRows,
    /// The head row exists in the store (else it is inserted).
    stored: bool,
    /// A request changed the rows (else nothing is written).
    dirty: bool,
    upserted: BTreeSet<InstanceId>,
    removed: Vec<InstanceState>,
    /// Budget cycles the requests closed, and thresholds they crossed.
    closed_cycles: Vec<CycleRecord>,
    budget_events: Vec<BudgetEvent>,
    /// Its tenant's organisation, if it belongs to one.
    member: Option<Member>,
    /// Its tenant is an organisation: pods are refused.
    organisation: bool,
    /// It drew from its organisation in this transaction (its pods'
    /// requests count towards the next draw only).
    drew: bool,
}

/// What to write back for one bucket.
#[derive(Debug, PartialEq)]
pub struct BucketWrite<'a> {
    pub key: &'a BucketKey,
    pub head: &'a BucketRow,
    /// The head row is new: insert it (a store that may hold instance rows
    /// left without a head deletes those first, so a new bucket starts
    /// with an empty instance list). Otherwise update it.
    pub insert: bool,
    /// Instance rows to insert or replace.
    pub upsert: Vec<&'a InstanceState>,
    /// Instance rows to delete.
    pub delete: Vec<InstanceId>,
    /// Budget cycles closed: billing records to insert.
    pub closed_cycles: &'a [CycleRecord],
    /// Budget thresholds crossed: events to insert for delivery.
    pub budget_events: &'a [BudgetEvent],
}

impl BucketWrite<'_> {
    /// Applies the write to a bucket kept in memory (the simulator's store,
    /// tests).
    pub fn apply_to(
        &self,
        head: &mut BucketRow,
        instances: &mut BTreeMap<InstanceId, InstanceState>,
    ) {
        if self.insert {
            instances.clear();
        }
        head.clone_from(self.head);
        for row in &self.upsert {
            instances.insert(row.instance_id, (*row).clone());
        }
        for id in &self.delete {
            instances.remove(id);
        }
    }
}

/// The buckets one transaction serves requests for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// `Err`: the bucket is not served, and why.
    buckets: BTreeMap<BucketKey, Result<BucketWork, Closed>>,
    /// The members' windows in organisation buckets already asked for.
    member_windows: BTreeSet<(BucketKey, InstanceId)>,
    /// The store's clock when the batch was opened.
    now: Timestamp,
}

/// What the due draws of a batch need: more head rows to lock (in key
/// order), the state and tree rows of their tenants, and the members'
/// windows in them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParentPlan {
    pub lock: Vec<BucketKey>,
    pub windows: Vec<(BucketKey, InstanceWindow)>,
    /// The due draws another transaction could make as well, each as the
    /// member's bucket and its organisation's: every due draw of a
    /// tenant's bucket but a first one (which asks for what this batch's
    /// requests ask). A store that skips an organisation's row may make
    /// these in a later transaction ([`Plan::with_draws`]).
    pub draws: Vec<(BucketKey, BucketKey)>,
}

impl ParentPlan {
    pub fn is_empty(&self) -> bool {
        self.lock.is_empty() && self.windows.is_empty()
    }

    /// The tenants whose state and tree rows to read, each once, in order.
    pub fn tenants(&self) -> Vec<&TenantId> {
        let mut tenants: Vec<&TenantId> = self.lock.iter().map(|k| &k.tenant).collect();
        tenants.dedup();
        tenants
    }
}

/// Why a bucket of a batch is not served.
#[derive(Clone, Debug, PartialEq)]
enum Closed {
    /// It does not exist and is not created.
    NotFound,
    /// Its tenant is deleted or suspended.
    Tenant(TenantRefused),
    /// An organisation's bucket another transaction holds: the draws
    /// that need it wait for their bucket's next request.
    Busy,
}

impl Batch {
    /// What a transaction serving `requests` (bucket and requesting
    /// instance, in batch order) must lock and load.
    pub fn plan<'a>(
        requests: impl IntoIterator<Item = (&'a BucketKey, InstanceId)>,
        cleanup_window: usize,
    ) -> Plan {
        let mut lock = BTreeSet::new();
        let mut windows = Vec::new();
        for (key, instance) in requests {
            lock.insert(key.clone());
            windows.push(instance_window(instance, cleanup_window));
        }
        Plan {
            lock: lock.into_iter().collect(),
            windows,
        }
    }

    /// Opens the buckets of `keys` with the head rows a store found
    /// (`heads`; a key without one has no row) and the state rows of their
    /// tenants (`states`; a tenant without one is served). A bucket of a
    /// deleted or suspended tenant is refused, whether its head row exists
    /// or not: a deleted tenant's request-unit bucket is never created
    /// again by default. Otherwise a missing request-unit bucket is created
    /// by `unconfigured`, and any other missing bucket does not exist.
    pub fn open(
        keys: impl IntoIterator<Item = BucketKey>,
        mut heads: BTreeMap<BucketKey, BucketRow>,
        states: &BTreeMap<TenantId, TenantState>,
        unconfigured: &UnconfiguredTenants,
        now: Timestamp,
    ) -> Batch {
        let mut buckets = BTreeMap::new();
        for key in keys {
            let head = heads.remove(&key);
            let work =
                if let Err(refused) = tenant_state::admit(&key.tenant, states.get(&key.tenant)) {
                    Err(Closed::Tenant(refused))
                } else {
                    match head {
                        Some(head) => Ok(BucketWork::new(head, true)),
                        None if key.bucket.is_request_units() => match unconfigured {
                            UnconfiguredTenants::UseDefaults(d) => Ok(BucketWork::new(
                                BucketRow::new(d.limits, d.initial_tokens, false, now),
                                false,
                            )),
                            UnconfiguredTenants::Reject => Err(Closed::NotFound),
                        },
                        None => Err(Closed::NotFound),
                    }
                };
            buckets.insert(key, work);
        }
        Batch {
            buckets,
            member_windows: BTreeSet::new(),
            now,
        }
    }

    /// Takes the tree rows of the batch's tenants (`nodes`; a tenant
    /// without one is neither an organisation nor a member).
    pub fn join_tree(&mut self, nodes: &BTreeMap<TenantId, Node>) {
        for (key, work) in &mut self.buckets {
            if let Ok(work) = work {
                let node = nodes.get(&key.tenant);
                work.member = node.and_then(|n| n.member_of.clone());
                work.organisation = node.is_some_and(|n| n.organisation.is_some());
            }
        }
    }

    /// What the draws due at `now` need that is not loaded yet.
    pub fn parents_due(&mut self, now: Timestamp, config: &GlobalBucketConfig) -> ParentPlan {
        let mut lock = BTreeSet::new();
        let mut windows = Vec::new();
        let mut draws = Vec::new();
        for (key, work) in &self.buckets {
            let Ok(work) = work else { continue };
            let Some(member) = &work.member else { continue };
            if work.drew || !organisation::draw_due(&work.rows.head, member, now) {
                continue;
            }
            let parent = BucketKey::new(member.organisation.clone(), key.bucket.clone());
            if !self
                .member_windows
                .insert((parent.clone(), member.member_id))
            {
                continue;
            }
            let first = !work
                .rows
                .head
                .draw
                .as_ref()
                .is_some_and(|d| d.is_from(member));
            if !work.organisation && !first {
                draws.push((key.clone(), parent.clone()));
            }
            if !self.buckets.contains_key(&parent) {
                lock.insert(parent.clone());
            }
            windows.push((
                parent,
                instance_window(member.member_id, config.cleanup_window),
            ));
        }
        ParentPlan {
            lock: lock.into_iter().collect(),
            windows,
            draws,
        }
    }

    /// Opens organisation buckets for draws: `keys` with the head rows a
    /// store found and locked, those it found held by another transaction
    /// (`busy`: a store may skip a locked organisation row rather than
    /// wait on it), their tenants' state and tree rows. A missing head row
    /// means the organisation does not limit that bucket name (never
    /// created by default); a deleted or suspended organisation grants
    /// nothing; the draws of a busy one are left for their bucket's next
    /// request. An organisation that belongs to another and has no bucket
    /// of the name gets one, with no limit of its own, through which its
    /// members' draws pass up: what they admit still counts in the
    /// organisations above.
    pub fn open_parents(
        &mut self,
        keys: impl IntoIterator<Item = BucketKey>,
        mut heads: BTreeMap<BucketKey, BucketRow>,
        busy: &BTreeSet<BucketKey>,
        states: &BTreeMap<TenantId, TenantState>,
        nodes: &BTreeMap<TenantId, Node>,
    ) {
        for key in keys {
            if self.buckets.contains_key(&key) {
                continue;
            }
            let work = if busy.contains(&key) {
                Err(Closed::Busy)
            } else if let Err(refused) = tenant_state::admit(&key.tenant, states.get(&key.tenant)) {
                Err(Closed::Tenant(refused))
            } else {
                let member = nodes.get(&key.tenant).and_then(|n| n.member_of.clone());
                let work = match heads.remove(&key) {
                    Some(head) => Some(BucketWork::new(head, true)),
                    None if member.is_some() => {
                        let mut work = BucketWork::new(organisation::pass_through(self.now), false);
                        work.dirty = true;
                        Some(work)
                    }
                    None => None,
                };
                match work {
                    Some(mut work) => {
                        work.member = member;
                        work.organisation = true;
                        Ok(work)
                    }
                    None => Err(Closed::NotFound),
                }
            };
            self.buckets.insert(key, work);
        }
    }

    /// Makes every draw due at `now`, an organisation's own before its
    /// members' asks. `requests` are the batch's pod requests (bucket and
    /// tokens asked for): what a draw asks for counts them.
    pub fn draw<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a BucketKey, f64)>,
        now: Timestamp,
        config: &GlobalBucketConfig,
    ) {
        let mut pending: BTreeMap<BucketKey, f64> = BTreeMap::new();
        for (key, tokens) in requests {
            *pending.entry(key.clone()).or_default() += tokens;
        }
        // From the tenants' buckets: an organisation's bucket draws from
        // its own organisation within its members' draws, once it knows
        // what they ask for (were it taken in key order, `labs` would draw
        // before `labs-ml` asked).
        let keys: Vec<BucketKey> = self
            .buckets
            .iter()
            .filter(|(_, work)| !matches!(work, Ok(w) if w.organisation))
            .map(|(key, _)| key.clone())
            .collect();
        for key in keys {
            self.draw_one(&key, &mut pending, now, config, 0);
        }
    }

    fn draw_one(
        &mut self,
        key: &BucketKey,
        pending: &mut BTreeMap<BucketKey, f64>,
        now: Timestamp,
        config: &GlobalBucketConfig,
        depth: usize,
    ) {
        let period = config.draw_period;
        let Some(Ok(work)) = self.buckets.get_mut(key) else {
            return;
        };
        let Some(member) = work.member.clone() else {
            if organisation::release(&mut work.rows.head, now, period) {
                work.dirty = true;
            }
            return;
        };
        if work.drew || depth > organisation::MAX_DEPTH {
            return;
        }
        if !organisation::draw_due(&work.rows.head, &member, now) {
            return;
        }
        let mine = pending.get(key).copied().unwrap_or(0.0);
        let (ask, guaranteed) = organisation::ask(key, &work.rows.head, &member, mine, now, period);
        let parent_key = BucketKey::new(member.organisation.clone(), key.bucket.clone());
        // What the organisation's own draw asks for counts this ask only
        // if the organisation's bucket will answer it.
        if matches!(self.buckets.get(&parent_key), Some(Ok(_))) {
            *pending.entry(parent_key.clone()).or_default() += ask.requested_tokens;
        }
        // The organisation's own draw first: the rate it hands out is the
        // one it was just given.
        self.draw_one(&parent_key, pending, now, config, depth + 1);
        let grant = match self.buckets.get_mut(&parent_key) {
            Some(Ok(parent)) => {
                if !parent.removed.is_empty() {
                    // An earlier ask removed silent members: this one's
                    // rows may not all be loaded. It draws next time.
                    return;
                }
                match global_bucket::request_guaranteed(
                    &mut parent.rows,
                    &ask,
                    guaranteed,
                    now,
                    &organisation::parent_config(config),
                ) {
                    Ok(outcome) => {
                        let grant = outcome.grant;
                        parent.record(outcome);
                        if !parent.drew {
                            organisation::tally(&mut parent.rows.head, ask.requested_tokens);
                        }
                        Some(grant)
                    }
                    Err(e) => {
                        tracing::warn!(
                            tenant = %key.tenant,
                            bucket = %key.bucket,
                            organisation = %member.organisation,
                            error = %e,
                            "an organisation refused its member's draw; it draws again next period"
                        );
                        Some(Grant::default())
                    }
                }
            }
            Some(Err(Closed::NotFound)) => None,
            Some(Err(Closed::Tenant(_))) => Some(Grant::default()),
            // Held by another transaction, or not loaded: the draw waits
            // for the bucket's next request.
            Some(Err(Closed::Busy)) | None => return,
        };
        if let Some(Ok(work)) = self.buckets.get_mut(key) {
            organisation::settle(
                &mut work.rows.head,
                &member,
                &ask,
                grant.as_ref(),
                now,
                period,
            );
            work.drew = true;
            work.dirty = true;
        }
    }

    /// Adds instance rows loaded for `key`. Rows of a bucket whose head row
    /// did not exist are strays (left by an older delete) and are ignored:
    /// a new bucket starts with none.
    pub fn load(&mut self, key: &BucketKey, instances: impl IntoIterator<Item = InstanceState>) {
        if let Some(Ok(work)) = self.buckets.get_mut(key)
            && work.stored
        {
            for instance in instances {
                work.rows
                    .instances
                    .entry(instance.instance_id)
                    .or_insert(instance);
            }
        }
    }

    /// Serves one request for `key` on the rows loaded so far.
    pub fn serve(
        &mut self,
        key: &BucketKey,
        request: &TokenBucketRequest,
        now: Timestamp,
        config: &GlobalBucketConfig,
    ) -> Answer {
        let work = match self.buckets.get_mut(key) {
            Some(Ok(work)) => work,
            Some(Err(Closed::Tenant(refused))) => return Answer::TenantRefused(refused.clone()),
            Some(Err(Closed::NotFound | Closed::Busy)) | None => return Answer::NotFound,
        };
        if work.organisation {
            return Answer::TenantRefused(TenantRefused::Organisation {
                tenant: key.tenant.clone(),
            });
        }
        if !work.removed.is_empty() {
            return Answer::Deferred;
        }
        match global_bucket::request(&mut work.rows, request, now, config) {
            Ok(outcome) => {
                let (duplicate, grant) = (outcome.duplicate, outcome.grant);
                work.record(outcome);
                if !duplicate && !work.drew && work.member.is_some() {
                    organisation::tally(&mut work.rows.head, request.requested_tokens);
                }
                Answer::Granted(grant)
            }
            Err(e) => Answer::Refused(e),
        }
    }

    /// The rows to write back, bucket by bucket in key order; buckets no
    /// request changed are left out.
    pub fn writes(&self) -> Vec<BucketWrite<'_>> {
        self.buckets
            .iter()
            .filter_map(|(key, work)| work.as_ref().ok().map(|work| (key, work)))
            .filter(|(_, work)| work.dirty)
            .map(|(key, work)| {
                let gone: BTreeSet<InstanceId> =
                    work.removed.iter().map(|r| r.instance_id).collect();
                BucketWrite {
                    key,
                    head: &work.rows.head,
                    insert: !work.stored,
                    upsert: work
                        .upserted
                        .difference(&gone)
                        .filter_map(|id| work.rows.instances.get(id))
                        .collect(),
                    delete: gone.into_iter().collect(),
                    closed_cycles: &work.closed_cycles,
                    budget_events: &work.budget_events,
                }
            })
            .collect()
    }

    /// Logs every instance the committed transaction removed for being
    /// silent, and returns how many there were. Call it once the commit
    /// holds (a transaction that failed removed nothing).
    pub fn report_removed(&self, now: Timestamp) -> u64 {
        let mut count = 0;
        for (key, work) in &self.buckets {
            for removed in work.iter().flat_map(|w| &w.removed) {
                count += 1;
                tracing::info!(
                    tenant = %key.tenant,
                    bucket = %key.bucket,
                    instance = removed.instance_id,
                    silent_for_secs = now.duration_since(removed.last_update).as_secs_f64(),
                    "removed silent instance"
                );
            }
        }
        count
    }
}

impl BucketWork {
    fn new(head: BucketRow, stored: bool) -> Self {
        BucketWork {
            rows: BucketRows {
                head,
                instances: BTreeMap::new(),
            },
            stored,
            dirty: false,
            upserted: BTreeSet::new(),
            removed: Vec::new(),
            closed_cycles: Vec::new(),
            budget_events: Vec::new(),
            member: None,
            organisation: false,
            drew: false,
        }
    }

    /// Keeps what a request changed.
    fn record(&mut self, outcome: global_bucket::RequestOutcome) {
        if !outcome.duplicate {
            self.dirty = true;
            self.upserted.extend(outcome.changes.upserted);
            self.removed.extend(outcome.changes.removed);
            self.closed_cycles.extend(outcome.budget.closed);
            self.budget_events.extend(outcome.budget.events);
        }
    }
}

#[cfg(test)]
mod tests;
