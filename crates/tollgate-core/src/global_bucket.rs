//! A global token bucket: one per tenant and bucket name.
//!
//! The server keeps each bucket in its store and runs [`request`] inside
//! one store transaction per pod request (by the script of
//! [`crate::transaction`]). The state is split the way the store keeps it
//! (the RFC's `tenant_usage` table): one head row, [`BucketRow`]
//! (instance 0), and one [`InstanceState`] row per live pod. The instance
//! rows form a circular linked list ordered by id, with the head row as the
//! sentinel: its `first_instance_id` points at the lowest live id, each
//! instance's `next_instance_id` at the next higher one, and the highest
//! points back at 0.
//!
//! A transaction does not need all of a bucket's instance rows; it loads
//! the few a request touches ([`instance_window`]), so the cost of a
//! request does not grow with the number of pods.
//!
//! # The rules
//! - **Refill**: `refill_rate` tokens per second, paused while the bucket
//!   and its pods together hold `burst_limit` tokens or more (a level an
//!   operator set above the limit is kept, not cut). Time comes from the
//!   store's clock and is clamped at zero; `last_refill` never moves
//!   backwards.
//! - **What pods hold**: every request says what its pod holds, granted
//!   and unused (`held_tokens`); the bucket counts it, plus what it grants
//!   at once, as used at the pod's shares per second until it reports
//!   again (the head row keeps the sum and its rate, each instance row its
//!   own part, so a report or a removal replaces exactly what the instance
//!   added). Without it, pods' buffers sat beside a full bucket: a tenant
//!   of many idle pods could admit the burst twice over. The parts below
//!   count it as used at twice the pods' shares
//!   ([`PARTS_HELD_USE_FACTOR`]): shares are a moving average of usage
//!   and lag it while demand climbs, so at the shares' rate the others
//!   seem to hold more than they do, and the first of pods asking at once
//!   take parts the last find gone. The burst cap keeps the slower count
//!   (counting less there would let the bucket refill beside tokens the
//!   pods still hold).
//! - **Tokens and consumption**: tokens leave the bucket only when granted.
//!   Reported consumption only adds to the bucket's totals, which never
//!   decrease.
//! - **Immediate grant**: enough tokens in the bucket: grant the request at
//!   once (a trickle duration of zero). A request for zero tokens gets
//!   none; it still reports its consumption and shares.
//! - **Parts** ([`GrantPolicy::Shares`]): a pod takes at once no more than
//!   its part of what the bucket and the pods hold together, by its
//!   fraction of the shares (at least an even split; an even split after
//!   a jump in shares), less what it holds (by its own report); held back from what the bucket
//!   holds, it gets the rest as a trickle of at most a quarter of the
//!   period, and asks again. Pods bursting together thus get equal parts
//!   whichever asks first, and a lone busy pod still takes the whole
//!   bucket.
//! - **Trickle grant** ([`GrantPolicy::Shares`], the default): otherwise
//!   grant what the bucket holds plus the pod's fraction of the refill rate
//!   (`shares / sum(shares)`, an even split over the live instances if the
//!   sum is zero), delivered at a constant rate over between 1 s and one
//!   target request period, with `max_burst_tokens = max(burst_limit ×
//!   fraction, tokens per second of the trickle)`. If that rate works out
//!   to zero, the pod gets what the bucket holds, at once.
//! - **Short trickles after a jump in shares** ([`GrantPolicy::Shares`]):
//!   a pod whose shares at least doubled since its last request (its work
//!   just queued up, or it is new: its first request counts) gets a
//!   trickle of at most a quarter of the period, at an even split of the
//!   refill rate at most. Not a member of an
//!   organisation drawing, which draws once per draw period whatever its
//!   trickle. The pod's fraction was computed against the other pods'
//!   shares as they last reported them; when many pods' demand rises at
//!   once (a burst, a herd joining), the first to ask would otherwise hold
//!   a period of nearly the whole refill rate while the others' shares
//!   are still old. It asks again soon, when their shares are known, and
//!   the split evens out within the period (measured on generated
//!   workloads: sim/README.md, "Bursts").
//! - **Short trickles after a drop in shares** ([`GrantPolicy::Shares`]):
//!   the same when a pod's shares fell to a quarter or less, at an even
//!   split of the refill rate at least. When many pods' demand falls at
//!   once (a burst ending), the first to ask would otherwise get a
//!   sliver of the rate against the others' old shares for a whole
//!   period while its queue waits, and the refill nobody was handed is
//!   lost once the bucket fills (sim/README.md, "Demand falling at once").
//! - **Commitments**: every trickle is taken from the bucket in advance.
//!   The part of it that future refill pays for is a commitment; the tokens
//!   the bucket held when it granted the trickle are not (counting them
//!   would hand them out twice). The head row tracks the undelivered
//!   commitments (`committed_tokens`, delivered at `committed_rate`), each
//!   instance row its own. A pod folds the rest of its previous trickle
//!   into the new one, and that rest counts towards the new grant, so a pod
//!   renewing early still gets one period of its rate per period. Under the
//!   shares policy the bucket is judged by its *level*, `tokens +
//!   min(committed, refill_rate × period)`, what an ideal bucket would
//!   hold; a request the level covers is granted at once.
//! - **Systematic debt**: a negative level (debt beyond what the trickles
//!   have yet to deliver) lowers the rate handed out to `refill_rate −
//!   excess / period`, so it is paid back over the next period; grants
//!   therefore never take the bucket below `−2 × refill_rate × period`.
//!   (The RFC excuses a full period of refill; pods renew at different
//!   times, so on average only half of it is committed, and excusing the
//!   rest lets a saturated tenant overspend by up to half a period.)
//! - **Bucket-level EMA** ([`GrantPolicy::BucketLevelEma`]): CockroachDB's
//!   2023 policy, kept for the simulator to compare. `tokens_avg = 0.25 ×
//!   tokens + 0.75 × tokens_avg`, updated on every request that is not a
//!   duplicate, under every policy. Shares are ignored: a request may take
//!   up to `refill_rate × period − max(0, −tokens_avg)` beyond what the
//!   bucket holds, never more than 1.5 periods of refill into debt, spread
//!   over the whole period.
//! - **Greedy** ([`GrantPolicy::Greedy`]): the simulator's baseline: what
//!   the bucket holds, up to the request, at once; no trickles.
//! - **Returned tokens**: a pod gives back what it holds beyond what it
//!   wants, and at shutdown (shares 0) all it holds and what its trickle
//!   has yet to deliver (`returned_tokens`); they go back into the bucket,
//!   never above the burst limit less what the pods hold.
//! - **Instances**: a pod's first request links it into the list after its
//!   predecessor. Every request walks at most `cleanup_window` (8) rows
//!   after the requester, wrapping past the sentinel, and unlinks those
//!   silent longer than the inactivity timeout (60 s), or longer than the
//!   reported-dead timeout (10 s) if they lie between the requester and the
//!   `next_live_instance_id` it reported; their shares leave the sum. No
//!   liveness service is involved.
//! - **Instance window** ([`instance_window`]): the rows a request needs
//!   are its own, its predecessor (the highest id below it) and up to
//!   `cleanup_window` rows after it, wrapping past the highest id: four
//!   runs of ids ([`IdRange`]) any store reads with index range scans. On
//!   them [`request`] gives exactly the grant and leaves exactly the rows
//!   it would on all rows (a proptest in `transaction/tests.rs`).
//! - **Idempotency**: each instance row keeps its lease, last `seq` and the
//!   grant it answered. A request repeating the last `(lease, seq)` of its
//!   instance gets that grant back and changes nothing; an older `seq` on
//!   the same lease is refused ([`RequestError::StaleSequence`]). A new
//!   lease starts a new sequence.
//! - **Incarnations**: leases of an instance id are ordered (as byte
//!   strings, lexicographically), and a pod that restarts uses a greater
//!   lease than before (the client's begins with its start time). A request
//!   with a lease below the one the instance holds comes from an older
//!   incarnation (a late copy, or an attempt abandoned when the pod
//!   restarted): it is refused ([`RequestError::SupersededLease`],
//!   FAILED_PRECONDITION on the wire) and changes nothing, so an old
//!   incarnation never displaces a newer one nor counts anything again.
//!   Only once the newer incarnation has been silent past the inactivity
//!   timeout (it would be removed anyway) may a lower lease take the id.
//! - **Reconfiguration** ([`reconfigure`]): sets the limits and the level.
//!   With `as_of`, the level is `available_tokens` plus the refill from
//!   `as_of` to now under the new limits (capped as the bucket would cap
//!   it), minus the request units consumed beyond `as_of_consumed_tokens`;
//!   an `as_of_consumed_tokens` above the bucket's total is refused, and so
//!   is an `as_of` more than [`MAX_AS_OF_AHEAD`] (5 s) after the store's
//!   clock. Without `as_of`, `available_tokens` is taken as it is. A
//!   [`LimitsMask`] (the wire's `update_mask`) sets only some of the three
//!   values: the others keep the bucket's, and a level left out is the
//!   bucket's own, refilled to now under its old limits. Only an existing
//!   bucket is updated in part; [`configure`] is the update of a bucket
//!   that may not exist yet (created from [`BucketRow::new`] with no
//!   tokens, then reconfigured).
//! - **Errors change nothing**: [`request`] and [`reconfigure`] leave the
//!   rows untouched when they refuse.
//! - **Fallback rate**: every response tells the pod what it may consume
//!   per second on its own while the server is unreachable, `refill_rate ×
//!   (fraction + 1 / live_instances) / 2`: half its share of the refill
//!   rate and half an even split, so an idle pod (shares 0) still runs on
//!   its own, and all pods' rates sum to the refill rate.
//! - **Fallback charges** (`BucketState::charge_fallback`): tokens a pod
//!   used on its fallback rate are charged to the bucket with its next
//!   request (`fallback_tokens`, `fallback_duration`), or with the retry of
//!   the request that went unanswered (the bucket carries the debt, every
//!   pod's rate drops while it is paid back). While nobody reached the
//!   server the bucket refilled only up to its burst limit; `refill` keeps
//!   the refill lost to the limit in the last stretch without requests
//!   (`capped_refill`, `capped_from`, `capped_until`; PostgreSQL migration
//!   V7). The refill the bucket kept while the fallback ran (up to
//!   `capped_from`) is charged first, then the lost refill forgives the
//!   rest: at most the refill of the overlap, and only within one target
//!   period after the stretch ended. So an outage costs the tenant what it
//!   would have under one bucket (the shipped `outage` workload ended 7.4 %
//!   under the ideal without this, 0.4 % with it). The first request back
//!   from an outage is the retry of the one it cut off; granted before
//!   being charged, it was handed the refill the fallback had used, so
//!   retries carry the fallback used so far. Each grant records what its
//!   request was charged (`Grant::fallback_charged`, migration V8, the
//!   response's `fallback_charged_tokens`): a retry answered with the grant
//!   of an earlier attempt tells the pod what is still to charge, once.
//!
//! The head row has three parts, kept apart in memory and stored flat
//! (their fields side by side): [`BucketState`] (limits, level,
//! commitments: what refill, grants and reconfiguration change),
//! [`Membership`] (the pods' list head and share sum) and [`Totals`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::budget::{BucketBudget, BudgetEvent, CycleRecord};
use crate::consumption::Consumption;
use crate::organisation::{Draw, Drawn};
use crate::time::Timestamp;
use crate::validate::{self, InvalidInput, MAX_LEASE_LEN, MAX_REFILL_RATE, MAX_SEQ, MAX_TOKENS};

