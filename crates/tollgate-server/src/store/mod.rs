//! Where tenants' buckets live, behind one [`Store`] trait.
//!
//! The server is stateless: every piece of bucket state is in the store, and
//! every operation is one store transaction that reads the rows it needs,
//! runs a `tollgate-core` state machine on them with the store's clock, and
//! writes the changed rows back. Any number of server replicas can therefore
//! share a store.
//!
//! Stores: [`EmbeddedStore`] (one crash-safe file, the default) and
//! [`PostgresStore`] (PostgreSQL and compatible databases, for several
//! replicas).
//!
//! Every method is keyed by bucket or tenant; the rules live in
//! `tollgate-core` and each store only reads, locks and writes rows. What
//! they share besides the trait: [`BucketSettings`] (the global bucket's
//! knobs and what tenants nobody configured get), [`StoreError`] (with
//! [`StoreError::not_found`]: a missing request-unit bucket is
//! `TenantNotFound`, a missing named bucket `BucketNotFound`), the export
//! format ([`image`]), where a store's time goes (`stages`), and
//! [`sweep_idle_keys`], the task each server runs to remove idle keys and
//! expired check records: every [`SWEEP_INTERVAL`] (1 s), up to
//! [`SWEEP_BATCH`] (10 000) rows of each table a transaction, a few
//! transactions back to back while more wait.

mod embedded;
pub mod image;
pub mod postgres;
mod stages;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tollgate_core::budget::CycleRecord;
use tollgate_core::budget::delivery::{Attempt, Backoff, Delivery};
use tollgate_core::global_bucket::GlobalBucketConfig;
use tollgate_core::history::checks::{CheckRow, StoredCheckRow};
use tollgate_core::history::{HistoryConfig, HistorySample, Resolution};
use tollgate_core::key_bucket::{CallAnswer, CheckCall, CheckError, StoredKey};
use tollgate_core::organisation::{Node, TreeChange, TreeError};
use tollgate_core::partition::{Exchange, ExchangeAnswer};
use tollgate_core::tenant_state::{StateChange, StateChangeError, StateEdit};
use tollgate_core::tier::{
    BucketDefinition, ClosedBucket, ClosedBy, DefinedBy, LoadedTenant, Retirement, TenantChange,
    TenantEdit, TenantRecord, Tier, TierError,
};
pub use tollgate_core::transaction::{DefaultLimits, UnconfiguredTenants};
use tollgate_core::{
    BucketKey, BucketName, BucketRow, Grant, InstanceState, LimitsUpdate, RequestError, TenantId,
    TenantRefused, TenantState, TierName, Timestamp, TokenBucketRequest,
};

pub use embedded::{Clock, EmbeddedStore};
pub use image::{Counts, ImageError, Record, RecordSink, StoreImage};
pub use postgres::{PostgresOptions, PostgresStore};
pub use stages::{STAGE_BOUNDS, Stage, StageHistogram, StageHistograms};
pub(crate) use stages::{StageTimes, Stopwatch};

/// What every store is told at construction: how buckets behave, what
/// happens to tenants nobody configured, and how long closed budget
/// cycles are kept.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSettings {
    pub bucket: GlobalBucketConfig,
    pub unconfigured_tenants: UnconfiguredTenants,
    /// A closed budget cycle that ended longer ago is removed
    /// ([`Store::prune_budget_cycles`]).
    pub budget_record_retention: Duration,
    /// What is kept of each bucket's totals over time
    /// ([`Store::sample_history`]).
    pub history: HistoryConfig,
}

impl Default for BucketSettings {
    fn default() -> Self {
        BucketSettings {
            bucket: GlobalBucketConfig::default(),
            unconfigured_tenants: UnconfiguredTenants::default(),
            budget_record_retention: tollgate_core::budget::DEFAULT_RECORD_RETENTION,
            history: HistoryConfig::default(),
        }
    }
}

/// A budget event as a store keeps it: what crossed, and how far its
/// delivery to the webhooks has gone.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeptEvent {
    pub event: tollgate_core::budget::BudgetEvent,
    #[serde(flatten)]
    pub delivery: Delivery,
}

