//! The web console on the HTTP port: `/console`, an operator's first
//! screen. The overview lists every tenant's buckets (tier, limits, level,
//! request units per second, pods throttled and since when, live pods, the
//! budget's spend against its amount with the forecast), their per-key
//! buckets (definition, keys stored, this replica's checks and refusals
//! per second, the busiest keys) and the tree of organisations (each
//! member's buckets with what they use, want, are guaranteed, draw and
//! borrow); `/console/api/buckets` is the JSON it polls. A tenant's page
//! (`/console/api/tenant`) charts each of its buckets, and their sum, over
//! 1 h, 24 h, 7 d or 30 d from the usage history in the store
//! (`tollgate_core::history`): request units and granted tokens per second
//! against the refill rate, and pods throttled; with its pods, tier,
//! budget, organisation and per-key buckets.
//!
//! The page is one static file with its script inline: no build step, and
//! nothing to serve but itself. The overview's data comes from the store,
//! read at most every [`SAMPLE_INTERVAL`] whatever the number of open
//! consoles, and only while a console asks: with no console open, nothing
//! is read. Each read keeps the first [`MAX_BUCKETS`] buckets (in
//! tenant-id order); rates are the differences of the exact totals over
//! the reads of the last [`RATE_WINDOW`]. Whether a bucket's pods are
//! throttled is exact (trickle tokens still owed to its pods, whichever
//! replica granted them); since when is read from the history (the start
//! of the run of minutes with throttled time), or, for a throttling too
//! new for it, from the first read that saw it. Per-key buckets are shown
//! as the last read found them, with the check rates this replica counted
//! then (`check_rates`). Read-only: the console changes nothing, and wants
//! an admin token (any role, unscoped) where the Admin service does.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;
use tollgate_core::history::{self, ThrottledSince, Usage, checks};
use tollgate_core::key_bucket::KeyReading;
use tollgate_core::organisation::{MemberRates, Node};
use tollgate_core::tier::DefinedBy;
use tollgate_core::{BucketKey, BucketName, InvalidInput, Limits, TenantId, Timestamp};

use super::Metrics;
use super::metrics::read_buckets;
use crate::store::{BucketSnapshot, KeyBucketSnapshot, NodeFilter, Store, StoreError};

/// The busiest keys shown per per-key bucket.
pub const BUSIEST_KEYS: usize = 3;

/// How often the store is read, at most, while a console is open.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// How many buckets a read keeps: the first, in tenant-id and bucket order.
pub const MAX_BUCKETS: usize = 1000;

/// How many organisations a read keeps: the first, in id order.
pub const MAX_ORGANISATIONS: usize = 100;

/// The overview's rates cover the reads of this long (pods report about
/// every 10 s, so a shorter window reads 0 between their reports).
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// How far back the history is read to say since when a bucket has been
/// throttled, in slots of [`SINCE_STEP`].
pub const SINCE_LOOKBACK: Duration = Duration::from_secs(24 * 3_600);
const SINCE_STEP: Duration = Duration::from_secs(60);

/// At most this many throttled buckets have their history read per read
/// of the overview; the rest say "throttled" without since when until a
/// later read.
pub const MAX_SINCE_LOOKUPS: usize = 50;

/// A bucket's since-when is read again after this long.
const SINCE_REFRESH: Duration = Duration::from_secs(60);

/// One bucket as one read found it.
#[derive(Clone, Debug)]
struct BucketSample {
    refill_rate: f64,
    burst_limit: f64,
    tokens: f64,
    live_instances: u32,
    request_unit_micros: u64,
    throttled_micros: u64,
    /// Trickle tokens still owed to its pods: some are throttled.
    throttled: bool,
    /// Shadow mode, and what enforcing would have throttled.
    shadow: bool,
    shadow_throttled_micros: u64,
    would_throttle: bool,
    /// Tokens granted to its pods (or its members' draws) so far.
    granted_tokens: f64,
    /// A member's bucket: its standing with its organisation.
    member: Option<MemberRates>,
    budget: Option<BudgetColumn>,
}

/// One read of the store.
#[derive(Debug)]
struct Sample {
    taken: Instant,
    read_at: Timestamp,
    buckets: BTreeMap<BucketKey, BucketSample>,
    truncated: bool,
    /// The tier each tenant read is on.
    tiers: BTreeMap<TenantId, String>,
    /// The per-key buckets as read, with this replica's rates then.
    key_buckets: Vec<KeyBucketView>,
    key_buckets_truncated: bool,
    /// The organisations' rows and their members', by id.
    tree: BTreeMap<TenantId, Node>,
    organisations_truncated: bool,
}

/// Since when a bucket has been throttled, as its history said when read.
#[derive(Clone, Copy, Debug)]
struct SinceLookup {
    read: Instant,
    found: Option<ThrottledSince>,
}

#[derive(Debug, Default)]
struct Reads {
    /// Newest last, the last [`RATE_WINDOW`] of them (and one before).
    samples: VecDeque<Sample>,
    since: HashMap<BucketKey, SinceLookup>,
}

/// The console's reads.
#[derive(Debug, Default)]
pub struct Console {
    reads: tokio::sync::Mutex<Reads>,
}

/// What `/console/api/buckets` answers.
#[derive(Debug, Serialize)]
pub struct ConsoleView {
    /// When the store was last read, by its clock: seconds since the Unix
    /// epoch.
    pub read_at_unix: f64,
    pub sample_interval_seconds: f64,
    /// The time the rates cover (the reads of the last [`RATE_WINDOW`]);
    /// `null` until there are two reads.
    pub rate_window_seconds: Option<f64>,
    /// More buckets exist than [`MAX_BUCKETS`]; only the first are shown.
    pub truncated: bool,
    pub total_buckets: usize,
    pub total_tenants: usize,
    /// This replica's pod-facing requests in flight.
    pub pending_requests: i64,
    pub buckets: Vec<BucketView>,
    /// Per-key buckets in tenant and bucket order, as the last read found
    /// them.
    pub key_buckets: Vec<KeyBucketView>,
    /// More per-key buckets exist than [`MAX_BUCKETS`].
    pub key_buckets_truncated: bool,
    /// The tree of organisations, depth first: each organisation's
    /// buckets, then its members' (an organisation among them followed
    /// by its own members).
    pub organisations: Vec<TreeRowView>,
    /// More organisations exist than [`MAX_ORGANISATIONS`].
    pub organisations_truncated: bool,
}