/// A pod's id within its bucket. 0 is the head row (the list's sentinel).
pub type InstanceId = u32;

/// The smoothing factor of the bucket-level EMA (CockroachDB's 0.25).
const BUCKET_LEVEL_EMA_FACTOR: f64 = 0.25;
/// The EMA policy refuses to go deeper in debt than this many periods of refill.
const BUCKET_LEVEL_EMA_MAX_DEBT_PERIODS: f64 = 1.5;
/// The longest fallback a pod may report (30 days).
pub const MAX_FALLBACK_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The shortest trickle handed out, seconds (unless the period is shorter).
const MIN_TRICKLE_SECS: f64 = 1.0;
/// Shares at least this many times a pod's last ones are a jump: its
/// trickle is at most [`JUMP_TRICKLE_PERIODS`] of the period.
const SHARES_JUMP_FACTOR: f64 = 2.0;
/// Shares this many times below a pod's last ones are a drop: its trickle
/// is short too, at an even split of the rate at least. Measured at 2 and
/// 4 on the simulator's corpus (sim/README.md, "Demand falling at once").
const SHARES_DROP_FACTOR: f64 = 4.0;
/// The longest trickle after a jump or a drop in shares (or held back to
/// a part of what the bucket holds), in target request periods.
const JUMP_TRICKLE_PERIODS: f64 = 0.25;
/// How many times their shares per second the parts count pods as using
/// what they hold (the burst cap counts once).
pub const PARTS_HELD_USE_FACTOR: f64 = 2.0;
/// Tolerance when comparing an operator's `as_of_consumed_tokens` with the
/// stored total, as a power of two the total is divided by: the operator
/// read the total as a double, which rounds it (by at most 2^-53 of it).
const AS_OF_CONSUMED_TOLERANCE_SHIFT: u32 = 50;

/// How a tenant's tokens are handed out when the bucket cannot grant at once.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum GrantPolicy {
    /// The RFC's policy: each pod gets `shares / sum(shares)` of the refill
    /// rate, with systematic debt paid back over the next period.
    #[default]
    Shares,
    /// CockroachDB's 2023 policy: ignore shares; allow each request one
    /// period of refill minus the smoothed debt, and never more than 1.5
    /// periods of debt.
    BucketLevelEma,
    /// Plain first-come greed: a request gets what the bucket holds, up to
    /// what it asks for, at once; no trickles, no debt. A baseline for the
    /// simulator, not meant for production: whoever asks first takes all.
    Greedy,
}

/// Knobs of the global bucket, set per server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GlobalBucketConfig {
    pub policy: GrantPolicy,
    /// An instance silent for longer than this is removed from the list.
    pub inactivity_timeout: Duration,
    /// An instance that the requesting pod reports dead (it lies between the
    /// pod and its `next_live_instance_id`) is removed once silent this long.
    pub reported_dead_timeout: Duration,
    /// At most this many following instances are examined (and possibly
    /// removed) per request.
    pub cleanup_window: usize,
    /// How often a member of an organisation draws from its
    /// organisation's bucket ([`crate::organisation`]).
    #[serde(default = "default_draw_period")]
    pub draw_period: Duration,
}

fn default_draw_period() -> Duration {
    crate::organisation::DEFAULT_DRAW_PERIOD
}

impl GrantPolicy {
    pub const ALL: [GrantPolicy; 3] = [
        GrantPolicy::Shares,
        GrantPolicy::BucketLevelEma,
        GrantPolicy::Greedy,
    ];

    /// The policy's name in configuration, on the command line and in
    /// reports (as serde spells it).
    pub fn name(self) -> &'static str {
        match self {
            GrantPolicy::Shares => "shares",
            GrantPolicy::BucketLevelEma => "bucket-level-ema",
            GrantPolicy::Greedy => "greedy",
        }
    }
}

impl Default for GlobalBucketConfig {
    fn default() -> Self {
        GlobalBucketConfig {
            policy: GrantPolicy::Shares,
            inactivity_timeout: Duration::from_secs(60),
            reported_dead_timeout: Duration::from_secs(10),
            cleanup_window: 8,
            draw_period: default_draw_period(),
        }
    }
}

/// A tenant's limits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Tokens added per second.
    pub refill_rate: f64,
    /// Refill pauses while the bucket holds this many tokens or more.
    pub burst_limit: f64,
}

impl Limits {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate::non_negative("refill_rate", self.refill_rate, MAX_REFILL_RATE)?;
        validate::non_negative("burst_limit", self.burst_limit, MAX_TOKENS)?;
        Ok(())
    }
}

/// A bucket's level and limits: what refill, grants and reconfiguration
/// change. Kept apart from the pods' membership and the totals so that a
/// bucket without pods (a per-key limit) can reuse it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketState {
    pub limits: Limits,
    /// False while the bucket runs on the server's default limits.
    pub configured: bool,
    /// Tokens in the bucket as of `last_refill`; negative is debt.
    pub tokens: f64,
    /// Exponential moving average of `tokens`, updated on every request
    /// (used by [`GrantPolicy::BucketLevelEma`], tracked under every policy).
    pub tokens_avg: f64,
    /// When `tokens` was last brought up to date.
    pub last_refill: Timestamp,
    /// Trickle tokens granted but not yet delivered to the pods, as of
    /// `last_refill`: the debt the bucket is in by design.
    #[serde(default)]
    pub committed_tokens: f64,
    /// The rate at which `committed_tokens` are being delivered: the sum of
    /// the instances' trickle rates.
    #[serde(default)]
    pub committed_rate: f64,
    /// Refill the bucket lost to its burst limit during the last stretch
    /// in which no request came (`capped_from` to `capped_until`), not yet
    /// used to forgive fallback tokens (see [`BucketState::refill`]).
    #[serde(default)]
    pub capped_refill: f64,
    /// Tokens the live pods hold, granted and not yet used, as of
    /// `last_refill`: what each last reported (plus what it was granted
    /// at once then), less what it has used since at its reported rate.
    /// Part of what the bucket holds: refill stops when the bucket and the
    /// pods together hold the burst limit.
    #[serde(default)]
    pub held_tokens: f64,
    /// The rate at which the pods use what they hold: the sum of the
    /// holding instances' shares.
    #[serde(default)]
    pub held_use_rate: f64,
    /// What the holding instances said they hold at their last request
    /// (plus what they were granted at once then), none of it used: the
    /// sum of their `held_tokens`. With `held_tokens`, it gives the count
    /// the parts use ([`PARTS_HELD_USE_FACTOR`]).
    #[serde(default)]
    pub held_reported: f64,
    #[serde(default)]
    pub capped_from: Timestamp,
    #[serde(default)]
    pub capped_until: Timestamp,
    /// While the bucket draws its refill from an organisation's bucket:
    /// the rate it was given and until when ([`crate::organisation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drawn: Option<Drawn>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// The pods drawing on a bucket: the head of their list and their shares.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Membership {
    /// Sum of the live instances' shares.
    pub share_sum: f64,
    /// Number of instances in the list.
    pub live_instances: u32,
    /// Sum of the live instances' guaranteed rates (members of an
    /// organisation; pods have none).
    #[serde(default)]
    pub guarantee_sum: f64,
    /// The sentinel's `next_instance_id`: the lowest live instance, or 0.
    pub first_instance_id: InstanceId,
}