impl KeptEvent {
    /// A new event, not delivered yet, due at once.
    pub fn new(event: tollgate_core::budget::BudgetEvent) -> Self {
        let delivery = Delivery {
            next_attempt_at: event.at,
            ..Delivery::default()
        };
        KeptEvent { event, delivery }
    }

    /// The key a store keeps it under besides its bucket: the cycle's
    /// start and the threshold's label.
    pub fn cycle_and_threshold(&self) -> (Timestamp, String) {
        (self.event.cycle.start, self.event.threshold.label())
    }
}

/// A budget event a server claimed for delivery
/// ([`Store::claim_budget_events`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedEvent {
    pub key: BucketKey,
    /// The event, its delivery as of the claim.
    pub kept: KeptEvent,
    /// The claim, given back to [`Store::settle_budget_event`].
    pub claim: Timestamp,
}

/// A consistent read of one bucket, as of the store's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSnapshot {
    pub key: BucketKey,
    pub head: BucketRow,
    /// The instance rows in list order; empty in listings.
    pub instances: Vec<InstanceState>,
    /// The store's clock when the snapshot was read.
    pub read_at: Timestamp,
    /// The store's inactivity timeout: pods silent longer are not live.
    pub inactivity_timeout: Duration,
}

impl BucketSnapshot {
    /// The bucket level at `read_at`, refill included.
    pub fn current_tokens(&self) -> f64 {
        self.head.state.tokens_at(self.read_at)
    }

    /// The pods heard from within the inactivity timeout (by the rule of
    /// `tollgate_core::global_bucket::live_instances`): counted from the
    /// instance rows when the snapshot has them, else the list's count,
    /// or none for a bucket idle past the timeout.
    pub fn live_instances(&self) -> u32 {
        let rows = (!self.instances.is_empty()).then_some(self.instances.as_slice());
        tollgate_core::live_instances(&self.head, rows, self.read_at, self.inactivity_timeout)
    }

    /// How long the server has not heard from `instance`.
    pub fn silent_for(&self, instance: &InstanceState) -> Duration {
        self.read_at.duration_since(instance.last_update)
    }
}

/// The result of a limits update: the bucket before (if it existed) and after.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitsChange {
    pub before: Option<BucketRow>,
    pub after: BucketSnapshot,
    /// The tombstone the change removed: the tenant had been deleted and
    /// is created again.
    pub revived: Option<TenantState>,
}

/// A tenant as tiers see it: what it is on, and its buckets now.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantView {
    pub tenant: TenantId,
    /// `None` for a tenant never put on a tier nor given an override.
    pub record: Option<TenantRecord>,
    /// Its buckets in name order, without instances.
    pub buckets: Vec<BucketSnapshot>,
}

/// What a tenant change did (or, in a dry run, would do).
#[derive(Clone, Debug, PartialEq)]
pub struct TenantChangeOutcome {
    pub view: TenantView,
    pub created: Vec<BucketName>,
    pub changed: Vec<BucketName>,
    /// The buckets retired, as they were when deleted.
    pub retired: Vec<BucketSnapshot>,
    /// The closed records written for them, in the same order.
    pub closed: Vec<ClosedBucket>,
    /// The tombstone the change removed: the tenant had been deleted and
    /// is created again.
    pub revived: Option<TenantState>,
}

impl TenantChangeOutcome {
    /// What a change did, from the rows a store loaded for it
    /// (`loaded`), the edit it wrote and the buckets that edit retired
    /// (`retirements`, whose closed records it wrote): every store answers
    /// the same, without reading its rows again.
    pub fn new(
        tenant: &TenantId,
        loaded: &LoadedTenant,
        edit: TenantEdit,
        retirements: Vec<Retirement>,
        revived: Option<TenantState>,
        now: Timestamp,
        inactivity_timeout: Duration,
    ) -> TenantChangeOutcome {
        let snapshot = |name: BucketName, head: BucketRow| BucketSnapshot {
            key: BucketKey::new(tenant.clone(), name),
            head,
            instances: Vec::new(),
            read_at: now,
            inactivity_timeout,
        };
        let buckets = edit
            .buckets_after(loaded)
            .into_iter()
            .map(|(name, head)| snapshot(name, head))
            .collect();
        let (retired, closed) = retirements
            .into_iter()
            .map(|r| (snapshot(r.name, r.head), r.closed))
            .unzip();
        TenantChangeOutcome {
            view: TenantView {
                tenant: tenant.clone(),
                record: Some(edit.record),
                buckets,
            },
            created: edit.created.into_keys().collect(),
            changed: edit.changed.into_keys().collect(),
            retired,
            closed,
            revived,
        }
    }