/// One bucket of the tree of organisations: an organisation's own, or a
/// member's (an id with no bucket listed has one row, its bucket and
/// figures `null`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TreeRowView {
    /// 0 for an organisation at the top.
    pub depth: usize,
    pub id: String,
    pub is_organization: bool,
    /// An organisation's display name.
    pub display_name: String,
    pub bucket: Option<String>,
    /// The bucket's own limit: for a member, its ceiling.
    pub refill_rate: Option<f64>,
    /// Tokens per second granted (to its pods, or to its members' draws),
    /// over `rate_window_seconds`.
    pub granted_per_second: Option<f64>,
    /// A member's bucket as of its last draw ([`MemberRates`]).
    pub wanted_rate: Option<f64>,
    pub guaranteed_rate: Option<f64>,
    pub drawn_rate: Option<f64>,
    pub borrowed_rate: Option<f64>,
}

/// A per-key bucket: its definition, its stored keys, and this replica's
/// checks.
#[derive(Clone, Debug, Serialize)]
pub struct KeyBucketView {
    pub tenant_id: String,
    pub bucket: String,
    /// Per key.
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// `tier` or `override`.
    pub defined_by: &'static str,
    /// Keys below their burst.
    pub keys_stored: u64,
    /// False: in shadow mode (refusing nothing).
    pub enforce: bool,
    /// This replica's, over `rate_window_seconds`.
    pub checks_per_second: f64,
    pub refusals_per_second: f64,
    /// Checks allowed in shadow mode that enforcing would have refused.
    pub shadow_refusals_per_second: f64,
    pub rate_window_seconds: f64,
    /// At most [`BUSIEST_KEYS`], the furthest from full first.
    pub busiest_keys: Vec<BusyKeyView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BusyKeyView {
    pub key: String,
    pub tokens: f64,
    /// `null`: never (no refill).
    pub full_in_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct BucketView {
    pub tenant_id: String,
    /// Empty for the tenant's request-unit bucket.
    pub bucket: String,
    /// The tenant's tier; `null` if it is on none.
    pub tier: Option<String>,
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// The level when read; negative is debt.
    pub tokens: f64,
    pub live_instances: u32,
    /// Over `rate_window_seconds`; `null` until there are two reads.
    pub request_units_per_second: Option<f64>,
    /// Pods throttled on average over `rate_window_seconds` (the time
    /// they spent on trickles, counted when each asks again).
    pub throttled_pods: Option<f64>,
    /// Some of its pods are throttled now.
    pub throttled: bool,
    /// Since when, by the history, or the first read that saw it: unix
    /// seconds; `null` if not throttled or not yet known.
    pub throttled_since_unix: Option<f64>,
    /// Throttled throughout what was read ([`SINCE_LOOKBACK`]): since
    /// then at least.
    pub throttled_since_at_least: bool,
    /// The bucket's budget in its current cycle; `null` without one.
    pub budget: Option<BudgetColumn>,
    /// Shadow mode: pods get what they ask; `would_throttle` and
    /// `would_throttle_pods` say what enforcing would do.
    pub shadow: bool,
    pub would_throttle: bool,
    /// Pods enforcing would have on trickles, on average over
    /// `rate_window_seconds`; `null` until there are two reads.
    pub would_throttle_pods: Option<f64>,
}

/// A bucket's budget as the console shows it: a bar of the spend against
/// the amount, with the forecast.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetColumn {
    pub amount: f64,
    pub spend: f64,
    pub forecast: f64,
    /// `under`, `over`, `throttled` or `stopped`.
    pub state: &'static str,
    /// `monthly`, `weekly` or `daily`.
    pub period: &'static str,
    pub cycle_end_unix: f64,
    /// For display: the spend's price, and its currency.
    pub spend_price: Option<f64>,
    pub currency: Option<String>,
    /// False: shadow mode (past the amount it only alerts).
    pub enforce: bool,
    /// In shadow mode past the amount: what enforcing would have held
    /// back of the spend.
    pub shadow_excess: Option<f64>,
}

impl BudgetColumn {
    fn of(snapshot: &BucketSnapshot) -> Option<BudgetColumn> {
        use tollgate_core::budget::Period;
        let budget = snapshot.head.budget.as_ref()?;
        let view = budget.view(&snapshot.head.state, snapshot.read_at);
        let spend = view.usage.spend();
        Some(BudgetColumn {
            amount: view.budget.amount,
            spend,
            forecast: view.forecast,
            state: view.standing.name(),
            period: match view.budget.cycle.period {
                Period::Monthly { .. } => "monthly",
                Period::Weekly { .. } => "weekly",
                Period::Daily => "daily",
            },
            cycle_end_unix: unix_seconds(view.cycle.end),
            spend_price: view.budget.price.as_ref().map(|p| p.of(spend)),
            currency: view.budget.price.as_ref().map(|p| p.currency.clone()),
            enforce: view.budget.enforce,
            shadow_excess: view.shadow_excess,
        })
    }
}

/// Some of `snapshot`'s pods are throttled at its reading: trickle tokens
/// are still owed to them.
fn throttled(snapshot: &BucketSnapshot) -> bool {
    snapshot.head.enforce && owes_trickles(snapshot)
}

/// Trickle tokens are still owed to its pods: enforcing, some are
/// throttled; in shadow mode, enforcing would have them throttled.
fn owes_trickles(snapshot: &BucketSnapshot) -> bool {
    snapshot.head.state.committed_at(snapshot.read_at) > 0.0
}

/// In shadow mode, and enforcing would have pods throttled now.
fn would_throttle(snapshot: &BucketSnapshot) -> bool {
    !snapshot.head.enforce && owes_trickles(snapshot)
}

impl Console {
    pub fn new() -> Console {
        Console::default()
    }