/// What a bucket has counted since it was created; only ever grows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Cumulative consumption the pods reported.
    pub consumption: Consumption,
    /// Cumulative tokens granted.
    pub granted_tokens: f64,
    /// Time the pods spent on trickles (throttled: the bucket could not
    /// give them what they asked for at once), summed over the pods, in
    /// microseconds: counted when a pod asks again, up to the end of its
    /// trickle ([`throttled_since`]). Its rate is the number of pods
    /// throttled.
    #[serde(default)]
    pub throttled_micros: u64,
}

/// How long `instance` was on its last trickle between its last request
/// and `now`, in microseconds: zero if its last grant was given at once.
pub fn throttled_since(instance: &InstanceState, now: Timestamp) -> u64 {
    let trickle = instance.last_grant.trickle_duration;
    if trickle.is_zero() {
        return 0;
    }
    let end = instance.last_update.saturating_add(trickle);
    let until = if now < end { now } else { end };
    u64::try_from(until.duration_since(instance.last_update).as_micros()).unwrap_or(u64::MAX)
}

/// A bucket's head row (instance 0): its state, its pods and its totals.
///
/// Serialized flat (the three parts' fields side by side), the shape the
/// stores have always kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketRow {
    #[serde(flatten)]
    pub state: BucketState,
    #[serde(flatten)]
    pub members: Membership,
    #[serde(flatten)]
    pub totals: Totals,
    /// The bucket's spend budget and its state in the current cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Box<BucketBudget>>,
    /// A member of an organisation: its draws from the organisation's
    /// bucket of the same name ([`crate::organisation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw: Option<Box<Draw>>,
    /// False: shadow mode. Every request is decided as if enforced (the
    /// bucket's state is the enforced one, so switching back keeps it),
    /// but the pod is granted what it asked for at once, and
    /// [`ShadowTotals`] count what enforcing would have held back.
    #[serde(
        default = "crate::budget::enforced",
        skip_serializing_if = "crate::budget::is_enforced"
    )]
    pub enforce: bool,
    #[serde(flatten)]
    pub shadow: ShadowTotals,
}

/// What a bucket in shadow mode let through that enforcing would not
/// have, since it was created; only ever grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowTotals {
    /// Tokens the pods were granted at once that enforcing would not have
    /// given them at once: what a request asked beyond an at-once grant,
    /// or all it asked where enforcing would have trickled.
    #[serde(default, rename = "shadow_throttled_tokens")]
    pub throttled_tokens: f64,
    /// The trickles enforcing would have put the pods on, summed, in
    /// microseconds (pod time it would have throttled).
    #[serde(default, rename = "shadow_throttled_micros")]
    pub throttled_micros: u64,
}

impl BucketRow {
    /// A new bucket holding `initial_tokens`, with no pods and no totals.
    pub fn new(limits: Limits, initial_tokens: f64, configured: bool, now: Timestamp) -> Self {
        BucketRow {
            state: BucketState::new(limits, initial_tokens, configured, now),
            members: Membership::default(),
            totals: Totals::default(),
            budget: None,
            draw: None,
            enforce: true,
            shadow: ShadowTotals::default(),
        }
    }

    /// The bucket's own limits: those it runs at, or while a budget
    /// throttles it, those it comes back to.
    pub fn own_limits(&self) -> Limits {
        self.budget
            .as_ref()
            .map_or(self.state.limits, |b| b.own_limits(&self.state))
    }

    /// Sets the bucket's own limits (kept aside while a budget throttles it).
    pub fn set_own_limits(&mut self, limits: Limits) {
        match self.budget.as_mut().filter(|b| b.throttled()) {
            Some(budget) => budget.state.own_limits = Some(limits),
            None => self.state.limits = limits,
        }
    }
}

impl BucketState {
    /// A bucket holding `initial_tokens`.
    pub fn new(limits: Limits, initial_tokens: f64, configured: bool, now: Timestamp) -> Self {
        BucketState {
            limits,
            configured,
            tokens: initial_tokens,
            tokens_avg: initial_tokens,
            last_refill: now,
            committed_tokens: 0.0,
            committed_rate: 0.0,
            capped_refill: 0.0,
            held_tokens: 0.0,
            held_use_rate: 0.0,
            held_reported: 0.0,
            capped_from: now,
            capped_until: now,
            drawn: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// The bucket level at `now`, refill included, without changing state.
    pub fn tokens_at(&self, now: Timestamp) -> f64 {
        self.refilled_with_held(now, self.held_at(now))
    }

    /// The level at `now` if the pods held `held` then: refill stops where
    /// the bucket and the pods together hold the burst limit.
    fn refilled_with_held(&self, now: Timestamp, held: f64) -> f64 {
        let limits = self.refill_limits();
        let ceiling = Limits {
            burst_limit: (limits.burst_limit - held).max(0.0),
            ..limits
        };
        refilled_tokens(self.tokens, &ceiling, self.refill_secs(now))
    }

    /// What the pods hold at `now`, as far as the bucket can tell.
    pub fn held_at(&self, now: Timestamp) -> f64 {
        self.held_sum_at(now).max(0.0)
    }

    /// What the pods hold as of the last refill.
    fn held(&self) -> f64 {
        self.held_at(self.last_refill)
    }

    /// The sum of every holding instance's count (what it held less what
    /// it used since at its rate), unclamped: an instance that ran dry
    /// counts below zero until it reports, so that taking out exactly what
    /// it added keeps the sum exact.
    fn held_sum_at(&self, now: Timestamp) -> f64 {
        self.held_tokens - self.held_use_rate * now.seconds_since(self.last_refill)
    }

    /// What the bucket counts `instance` as holding at `now` (below zero
    /// once it ran dry by that count).
    fn counted_held(instance: &InstanceState, now: Timestamp) -> f64 {
        instance.held_tokens - instance.held_use_rate * now.seconds_since(instance.last_update)
    }

    /// Takes an instance's holding out of the pods' (it reports again, or
    /// it is removed). The bucket took out its use at its rate since it
    /// last reported; what it has left by that count goes now, and what
    /// was taken out beyond what it held (it ran dry earlier) comes back.
    fn release_held(&mut self, instance: &InstanceState, now: Timestamp) {
        self.held_tokens -= Self::counted_held(instance, now);
        self.held_use_rate = (self.held_use_rate - instance.held_use_rate).max(0.0);
        self.held_reported -= instance.held_tokens;
    }

    /// Counts what an instance holds now, used at `rate`.
    fn hold(&mut self, instance: &mut InstanceState, tokens: f64, rate: f64) {
        instance.held_tokens = tokens;
        instance.held_use_rate = if tokens > 0.0 { rate } else { 0.0 };
        self.held_tokens += instance.held_tokens;
        self.held_use_rate += instance.held_use_rate;
        self.held_reported += instance.held_tokens;
    }

    /// What `instances` last reported holding, summed: `held_reported` of
    /// a bucket whose instances they are.
    pub fn reported_by<'a>(instances: impl IntoIterator<Item = &'a InstanceState>) -> f64 {
        instances.into_iter().map(|i| i.held_tokens).sum()
    }

    /// What the pods hold as of the last refill as the parts count it: used
    /// at [`PARTS_HELD_USE_FACTOR`] times their shares since they reported.
    /// Per instance that is `k·counted − (k − 1)·reported`, so the sums
    /// give it. A sum below the count (rows written before it was kept)
    /// falls back to the count.
    fn held_for_parts(&self) -> f64 {
        let k = PARTS_HELD_USE_FACTOR;
        let counted = self.held_tokens;
        let reported = self.held_reported.max(counted);
        (k * counted - (k - 1.0) * reported).max(0.0)
    }

    /// The limits the bucket refills under: its own, and for a member of
    /// an organisation at most the rate it drew.
    pub fn refill_limits(&self) -> Limits {
        match self.drawn {
            Some(drawn) => Limits {
                refill_rate: self.limits.refill_rate.min(drawn.rate.max(0.0)),
                burst_limit: self.limits.burst_limit,
            },
            None => self.limits,
        }
    }

    /// Seconds of refill from `last_refill` to `now`: a member of an
    /// organisation refills only until the end of what it drew.
    fn refill_secs(&self, now: Timestamp) -> f64 {
        let end = self.drawn.map_or(now, |drawn| now.min(drawn.until));
        end.seconds_since(self.last_refill)
    }

    /// Brings `tokens` up to date with the refill since `last_refill`.
    /// `last_refill` never moves backwards, so a clock that steps back does
    /// not refill the same interval twice.
    ///
    /// Refill lost to the burst limit in the interval is kept (with when it
    /// was lost) to forgive fallback tokens, unless what is left of an
    /// earlier loss, recent by `credit_window`, is larger.
    pub fn refill(&mut self, now: Timestamp, credit_window: Duration) {
        self.refill_knowing(now, credit_window, 0.0);
    }

    /// [`BucketState::refill`], where the pods are known to hold
    /// `held_correction` more at `now` than the bucket counts (a pod's
    /// report of what it holds, read before the refill it caps).
    fn refill_knowing(&mut self, now: Timestamp, credit_window: Duration, held_correction: f64) {
        let held = (self.held_sum_at(now) + held_correction).max(0.0);
        let refilled = self.refilled_with_held(now, held);
        let rate = self.refill_limits().refill_rate;
        let lost = rate * self.refill_secs(now) - (refilled - self.tokens).max(0.0);
        if lost > 0.0 && rate > 0.0 {
            let earlier_left = if self.capped_valid(now, credit_window) {
                self.capped_refill
            } else {
                0.0
            };
            if lost > earlier_left {
                self.capped_refill = lost;
                self.capped_until = now;
                self.capped_from = now.saturating_sub(Duration::from_secs_f64(lost / rate));
            }
        }
        self.tokens = refilled;
        self.held_tokens = self.held_sum_at(now);
        self.committed_tokens = self.committed_at(now);
        self.last_refill = self.last_refill.max(now);
    }

    /// Trickle tokens still to be delivered at `now`: above zero, some of
    /// the bucket's pods are throttled (on trickles it could not pay at
    /// once).
    pub fn committed_at(&self, now: Timestamp) -> f64 {
        let elapsed = now.seconds_since(self.last_refill);
        (self.committed_tokens - self.committed_rate * elapsed).max(0.0)
    }

    fn capped_valid(&self, now: Timestamp, credit_window: Duration) -> bool {
        now.duration_since(self.capped_until) <= credit_window
    }

    /// Charges the tokens a pod gave itself at its fallback rate. The
    /// refill the bucket got while the fallback ran pays for them: what it
    /// kept (until it reached its burst limit at `capped_from`) is charged
    /// first, then the refill it lost meanwhile is used to forgive the rest
    /// (it would otherwise have been lost): at most the refill of the time
    /// the fallback and the loss overlap, and at most what is left of the
    /// loss.
    fn charge_fallback(&mut self, req: &TokenBucketRequest, now: Timestamp) {
        let window = req.target_request_period;
        let forgiven = if req.fallback_tokens > 0.0 && self.capped_valid(now, window) {
            let fallback_from = now.saturating_sub(req.fallback_duration);
            let overlap = self
                .capped_until
                .min(now)
                .seconds_since(self.capped_from.max(fallback_from));
            // Refill the bucket kept while the fallback ran (it refilled
            // up to `capped_from`, then lost the rest) pays for it before
            // the refill it lost: both are the fallback's.
            let rate = self.refill_limits().refill_rate;
            let kept = (rate * self.capped_from.seconds_since(fallback_from))
                .min(self.tokens)
                .max(0.0);
            (req.fallback_tokens - kept)
                .min(self.capped_refill)
                .min(rate * overlap)
                .max(0.0)
        } else {
            0.0
        };
        self.capped_refill -= forgiven;
        self.tokens -= req.fallback_tokens - forgiven;
    }

    /// Puts tokens a pod gave back into the bucket, never lifting it above
    /// the burst limit less what the pods hold (or above where it already
    /// was).
    fn take_back(&mut self, returned: f64) {
        if returned > 0.0 {
            let ceiling = (self.limits.burst_limit - self.held()).max(self.tokens);
            self.tokens = (self.tokens + returned).min(ceiling);
        }
    }

    /// Takes an instance's trickle out of the commitments (it was replaced,
    /// folded into a new grant, or its instance removed).
    fn release_trickle(&mut self, instance: &InstanceState, now: Timestamp) {
        let undelivered = instance.committed_rate * instance.committed_until.seconds_since(now);
        self.committed_tokens = (self.committed_tokens - undelivered).max(0.0);
        self.committed_rate = (self.committed_rate - instance.committed_rate).max(0.0);
    }
}

pub(crate) fn refilled_tokens(tokens: f64, limits: &Limits, elapsed_secs: f64) -> f64 {
    if tokens >= limits.burst_limit {
        // Refill is paused at or above the burst limit; an operator may have
        // set more than the limit, which is kept, not cut.
        return tokens;
    }
    (tokens + limits.refill_rate * elapsed_secs).min(limits.burst_limit)
}

/// An instance row: one pod's place in the list and its idempotency record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceState {
    pub instance_id: InstanceId,
    pub next_instance_id: InstanceId,
    pub lease: Vec<u8>,
    /// The last sequence number seen for `lease`.
    pub seq: u64,
    pub shares: f64,
    /// When the server last heard from the instance.
    pub last_update: Timestamp,
    /// The rate reserved for it while it wants it (a member of an
    /// organisation; pods have none).
    #[serde(default)]
    pub guaranteed: f64,
    /// The response to `(lease, seq)`, replayed to a duplicate.
    pub last_grant: Grant,
    /// The part of the pod's trickle that future refill pays for: the rate
    /// at which it is delivered, and until when. (Tokens the bucket already
    /// held when the trickle was granted are not a commitment.)
    #[serde(default, alias = "trickle_rate")]
    pub committed_rate: f64,
    #[serde(default, alias = "trickle_until")]
    pub committed_until: Timestamp,
    /// Tokens the pod holds: what it last reported, plus what it was
    /// granted at once then, as of `last_update` (counted in the head
    /// row's `held_tokens`)…
    #[serde(default)]
    pub held_tokens: f64,
    /// …and the rate it uses them at (its shares then).
    #[serde(default)]
    pub held_use_rate: f64,
}