    /// True if the change created, changed and retired nothing: a tier's
    /// new definition leaves such a tenant out of what it reports.
    pub fn is_unchanged(&self) -> bool {
        self.created.is_empty() && self.changed.is_empty() && self.retired.is_empty()
    }
}

/// Who asks for an operator change, and whether to keep it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdminCall {
    /// Written into the closed record of every bucket the change closes.
    pub by: ClosedBy,
    /// Run the whole transaction, answer what it did, and roll it back:
    /// nothing changes.
    pub dry_run: bool,
}

/// What deleting a tenant did.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletedTenant {
    /// Its buckets as they were when deleted, without instances.
    pub buckets: Vec<BucketSnapshot>,
    /// The closed record written for each, in the same order.
    pub closed: Vec<ClosedBucket>,
}

/// A closed record as a store lists it: `seq` orders a tenant's records
/// in the order they were closed (the page token of the next page).
#[derive(Clone, Debug, PartialEq)]
pub struct ClosedEntry {
    pub seq: u64,
    pub closed: ClosedBucket,
}

/// What putting a tier did.
#[derive(Clone, Debug, PartialEq)]
pub struct PutTierOutcome {
    pub tier: Tier,
    /// False if the tier existed and was replaced.
    pub created: bool,
    /// The changes to the tenants on the tier, of those whose buckets
    /// changed.
    pub tenants: Vec<TenantChangeOutcome>,
}

/// Which rows of the tree of organisations to read.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeFilter {
    /// Every organisation's row.
    Organisations,
    /// The rows of the members of an organisation.
    MembersOf(TenantId),
    /// The rows of these ids (an id without one is left out).
    Ids(Vec<TenantId>),
}