    /// The view, reading the store first if the last read is older than
    /// [`SAMPLE_INTERVAL`]. Concurrent callers share one read.
    pub async fn view(
        &self,
        store: &dyn Store,
        metrics: &Metrics,
    ) -> Result<ConsoleView, StoreError> {
        let mut reads = self.reads.lock().await;
        let stale = reads
            .samples
            .back()
            .is_none_or(|last| last.taken.elapsed() >= SAMPLE_INTERVAL);
        if stale {
            let sample = read(store, metrics).await?;
            look_up_since(store, &sample, &mut reads.since).await?;
            reads.samples.push_back(sample);
            // Keep one read older than the window, so rates cover all of it.
            while reads
                .samples
                .get(1)
                .is_some_and(|second| second.taken.elapsed() > RATE_WINDOW)
            {
                reads.samples.pop_front();
            }
        }
        Ok(view_of(&reads.samples, &reads.since, metrics))
    }
}

/// Reads since when each bucket throttled in `sample` has been, from its
/// history, for those not read within [`SINCE_REFRESH`] (at most
/// [`MAX_SINCE_LOOKUPS`]); forgets buckets no longer throttled.
async fn look_up_since(
    store: &dyn Store,
    sample: &Sample,
    since: &mut HashMap<BucketKey, SinceLookup>,
) -> Result<(), StoreError> {
    since.retain(|key, _| sample.buckets.get(key).is_some_and(|b| b.throttled));
    let due: Vec<&BucketKey> = sample
        .buckets
        .iter()
        .filter(|(key, b)| {
            b.throttled
                && since
                    .get(*key)
                    .is_none_or(|l| l.read.elapsed() >= SINCE_REFRESH)
        })
        .map(|(key, _)| key)
        .take(MAX_SINCE_LOOKUPS)
        .collect();
    for key in due {
        let found = throttled_since(store, key, sample.read_at).await?;
        since.insert(
            key.clone(),
            SinceLookup {
                read: Instant::now(),
                found,
            },
        );
    }
    Ok(())
}

/// Since when `key` has been throttled by its history of the last
/// [`SINCE_LOOKBACK`] at `now`.
async fn throttled_since(
    store: &dyn Store,
    key: &BucketKey,
    now: Timestamp,
) -> Result<Option<ThrottledSince>, StoreError> {
    let since = now.saturating_sub(SINCE_LOOKBACK);
    let rows = store.history(key, since, now, SINCE_STEP).await?;
    let usage = history::usage(&rows.samples);
    let slots = history::per_slot(&usage, since, now, rows.resolution.step);
    Ok(history::throttled_since(&slots))
}

async fn read(store: &dyn Store, metrics: &Metrics) -> Result<Sample, StoreError> {
    let taken = Instant::now();
    let (tree, organisations_truncated) = read_tree(store).await?;
    // One more than kept, to know whether there are more.
    let mut listed = read_buckets(store, MAX_BUCKETS + 1).await?;
    let truncated = listed.len() > MAX_BUCKETS;
    listed.truncate(MAX_BUCKETS);
    let mut per_key = store
        .list_key_buckets(None, None, MAX_BUCKETS + 1, BUSIEST_KEYS)
        .await?;
    let key_buckets_truncated = per_key.len() > MAX_BUCKETS;
    per_key.truncate(MAX_BUCKETS);
    let key_buckets = per_key
        .iter()
        .map(|b| key_bucket_view(b, metrics))
        .collect();
    let mut tenants: Vec<TenantId> = listed
        .iter()
        .map(|b| b.key.tenant.clone())
        .chain(per_key.iter().map(|b| b.key.tenant.clone()))
        .collect();
    tenants.dedup();
    let tiers = store
        .tenant_records(&tenants)
        .await?
        .into_iter()
        .filter_map(|(tenant, record)| Some((tenant, record.tier?.as_str().to_owned())))
        .collect();
    let read_at = listed
        .first()
        .map(|b| b.read_at)
        .or_else(|| per_key.first().map(|b| b.read_at))
        .unwrap_or(Timestamp::EPOCH);
    let buckets = listed
        .into_iter()
        .map(|b| {
            let sample = BucketSample {
                refill_rate: b.head.state.limits.refill_rate,
                burst_limit: b.head.state.limits.burst_limit,
                tokens: b.current_tokens(),
                live_instances: b.live_instances(),
                request_unit_micros: b.head.totals.consumption.request_unit_micros,
                throttled_micros: b.head.totals.throttled_micros,
                throttled: throttled(&b),
                shadow: !b.head.enforce,
                shadow_throttled_micros: b.head.shadow.throttled_micros,
                would_throttle: would_throttle(&b),
                granted_tokens: b.head.totals.granted_tokens,
                member: b.head.draw.as_ref().map(|_| {
                    let member = tree.get(&b.key.tenant).and_then(|n| n.member_of.as_ref());
                    MemberRates::of(&b.head, member, &b.key.bucket, b.read_at)
                }),
                budget: BudgetColumn::of(&b),
            };
            (b.key, sample)
        })
        .collect();
    Ok(Sample {
        taken,
        read_at,
        buckets,
        truncated,
        tiers,
        key_buckets,
        key_buckets_truncated,
        tree,
        organisations_truncated,
    })
}

/// A per-key bucket as the console shows it, with this replica's check
/// rates.
fn key_bucket_view(b: &KeyBucketSnapshot, metrics: &Metrics) -> KeyBucketView {
    let rates = metrics.check_rates(&b.key);
    let limits = b.definition.limits;
    KeyBucketView {
        tenant_id: b.key.tenant.as_str().to_owned(),
        bucket: b.key.bucket.as_str().to_owned(),
        refill_rate: limits.refill_rate,
        burst_limit: limits.burst_limit,
        defined_by: match b.defined_by {
            DefinedBy::Tier => "tier",
            DefinedBy::Override => "override",
        },
        keys_stored: b.keys_stored,
        enforce: b.definition.enforce,
        checks_per_second: rates.events_per_second,
        refusals_per_second: rates.refusals_per_second,
        shadow_refusals_per_second: rates.shadow_refusals_per_second,
        rate_window_seconds: rates.window.as_secs_f64(),
        busiest_keys: b
            .busiest
            .iter()
            .map(|(key, stored)| {
                let reading = KeyReading::new(key.clone(), stored, &limits, b.read_at);
                BusyKeyView {
                    key: reading.key,
                    tokens: reading.tokens,
                    full_in_seconds: reading.full_in.map(|d| d.as_secs_f64()),
                }
            })
            .collect(),
    }
}

/// The first [`MAX_ORGANISATIONS`] organisations' rows and their members',
/// and whether there were more.
async fn read_tree(store: &dyn Store) -> Result<(BTreeMap<TenantId, Node>, bool), StoreError> {
    let mut organisations = store.tree_nodes(&NodeFilter::Organisations).await?;
    organisations.sort_by(|a, b| a.0.cmp(&b.0));
    let truncated = organisations.len() > MAX_ORGANISATIONS;
    organisations.truncate(MAX_ORGANISATIONS);
    let mut tree = BTreeMap::new();
    for (id, node) in organisations {
        for (member, row) in store.tree_nodes(&NodeFilter::MembersOf(id.clone())).await? {
            tree.insert(member, row);
        }
        tree.insert(id, node);
    }
    Ok((tree, truncated))
}

/// The tree rows of `last`, depth first from the organisations at the top
/// (those below none the read kept); rates from `window` (its first read, and the seconds from it to `last`).
fn tree_rows(last: &Sample, window: Option<(&Sample, f64)>) -> Vec<TreeRowView> {
    let mut rows = Vec::new();
    let tops = last.tree.iter().filter(|(_, n)| {
        n.organisation.is_some()
            && n.member_of
                .as_ref()
                .is_none_or(|m| !last.tree.contains_key(&m.organisation))
    });
    for (id, _) in tops {
        tree_walk(id, 0, last, window, &mut rows);
    }
    rows
}

/// The rows of `id` and, if it is an organisation, of its members.
fn tree_walk(
    id: &TenantId,
    depth: usize,
    last: &Sample,
    window: Option<(&Sample, f64)>,
    rows: &mut Vec<TreeRowView>,
) {
    let organisation = last.tree.get(id).and_then(|n| n.organisation.as_ref());
    let row = |bucket: Option<(&BucketKey, &BucketSample)>| TreeRowView {
        depth,
        id: id.as_str().to_owned(),
        is_organization: organisation.is_some(),
        display_name: organisation
            .map(|o| o.display_name.clone())
            .unwrap_or_default(),
        bucket: bucket.map(|(k, _)| k.bucket.as_str().to_owned()),
        refill_rate: bucket.map(|(_, b)| b.refill_rate),
        granted_per_second: bucket.and_then(|(key, now)| {
            let (before, seconds) = window?;
            let before = before.buckets.get(key)?;
            Some((now.granted_tokens - before.granted_tokens).max(0.0) / seconds)
        }),
        wanted_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.wanted)),
        guaranteed_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.guaranteed)),
        drawn_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.drawn)),
        borrowed_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.borrowed)),
    };
    let own: Vec<_> = last
        .buckets
        .iter()
        .filter(|(key, _)| &key.tenant == id)
        .collect();
    if own.is_empty() {
        rows.push(row(None));
    }
    rows.extend(own.into_iter().map(|b| row(Some(b))));
    if organisation.is_none() || depth > tollgate_core::organisation::MAX_DEPTH {
        return;
    }
    let members = last
        .tree
        .iter()
        .filter(|(_, n)| n.member_of.as_ref().is_some_and(|m| &m.organisation == id));
    for (member, _) in members {
        tree_walk(member, depth + 1, last, window, rows);
    }
}