/// The answer to a token-bucket request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    pub granted_tokens: f64,
    /// Zero: use the tokens at once. Otherwise they arrive evenly over it.
    pub trickle_duration: Duration,
    /// With a trickle: most unused tokens the pod may hold; zero otherwise.
    pub max_burst_tokens: f64,
    /// Tokens per second the pod may use on its own while the server is unreachable.
    pub fallback_rate: f64,
    /// The fallback tokens charged with the request this answers: those
    /// its applied attempt carried. A retry carries the fallback its pod
    /// used since the first attempt as well; answered with the grant of an
    /// earlier attempt, this tells the pod how much is still to charge.
    /// `None` where it was not recorded (a grant stored before it was, or
    /// a server that does not say): the pod takes all it sent as charged.
    #[serde(default)]
    pub fallback_charged: Option<f64>,
    /// What a new pod of this bucket may use before its first answer
    /// ([`initial_allowance`]), as of this answer (a repeat gets the same).
    /// `None` from a server that does not say, or a grant stored before it
    /// was (PostgreSQL migration V15).
    #[serde(default)]
    pub initial_allowance: Option<f64>,
}

/// A pod's request to its tenant's global bucket. Serializable so that a
/// process can write what it sends to a journal and send it again after a
/// crash (the agent's recovery: [`crate::recovery`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenBucketRequest {
    pub instance_id: InstanceId,
    pub lease: Vec<u8>,
    pub seq: u64,
    pub requested_tokens: f64,
    pub shares: f64,
    pub target_request_period: Duration,
    pub consumption: Consumption,
    pub next_live_instance_id: Option<InstanceId>,
    /// Tokens the pod gives back (at shutdown: what it held and what its
    /// trickle had yet to deliver).
    pub returned_tokens: f64,
    /// Tokens the pod holds, granted and not used, after what it returns:
    /// the bucket counts them as part of what it holds.
    #[serde(default)]
    pub held_tokens: f64,
    /// Tokens the pod gave itself at its fallback rate while the server did
    /// not answer, used already: the bucket is charged for them (they are
    /// not granted)…
    pub fallback_tokens: f64,
    /// …over this long before the request (from when the pod began running
    /// on its fallback rate).
    pub fallback_duration: Duration,
}

impl TokenBucketRequest {
    /// Checks every field; field names are the wire contract's.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.instance_id == 0 {
            return Err(InvalidInput::new(
                "instance_id",
                "must be >= 1 (0 is reserved for the tenant)",
            ));
        }
        if self.lease.is_empty() {
            return Err(InvalidInput::new("instance_lease", "must not be empty"));
        }
        if self.lease.len() > MAX_LEASE_LEN {
            return Err(InvalidInput::new(
                "instance_lease",
                format!(
                    "must be at most {MAX_LEASE_LEN} bytes, got {}",
                    self.lease.len()
                ),
            ));
        }
        validate::counter("seq", self.seq, MAX_SEQ)?;
        validate::non_negative("requested_tokens", self.requested_tokens, MAX_TOKENS)?;
        validate::non_negative("shares", self.shares, MAX_TOKENS)?;
        validate::target_request_period("target_request_period", self.target_request_period)?;
        validate::non_negative("returned_tokens", self.returned_tokens, MAX_TOKENS)?;
        validate::non_negative("held_tokens", self.held_tokens, MAX_TOKENS)?;
        validate::non_negative("fallback_tokens", self.fallback_tokens, MAX_TOKENS)?;
        if self.fallback_duration > MAX_FALLBACK_DURATION {
            return Err(InvalidInput::new(
                "fallback_duration",
                format!(
                    "must be at most {} s, got {} s",
                    MAX_FALLBACK_DURATION.as_secs(),
                    validate::number(self.fallback_duration.as_secs_f64())
                ),
            ));
        }
        self.consumption
            .validate()
            .map_err(|e| e.within("consumption_since_last_request"))?;
        Ok(())
    }
}

/// An operator's change of a tenant's limits.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitsUpdate {
    pub available_tokens: f64,
    pub limits: Limits,
    /// When the consumption the limits are based on was read; `None` takes
    /// `available_tokens` as it is.
    pub as_of: Option<Timestamp>,
    /// The tenant's cumulative request units at `as_of`.
    pub as_of_consumed_tokens: f64,
    /// Which of the three values the update sets; the others keep the
    /// bucket's.
    pub mask: LimitsMask,
}

/// The values a [`LimitsUpdate`] sets. A value left out keeps what the
/// bucket has: the rate changes without touching the tokens, say. Only an
/// existing bucket can be updated in part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitsMask {
    pub available_tokens: bool,
    pub refill_rate: bool,
    pub burst_limit: bool,
}