impl NodeFilter {
    /// Whether the row of `id` is one this filter asks for.
    pub fn matches(&self, id: &TenantId, node: &Node) -> bool {
        match self {
            NodeFilter::Organisations => node.organisation.is_some(),
            NodeFilter::MembersOf(org) => node
                .member_of
                .as_ref()
                .is_some_and(|m| &m.organisation == org),
            NodeFilter::Ids(ids) => ids.contains(id),
        }
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("tenant \"{0}\" not found")]
    TenantNotFound(TenantId),
    /// A named bucket the tenant does not have (a missing request-unit
    /// bucket is [`StoreError::TenantNotFound`]).
    #[error("tenant \"{}\" has no bucket \"{}\"", .0.tenant, .0.bucket)]
    BucketNotFound(BucketKey),
    /// The state machine refused the operation; nothing was changed.
    #[error(transparent)]
    Rejected(#[from] RequestError),
    /// A tier or tenant change was refused; nothing was changed.
    #[error(transparent)]
    Tier(#[from] TierError),
    /// A check was refused (an unknown or shared bucket, a reused request
    /// id); nothing was taken.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The tenant is deleted or suspended: its pods are refused; nothing
    /// was changed.
    #[error(transparent)]
    TenantRefused(#[from] TenantRefused),
    /// A change of the tree of organisations was refused; nothing was
    /// changed.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The store cannot be reached right now; the operation may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// An import into a store that already holds something, not told to
    /// replace it; nothing was changed.
    #[error("the store is not empty: it holds {0}")]
    NotEmpty(String),
    /// The store failed in a way a retry will not fix.
    #[error("{context}: {source}")]
    Internal {
        context: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// True if the store failed (as opposed to answering that the tenant
    /// does not exist or that the operation is refused): what
    /// [`StoreStats::failures`] counts and operators are alerted on.
    pub fn is_store_failure(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Internal { .. }
        )
    }

    /// The same error again, for another caller that shared the failed
    /// transaction (the source of an `Internal` one is kept as its message).
    pub(crate) fn for_another_caller(&self) -> StoreError {
        match self {
            StoreError::TenantNotFound(tenant) => StoreError::TenantNotFound(tenant.clone()),
            StoreError::BucketNotFound(key) => StoreError::BucketNotFound(key.clone()),
            StoreError::Rejected(e) => StoreError::Rejected(e.clone()),
            StoreError::Tier(e) => StoreError::Tier(e.clone()),
            StoreError::Check(e) => StoreError::Check(e.clone()),
            StoreError::TenantRefused(e) => StoreError::TenantRefused(e.clone()),
            StoreError::Tree(e) => StoreError::Tree(e.clone()),
            StoreError::Unavailable(message) => StoreError::Unavailable(message.clone()),
            StoreError::NotEmpty(what) => StoreError::NotEmpty(what.clone()),
            StoreError::Internal { context, source } => {
                StoreError::internal(context, source.to_string())
            }
        }
    }

    /// The error for a bucket that does not exist.
    pub fn not_found(key: &BucketKey) -> StoreError {
        if key.bucket.is_request_units() {
            StoreError::TenantNotFound(key.tenant.clone())
        } else {
            StoreError::BucketNotFound(key.clone())
        }
    }

    /// The error for a refused tenant state change.
    pub fn state_change(e: StateChangeError) -> StoreError {
        match e {
            StateChangeError::TenantNotFound(tenant) => StoreError::TenantNotFound(tenant),
            StateChangeError::Refused(e) => StoreError::TenantRefused(e),
        }
    }

    pub(crate) fn internal(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError::Internal {
            context,
            source: source.into(),
        }
    }
}

/// Counters of a store's work since it was opened, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Write transactions committed (a batch of token-bucket requests
    /// counts once).
    pub transactions: u64,
    /// Token-bucket requests served by those transactions.
    pub requests: u64,
    /// Attempts that failed and were run again.
    pub retries: u64,
    /// Operations that failed for good (after their last attempt).
    pub failures: u64,
    /// Instances removed for being silent.
    pub instances_removed: u64,
    /// Checks of per-key buckets answered (a call counts once).
    pub checks: u64,
    /// Round trips token-bucket transactions took for the organisation
    /// rows their draws needed, beyond their own (PostgreSQL only).
    pub draw_round_trips: u64,
    /// Organisation draws a transaction skipped because the
    /// organisation's row was held, tried again by the worker's next
    /// transaction (PostgreSQL only; each try counts).
    pub owed_draws: u64,
    /// Keys whose rows were removed for being full again (when a check
    /// found them so, or by a sweep).
    pub keys_removed: u64,
    /// How long writes spent in each stage, indexed as [`Stage::ALL`].
    pub stages: StageHistograms,
}

/// What a sweep of idle keys removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeySweep {
    /// Key rows full by now, removed.
    pub keys: u64,
    /// Request records past their time, removed.
    pub records: u64,
    /// True if the sweep stopped at its limit: more may be waiting.
    pub more: bool,
}

/// What the per-key tables hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCounts {
    /// Keys below their burst (a full key has no row).
    pub keys: u64,
    /// Request records kept for retries.
    pub records: u64,
}

/// A tenant's per-key bucket as the store holds it: its definition and its
/// stored keys, from one snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyBucketSnapshot {
    pub key: BucketKey,
    /// The definition in force (the tenant's override, else its tier's).
    pub definition: BucketDefinition,
    pub defined_by: DefinedBy,
    /// Keys below their burst: the rows stored (a full key has none).
    pub keys_stored: u64,
    /// The busiest of its stored keys, busiest first (by
    /// `tollgate_core::key_bucket::busiest_first`), as many as asked for.
    pub busiest: Vec<(String, StoredKey)>,
    /// The store's clock when the snapshot was read.
    pub read_at: Timestamp,
}

/// The atomic counters behind [`StoreStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) instances_removed: AtomicU64,
    pub(crate) checks: AtomicU64,
    pub(crate) draw_round_trips: AtomicU64,
    pub(crate) owed_draws: AtomicU64,
    pub(crate) keys_removed: AtomicU64,
    pub(crate) stages: StageTimes,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> StoreStats {
        StoreStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            instances_removed: self.instances_removed.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            draw_round_trips: self.draw_round_trips.load(Ordering::Relaxed),
            owed_draws: self.owed_draws.load(Ordering::Relaxed),
            keys_removed: self.keys_removed.load(Ordering::Relaxed),
            stages: self.stages.snapshot(),
        }
    }
}