fn unix_seconds(t: Timestamp) -> f64 {
    t.unix_micros() as f64 / 1e6
}

/// Units per second between two cumulative readings `seconds` apart.
fn per_second(earlier: u64, later: u64, seconds: f64) -> f64 {
    later.saturating_sub(earlier) as f64 / seconds
}

/// The spans a tenant's page charts: the last hour, day, week or 30 days.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    Hour,
    Day,
    Week,
    Month,
}

impl Range {
    /// `1h`, `24h`, `7d` or `30d`; anything else is refused, by `field`.
    pub fn parse(field: &str, text: &str) -> Result<Range, InvalidInput> {
        match text {
            "1h" => Ok(Range::Hour),
            "24h" => Ok(Range::Day),
            "7d" => Ok(Range::Week),
            "30d" => Ok(Range::Month),
            _ => Err(InvalidInput::new(
                field,
                format!("must be 1h, 24h, 7d or 30d, got {text:?}"),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Range::Hour => "1h",
            Range::Day => "24h",
            Range::Week => "7d",
            Range::Month => "30d",
        }
    }

    pub fn span(self) -> Duration {
        const HOUR: u64 = 3_600;
        Duration::from_secs(match self {
            Range::Hour => HOUR,
            Range::Day => 24 * HOUR,
            Range::Week => 7 * 24 * HOUR,
            Range::Month => 30 * 24 * HOUR,
        })
    }

    /// A chart's step: 60 to 168 points a chart.
    pub fn step(self) -> Duration {
        Duration::from_secs(match self {
            Range::Hour => 60,
            Range::Day => 15 * 60,
            Range::Week => 3_600,
            Range::Month => 6 * 3_600,
        })
    }
}

/// What `/console/api/preview` answers: a bucket's limits tried on its
/// recorded usage (`crate::preview`), and the command that applies them.
#[derive(Debug, Serialize)]
pub struct PreviewView {
    pub tenant_id: String,
    pub bucket: String,
    pub since_unix: f64,
    pub until_unix: f64,
    pub max_wait_seconds: f64,
    pub current_limits: Limits,
    pub proposed_limits: Limits,
    /// In shadow mode: it throttles nothing, and the figures are what its
    /// shadow counts would say.
    pub shadow: bool,
    pub current: ImpactView,
    pub proposed: ImpactView,
    /// What an operator runs to apply the proposed limits.
    pub command: String,
}

/// ` --bucket B` of a command, or nothing for the request-unit bucket.
fn bucket_flag(key: &BucketKey) -> String {
    if key.bucket.as_str().is_empty() {
        String::new()
    } else {
        format!(" --bucket {}", key.bucket.as_str())
    }
}

/// What `/console/api/preview?scope=tier` answers: one bucket's limits
/// tried in a tier, on the recorded usage of every tenant on the tier
/// that does not override the bucket (`crate::preview::tier`).
#[derive(Debug, Serialize)]
pub struct TierPreviewView {
    pub tier: String,
    pub bucket: String,
    pub since_unix: f64,
    pub until_unix: f64,
    pub max_wait_seconds: f64,
    pub proposed_limits: Limits,
    /// Each tenant's bucket whose limits the change would change, in
    /// tenant order.
    pub buckets: Vec<PreviewView>,
    /// Summed over them.
    pub demand: f64,
    pub current_throttled: f64,
    pub proposed_throttled: f64,
    /// The tier file's lines that make the change.
    pub tier_file: String,
}

/// Why a tier's preview cannot be asked for this way.
#[derive(Debug, thiserror::Error)]
pub enum TierPreviewError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `bucket`'s limits as `limits` in the tier `tenant` is on, previewed
/// over `span` for every tenant the change touches. INVALID_INPUT naming
/// `scope` if the tenant is on no tier, `bucket` if the tier has no
/// shared bucket of that name.
pub async fn tier_preview(
    store: &dyn Store,
    tenant: &TenantId,
    bucket: &BucketName,
    limits: Limits,
    span: crate::preview::Span,
) -> Result<TierPreviewView, TierPreviewError> {
    let ids = [tenant.clone()];
    let Some(name) = store
        .tenant_records(&ids)
        .await?
        .remove(tenant)
        .and_then(|r| r.tier)
    else {
        return Err(InvalidInput::new("scope", format!("tenant {tenant} is on no tier")).into());
    };
    let mut tier = store.get_tier(&name).await?;
    let Some(defined) = tier
        .buckets
        .get_mut(bucket)
        .filter(|d| d.kind == tollgate_core::tier::BucketKind::Shared)
    else {
        return Err(InvalidInput::new(
            "bucket",
            format!("tier {name} defines no shared bucket {bucket}"),
        )
        .into());
    };
    defined.limits = limits;
    let previews = crate::preview::tier(store, &name, &tier, span).await?;
    let sum = |f: &dyn Fn(&crate::preview::BucketPreview) -> f64| previews.iter().map(f).sum();
    Ok(TierPreviewView {
        tier: name.as_str().to_owned(),
        bucket: bucket.as_str().to_owned(),
        since_unix: unix_seconds(span.since),
        until_unix: unix_seconds(span.until),
        max_wait_seconds: span.max_wait.as_secs_f64(),
        proposed_limits: limits,
        demand: sum(&|p| p.proposed.demand),
        current_throttled: sum(&|p| p.current.throttled),
        proposed_throttled: sum(&|p| p.proposed.throttled),
        buckets: previews.iter().map(|p| PreviewView::of(p, span)).collect(),
        tier_file: format!(
            "[tiers.{name}.buckets.{bucket}]\nrefill_rate = {}\nburst_limit = {}",
            tollgate_core::validate::number(limits.refill_rate),
            tollgate_core::validate::number(limits.burst_limit),
        ),
    })
}

#[derive(Debug, Serialize)]
pub struct ImpactView {
    pub demand: f64,
    pub throttled: f64,
    pub delayed: f64,
    pub longest_wait_seconds: f64,
    pub busiest_hour_unix: Option<f64>,
    pub busiest_hour_demand: f64,
    pub busiest_hour_throttled: f64,
    pub recorded_throttled_seconds: f64,
    /// When a budget would have been reached; `null` if never (or none).
    pub budget_reached_unix: Option<f64>,
}

impl ImpactView {
    fn of(i: &tollgate_core::impact::Impact) -> Self {
        ImpactView {
            demand: i.demand,
            throttled: i.throttled,
            delayed: i.delayed,
            longest_wait_seconds: i.longest_wait_seconds,
            busiest_hour_unix: i.busiest_hour.map(|h| unix_seconds(h.start)),
            busiest_hour_demand: i.busiest_hour.map_or(0.0, |h| h.demand),
            busiest_hour_throttled: i.busiest_hour.map_or(0.0, |h| h.throttled),
            recorded_throttled_seconds: i.recorded_throttled_seconds,
            budget_reached_unix: i.budget_reached.map(unix_seconds),
        }
    }
}

impl PreviewView {
    /// A budget's preview, with the `tollgate budget set` command that
    /// sets `budget` (made by the console: its cycle starts on a Monday or
    /// the 1st, in UTC).
    pub fn of_budget(
        p: &crate::preview::BucketPreview,
        span: crate::preview::Span,
        budget: &tollgate_core::budget::Budget,
    ) -> Self {
        use tollgate_core::budget::{AtLimit, Period};
        let cycle = match budget.cycle.period {
            Period::Daily => "daily",
            Period::Weekly { .. } => "weekly --anchor-weekday monday",
            Period::Monthly { .. } => "monthly --anchor-day 1",
        };
        let at_limit = match budget.at_limit {
            AtLimit::Notify => "notify",
            AtLimit::Throttle { .. } => "throttle",
            AtLimit::Stop => "stop",
        };
        PreviewView {
            command: format!(
                "tollgate budget set --tenant {}{} --amount {} --cycle {cycle} --at-limit {at_limit}",
                p.key.tenant.as_str(),
                bucket_flag(&p.key),
                tollgate_core::validate::number(budget.amount),
            ),
            ..PreviewView::of(p, span)
        }
    }

    pub fn of(p: &crate::preview::BucketPreview, span: crate::preview::Span) -> Self {
        let bucket = p.key.bucket.as_str();
        let bucket_flag = bucket_flag(&p.key);
        PreviewView {
            tenant_id: p.key.tenant.as_str().to_owned(),
            bucket: bucket.to_owned(),
            since_unix: unix_seconds(span.since),
            until_unix: unix_seconds(span.until),
            max_wait_seconds: span.max_wait.as_secs_f64(),
            current_limits: p.current_limits,
            proposed_limits: p.proposed_limits,
            shadow: p.proposed_shadow,
            current: ImpactView::of(&p.current),
            proposed: ImpactView::of(&p.proposed),
            command: format!(
                "tollgate tenant set-limits --tenant {}{bucket_flag} --refill-rate {} --burst-limit {}",
                p.key.tenant.as_str(),
                tollgate_core::validate::number(p.proposed_limits.refill_rate),
                tollgate_core::validate::number(p.proposed_limits.burst_limit),
            ),
        }
    }
}

/// What `/console/api/tenant` answers: a tenant's page.
#[derive(Debug, Serialize)]
pub struct TenantPage {
    pub tenant_id: String,
    /// Its tier; `null` if it is on none.
    pub tier: Option<String>,
    /// `suspended` or `deleted`; `null` while it is served.
    pub state: Option<&'static str>,
    /// The organisation it is a member of, if any.
    pub organisation: Option<String>,
    pub range: &'static str,
    /// The charts' step and span, by the store's clock.
    pub step_seconds: f64,
    pub since_unix: f64,
    pub until_unix: f64,
    pub buckets: Vec<TenantBucketView>,
    /// The buckets' points summed, slot by slot.
    pub total: Vec<ChartPoint>,
    pub key_buckets: Vec<KeyBucketView>,
    /// Each per-key bucket's checks over the span, from the usage history
    /// (summed over the replicas that answered them).
    pub key_histories: Vec<KeyHistoryView>,
}

/// A per-key bucket's checks over a tenant page's span.
#[derive(Debug, Serialize)]
pub struct KeyHistoryView {
    pub bucket: String,
    pub enforce: bool,
    pub checks: u64,
    pub refusals: u64,
    pub shadow_refusals: u64,
    /// One a step, oldest first, every step of the span present.
    pub points: Vec<CheckChartPoint>,
    /// The keys checked most over the span, busiest first, each with the
    /// checks it had at least.
    pub busiest_keys: Vec<CheckedKeyView>,
}

/// A per-key chart's point: a slot's checks per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CheckChartPoint {
    pub from_unix: f64,
    pub to_unix: f64,
    pub checks_per_second: f64,
    pub refusals_per_second: f64,
    pub shadow_refusals_per_second: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CheckedKeyView {
    pub key: String,
    pub checks_at_least: u64,
}

/// One of a tenant's buckets on its page.
#[derive(Debug, Serialize)]
pub struct TenantBucketView {
    /// Empty for the tenant's request-unit bucket.
    pub bucket: String,
    pub refill_rate: f64,
    pub burst_limit: f64,
    pub tokens: f64,
    pub live_instances: u32,
    pub throttled: bool,
    pub throttled_since_unix: Option<f64>,
    pub throttled_since_at_least: bool,
    pub budget: Option<BudgetColumn>,
    /// Shadow mode, whether enforcing would throttle now, and what it
    /// would have held back since the bucket was created.
    pub shadow: bool,
    pub would_throttle: bool,
    pub shadow_throttled_tokens: f64,
    pub shadow_throttled_seconds: f64,
    /// Its live pods, by instance id.
    pub pods: Vec<PodView>,
    /// One a step, oldest first, every step of the span present.
    pub points: Vec<ChartPoint>,
}

#[derive(Debug, Serialize)]
pub struct PodView {
    pub instance_id: u32,
    pub heard_seconds_ago: f64,
    pub shares: f64,
    /// The end of the trickle it is on (throttled until then); `null`
    /// if on none, or in shadow mode (it got all it asked at once).
    pub throttled_until_unix: Option<f64>,
}

/// A chart's point: what a slot of the history saw, per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ChartPoint {
    pub from_unix: f64,
    pub to_unix: f64,
    pub request_units_per_second: f64,
    pub granted_per_second: f64,
    pub throttled_pods: f64,
    /// The bucket's level at the last row of the slot; `null` if no row
    /// there kept one (the bucket was idle, or in a tenant's sum).
    pub level: Option<f64>,
}

impl ChartPoint {
    fn of(slot: &Usage) -> ChartPoint {
        ChartPoint {
            from_unix: unix_seconds(slot.from),
            to_unix: unix_seconds(slot.to),
            request_units_per_second: slot.request_units_per_second(),
            granted_per_second: slot.granted_per_second(),
            throttled_pods: slot.throttled_pods(),
            level: slot.level,
        }
    }
}

/// `tenant`'s page over `range`, read from the store; `None` if the store
/// knows nothing of it (no bucket, per-key bucket or record).
pub async fn tenant_page(
    store: &dyn Store,
    metrics: &Metrics,
    tenant: &TenantId,
    range: Range,
) -> Result<Option<TenantPage>, StoreError> {
    let buckets = match store.get_tenant(tenant).await {
        Ok(buckets) => buckets,
        Err(StoreError::TenantNotFound(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    let key_buckets = store
        .list_key_buckets(Some(tenant), None, MAX_BUCKETS, BUSIEST_KEYS)
        .await?;
    let ids = [tenant.clone()];
    let record = store.tenant_records(&ids).await?.remove(tenant);
    if buckets.is_empty() && key_buckets.is_empty() && record.is_none() {
        return Ok(None);
    }
    let state = store.tenant_states(&ids).await?.remove(tenant);
    let organisation = store
        .tree_nodes(&NodeFilter::Ids(ids.to_vec()))
        .await?
        .into_iter()
        .find_map(|(_, node)| node.member_of.map(|m| m.organisation.as_str().to_owned()));
    let now = buckets
        .first()
        .map(|b| b.read_at)
        .or_else(|| key_buckets.first().map(|b| b.read_at))
        .unwrap_or_else(system_now);
    let since = now.saturating_sub(range.span());
    // Every slot of the span, nothing used yet: each bucket's add to it.
    let mut total = history::per_slot(&[], since, now, range.step());
    let mut views = Vec::with_capacity(buckets.len());
    for b in &buckets {
        let rows = store.history(&b.key, since, now, range.step()).await?;
        let usage = history::usage(&rows.samples);
        let slots = history::per_slot(&usage, since, now, range.step());
        for (sum, slot) in total.iter_mut().zip(&slots) {
            sum.add(slot);
        }
        let is_throttled = throttled(b);
        let found = if is_throttled {
            throttled_since(store, &b.key, now).await?
        } else {
            None
        };
        views.push(TenantBucketView {
            bucket: b.key.bucket.as_str().to_owned(),
            refill_rate: b.head.state.limits.refill_rate,
            burst_limit: b.head.state.limits.burst_limit,
            tokens: b.current_tokens(),
            live_instances: b.live_instances(),
            throttled: is_throttled,
            throttled_since_unix: found.map(|f| unix_seconds(f.since)),
            throttled_since_at_least: found.is_some_and(|f| f.whole_span),
            budget: BudgetColumn::of(b),
            shadow: !b.head.enforce,
            would_throttle: would_throttle(b),
            shadow_throttled_tokens: b.head.shadow.throttled_tokens,
            shadow_throttled_seconds: b.head.shadow.throttled_micros as f64 / 1e6,
            pods: b
                .instances
                .iter()
                .filter(|i| b.silent_for(i) < b.inactivity_timeout)
                .map(|i| PodView {
                    instance_id: i.instance_id,
                    heard_seconds_ago: b.silent_for(i).as_secs_f64(),
                    shares: i.shares,
                    throttled_until_unix: (b.head.enforce
                        && i.committed_rate > 0.0
                        && i.committed_until > b.read_at)
                        .then(|| unix_seconds(i.committed_until)),
                })
                .collect(),
            points: slots.iter().map(ChartPoint::of).collect(),
        });
    }
    let mut key_histories = Vec::with_capacity(key_buckets.len());
    for b in &key_buckets {
        let rows = store
            .check_history(&b.key, since, now, range.step())
            .await?
            .rows;
        let slots = checks::chart(&rows, since, now, range.step());
        key_histories.push(KeyHistoryView {
            bucket: b.key.bucket.as_str().to_owned(),
            enforce: b.definition.enforce,
            checks: slots.iter().map(|s| s.checks).sum(),
            refusals: slots.iter().map(|s| s.refusals).sum(),
            shadow_refusals: slots.iter().map(|s| s.shadow_refusals).sum(),
            points: slots
                .iter()
                .map(|s| CheckChartPoint {
                    from_unix: unix_seconds(s.from),
                    to_unix: unix_seconds(s.to),
                    checks_per_second: s.per_second(s.checks),
                    refusals_per_second: s.per_second(s.refusals),
                    shadow_refusals_per_second: s.per_second(s.shadow_refusals),
                })
                .collect(),
            busiest_keys: checks::busiest(&rows, BUSIEST_KEYS)
                .into_iter()
                .map(|k| CheckedKeyView {
                    key: k.key,
                    checks_at_least: k.checks,
                })
                .collect(),
        });
    }
    Ok(Some(TenantPage {
        tenant_id: tenant.as_str().to_owned(),
        tier: record.and_then(|r| r.tier).map(|t| t.as_str().to_owned()),
        state: state.map(|s| s.kind.name()),
        organisation,
        range: range.name(),
        step_seconds: range.step().as_secs_f64(),
        since_unix: unix_seconds(since),
        until_unix: unix_seconds(now),
        buckets: views,
        // A sum of buckets has no level worth charting.
        total: total
            .iter()
            .map(|u| ChartPoint {
                level: None,
                ..ChartPoint::of(u)
            })
            .collect(),
        key_buckets: key_buckets
            .iter()
            .map(|b| key_bucket_view(b, metrics))
            .collect(),
        key_histories,
    }))
}

/// This machine's clock, for a tenant the store returned no reading of.
fn system_now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

fn view_of(
    samples: &VecDeque<Sample>,
    since: &HashMap<BucketKey, SinceLookup>,
    metrics: &Metrics,
) -> ConsoleView {
    let Some(last) = samples.back() else {
        return ConsoleView {
            read_at_unix: 0.0,
            sample_interval_seconds: SAMPLE_INTERVAL.as_secs_f64(),
            rate_window_seconds: None,
            truncated: false,
            total_buckets: 0,
            total_tenants: 0,
            pending_requests: metrics.pending_requests(),
            buckets: Vec::new(),
            key_buckets: Vec::new(),
            key_buckets_truncated: false,
            organisations: Vec::new(),
            organisations_truncated: false,
        };
    };
    // The oldest read within the window (or the one just before it), and
    // the seconds from it to the last: what rates cover.
    let window = samples
        .iter()
        .find(|s| last.taken.duration_since(s.taken) <= RATE_WINDOW + SAMPLE_INTERVAL)
        .filter(|first| !std::ptr::eq(*first, last))
        .map(|first| (first, last.taken.duration_since(first.taken).as_secs_f64()))
        .filter(|(_, seconds)| *seconds > 0.0);
    let buckets = last
        .buckets
        .iter()
        .map(|(key, now)| {
            let before =
                window.and_then(|(first, seconds)| first.buckets.get(key).map(|b| (b, seconds)));
            let (since_unix, at_least) = if now.throttled {
                match since.get(key).and_then(|l| l.found) {
                    Some(found) => (Some(unix_seconds(found.since)), found.whole_span),
                    // Too new for the history: the first read that saw it.
                    None => (first_seen_throttled(samples, key).map(unix_seconds), false),
                }
            } else {
                (None, false)
            };
            BucketView {
                tenant_id: key.tenant.as_str().to_owned(),
                bucket: key.bucket.as_str().to_owned(),
                tier: last.tiers.get(&key.tenant).cloned(),
                refill_rate: now.refill_rate,
                burst_limit: now.burst_limit,
                tokens: now.tokens,
                live_instances: now.live_instances,
                request_units_per_second: before.map(|(b, seconds)| {
                    per_second(b.request_unit_micros, now.request_unit_micros, seconds) / 1e6
                }),
                throttled_pods: before.map(|(b, seconds)| {
                    per_second(b.throttled_micros, now.throttled_micros, seconds) / 1e6
                }),
                throttled: now.throttled,
                throttled_since_unix: since_unix,
                throttled_since_at_least: at_least,
                budget: now.budget.clone(),
                shadow: now.shadow,
                would_throttle: now.would_throttle,
                would_throttle_pods: before.map(|(b, seconds)| {
                    per_second(
                        b.shadow_throttled_micros,
                        now.shadow_throttled_micros,
                        seconds,
                    ) / 1e6
                }),
            }
        })
        .collect::<Vec<_>>();
    // Tenants with shared buckets, per-key buckets or both.
    let mut tenants: Vec<&str> = buckets
        .iter()
        .map(|b| b.tenant_id.as_str())
        .chain(last.key_buckets.iter().map(|b| b.tenant_id.as_str()))
        .collect();
    tenants.sort_unstable();
    tenants.dedup();
    ConsoleView {
        read_at_unix: unix_seconds(last.read_at),
        sample_interval_seconds: SAMPLE_INTERVAL.as_secs_f64(),
        rate_window_seconds: window.map(|(_, seconds)| seconds),
        truncated: last.truncated,
        total_buckets: buckets.len(),
        total_tenants: tenants.len(),
        pending_requests: metrics.pending_requests(),
        buckets,
        key_buckets: last.key_buckets.clone(),
        key_buckets_truncated: last.key_buckets_truncated,
        organisations: tree_rows(last, window),
        organisations_truncated: last.organisations_truncated,
    }
}

/// When the run of reads that ends with the last and found `key`
/// throttled began: the store's clock at the first of them.
fn first_seen_throttled(samples: &VecDeque<Sample>, key: &BucketKey) -> Option<Timestamp> {
    samples
        .iter()
        .rev()
        .take_while(|s| s.buckets.get(key).is_some_and(|b| b.throttled))
        .last()
        .map(|s| s.read_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{BucketName, TenantId};

    fn key(tenant: &str) -> BucketKey {
        BucketKey::new(
            TenantId::parse("tenant_id", tenant).expect("tenant"),
            BucketName::REQUEST_UNITS,
        )
    }

    /// A read at `secs` of buckets (tenant, request-unit micros, throttled
    /// micros); a bucket is throttled when its throttled total is odd.
    fn sample(taken: Instant, secs: f64, buckets: &[(&str, u64, u64)]) -> Sample {
        Sample {
            taken,
            read_at: Timestamp::from_secs_f64(secs),
            buckets: buckets
                .iter()
                .map(|&(tenant, micros, throttled_micros)| {
                    (
                        key(tenant),
                        BucketSample {
                            refill_rate: 10.0,
                            burst_limit: 100.0,
                            tokens: 5.0,
                            live_instances: 2,
                            request_unit_micros: micros,
                            throttled_micros,
                            throttled: throttled_micros % 2 == 1,
                            shadow: false,
                            shadow_throttled_micros: 0,
                            would_throttle: false,
                            granted_tokens: micros as f64 / 1e6,
                            member: None,
                            budget: None,
                        },
                    )
                })
                .collect(),
            truncated: false,
            tiers: [(TenantId::parse("t", "acme").expect("id"), "gold".to_owned())].into(),
            key_buckets: Vec::new(),
            key_buckets_truncated: false,
            tree: BTreeMap::new(),
            organisations_truncated: false,
        }
    }

    #[test]
    fn the_view_has_rates_over_the_window_and_says_since_when_a_bucket_is_throttled() {
        let metrics = Metrics::new().expect("metrics");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let none = HashMap::new();
        let samples: VecDeque<Sample> = [
            sample(at(0), 100.0, &[("acme", 0, 0)]),
            // 50 request units; throttled from here (odd), 2 pod-seconds.
            sample(
                at(5),
                105.0,
                &[("acme", 50_000_000, 2_000_001), ("new", 7_000_000, 0)],
            ),
            // 10 more; 6 pod-seconds more.
            sample(
                at(10),
                110.0,
                &[("acme", 60_000_000, 8_000_001), ("new", 7_000_000, 0)],
            ),
        ]
        .into();
        let view = view_of(&samples, &none, &metrics);
        assert_eq!(view.total_buckets, 2);
        assert_eq!(view.read_at_unix, 110.0);
        // Over the whole window: the first read to the last.
        assert_eq!(view.rate_window_seconds, Some(10.0));
        let acme = &view.buckets[0];
        assert_eq!(acme.tenant_id, "acme");
        assert_eq!(acme.tier.as_deref(), Some("gold"));
        assert_eq!(acme.request_units_per_second, Some(6.0));
        assert_eq!(acme.throttled_pods, Some(0.8000001));
        assert!(acme.throttled);
        // Not in the history yet: since the first read that saw it.
        assert_eq!(acme.throttled_since_unix, Some(105.0));
        assert!(!acme.throttled_since_at_least);
        // A bucket first seen in the middle read: no rate until the
        // window's first read has it.
        let new = &view.buckets[1];
        assert_eq!(new.tier, None);
        assert_eq!(new.request_units_per_second, None);
        assert!(!new.throttled);
        assert_eq!(new.throttled_since_unix, None);
        // The history's answer wins where there is one.
        let found: HashMap<BucketKey, SinceLookup> = [(
            key("acme"),
            SinceLookup {
                read: t0,
                found: Some(ThrottledSince {
                    since: Timestamp::from_secs_f64(40.0),
                    whole_span: true,
                }),
            },
        )]
        .into();
        let view = view_of(&samples, &found, &metrics);
        assert_eq!(view.buckets[0].throttled_since_unix, Some(40.0));
        assert!(view.buckets[0].throttled_since_at_least);
        // One read: levels, no rates yet.
        let first: VecDeque<Sample> = [sample(at(0), 100.0, &[("acme", 0, 0)])].into();
        let view = view_of(&first, &none, &metrics);
        assert_eq!(view.buckets[0].request_units_per_second, None);
        assert_eq!(view.rate_window_seconds, None);
    }

    #[test]
    fn ranges_are_named_and_anything_else_is_refused_by_field() {
        for (name, points) in [("1h", 60), ("24h", 96), ("7d", 168), ("30d", 120)] {
            let range = Range::parse("range", name).expect("a range");
            assert_eq!(range.name(), name);
            assert_eq!(range.span().as_secs() / range.step().as_secs(), points);
        }
        for bad in ["", "2h", "1H", "24 h"] {
            let e = Range::parse("range", bad).expect_err("refused");
            assert_eq!(e.field, "range", "{bad}");
        }
    }

    #[test]
    fn the_tree_lists_each_organisation_then_its_members_depth_first() {
        use tollgate_core::organisation::{Member, Organisation};
        let id = |s: &str| TenantId::parse("id", s).expect("id");
        let organisation = |name: &str| Organisation {
            display_name: name.into(),
            created_at: Timestamp::EPOCH,
            next_member_id: 3,
        };
        let member = |of: &str, member_id, guaranteed: f64| Member {
            organisation: id(of),
            member_id,
            guaranteed: [(BucketName::REQUEST_UNITS, guaranteed)].into(),
            since: Timestamp::EPOCH,
        };
        let t0 = Instant::now();
        let mut before = sample(t0, 100.0, &[("acme", 0, 0), ("db1", 0, 0)]);
        let mut after = sample(
            t0 + Duration::from_secs(5),
            105.0,
            &[
                ("acme", 50_000_000, 0),
                ("db1", 40_000_000, 0),
                ("db2", 0, 0),
            ],
        );
        let rates = MemberRates {
            wanted: 12.0,
            drawn: 9.0,
            guaranteed: 4.0,
            borrowed: 5.0,
            draws: 3,
        };
        for sample in [&mut before, &mut after] {
            if let Some(db1) = sample.buckets.get_mut(&key("db1")) {
                db1.member = Some(rates);
            }
            sample.tree = [
                (
                    id("acme"),
                    Node {
                        organisation: Some(organisation("Acme")),
                        member_of: None,
                    },
                ),
                (
                    id("acme-eu"),
                    Node {
                        organisation: Some(organisation("")),
                        member_of: Some(member("acme", 2, 0.0)),
                    },
                ),
                (
                    id("db1"),
                    Node {
                        organisation: None,
                        member_of: Some(member("acme-eu", 1, 4.0)),
                    },
                ),
                (
                    id("db2"),
                    Node {
                        organisation: None,
                        member_of: Some(member("acme", 1, 0.0)),
                    },
                ),
            ]
            .into();
        }
        let rows = tree_rows(&after, Some((&before, 5.0)));
        let order: Vec<(&str, usize, Option<&str>)> = rows
            .iter()
            .map(|r| (r.id.as_str(), r.depth, r.bucket.as_deref()))
            .collect();
        assert_eq!(
            order,
            [
                ("acme", 0, Some("")),
                ("acme-eu", 1, None),
                ("db1", 2, Some("")),
                ("db2", 1, Some("")),
            ]
        );
        assert_eq!(rows[0].display_name, "Acme");
        assert!(rows[0].is_organization && rows[1].is_organization && !rows[2].is_organization);
        // 50 tokens in 5 s to the organisation's members; 40 to db1's pods.
        assert_eq!(rows[0].granted_per_second, Some(10.0));
        assert_eq!(rows[2].granted_per_second, Some(8.0));
        assert_eq!(rows[2].wanted_rate, Some(12.0));
        assert_eq!(rows[2].guaranteed_rate, Some(4.0));
        assert_eq!(rows[2].drawn_rate, Some(9.0));
        assert_eq!(rows[2].borrowed_rate, Some(5.0));
        // No bucket listed: figures unknown; first seen: no rate yet.
        assert_eq!(rows[1].refill_rate, None);
        assert_eq!(rows[3].granted_per_second, None);
        assert_eq!(rows[3].wanted_rate, None);
    }

    #[test]
    fn rates_are_differences_of_totals_over_the_time_between_reads() {
        assert_eq!(per_second(1_000_000, 6_000_000, 5.0), 1_000_000.0);
        // A total never decreases; a smaller later reading (a bucket
        // deleted and made again) gives zero, not a negative rate.
        assert_eq!(per_second(6_000_000, 1_000_000, 5.0), 0.0);
    }
}