impl LimitsMask {
    /// Every value: the update replaces the bucket's limits and level.
    pub const ALL: LimitsMask = LimitsMask {
        available_tokens: true,
        refill_rate: true,
        burst_limit: true,
    };

    pub fn is_all(&self) -> bool {
        *self == LimitsMask::ALL
    }

    /// The limits an update leaves: `update`'s values where the mask
    /// names them, `kept`'s elsewhere.
    pub fn limits(&self, update: Limits, kept: Limits) -> Limits {
        Limits {
            refill_rate: if self.refill_rate {
                update.refill_rate
            } else {
                kept.refill_rate
            },
            burst_limit: if self.burst_limit {
                update.burst_limit
            } else {
                kept.burst_limit
            },
        }
    }
}

/// How far after the store's clock an update's `as_of` may lie: the clock
/// of whoever read the consumption may be a little ahead. Later is refused.
pub const MAX_AS_OF_AHEAD: Duration = Duration::from_secs(5);

impl LimitsUpdate {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.mask.available_tokens {
            validate::non_negative("available_tokens", self.available_tokens, MAX_TOKENS)?;
        }
        // The limits' own rules, on the values the update sets (0 is
        // valid for either).
        let unset = Limits {
            refill_rate: 0.0,
            burst_limit: 0.0,
        };
        self.mask.limits(self.limits, unset).validate()?;
        if !(self.mask.available_tokens || self.mask.refill_rate || self.mask.burst_limit) {
            return Err(InvalidInput::new(
                "update_mask",
                "names none of available_tokens, refill_rate, burst_limit: nothing to update",
            ));
        }
        if self.as_of.is_some() && !self.mask.available_tokens {
            return Err(InvalidInput::new(
                "as_of",
                "applies to available_tokens, which update_mask leaves out",
            ));
        }
        // No bound of its own: any value up to the tenant's total is valid,
        // and that is checked against the stored total.
        validate::non_negative(
            "as_of_consumed_tokens",
            self.as_of_consumed_tokens,
            f64::MAX,
        )?;
        if self.as_of.is_none() && self.as_of_consumed_tokens != 0.0 {
            return Err(InvalidInput::new(
                "as_of_consumed_tokens",
                "is meaningful only with as_of; set as_of or leave this 0",
            ));
        }
        Ok(())
    }
}

/// Why a request was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// A late duplicate of a request older than the last one answered.
    #[error(
        "seq {seq} is older than the last sequence number {last_seq} seen for this instance lease"
    )]
    StaleSequence { seq: u64, last_seq: u64 },
    /// A request from an older incarnation of an instance than the one the
    /// instance row holds.
    #[error(
        "instance_lease is older than the lease instance {instance_id} holds now: a newer incarnation took the instance over (a new incarnation must use a greater lease)"
    )]
    SupersededLease { instance_id: InstanceId },
    /// The rows handed in do not form a consistent list; a store bug.
    #[error("instance list is inconsistent: {0}")]
    Inconsistent(String),
}

/// The rows of one bucket that a transaction has loaded: the head row and
/// the instance rows of [`instance_window`] (a store may load more, never
/// fewer).
#[derive(Clone, Debug, PartialEq)]
pub struct BucketRows {
    pub head: BucketRow,
    pub instances: BTreeMap<InstanceId, InstanceState>,
}

impl BucketRows {
    /// With every instance row of the bucket loaded (not a window): checks
    /// that the list from the sentinel is the instance rows in ascending
    /// id order, each once, and that the head's `live_instances` and
    /// `share_sum` match them. What every operation keeps true; the tests
    /// and the fuzz targets check it after each step.
    pub fn check_whole_list(&self) -> Result<(), String> {
        let mut seen = Vec::new();
        let mut cur = self.head.members.first_instance_id;
        while cur != 0 {
            if seen.len() > self.instances.len() {
                return Err("a cycle that misses the sentinel".to_owned());
            }
            seen.push(cur);
            cur = match self.instances.get(&cur) {
                Some(row) => row.next_instance_id,
                None => {
                    return Err(format!(
                        "the list links to instance {cur}, which has no row"
                    ));
                }
            };
        }
        let ids: Vec<InstanceId> = self.instances.keys().copied().collect();
        if seen != ids {
            return Err(format!(
                "the list is {seen:?}, not the ascending ids {ids:?}"
            ));
        }
        if self.head.members.live_instances as usize != ids.len() {
            return Err(format!(
                "live_instances {} for {} rows",
                self.head.members.live_instances,
                ids.len()
            ));
        }
        let sum: f64 = self.instances.values().map(|i| i.shares).sum();
        let share_sum = self.head.members.share_sum;
        if !sums_agree(share_sum, sum) {
            return Err(format!(
                "share_sum {share_sum} for shares adding up to {sum}"
            ));
        }
        let held = BucketState::reported_by(self.instances.values());
        let reported = self.head.state.held_reported;
        if !sums_agree(reported, held) {
            return Err(format!(
                "held_reported {reported} for instances holding {held}"
            ));
        }
        Ok(())
    }
}

/// A run of instance ids to load: `first..=last` (empty if `first >
/// last`), in ascending order or descending, at most `limit` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    pub first: InstanceId,
    pub last: InstanceId,
    pub descending: bool,
    pub limit: usize,
}

impl IdRange {
    pub fn is_empty(&self) -> bool {
        self.first > self.last || self.limit == 0
    }

    /// The rows of `all` this range selects, in its order.
    pub fn select<'a, V>(
        &self,
        all: &'a BTreeMap<InstanceId, V>,
    ) -> Box<dyn Iterator<Item = (&'a InstanceId, &'a V)> + 'a> {
        if self.is_empty() {
            return Box::new(std::iter::empty());
        }
        let range = all.range(self.first..=self.last);
        if self.descending {
            Box::new(range.rev().take(self.limit))
        } else {
            Box::new(range.take(self.limit))
        }
    }
}

/// The instance rows a request from one instance needs, as four runs of
/// ids every store can read with an index range scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceWindow {
    /// The requester's own row.
    pub own: IdRange,
    /// Its predecessor, the highest id below it (where a new instance is
    /// linked in). Descending, one row.
    pub predecessor: IdRange,
    /// The rows after it, which the inactivity walk examines…
    pub following: IdRange,
    /// …wrapping past the highest id to the lowest.
    pub wrapped: IdRange,
}

/// The one rule for which instance rows a transaction loads for a request
/// from instance `id`: its own row, its predecessor, and the up to
/// `cleanup_window` rows that follow it in list order, wrapping past the
/// highest id to the lowest. [`request`] on these rows gives exactly what
/// it gives on all of them (a property test checks it).
pub fn instance_window(id: InstanceId, cleanup_window: usize) -> InstanceWindow {
    let below = id.saturating_sub(1);
    InstanceWindow {
        own: IdRange {
            first: id,
            last: id,
            descending: false,
            limit: 1,
        },
        predecessor: IdRange {
            first: 1,
            last: below,
            descending: true,
            limit: 1,
        },
        following: IdRange {
            first: id.saturating_add(1),
            last: if id == InstanceId::MAX {
                0
            } else {
                InstanceId::MAX
            },
            descending: false,
            limit: cleanup_window,
        },
        wrapped: IdRange {
            first: 1,
            last: below,
            descending: false,
            limit: cleanup_window,
        },
    }
}

impl InstanceWindow {
    pub fn ranges(&self) -> [IdRange; 4] {
        [self.own, self.predecessor, self.following, self.wrapped]
    }

    /// The rows of `all` the window selects (for stores that hold every
    /// row in memory, and for tests).
    pub fn select(
        &self,
        all: &BTreeMap<InstanceId, InstanceState>,
    ) -> BTreeMap<InstanceId, InstanceState> {
        self.ranges()
            .iter()
            .flat_map(|range| range.select(all))
            .map(|(&id, row)| (id, row.clone()))
            .collect()
    }
}

/// Which rows a transaction must write back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowChanges {
    /// Instance rows inserted or updated (their new values are in [`BucketRows`]).
    pub upserted: BTreeSet<InstanceId>,
    /// Instance rows to delete.
    pub removed: Vec<InstanceState>,
}

impl RowChanges {
    fn upsert(&mut self, id: InstanceId) {
        if id != 0 {
            self.upserted.insert(id);
        }
    }
}

/// The result of [`request`].
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutcome {
    pub grant: Grant,
    /// True if this repeated the instance's last request: the grant is the
    /// stored one and no state changed (nothing needs writing).
    pub duplicate: bool,
    /// Rows to write back; the head row is written whenever `duplicate` is false.
    pub changes: RowChanges,
    /// The budget's closed cycle and crossed thresholds, for the store to keep.
    pub budget: BudgetOutcome,
}

/// What a request did to its bucket's budget: rows the store writes
/// beside the head row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetOutcome {
    /// The cycle the request found over.
    pub closed: Option<CycleRecord>,
    /// Thresholds it crossed.
    pub events: Vec<BudgetEvent>,
}

/// How many seconds of its refill rate a tenant's pods may start on
/// together when its burst limit is smaller.
pub const INITIAL_ALLOWANCE_REFILL: Duration = Duration::from_secs(1);