/// A transactional home for tenants' buckets.
///
/// Every method is one transaction: it either happens completely or not at
/// all. Time is the store's own clock. A bucket is keyed by tenant and
/// bucket name; the empty name is the tenant's request-unit bucket.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Serves a pod's token-bucket request (the script of
    /// `tollgate_core::transaction`).
    async fn token_bucket(
        &self,
        key: &BucketKey,
        request: &TokenBucketRequest,
    ) -> Result<Grant, StoreError>;

    /// Sets a bucket's limits, creating the bucket if needed, and removes
    /// the tenant's tombstone, if it has one.
    async fn update_limits(
        &self,
        key: &BucketKey,
        update: &LimitsUpdate,
    ) -> Result<LimitsChange, StoreError>;

    /// Reads a bucket with its instances.
    async fn get_bucket(&self, key: &BucketKey) -> Result<BucketSnapshot, StoreError>;

    /// Reads every bucket of a tenant, with instances, in bucket order;
    /// `TenantNotFound` if it has none.
    async fn get_tenant(&self, tenant: &TenantId) -> Result<Vec<BucketSnapshot>, StoreError>;

    /// Reads up to `limit` buckets with keys after `after`, in key order,
    /// without instances.
    async fn list_buckets(
        &self,
        after: Option<&BucketKey>,
        limit: usize,
    ) -> Result<Vec<BucketSnapshot>, StoreError>;

    /// Deletes a tenant: all its buckets and their instances, answering
    /// with the buckets as they were when deleted (without instances).
    /// Each bucket leaves a closed record, and the tenant a tombstone
    /// saying when and by whom: its pods are refused until an operator
    /// creates it again (`tollgate_core::tenant_state`).
    async fn delete_tenant(&self, tenant: &TenantId) -> Result<Vec<BucketSnapshot>, StoreError> {
        Ok(self
            .delete_tenant_by(tenant, &AdminCall::default())
            .await?
            .buckets)
    }

    /// [`Store::delete_tenant`] for `call`: its closed records name who
    /// asked; a dry run deletes nothing.
    async fn delete_tenant_by(
        &self,
        tenant: &TenantId,
        call: &AdminCall,
    ) -> Result<DeletedTenant, StoreError>;

    /// Suspends or resumes a tenant (the rules of
    /// `tollgate_core::tenant_state::change`), keeping its limits, buckets
    /// and totals as they are.
    async fn change_tenant_state(
        &self,
        tenant: &TenantId,
        change: &StateChange,
    ) -> Result<StateEdit, StoreError>;

    /// The state rows (tombstones, suspensions) of `tenants`; a tenant
    /// without one is left out.
    async fn tenant_states(
        &self,
        tenants: &[TenantId],
    ) -> Result<BTreeMap<TenantId, TenantState>, StoreError>;

    /// Applies a tier or override change to a tenant, in one transaction
    /// (the rules of `tollgate_core::tier::change_tenant`); each bucket it
    /// retires leaves a closed record in the same transaction, and a
    /// change that succeeds removes the tenant's tombstone, if it has one.
    async fn change_tenant(
        &self,
        tenant: &TenantId,
        change: &TenantChange,
    ) -> Result<TenantChangeOutcome, StoreError> {
        self.change_tenant_by(tenant, change, &AdminCall::default())
            .await
    }

    /// [`Store::change_tenant`] for `call`.
    async fn change_tenant_by(
        &self,
        tenant: &TenantId,
        change: &TenantChange,
        call: &AdminCall,
    ) -> Result<TenantChangeOutcome, StoreError>;

    /// Changes the tree of organisations by the rules of
    /// `tollgate_core::organisation::apply`, in one transaction: reads the
    /// rows of [`TreeChange::reads`] (locked), writes what the rules
    /// decide; answers the rows written (an empty one was deleted).
    async fn change_tree(&self, change: &TreeChange) -> Result<Vec<(TenantId, Node)>, StoreError>;

    /// Rows of the tree of organisations, in id order.
    async fn tree_nodes(&self, filter: &NodeFilter) -> Result<Vec<(TenantId, Node)>, StoreError>;

    /// A tenant's closed records with `seq` above `after`, in the order
    /// they were closed, at most `limit`. Those of a deleted tenant stay.
    async fn list_closed(
        &self,
        tenant: &TenantId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ClosedEntry>, StoreError>;

    /// A bucket's closed budget cycles, newest first, at most `limit`.
    /// Those of a retired bucket or a deleted tenant stay.
    async fn budget_cycles(
        &self,
        key: &BucketKey,
        limit: usize,
    ) -> Result<Vec<CycleRecord>, StoreError>;

    /// Removes at most `limit` closed budget cycles that ended, and at
    /// most `limit` budget events made, longer ago than the store's
    /// `budget_record_retention`, by the store's clock; answers how many
    /// of each it removed.
    async fn prune_budget_records(&self, limit: usize) -> Result<PrunedRecords, StoreError>;

    /// Samples the totals of up to `limit` buckets with keys after
    /// `after`, in key order, at the store's clock, into the rows of the
    /// store's history resolutions (`tollgate_core::history::
    /// rows_to_write`). Any replica may sample: rows are keyed by bucket,
    /// resolution and slot.
    async fn sample_history(
        &self,
        after: Option<&BucketKey>,
        limit: usize,
    ) -> Result<HistoryPage, StoreError>;

    /// `key`'s history from `since` to `until` in the resolution of steps
    /// nearest to `step` that keeps `since` (`HistoryConfig::
    /// resolution_for`, at the store's clock), after the last row before
    /// `since`. Rows outlive their bucket: a deleted bucket's history is
    /// read as any other's.
    async fn history(
        &self,
        key: &BucketKey,
        since: Timestamp,
        until: Timestamp,
        step: Duration,
    ) -> Result<HistoryRows, StoreError>;

    /// Removes up to `limit` history rows, and up to `limit` per-key check
    /// rows, past their resolution's retention by the store's clock;
    /// answers how many.
    async fn prune_history(&self, limit: usize) -> Result<u64, StoreError>;

    /// Writes `replica`'s counts of per-key checks
    /// (`tollgate_core::history::checks`): each row in place of the
    /// replica's row of its bucket, resolution and slot, only if its
    /// counts grew (`CheckCounts::replaces`).
    async fn record_checks(&self, replica: &str, rows: &[CheckRow]) -> Result<(), StoreError>;

    /// `key`'s per-key check rows, every replica's, with slots from
    /// `since` to `until`, in the resolution [`Store::history`] reads for
    /// the same span.
    async fn check_history(
        &self,
        key: &BucketKey,
        since: Timestamp,
        until: Timestamp,
        step: Duration,
    ) -> Result<CheckHistoryRows, StoreError>;

    /// The usage history's resolutions and sample interval.
    fn history_config(&self) -> HistoryConfig;

    /// Claims at most `limit` budget events due for delivery
    /// ([`Delivery::is_due`]) for `lease`, by the store's clock: no other
    /// server claims them until the lease ends, unless the claim is
    /// settled first. Oldest due first.
    async fn claim_budget_events(
        &self,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedEvent>, StoreError>;

    /// Settles `claimed` with what came of posting it to `webhooks`
    /// ([`Delivery::settle`]). An event no longer kept (pruned) is let go.
    async fn settle_budget_event(
        &self,
        claimed: &ClaimedEvent,
        attempt: &Attempt,
        webhooks: &[String],
        backoff: &Backoff,
    ) -> Result<(), StoreError>;

    /// Reads a tenant's record and buckets; `TenantNotFound` if it has
    /// neither.
    async fn describe_tenant(&self, tenant: &TenantId) -> Result<TenantView, StoreError>;

    /// The records (tier, overrides) of `tenants`, read without a lock; a
    /// tenant without one is left out.
    async fn tenant_records(
        &self,
        tenants: &[TenantId],
    ) -> Result<BTreeMap<TenantId, TenantRecord>, StoreError>;

    /// Creates or replaces a tier and, in the same transaction, brings
    /// every tenant on it in line with the new definition.
    async fn put_tier(&self, name: &TierName, tier: &Tier) -> Result<PutTierOutcome, StoreError> {
        self.put_tier_by(name, tier, &AdminCall::default()).await
    }

    /// [`Store::put_tier`] for `call`.
    async fn put_tier_by(
        &self,
        name: &TierName,
        tier: &Tier,
        call: &AdminCall,
    ) -> Result<PutTierOutcome, StoreError>;

    /// Reads a tier.
    async fn get_tier(&self, name: &TierName) -> Result<Tier, StoreError>;

    /// Reads every tier, in name order.
    async fn list_tiers(&self) -> Result<Vec<(TierName, Tier)>, StoreError>;

    /// Deletes a tier no tenant is on.
    async fn delete_tier(&self, name: &TierName) -> Result<(), StoreError>;

    /// Serves a pod's partition-load exchange (the rules of
    /// `tollgate_core::partition::exchange`): its report recorded in the
    /// tenant's reports, its limits and shares answered. A tenant without
    /// table limits, or unknown, has an empty set of them; a deleted or
    /// suspended one is refused.
    async fn partition_load(
        &self,
        tenant: &TenantId,
        exchange: &Exchange,
    ) -> Result<ExchangeAnswer, StoreError>;

    /// Serves a check of per-key buckets (the script of
    /// `tollgate_core::key_bucket`): every item taken, or none.
    async fn check(&self, call: &CheckCall) -> Result<CallAnswer, StoreError>;

    /// Removes up to `limit` key rows that are full by now and up to
    /// `limit` request records past their time.
    async fn sweep_keys(&self, limit: usize) -> Result<KeySweep, StoreError>;

    /// Counts the stored keys and request records.
    async fn key_counts(&self) -> Result<KeyCounts, StoreError>;

    /// Reads per-key buckets in tenant-id and bucket order, those after
    /// `after`, at most `limit`: every tenant's, or `tenant`'s only (none
    /// if it has none or does not exist). Each comes with its stored keys
    /// counted and up to `busiest` of them, busiest first. Reads only, from
    /// one snapshot: a check never waits on it, and it adds nothing to a
    /// check's work (it walks the bucket's key rows instead: its cost grows
    /// with the keys stored).
    async fn list_key_buckets(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&BucketKey>,
        limit: usize,
        busiest: usize,
    ) -> Result<Vec<KeyBucketSnapshot>, StoreError>;

    /// Sends a consistent snapshot of the whole store to `sink`: a header,
    /// every tier, tenant record, tenant state, bucket with its instances,
    /// key, check record and closed bucket, and an end line with their counts (the format of
    /// [`image`]). Writes nothing.
    async fn export(&self, sink: RecordSink) -> Result<Counts, StoreError>;

    /// Loads `image` in one transaction. A store that already holds tiers,
    /// tenants, buckets, keys or closed buckets is refused with `NotEmpty` unless
    /// `replace`, which removes all of it first, in the same transaction.
    async fn import(&self, image: StoreImage, replace: bool) -> Result<Counts, StoreError>;

    /// Counters of the store's work so far.
    fn stats(&self) -> StoreStats;

    /// Finishes pending work and releases the store (files, connections).
    /// Operations after `close` fail.
    async fn close(&self) -> Result<(), StoreError>;
}

/// How often each replica sweeps idle keys and expired check records.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// The most rows of each table one sweep transaction walks.
pub const SWEEP_BATCH: usize = 10_000;
/// The most sweep transactions run back to back while more rows wait.
const SWEEP_ROUNDS: usize = 10;

/// How often each server prunes budget records past their retention.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(3_600);

/// What one call of [`Store::sample_history`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryPage {
    /// Buckets sampled.
    pub buckets: usize,
    /// Rows written: none for a bucket whose totals had not changed.
    pub rows_written: u64,
    /// The last bucket sampled, where more may follow.
    pub last: Option<BucketKey>,
}