/// The part of the refill rate a pod whose fraction of the tenant's
/// shares is `share`, one of `live_instances` pods, runs on while the
/// server cannot be reached: half its share and half an even split, so an
/// idle pod (share 0) still runs on its own in an outage, and the parts
/// of all pods sum to 1.
pub fn fallback_fraction(share: f64, live_instances: u32) -> f64 {
    (share + 1.0 / f64::from(live_instances.max(1))) / 2.0
}

/// What a new pod may use before its first answer, so that all the
/// tenant's pods starting at once use no more than its bucket holds when
/// full: the burst limit (at least [`INITIAL_ALLOWANCE_REFILL`] of the
/// refill rate) split evenly between `live_instances` pods (at least one).
/// Pods learn it from every answer and a process that keeps it (the agent,
/// in its journal) starts the bucket's next life on it.
pub fn initial_allowance(limits: &Limits, live_instances: u32) -> f64 {
    let affordable = limits
        .burst_limit
        .max(limits.refill_rate * INITIAL_ALLOWANCE_REFILL.as_secs_f64());
    affordable / f64::from(live_instances.max(1))
}

/// The allowance a bucket's rows afford: none while a budget allows no
/// fallback (a pod may use nothing it is not granted).
fn allowance_of(rows: &BucketRows) -> f64 {
    if rows
        .head
        .budget
        .as_ref()
        .is_some_and(|b| !b.fallback_allowed())
    {
        return 0.0;
    }
    initial_allowance(
        &rows.head.state.refill_limits(),
        rows.head.members.live_instances,
    )
}

/// Serves one pod request against its tenant's bucket.
///
/// On `Err`, `rows` is unchanged. On a duplicate, `rows` is unchanged and the
/// first response is returned.
pub fn request(
    rows: &mut BucketRows,
    req: &TokenBucketRequest,
    now: Timestamp,
    config: &GlobalBucketConfig,
) -> Result<RequestOutcome, RequestError> {
    serve(rows, req, Requester::Pod, now, config)
}

/// Shadow mode: `grant`, decided as if enforced (the bucket's state is
/// left as that decision leaves it), becomes what the pod asked for, at
/// once (at most the budget's `cap`: a budget enforces on its own terms),
/// and what enforcing would have held back is counted. The totals count
/// what the pod was granted.
fn shadow(head: &mut BucketRow, grant: &mut Grant, req: &TokenBucketRequest, cap: f64) {
    let at_once = if grant.trickle_duration.is_zero() {
        grant.granted_tokens
    } else {
        0.0
    };
    let asked = req.requested_tokens.min(cap.max(0.0));
    head.shadow.throttled_tokens += (asked - at_once).max(0.0);
    head.shadow.throttled_micros = head
        .shadow
        .throttled_micros
        .saturating_add(u64::try_from(grant.trickle_duration.as_micros()).unwrap_or(u64::MAX))
        .min(crate::validate::MAX_TOTAL);
    head.totals.granted_tokens += asked - grant.granted_tokens;
    grant.granted_tokens = asked;
    grant.trickle_duration = Duration::ZERO;
    grant.max_burst_tokens = 0.0;
}

/// Who asks a bucket for tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Requester {
    /// A pod, when it runs short.
    Pod,
    /// A member of an organisation, once per draw period, with its
    /// guaranteed rate.
    Member { guaranteed: f64 },
}

impl Requester {
    /// The rate reserved for it: a member's guarantee; none for a pod.
    fn guaranteed(self) -> f64 {
        match self {
            Requester::Pod => 0.0,
            Requester::Member { guaranteed } => guaranteed,
        }
    }
}

/// [`request`] from an instance with a guaranteed rate: a member of an
/// organisation drawing on the organisation's bucket
/// ([`crate::organisation`]). Under the shares policy the guarantees
/// wanted are handed out first (cut in proportion if they exceed the
/// refill rate), the rest by shares.
pub fn request_guaranteed(
    rows: &mut BucketRows,
    req: &TokenBucketRequest,
    guaranteed: f64,
    now: Timestamp,
    config: &GlobalBucketConfig,
) -> Result<RequestOutcome, RequestError> {
    serve(rows, req, Requester::Member { guaranteed }, now, config)
}

fn serve(
    rows: &mut BucketRows,
    req: &TokenBucketRequest,
    requester: Requester,
    now: Timestamp,
    config: &GlobalBucketConfig,
) -> Result<RequestOutcome, RequestError> {
    let guaranteed = requester.guaranteed();
    req.validate()?;
    validate::non_negative("guaranteed_rate", guaranteed, MAX_REFILL_RATE)?;
    let id = req.instance_id;
    if let Some(existing) = rows.instances.get(&id) {
        if existing.lease == req.lease {
            if req.seq == existing.seq {
                return Ok(RequestOutcome {
                    grant: existing.last_grant,
                    duplicate: true,
                    changes: RowChanges::default(),
                    budget: BudgetOutcome::default(),
                });
            }
            if req.seq < existing.seq {
                return Err(RequestError::StaleSequence {
                    seq: req.seq,
                    last_seq: existing.seq,
                });
            }
        } else if req.lease < existing.lease
            && now.duration_since(existing.last_update) <= config.inactivity_timeout
        {
            return Err(RequestError::SupersededLease { instance_id: id });
        }
    }

    // Work on a copy so that an error part-way leaves `rows` untouched.
    let mut next = rows.clone();
    let mut changes = RowChanges::default();
    // The pod's report of what it holds is the best count at `now`: the
    // refill up to `now` stops where it says.
    let held_correction = match (requester, rows.instances.get(&id)) {
        (Requester::Pod, Some(instance)) => {
            req.held_tokens - BucketState::counted_held(instance, now)
        }
        (Requester::Pod, None) => req.held_tokens,
        (Requester::Member { .. }, _) => 0.0,
    };
    next.head
        .state
        .refill_knowing(now, req.target_request_period, held_correction);
    let mut budget = BudgetOutcome::default();
    if let Some(b) = next.head.budget.as_mut() {
        budget.closed = b.roll(&mut next.head.state, now);
    }
    next.head.state.charge_fallback(req, now);
    next.head.totals.granted_tokens += req.fallback_tokens;
    if !next.instances.contains_key(&id) {
        link_instance(&mut next, id, now)?;
        changes.upsert(predecessor_of(&next, id));
    }
    changes.upsert(id);

    let tenant = &mut next.head;
    let instance = next.instances.get_mut(&id).ok_or_else(|| {
        RequestError::Inconsistent(format!("instance {id} missing after linking"))
    })?;
    // A member draws once per draw period whatever its trickle: only a
    // pod that asks when it runs short asks again sooner.
    let shares_change = SharesChange::of(requester, instance.shares, req.shares);
    tenant.members.share_sum = (tenant.members.share_sum - instance.shares + req.shares).max(0.0);
    instance.shares = req.shares;
    tenant.state.release_held(instance, now);
    tenant.state.hold(instance, req.held_tokens, req.shares);
    tenant.state.take_back(req.returned_tokens);
    tenant.members.guarantee_sum =
        (tenant.members.guarantee_sum - instance.guaranteed + guaranteed).max(0.0);
    instance.guaranteed = guaranteed;
    instance.lease.clone_from(&req.lease);
    instance.seq = req.seq;
    // A member's draws trickle by design: only a pod's trickle throttles.
    if matches!(requester, Requester::Pod) {
        tenant.totals.throttled_micros = tenant
            .totals
            .throttled_micros
            .saturating_add(throttled_since(instance, now))
            .min(crate::validate::MAX_TOTAL);
    }
    instance.last_update = now;
    tenant.totals.consumption.add(&req.consumption);
    tenant.state.updated_at = now;

    remove_silent_instances(&mut next, req, now, config, &mut changes)?;

    // The pod folds what is left of its trickle into the new grant; the
    // commitment it carries moves into the new one.
    let still_committed = match next.instances.get(&id) {
        Some(instance) => {
            let left = instance.committed_rate * instance.committed_until.seconds_since(now);
            next.head.state.release_trickle(instance, now);
            left
        }
        None => 0.0,
    };
    // What pods charge for their fallback and report counts first: it may
    // reach the budget's limit, which this grant must then respect.
    let cap = match next.head.budget.as_mut() {
        Some(b) => {
            let charged = b.record(
                &mut next.head.state,
                0.0,
                req.fallback_tokens,
                &req.consumption,
                now,
            );
            budget.events.extend(charged);
            b.grant_cap(now, req.target_request_period)
        }
        None => f64::INFINITY,
    };
    let (mut grant, commitment) = grant(
        &mut next,
        req,
        requester,
        config,
        still_committed,
        cap,
        shares_change,
    );
    if cap < req.requested_tokens && grant.trickle_duration < req.target_request_period {
        // The budget binds: what it allows goes out over the whole period
        // (nothing, if it allows nothing), so the pod asks again about a
        // period later rather than at once, again and again, for slivers.
        grant.trickle_duration = req.target_request_period;
        grant.max_burst_tokens = grant.max_burst_tokens.max(grant.granted_tokens);
    }
    grant.fallback_charged = Some(req.fallback_tokens);
    next.head.totals.granted_tokens += grant.granted_tokens;
    if let Some(instance) = next.instances.get_mut(&id) {
        if grant.trickle_duration.is_zero() {
            instance.committed_rate = 0.0;
            instance.committed_until = now;
            // Granted at once: the pod holds it until it reports otherwise
            // (a member's draw is its own bucket's refill). What a trickle
            // delivers it reports once it has it.
            if requester == Requester::Pod && grant.granted_tokens > 0.0 {
                let held = instance.held_tokens + grant.granted_tokens;
                next.head.state.release_held(instance, now);
                next.head.state.hold(instance, held, req.shares);
            }
        } else {
            instance.committed_rate = commitment / grant.trickle_duration.as_secs_f64();
            instance.committed_until = now.saturating_add(grant.trickle_duration);
            next.head.state.committed_tokens += commitment;
            next.head.state.committed_rate += instance.committed_rate;
        }
    }
    if !next.head.enforce && requester == Requester::Pod {
        shadow(&mut next.head, &mut grant, req, cap);
    }
    if let Some(b) = next.head.budget.as_mut() {
        let granted = b.record(
            &mut next.head.state,
            grant.granted_tokens,
            0.0,
            &Consumption::default(),
            now,
        );
        budget.events.extend(granted);
        if !b.fallback_allowed() {
            grant.fallback_rate = 0.0;
        }
    }
    grant.initial_allowance = Some(allowance_of(&next));
    // Kept whole, as answered, for a repeat of the request.
    if let Some(instance) = next.instances.get_mut(&id) {
        instance.last_grant = grant;
    }
    *rows = next;
    Ok(RequestOutcome {
        grant,
        duplicate: false,
        changes,
        budget,
    })
}