/// A bucket's history rows, oldest first ([`Store::history`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryRows {
    /// The resolution read.
    pub resolution: Resolution,
    pub samples: Vec<HistorySample>,
    /// Whether the first sample is the last row before the span asked
    /// for (what the first span's usage is counted from).
    pub baseline: bool,
}

/// A per-key bucket's check rows ([`Store::check_history`]), by slot.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckHistoryRows {
    /// The resolution read.
    pub resolution: Resolution,
    pub rows: Vec<StoredCheckRow>,
}

/// Samples every bucket's totals every `interval` ([`Store::
/// sample_history`]), [`HISTORY_PAGE`] buckets a transaction, and prunes
/// rows past retention once an hour, until the task is dropped.
pub async fn keep_history(store: Arc<dyn Store>, interval: Duration) {
    let sampling = async {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            ticks.tick().await;
            let mut after: Option<BucketKey> = None;
            let mut written = 0;
            loop {
                match store.sample_history(after.as_ref(), HISTORY_PAGE).await {
                    Ok(page) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("sampling usage history works again");
                        }
                        written += page.rows_written;
                        match page.last {
                            Some(last) => after = Some(last),
                            None => break,
                        }
                    }
                    Err(e) => {
                        if std::mem::replace(&mut failing, true) {
                            tracing::debug!(error = %e, "sampling usage history failed again");
                        } else {
                            tracing::warn!(error = %e, "sampling usage history failed; trying again every {interval:?}");
                        }
                        break;
                    }
                }
            }
            tracing::trace!(rows = written, "sampled usage history");
        }
    };
    let pruning = every(HISTORY_PRUNE_INTERVAL, "pruning usage history", || async {
        let pruned = store.prune_history(SWEEP_BATCH).await?;
        if pruned > 0 {
            tracing::debug!(rows = pruned, "pruned usage history past its retention");
        }
        Ok(pruned as usize >= SWEEP_BATCH)
    });
    tokio::join!(sampling, pruning);
}

/// Buckets [`keep_history`] samples a transaction: small enough that the
/// embedded store's one writer is never held long from pods' requests.
pub const HISTORY_PAGE: usize = 1_000;

/// How often [`keep_history`] prunes.
pub const HISTORY_PRUNE_INTERVAL: Duration = Duration::from_secs(3_600);

/// What [`Store::prune_budget_records`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrunedRecords {
    pub cycles: u64,
    pub events: u64,
    /// Of the events, those no webhook had been delivered to in full.
    pub undelivered_events: u64,
}

/// Prunes closed budget cycles and budget events past their retention
/// every `interval`, [`SWEEP_BATCH`] of each a transaction, until the
/// task is dropped.
pub async fn prune_budget_records(store: Arc<dyn Store>, interval: Duration) {
    every(interval, "pruning budget records", || async {
        let pruned = store.prune_budget_records(SWEEP_BATCH).await?;
        if pruned.cycles > 0 || pruned.events > 0 {
            tracing::info!(
                cycles = pruned.cycles,
                events = pruned.events,
                "pruned closed budget cycles and budget events past their retention"
            );
        }
        if pruned.undelivered_events > 0 {
            tracing::warn!(
                events = pruned.undelivered_events,
                "pruned budget events past their retention that were never delivered to every webhook"
            );
        }
        Ok(pruned.cycles.max(pruned.events) as usize >= SWEEP_BATCH)
    })
    .await
}