/// The id of the row pointing at `id`: the highest loaded id below it, or the
/// sentinel.
fn predecessor_of(rows: &BucketRows, id: InstanceId) -> InstanceId {
    rows.instances
        .range(..id)
        .next_back()
        .map_or(0, |(&pred, _)| pred)
}

fn next_of(rows: &BucketRows, id: InstanceId) -> Option<InstanceId> {
    if id == 0 {
        Some(rows.head.members.first_instance_id)
    } else {
        rows.instances.get(&id).map(|i| i.next_instance_id)
    }
}

fn set_next(rows: &mut BucketRows, id: InstanceId, next: InstanceId) {
    if id == 0 {
        rows.head.members.first_instance_id = next;
    } else if let Some(instance) = rows.instances.get_mut(&id) {
        instance.next_instance_id = next;
    }
}

/// Inserts a new instance row after its predecessor.
fn link_instance(
    rows: &mut BucketRows,
    id: InstanceId,
    now: Timestamp,
) -> Result<(), RequestError> {
    let pred = predecessor_of(rows, id);
    let after = next_of(rows, pred).unwrap_or(0);
    // The predecessor's successor must be beyond `id` (or the sentinel);
    // anything else means the store did not load the true predecessor.
    if after != 0 && after <= id {
        return Err(RequestError::Inconsistent(format!(
            "instance {pred} points at {after}, so it is not the predecessor of new instance {id}"
        )));
    }
    rows.instances.insert(
        id,
        InstanceState {
            instance_id: id,
            next_instance_id: after,
            lease: Vec::new(),
            seq: 0,
            shares: 0.0,
            last_update: now,
            guaranteed: 0.0,
            last_grant: Grant::default(),
            committed_rate: 0.0,
            committed_until: now,
            held_tokens: 0.0,
            held_use_rate: 0.0,
        },
    );
    set_next(rows, pred, id);
    rows.head.members.live_instances += 1;
    Ok(())
}

/// True if `candidate` lies strictly between `from` and `to` going around the
/// circular list (ascending ids, wrapping at the sentinel).
fn strictly_between(from: InstanceId, to: InstanceId, candidate: InstanceId) -> bool {
    if from < to {
        from < candidate && candidate < to
    } else {
        candidate > from || candidate < to
    }
}

/// Walks the instances after the requester and unlinks those silent too long.
fn remove_silent_instances(
    rows: &mut BucketRows,
    req: &TokenBucketRequest,
    now: Timestamp,
    config: &GlobalBucketConfig,
    changes: &mut RowChanges,
) -> Result<(), RequestError> {
    let me = req.instance_id;
    let mut cur = me;
    let mut examined = 0;
    let mut passed_sentinel = false;
    // Each step either advances `cur` or removes a row, so the walk ends.
    while examined < config.cleanup_window {
        let Some(candidate) = next_of(rows, cur) else {
            break;
        };
        if candidate == me {
            break; // all the way round
        }
        if candidate == 0 {
            if passed_sentinel {
                break; // a list with no way back to the requester; leave it be
            }
            passed_sentinel = true;
            cur = 0;
            continue;
        }
        let Some(row) = rows.instances.get(&candidate) else {
            break; // not loaded by this transaction
        };
        examined += 1;
        let silent = now.duration_since(row.last_update);
        let reported_dead = req
            .next_live_instance_id
            .is_some_and(|hint| strictly_between(me, hint, candidate));
        let timeout = if reported_dead {
            config.reported_dead_timeout
        } else {
            config.inactivity_timeout
        };
        if silent > timeout {
            let after = row.next_instance_id;
            let Some(removed) = rows.instances.remove(&candidate) else {
                break;
            };
            set_next(rows, cur, after);
            changes.upsert(cur);
            changes.upserted.remove(&candidate);
            let tenant = &mut rows.head;
            tenant.state.release_trickle(&removed, now);
            tenant.members.share_sum = (tenant.members.share_sum - removed.shares).max(0.0);
            tenant.state.release_held(&removed, now);
            tenant.members.guarantee_sum =
                (tenant.members.guarantee_sum - removed.guaranteed).max(0.0);
            tenant.members.live_instances = tenant
                .members
                .live_instances
                .checked_sub(1)
                .ok_or_else(|| {
                    RequestError::Inconsistent("live instance count would go below zero".into())
                })?;
            changes.removed.push(removed);
        } else {
            cur = candidate;
        }
    }
    if rows.head.members.live_instances <= 1 {
        // Drop rounding residue accumulated by incremental share updates.
        let mine = rows.instances.get(&me);
        rows.head.members.share_sum = mine.map_or(0.0, |instance| instance.shares);
        rows.head.members.guarantee_sum = mine.map_or(0.0, |instance| instance.guaranteed);
    }
    Ok(())
}

/// Whether a sum kept running on a head row (`share_sum`, `held_reported`)
/// agrees with the same sum taken over the instance rows, but for the
/// rounding of adding and taking out.
pub fn sums_agree(kept: f64, summed: f64) -> bool {
    (kept - summed).abs() <= 1e-6 * summed.abs().max(1.0)
}

/// How a pod's shares moved since its last request. Its fraction of the
/// refill rate is taken against its peers' shares as they last reported
/// them, which lag when many pods' demand moves at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SharesChange {
    /// Within a factor of [`SHARES_JUMP_FACTOR`] either way.
    Steady,
    /// At least doubled (or a new pod's first request): against its peers'
    /// old shares it would take most of the rate.
    Jumped,
    /// Fallen to a quarter or less: against its peers' old shares, still
    /// high if their demand fell too, it would get a sliver of the rate for
    /// a whole period, and the refill nobody was handed would be lost once
    /// the bucket fills.
    Dropped,
}

impl SharesChange {
    fn of(requester: Requester, before: f64, now: f64) -> SharesChange {
        if requester != Requester::Pod || now <= 0.0 {
            SharesChange::Steady
        } else if now >= SHARES_JUMP_FACTOR * before {
            SharesChange::Jumped
        } else if now * SHARES_DROP_FACTOR <= before {
            SharesChange::Dropped
        } else {
            SharesChange::Steady
        }
    }
}

/// This instance's fraction of the refill rate.
fn fraction(members: &Membership, shares: f64) -> f64 {
    if members.share_sum > 0.0 {
        (shares / members.share_sum).clamp(0.0, 1.0)
    } else {
        1.0 / f64::from(members.live_instances.max(1))
    }
}

/// Decides the grant and takes it from the bucket. `still_committed` is the
/// refill the pod's previous trickle had yet to deliver; the pod folds it
/// into the new one. After a jump or a drop in the pod's shares
/// (`shares_change`) its trickle is short.
///
/// Returns the grant and, for a trickle, the commitment it carries: the
/// tokens of the new trickle (folded ones included) that future refill pays
/// for, as opposed to tokens the bucket held when it was granted. The grant
/// never exceeds `cap` (a budget's; infinite without one).
fn grant(
    rows: &mut BucketRows,
    req: &TokenBucketRequest,
    requester: Requester,
    config: &GlobalBucketConfig,
    still_committed: f64,
    cap: f64,
    shares_change: SharesChange,
) -> (Grant, f64) {
    let guaranteed = requester.guaranteed();
    let tenant = &mut rows.head;
    tenant.state.tokens_avg = BUCKET_LEVEL_EMA_FACTOR * tenant.state.tokens
        + (1.0 - BUCKET_LEVEL_EMA_FACTOR) * tenant.state.tokens_avg;

    let share = fraction(&tenant.members, req.shares);
    let even_share = 1.0 / f64::from(tenant.members.live_instances.max(1));
    let limits = tenant.state.refill_limits();
    let fallback_rate =
        limits.refill_rate * fallback_fraction(share, tenant.members.live_instances);
    let requested = req.requested_tokens.min(cap);
    if requested <= 0.0 {
        let grant = Grant {
            fallback_rate,
            ..Grant::default()
        };
        return (grant, 0.0);
    }
    let period = req.target_request_period.as_secs_f64();
    let refill_rate = limits.refill_rate;
    // Under the shares policy the bucket is judged as an ideal bucket would
    // hold it: its tokens plus what trickles have yet to deliver (they were
    // taken in advance), excusing at most one period of refill.
    // The requester's own commitment moves into its new trickle, so it
    // still counts as committed.
    let excused = match config.policy {
        GrantPolicy::Shares => {
            (tenant.state.committed_tokens + still_committed).min(refill_rate * period)
        }
        GrantPolicy::BucketLevelEma | GrantPolicy::Greedy => 0.0,
    };
    let level = tenant.state.tokens + excused;
    // A pod's part of what the bucket and the pods hold together, by its
    // shares (evenly after a jump: its peers' shares are still old, and
    // they may be bursting too), less what it holds: what it may take
    // now, whoever asks first. A pod held to it asks again soon.
    let takeable = match config.policy {
        GrantPolicy::Shares if requester == Requester::Pod => {
            let whole = level.max(0.0) + tenant.state.held_for_parts();
            let part = if shares_change == SharesChange::Jumped {
                even_share
            } else {
                share.max(even_share)
            };
            level.min((whole * part - req.held_tokens).max(0.0))
        }
        GrantPolicy::Shares | GrantPolicy::BucketLevelEma | GrantPolicy::Greedy => level,
    };
    // Held back from what the bucket holds: the pod asks again soon, when
    // the others have had their parts.
    let held_to_part = takeable < level;
    if takeable >= requested {
        tenant.state.tokens -= requested;
        let grant = Grant {
            granted_tokens: requested,
            trickle_duration: Duration::ZERO,
            max_burst_tokens: 0.0,
            fallback_rate,
            fallback_charged: None,
            initial_allowance: None,
        };
        return (grant, 0.0);
    }

    let available_now = takeable.max(0.0);
    let needed = requested - available_now;
    let (granted, trickle_secs) = match config.policy {
        GrantPolicy::Shares => {
            // Debt beyond the trickles' commitments is systematic: the rate
            // handed out drops so it is paid back over the next period.
            let systematic_debt = (-level).max(0.0);
            let effective_rate = (refill_rate - systematic_debt / period).max(0.0);
            // Guarantees first (cut in proportion past the rate), then
            // what is left by shares.
            let guarantees = tenant.members.guarantee_sum;
            let scale = if guarantees > effective_rate {
                effective_rate / guarantees
            } else {
                1.0
            };
            // After a jump or a drop the pod's fraction is of its peers'
            // old shares: many pods jumping at once would each take most
            // of the rate, and many dropping at once a sliver each.
            let rate_share = match shares_change {
                SharesChange::Jumped => even_share,
                SharesChange::Dropped => share.max(even_share),
                SharesChange::Steady => share,
            };
            let rate = guaranteed * scale + (effective_rate - guarantees).max(0.0) * rate_share;
            if rate > 0.0 {
                // At least a second (or the period, if shorter): a shorter
                // trickle would have the pod ask again at once. After a
                // jump or a drop in shares, or held back to its part of
                // what the bucket holds, a quarter of the period at most.
                let shortest = MIN_TRICKLE_SECS.min(period);
                let longest = if shares_change != SharesChange::Steady || held_to_part {
                    (period * JUMP_TRICKLE_PERIODS).max(shortest)
                } else {
                    period
                };
                let trickle = (needed / rate).clamp(shortest, longest);
                // What the previous trickle still owes the pod counts
                // towards this one: a pod renewing early must not get a
                // period's worth of tokens more often than once a period.
                let granted = (available_now + rate * trickle - still_committed).max(0.0);
                (granted, trickle)
            } else {
                (available_now, 0.0)
            }
        }
        GrantPolicy::BucketLevelEma => {
            let max_debt = BUCKET_LEVEL_EMA_MAX_DEBT_PERIODS * refill_rate * period;
            let allowance = refill_rate * period - (-tenant.state.tokens_avg).max(0.0);
            let debt_room = tenant.state.tokens.min(0.0) + max_debt;
            let future = needed.min(allowance).min(debt_room).max(0.0);
            (
                available_now + future,
                if future > 0.0 { period } else { 0.0 },
            )
        }
        GrantPolicy::Greedy => (available_now, 0.0),
    };
    let granted = granted.min(cap);
    tenant.state.tokens -= granted;

    if trickle_secs == 0.0 {
        // Nothing to spread over time: what the bucket holds (maybe nothing)
        // is usable at once; a pod granted nothing asks again when it must.
        let grant = Grant {
            granted_tokens: granted,
            trickle_duration: Duration::ZERO,
            max_burst_tokens: 0.0,
            fallback_rate,
            fallback_charged: None,
            initial_allowance: None,
        };
        return (grant, 0.0);
    }
    let delivery_rate = (granted + still_committed) / trickle_secs;
    let commitment = granted - available_now.min(granted) + still_committed;
    let grant = Grant {
        granted_tokens: granted,
        // Never beyond the period, whatever the float conversion rounds to.
        trickle_duration: Duration::from_secs_f64(trickle_secs).min(req.target_request_period),
        // The pod's part of the tenant's burst, but at least a second of its trickle.
        max_burst_tokens: (limits.burst_limit * share).max(delivery_rate),
        fallback_rate,
        fallback_charged: None,
        initial_allowance: None,
    };
    (grant, commitment)
}

/// An operator's limits update of a bucket as it is (`None`: it does not
/// exist yet, and is created by the update): the head row to write.
pub fn configure(
    existing: Option<&BucketRow>,
    update: &LimitsUpdate,
    now: Timestamp,
) -> Result<BucketRow, RequestError> {
    let mut head = match existing {
        Some(row) => row.clone(),
        None if update.mask.is_all() => BucketRow::new(update.limits, 0.0, true, now),
        None => {
            return Err(InvalidInput::new(
                "update_mask",
                "sets only part of the limits, but the bucket does not exist: a new bucket needs available_tokens, refill_rate and burst_limit",
            )
            .into());
        }
    };
    reconfigure(&mut head, update, now)?;
    Ok(head)
}

/// How many of a bucket's pods count as live at `now`: those heard from
/// within the inactivity timeout.
///
/// With the instance rows at hand (`Some`), they are counted. Without
/// (listings read head rows only), the list's count, or none once the
/// bucket is idle: every request sets the head's `updated_at` as well as
/// its own instance's `last_update`, so a bucket without a request for
/// longer than the timeout has only silent instances.
///
/// The silent rows themselves stay until a request's walk removes them:
/// each is its pod's idempotency record, and a pod cut off after its
/// request was applied but before it heard the answer retries that request
/// when it gets through; while the row is there, the retry is answered,
/// not counted again.
pub fn live_instances(
    head: &BucketRow,
    instances: Option<&[InstanceState]>,
    now: Timestamp,
    inactivity_timeout: Duration,
) -> u32 {
    if now.duration_since(head.state.updated_at) > inactivity_timeout {
        return 0;
    }
    match instances {
        Some(rows) => {
            let heard = rows
                .iter()
                .filter(|i| now.duration_since(i.last_update) <= inactivity_timeout)
                .count();
            u32::try_from(heard).unwrap_or(u32::MAX)
        }
        None => head.members.live_instances,
    }
}

/// Applies an operator's new limits to a bucket.
///
/// With `as_of`, the new level is `available_tokens` plus the refill from
/// `as_of` to `now` (capped as the bucket would have capped it), minus the
/// request units consumed beyond `as_of_consumed_tokens`. On `Err`, `row`
/// is unchanged.
pub fn reconfigure(
    row: &mut BucketRow,
    update: &LimitsUpdate,
    now: Timestamp,
) -> Result<(), RequestError> {
    update.validate()?;
    let mask = update.mask;
    let limits = mask.limits(update.limits, row.own_limits());
    if !mask.available_tokens {
        // The level stays the bucket's own: brought up to `now` under the
        // limits it had, then kept under the new ones.
        row.state.refill(now, Duration::ZERO);
        row.set_own_limits(limits);
        row.state.configured = true;
        row.state.updated_at = now;
        return Ok(());
    }
    let mut tokens = update.available_tokens;
    if let Some(as_of) = update.as_of {
        if as_of.seconds_since(now) > MAX_AS_OF_AHEAD.as_secs_f64() {
            return Err(InvalidInput::new(
                "as_of",
                format!(
                    "is {} s after the store's clock: the consumption cannot have been read in the future",
                    validate::number(as_of.seconds_since(now)),
                ),
            )
            .into());
        }
        let total = row.totals.consumption.request_unit_micros;
        let as_of_consumed = validate::to_micros(update.as_of_consumed_tokens);
        let tolerance = 1 + (total >> AS_OF_CONSUMED_TOLERANCE_SHIFT);
        if as_of_consumed > total.saturating_add(tolerance) {
            return Err(InvalidInput::new(
                "as_of_consumed_tokens",
                format!(
                    "{} exceeds the tenant's total consumption of {} request units",
                    validate::number(update.as_of_consumed_tokens),
                    validate::number(row.totals.consumption.request_units())
                ),
            )
            .into());
        }
        let consumed_since = total.saturating_sub(as_of_consumed);
        tokens = refilled_tokens(tokens, &limits, now.seconds_since(as_of));
        tokens -= validate::units(consumed_since);
    }
    row.set_own_limits(limits);
    row.state.configured = true;
    row.state.tokens = tokens;
    row.state.tokens_avg = tokens;
    // The operator's level is the bucket's now: nothing lost before it is
    // owed to anyone.
    row.state.capped_refill = 0.0;
    row.state.last_refill = row.state.last_refill.max(now);
    row.state.updated_at = now;
    Ok(())
}

#[cfg(test)]
mod tests;