/// Removes idle keys and expired check records from `store` every
/// `interval`, `batch` rows a transaction, until the task is dropped. A
/// key left behind by a failed sweep only takes room: a check finds it
/// full all the same.
pub async fn sweep_idle_keys(store: Arc<dyn Store>, interval: Duration, batch: usize) {
    every(interval, "sweep of idle keys", || async {
        let sweep = store.sweep_keys(batch).await?;
        if sweep.keys > 0 || sweep.records > 0 {
            tracing::debug!(
                keys = sweep.keys,
                records = sweep.records,
                "swept idle keys and expired check records"
            );
        }
        Ok(sweep.more)
    })
    .await
}

/// Runs `round` every `interval` until the task is dropped, up to
/// [`SWEEP_ROUNDS`] times back to back while it answers that more work
/// waits. A failed round is tried again at the next interval; the first
/// failure of a run of them is logged as a warning, the rest at debug
/// level, so an outage of the store does not fill the log.
pub(crate) async fn every<F, Fut>(interval: Duration, what: &'static str, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, StoreError>>,
{
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        for _ in 0..SWEEP_ROUNDS {
            match round().await {
                Ok(more) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("{what} works again");
                    }
                    if !more {
                        break;
                    }
                }
                Err(e) => {
                    if std::mem::replace(&mut failing, true) {
                        tracing::debug!(error = %e, "{what} failed again");
                    } else {
                        tracing::warn!(error = %e, "{what} failed; trying again every {interval:?}");
                    }
                    break;
                }
            }
        }
    }
}
