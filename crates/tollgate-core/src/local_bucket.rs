//! A pod's local token bucket: the gate in front of the pod's work, and the
//! protocol that keeps it filled from the tenant's global bucket.
//!
//! The pod's work waits on this bucket only, never on the network. The bucket
//! decides, with time passed in, when to ask the server for more tokens, how
//! many, with which shares and which consumption report, and what to do with
//! the answer — or with its absence. The client crate runs it behind a lock
//! and does the IO; the tests and the simulator run it in virtual time.
//!
//! # The rules
//! - **Initial allowance**: a new bucket holds `initial_tokens` before any
//!   answer, so a pod starts working at once. The first request asks for
//!   what the pod needs as if it held none of them; at the first answer
//!   the pod drops what it did not use (it was never granted), and what
//!   it used is charged as fallback tokens are: in `fallback_tokens`, with
//!   its next request (within `report_interval`), so the tenant's bucket
//!   pays for it (into debt if it must, which every pod's rate repays, as
//!   under one bucket) and the pod does not stall on its own. Every answer
//!   says what the tenant can afford for a new pod
//!   ([`crate::global_bucket::initial_allowance`]; kept as
//!   [`LocalBucket::initial_allowance`]): a process that keeps it starts
//!   the bucket's next life on it; one that knows nothing starts small
//!   (10 tokens by default).
//! - **Fallback tokens**: tokens the pod gave itself at its fallback rate
//!   are already used; the next request has the global bucket charged for
//!   them (`fallback_tokens`, with how long the fallback lasted, so the
//!   server can pay them from refill it got meanwhile). A retry of the
//!   request that went unanswered carries those used so far, so that a
//!   bucket the first attempt never reached is charged before it grants;
//!   the answer says how many its applied attempt was charged, and the
//!   rest goes with the next request. The bucket, not the pod, carries
//!   that debt, so every pod's rate drops
//!   while it is paid back, as it would under one bucket. A pod never uses
//!   tokens the global bucket does not pay for or is not charged for.
//! - **When to ask**: at start; when the tokens on hand (with what a trickle
//!   delivers) would not last `low_tokens_horizon` (1 s) at the current usage;
//!   when work is queued; `trickle_anticipation` (1 s) before a trickle ends;
//!   at least every `report_interval` while there is consumption to report;
//!   when a trickle outruns the pod's use (below); and when the pod holds
//!   more than half its buffer that the server does not count: what a
//!   trickle delivered, once it ends, or the rest of one folded into a
//!   grant made at once (the server counts what it grants at once as
//!   held, not a trickle's deliveries). Uncounted, such tokens sat beside
//!   a bucket refilled to its burst; the report says what the pod holds,
//!   and asks for what it needs, if anything. One request is in flight
//!   at a time.
//! - **How much**: `usage × target_request_period + buffer + queued
//!   − tokens on hand` (the initial allowance not counted until the first
//!   answer settles it), with usage an EWMA (factor 0.5, per second) of
//!   the tokens the pod's work asked for, so one grant lasts about a period.
//!   The buffer is `buffer_tokens`, at most the pod's even part of what
//!   the tenant's bucket holds as the server last said (its
//!   `initial_allowance`): the pods of a tenant hold no more than its
//!   burst in buffers, and equal pods hold equal parts of it.
//! - **What it holds**: every request says how many granted tokens the
//!   pod holds (`held_tokens`), which the bucket counts as part of its
//!   level; and gives back what the pod holds beyond what it wants (an
//!   idle pod does not sit on a grant it no longer needs).
//! - **Grants**: an immediate grant adds to the bucket. A trickle grant
//!   delivers `granted / trickle_duration` per second, holding at most
//!   `max_burst_tokens` unused; what arrives beyond that is discarded. A new
//!   grant folds the undelivered rest of the previous trickle into itself.
//!   A trickle that outruns the pod's use (the bucket full, nobody
//!   waiting, delivering faster than the pod's usage) is ended: the next
//!   request asks for nothing and gives back what it has yet to deliver,
//!   which the tenant's bucket takes back, rather than the pod discarding
//!   it as it arrives (refill lost to the tenant).
//! - **Debt**: work charged after the fact (bytes read, CPU) is debt, paid
//!   from the bucket evenly over `debt_spread` (2 s) rather than at once, so
//!   a CPU report does not stall every waiting request.
//! - **Shares**: the EWMA of usage plus the backlog term: every queued
//!   acquisition adds `backlog_factor × tokens × e^(age / backlog_time_scale)`,
//!   so a pod whose queue is older gets a larger part of the refill rate.
//! - **Fallback**: with no answer `fallback_after` (1 s) after sending, the
//!   pod runs on its own at the server's last `fallback_rate` until an answer
//!   comes. Before any answer it assumes its initial allowance per period.
//! - **Retries** repeat the request, sequence number included (only the
//!   fallback tokens grow, above), so the server answers a retry of a
//!   request it already served with the same grant and counts nothing
//!   twice. Failed attempts back off exponentially. An attempt is given
//!   up when its answer is overdue: after a wait measured from the pod's
//!   answer times, not a fixed timeout ([`answer_time`]), so a lost
//!   message costs a pod a few round trips, not seconds.
//! - **Refusal**: an answer no retry changes (the bucket does not exist,
//!   the pod may not use it, its lease was superseded) stops the bucket for
//!   good ([`LocalBucket::on_refusal`]): it admits nothing more, leaves the
//!   fallback rate and sends nothing, not even a final report. Before that
//!   answer the pod admits at most its initial allowance, plus what the
//!   fallback rate gives while no answer comes at all.
//! - **Giving back**: tokens taken for work that did not run come back
//!   ([`LocalBucket::give_back`]) only while no request has reported them:
//!   the server's totals never decrease, so what it counted stays charged.
//! - **Shutdown**: [`LocalBucket::close`] refuses the waiters; the final
//!   request reports the last consumption and gives back the tokens the pod
//!   holds and what its trickle has yet to deliver, for other pods to use.
//! - **The FIFO queue**: work that cannot be admitted waits in arrival order;
//!   nothing is admitted past a waiter. An acquisition larger than a trickle
//!   can ever hold is admitted once the bucket holds as much as it can, and
//!   puts the bucket in debt for the rest.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

pub mod answer_time;

use self::answer_time::AnswerTime;
use crate::consumption::Consumption;
use crate::global_bucket::{Grant, InstanceId, MAX_FALLBACK_DURATION, TokenBucketRequest};
use crate::pushback::pushback_wait;
use crate::time::Timestamp;
use crate::validate::{self, InvalidInput, MAX_LEASE_LEN, MAX_TARGET_REQUEST_PERIOD, MAX_TOKENS};

/// How often usage is folded into its moving average.
pub const USAGE_TICK: Duration = Duration::from_secs(1);
/// The largest exponent of the backlog term; keeps shares finite however old
/// a waiter grows.
const MAX_BACKLOG_EXPONENT: f64 = 30.0;
/// The largest shares value sent (the server refuses more).
const MAX_SHARES: f64 = 1e12;
/// Less than this is not worth a request to give back.
const RETURN_EPSILON: f64 = 1e-6;
/// A trickle delivering more than this many times the pod's use into a
/// full bucket nobody waits on is ended and its rest given back.
const TRICKLE_OUTRUN_FACTOR: f64 = 1.0;
/// A pod's initial allowance when nothing better is known: small, so that
/// a pod of a small tenant does not start on more than its bucket holds.
pub const DEFAULT_INITIAL_TOKENS: f64 = 10.0;
/// The shortest wait for an answer before an attempt is given up.
pub const DEFAULT_MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(250);

/// The knobs of a pod's local bucket. The defaults follow CockroachDB's client.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalBucketConfig {
    /// How long one grant should last; sent with every request.
    pub target_request_period: Duration,
    /// Tokens usable before the first answer; what the pod used of them is
    /// charged to the tenant's bucket after it, the rest dropped. Small by
    /// default: a pod that does not know what its tenant can afford (the
    /// server's `initial_allowance`) must not start on more than a small
    /// tenant's bucket holds.
    pub initial_tokens: f64,
    /// Tokens asked for beyond one period of usage: at most the pod's even
    /// part of its tenant's bucket, once the server has said it.
    pub buffer_tokens: f64,
    /// Weight of the latest second in the usage EWMA.
    pub usage_smoothing: f64,
    /// Ask for more when the tokens on hand would last less than this.
    pub low_tokens_horizon: Duration,
    /// Ask again this long before a trickle ends.
    pub trickle_anticipation: Duration,
    /// After-the-fact charges are paid over this long.
    pub debt_spread: Duration,
    /// Run at the fallback rate once a request has gone unanswered this long.
    pub fallback_after: Duration,
    /// Time scale of the backlog term's exponential.
    pub backlog_time_scale: Duration,
    /// Weight of the backlog term in the shares.
    pub backlog_factor: f64,
    /// Report consumption at least this often while there is any.
    pub report_interval: Duration,
    /// After a grant of nothing, wait this long before asking again.
    pub empty_grant_retry: Duration,
    /// First wait after a failed request; doubles per failure.
    pub retry_initial_backoff: Duration,
    /// Longest wait between attempts.
    pub retry_max_backoff: Duration,
    /// The shortest wait for an attempt's answer before it is given up
    /// and sent again ([`LocalBucket::attempt_timeout`]): above a store's
    /// slowest answers under normal load. The default, 250 ms, is five
    /// times the slowest answer measured of the PostgreSQL store at its
    /// maximum rate (30 ms; 43 ms with one request per transaction,
    /// BENCHMARKS.md) and of an overloaded server's answered attempts
    /// (47 ms at 5× its capacity).
    pub min_attempt_timeout: Duration,
}

impl Default for LocalBucketConfig {
    fn default() -> Self {
        LocalBucketConfig {
            target_request_period: validate::DEFAULT_TARGET_REQUEST_PERIOD,
            initial_tokens: DEFAULT_INITIAL_TOKENS,
            buffer_tokens: 100.0,
            usage_smoothing: 0.5,
            low_tokens_horizon: Duration::from_secs(1),
            trickle_anticipation: Duration::from_secs(1),
            debt_spread: Duration::from_secs(2),
            fallback_after: Duration::from_secs(1),
            backlog_time_scale: Duration::from_secs(10),
            backlog_factor: 0.01,
            report_interval: validate::DEFAULT_TARGET_REQUEST_PERIOD,
            empty_grant_retry: Duration::from_secs(1),
            retry_initial_backoff: Duration::from_millis(100),
            retry_max_backoff: Duration::from_secs(5),
            min_attempt_timeout: DEFAULT_MIN_ATTEMPT_TIMEOUT,
        }
    }
}

impl LocalBucketConfig {
    /// Checks every knob; field names are the config's.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate::target_request_period("target_request_period", self.target_request_period)?;
        validate::non_negative("initial_tokens", self.initial_tokens, MAX_TOKENS)?;
        validate::non_negative("buffer_tokens", self.buffer_tokens, MAX_TOKENS)?;
        validate::non_negative("backlog_factor", self.backlog_factor, MAX_TOKENS)?;
        if !(self.usage_smoothing > 0.0 && self.usage_smoothing <= 1.0) {
            return Err(InvalidInput::new(
                "usage_smoothing",
                format!("must be in (0, 1], got {}", self.usage_smoothing),
            ));
        }
        let positive = [
            ("low_tokens_horizon", self.low_tokens_horizon),
            ("debt_spread", self.debt_spread),
            ("fallback_after", self.fallback_after),
            ("backlog_time_scale", self.backlog_time_scale),
            ("report_interval", self.report_interval),
            ("empty_grant_retry", self.empty_grant_retry),
            ("retry_initial_backoff", self.retry_initial_backoff),
            ("retry_max_backoff", self.retry_max_backoff),
            ("min_attempt_timeout", self.min_attempt_timeout),
        ];
        for (field, value) in positive {
            if value.is_zero() {
                return Err(InvalidInput::new(field, "must be greater than zero"));
            }
        }
        if self.retry_max_backoff < self.retry_initial_backoff {
            return Err(InvalidInput::new(
                "retry_max_backoff",
                "must be at least retry_initial_backoff",
            ));
        }
        Ok(())
    }
}

/// Identifies a queued acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(u64);

/// What [`LocalBucket::acquire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The tokens were taken.
    Admitted,
    /// The acquisition waits in the queue; [`LocalBucket::poll`] admits it.
    Queued(WaiterId),
    /// The bucket is closed; nothing was taken.
    Closed,
}

/// What the driver of a bucket must do after [`LocalBucket::poll`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PollOutcome {
    /// Queued acquisitions now admitted, in queue order. Their tokens are taken.
    pub admitted: Vec<WaiterId>,
    /// A request to send to the server, if one is due (a retry repeats the
    /// previous request exactly).
    pub request: Option<TokenBucketRequest>,
    /// When to poll again if nothing else happens first.
    pub wake_at: Option<Timestamp>,
}

/// A snapshot for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LocalBucketStatus {
    /// Tokens usable now (lent ones included); negative while paying debt.
    pub tokens: f64,
    /// Debt not yet paid from the bucket.
    pub debt: f64,
    /// Tokens per second arriving from a trickle grant, or 0.
    pub trickle_rate: f64,
    /// True while running on the fallback rate.
    pub fallback_active: bool,
    pub fallback_rate: f64,
    /// Queued acquisitions and the tokens they wait for.
    pub waiters: usize,
    pub queued_tokens: f64,
    /// The usage EWMA, tokens per second.
    pub usage_rate: f64,
    /// True while a request is in flight.
    pub request_in_flight: bool,
    /// Cumulative tokens granted by the server.
    pub granted_tokens: f64,
    /// Cumulative tokens charged for the pod's work (its request units).
    pub charged_tokens: f64,
    /// Cumulative trickle tokens discarded over `max_burst_tokens`.
    pub discarded_tokens: f64,
    /// Cumulative tokens the pod gave itself in fallback.
    pub fallback_tokens: f64,
}

#[derive(Clone, Debug, PartialEq)]
struct Trickle {
    rate: f64,
    until: Timestamp,
    /// When to ask for the next grant: `trickle_anticipation` before the
    /// end, but not before half of the trickle has arrived.
    renew_at: Timestamp,
    /// Most unused tokens the bucket may hold while the trickle runs.
    cap: f64,
}

impl Trickle {
    fn undelivered(&self, now: Timestamp) -> f64 {
        self.rate * self.until.seconds_since(now)
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Waiter {
    id: WaiterId,
    tokens: f64,
    since: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
struct InFlight {
    request: TokenBucketRequest,
    first_sent_at: Timestamp,
    /// When its latest attempt went out: its answer time is measured from it.
    sent_at: Timestamp,
    /// Set while the last attempt failed: when to try again.
    retry_at: Option<Timestamp>,
    failures: u32,
}

/// A pod's local bucket. See the module docs for the rules.
#[derive(Clone, Debug)]
pub struct LocalBucket {
    config: LocalBucketConfig,
    instance_id: InstanceId,
    lease: Vec<u8>,

    /// Usable tokens, excluding those lent out; negative while paying debt.
    tokens: f64,
    /// Tokens lent to a driver's lock-free fast path (see [`LocalBucket::lend`]).
    lent: f64,
    debt: f64,
    debt_rate: f64,
    trickle: Option<Trickle>,
    last_advance: Timestamp,

    fallback_rate: f64,
    fallback_active: bool,

    usage_rate: f64,
    demand_since_tick: f64,
    last_tick: Timestamp,

    waiters: VecDeque<Waiter>,
    queued_tokens: f64,
    next_waiter: u64,

    seq: u64,
    in_flight: Option<InFlight>,
    answer_time: AnswerTime,
    /// What the server last said a new pod of this bucket may start on.
    initial_allowance: Option<f64>,
    /// The initial allowance, until the first answer settles it.
    allowance: f64,
    /// What the pod used of its initial allowance, to charge with its next
    /// request (as fallback tokens, over no time).
    allowance_due: f64,
    /// Tokens given at the fallback rate not yet charged to the bucket, and
    /// since when the pod has run on it.
    fallback_tokens_due: f64,
    fallback_since: Option<Timestamp>,
    unreported: Consumption,
    last_request_at: Option<Timestamp>,
    answered: bool,
    empty_until: Option<Timestamp>,
    closed: bool,
    /// Set once a closed bucket has sent what it held back to the server.
    returned: bool,
    /// Set by an answer no retry changes: the bucket is stopped for good.
    refused: bool,

    granted_total: f64,
    charged_total: f64,
    discarded_total: f64,
    unreported_holding: bool,
    fallback_total: f64,
}

impl LocalBucket {
    /// A new bucket for one process lifetime of a pod, holding its initial
    /// allowance. `lease` must be new for every process start.
    pub fn new(
        config: LocalBucketConfig,
        instance_id: InstanceId,
        lease: Vec<u8>,
        now: Timestamp,
    ) -> Result<Self, InvalidInput> {
        config.validate()?;
        if instance_id == 0 {
            return Err(InvalidInput::new(
                "instance_id",
                "must be >= 1 (0 is reserved for the tenant)",
            ));
        }
        if lease.is_empty() || lease.len() > MAX_LEASE_LEN {
            return Err(InvalidInput::new(
                "instance_lease",
                format!("must be 1 to {MAX_LEASE_LEN} bytes, got {}", lease.len()),
            ));
        }
        let initial = config.initial_tokens;
        let fallback_rate = initial / config.target_request_period.as_secs_f64();
        Ok(LocalBucket {
            instance_id,
            lease,
            tokens: initial,
            lent: 0.0,
            debt: 0.0,
            debt_rate: 0.0,
            trickle: None,
            last_advance: now,
            fallback_rate,
            fallback_active: false,
            usage_rate: 0.0,
            demand_since_tick: 0.0,
            last_tick: now,
            waiters: VecDeque::new(),
            queued_tokens: 0.0,
            next_waiter: 0,
            seq: 0,
            in_flight: None,
            answer_time: AnswerTime::default(),
            initial_allowance: None,
            allowance: initial,
            allowance_due: 0.0,
            fallback_tokens_due: 0.0,
            fallback_since: None,
            unreported: Consumption::default(),
            last_request_at: None,
            answered: false,
            empty_until: None,
            closed: false,
            returned: false,
            refused: false,
            granted_total: 0.0,
            charged_total: 0.0,
            discarded_total: 0.0,
            unreported_holding: false,
            fallback_total: 0.0,
            config,
        })
    }

    pub fn config(&self) -> &LocalBucketConfig {
        &self.config
    }

    /// Takes `tokens` for work about to run, or queues the acquisition.
    ///
    /// Admitted at once only if nobody is queued (FIFO) and the bucket holds
    /// enough. `tokens` must be finite and non-negative.
    pub fn acquire(&mut self, tokens: f64, now: Timestamp) -> Result<Admission, InvalidInput> {
        validate::non_negative("tokens", tokens, MAX_TOKENS)?;
        if self.closed {
            return Ok(Admission::Closed);
        }
        self.advance(now);
        self.demand_since_tick += tokens;
        if self.waiters.is_empty() && self.tokens >= self.admission_level(tokens) {
            self.charge(tokens);
            return Ok(Admission::Admitted);
        }
        let id = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        self.waiters.push_back(Waiter {
            id,
            tokens,
            since: now,
        });
        self.queued_tokens += tokens;
        Ok(Admission::Queued(id))
    }

    /// Takes `tokens` if that is possible at once; never queues.
    pub fn try_acquire(&mut self, tokens: f64, now: Timestamp) -> Result<bool, InvalidInput> {
        validate::non_negative("tokens", tokens, MAX_TOKENS)?;
        if self.closed {
            return Ok(false);
        }
        self.advance(now);
        if self.waiters.is_empty() && self.tokens >= self.admission_level(tokens) {
            self.demand_since_tick += tokens;
            self.charge(tokens);
            return Ok(true);
        }
        Ok(false)
    }

    /// Removes a queued acquisition that is no longer wanted. Returns false
    /// if it was not queued (already admitted, or unknown).
    pub fn cancel(&mut self, id: WaiterId) -> bool {
        let Some(pos) = self.waiters.iter().position(|w| w.id == id) else {
            return false;
        };
        if let Some(waiter) = self.waiters.remove(pos) {
            self.queued_tokens = (self.queued_tokens - waiter.tokens).max(0.0);
        }
        if self.waiters.is_empty() {
            self.queued_tokens = 0.0;
        }
        true
    }

    /// Gives back tokens of an admission whose work never ran (its waiter
    /// went away before it learned it was admitted). Uncharges them.
    pub fn refund(&mut self, tokens: f64) {
        if !(tokens.is_finite() && tokens > 0.0) {
            return;
        }
        self.tokens += tokens;
        self.charged_total -= tokens;
        self.unreported.request_unit_micros = self
            .unreported
            .request_unit_micros
            .saturating_sub(validate::to_micros(tokens));
    }

    /// Gives back up to `tokens` taken for work that did not run, as the
    /// caller says (unlike [`refund`], which is for an admission nobody
    /// learned of). Only request units not yet in a request to the server
    /// can come back: the server counts what a request reported, and its
    /// totals never decrease. Returns what came back, `min(tokens,
    /// unreported request units)` in whole micro-units; that many tokens
    /// are put back in the bucket and uncharged. A refused bucket takes
    /// nothing back. `tokens` must be finite and non-negative.
    ///
    /// [`refund`]: LocalBucket::refund
    pub fn give_back(&mut self, tokens: f64) -> Result<f64, InvalidInput> {
        validate::non_negative("tokens", tokens, MAX_TOKENS)?;
        if self.refused {
            return Ok(0.0);
        }
        let micros = validate::to_micros(tokens).min(self.unreported.request_unit_micros);
        if micros == 0 {
            return Ok(0.0);
        }
        let returned = validate::units(micros);
        self.unreported.request_unit_micros -= micros;
        self.tokens += returned;
        self.charged_total -= returned;
        Ok(returned)
    }

    /// Records the counters of work whose tokens were already acquired
    /// (reads, writes…). `consumption.request_unit_micros` is ignored:
    /// acquiring charged them.
    pub fn record_counters(&mut self, consumption: &Consumption) -> Result<(), InvalidInput> {
        consumption.validate()?;
        let counters = Consumption {
            request_unit_micros: 0,
            ..*consumption
        };
        self.unreported.add(&counters);
        Ok(())
    }

    /// Charges work after the fact (bytes read, CPU, egress): its request
    /// units become debt, paid from the bucket over `debt_spread`.
    pub fn charge_after(
        &mut self,
        consumption: &Consumption,
        now: Timestamp,
    ) -> Result<(), InvalidInput> {
        consumption.validate()?;
        self.advance(now);
        let tokens = consumption.request_units();
        self.unreported.add(consumption);
        self.charged_total += tokens;
        self.demand_since_tick += tokens;
        self.debt += tokens;
        self.debt_rate = self.debt / self.config.debt_spread.as_secs_f64();
        Ok(())
    }

    /// Lends every usable token to a lock-free fast path, which admits work
    /// without this bucket (and without queueing, so only while nobody
    /// waits). Returns the amount, in whole micro-tokens; [`settle`] must be
    /// called with what is left before anything else uses the bucket.
    ///
    /// [`settle`]: LocalBucket::settle
    pub fn lend(&mut self) -> f64 {
        if self.closed || !self.waiters.is_empty() || self.tokens < 1e-6 {
            return 0.0;
        }
        let amount = (self.tokens * 1e6).floor() / 1e6;
        self.tokens -= amount;
        self.lent += amount;
        amount
    }

    /// Takes back what is left of the lent tokens and charges what the fast
    /// path admitted.
    pub fn settle(&mut self, returned: f64) {
        let returned = returned.clamp(0.0, self.lent);
        let used = self.lent - returned;
        self.lent = 0.0;
        self.tokens += returned;
        self.demand_since_tick += used;
        self.charged_total += used;
        self.unreported.add(&Consumption::from_request_units(used));
    }

    /// Brings the bucket to `now`, admits what can be admitted, and says
    /// whether to send a request and when to poll next.
    pub fn poll(&mut self, now: Timestamp) -> PollOutcome {
        self.advance(now);
        let admitted = self.admit_waiters();
        let request = self.next_request(now);
        PollOutcome {
            admitted,
            request,
            wake_at: self.wake_at(now),
        }
    }

    /// The server's answer to request `seq`. Answers to anything but the
    /// request in flight are ignored (returns false).
    pub fn on_response(&mut self, seq: u64, grant: &Grant, now: Timestamp) -> bool {
        if self.in_flight.as_ref().map(|f| f.request.seq) != Some(seq) {
            return false;
        }
        self.advance(now);
        let Some(in_flight) = self.in_flight.take() else {
            return false;
        };
        self.answer_time
            .record(now.duration_since(in_flight.sent_at));
        if !self.answered {
            self.settle_allowance();
        }
        self.answered = true;
        self.fallback_active = false;
        // The attempt the bucket applied was charged the fallback tokens it
        // carried; what this request carried beyond them (used since that
        // attempt) is still to charge. An answer that does not say is
        // taken to have charged them all.
        let carried = in_flight.request.fallback_tokens;
        let charged = grant
            .fallback_charged
            .filter(|charged| charged.is_finite())
            .map_or(carried, |charged| charged.clamp(0.0, carried));
        self.fallback_tokens_due += carried - charged;
        if grant.fallback_rate.is_finite() && grant.fallback_rate >= 0.0 {
            self.fallback_rate = grant.fallback_rate;
        }
        if let Some(allowance) = grant
            .initial_allowance
            .filter(|a| a.is_finite() && *a >= 0.0)
        {
            self.initial_allowance = Some(allowance.min(MAX_TOKENS));
        }
        let granted = if grant.granted_tokens.is_finite() {
            grant.granted_tokens.max(0.0)
        } else {
            0.0
        };
        self.granted_total += granted;
        let undelivered = self.end_trickle(now);
        let total = granted + undelivered;
        // Timestamps count whole microseconds: the rate is computed over
        // the rounded duration so that every granted token arrives.
        let until = now.saturating_add(grant.trickle_duration);
        let duration = until.seconds_since(now);
        if duration <= 0.0 {
            self.tokens += total;
            if undelivered > 0.0 {
                self.unreported_holding = true;
            }
        } else {
            let half = now.saturating_add(grant.trickle_duration / 2);
            let anticipated = until.saturating_sub(self.config.trickle_anticipation);
            self.trickle = Some(Trickle {
                rate: total / duration,
                until,
                renew_at: half.max(anticipated),
                cap: grant.max_burst_tokens.max(0.0),
            });
        }
        self.empty_until = if total <= 0.0 && in_flight.request.requested_tokens > 0.0 {
            Some(now.saturating_add(self.config.empty_grant_retry))
        } else {
            None
        };
        true
    }

    /// How long to wait for the answer to the attempt just sent before
    /// giving it up (it fails, and is sent again after its backoff): from
    /// the answer times measured so far, doubled for each attempt of the
    /// request given up or failed in a row, at least
    /// [`LocalBucketConfig::min_attempt_timeout`] and at most `longest`
    /// (see [`answer_time`]).
    pub fn attempt_timeout(&self, longest: Duration) -> Duration {
        let failed = self.in_flight.as_ref().map_or(0, |f| f.failures);
        self.answer_time
            .attempt_timeout(failed, self.config.min_attempt_timeout, longest)
    }

    /// Request `seq` failed (transport error, timeout, error status). It is
    /// sent again after a backoff, and not before `pushback` when an
    /// overloaded server asked for that pause; `jitter` in `[0, 1)` spreads
    /// the retries of many pods (by [`crate::pushback::pushback_wait`]).
    pub fn on_failure(
        &mut self,
        seq: u64,
        now: Timestamp,
        jitter: f64,
        pushback: Option<Duration>,
    ) -> bool {
        let config = &self.config;
        let Some(in_flight) = self.in_flight.as_mut() else {
            return false;
        };
        if in_flight.request.seq != seq {
            return false;
        }
        in_flight.failures = in_flight.failures.saturating_add(1);
        let doublings = in_flight.failures.saturating_sub(1).min(20);
        let backoff = config
            .retry_initial_backoff
            .saturating_mul(1 << doublings)
            .min(config.retry_max_backoff);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let wait = backoff
            .mul_f64(0.5 + jitter / 2.0)
            .max(pushback_wait(pushback.unwrap_or_default(), jitter));
        in_flight.retry_at = Some(now.saturating_add(wait));
        true
    }

    /// Request `seq` was answered with a refusal no retry changes: the
    /// bucket does not exist, the pod may not use it, or its lease was
    /// superseded. The bucket stops for good: it admits nothing more (as
    /// if closed), leaves the fallback rate, drops what it holds, and sends
    /// nothing more — not even a final report, which would be refused the
    /// same way. Returns the queued acquisitions, to be refused, or `None`
    /// (and changes nothing) if `seq` is not the request in flight.
    pub fn on_refusal(&mut self, seq: u64, now: Timestamp) -> Option<Vec<WaiterId>> {
        if self.in_flight.as_ref().map(|f| f.request.seq) != Some(seq) {
            return None;
        }
        self.advance(now);
        self.in_flight = None;
        self.refused = true;
        self.closed = true;
        self.fallback_active = false;
        self.fallback_since = None;
        self.fallback_tokens_due = 0.0;
        self.allowance = 0.0;
        self.allowance_due = 0.0;
        self.trickle = None;
        self.tokens = 0.0;
        self.debt = 0.0;
        self.debt_rate = 0.0;
        self.queued_tokens = 0.0;
        Some(self.waiters.drain(..).map(|w| w.id).collect())
    }

    /// What the server last said a new pod of this bucket may use before
    /// its first answer (`None` until an answer said): what to start the
    /// bucket's next life on ([`LocalBucketConfig::initial_tokens`]).
    pub fn initial_allowance(&self) -> Option<f64> {
        self.initial_allowance
    }

    /// At the first answer: drops what is left of the initial allowance
    /// (the tokens on hand beyond what the fallback rate gave, up to the
    /// allowance: it is used first) and charges what was used with the
    /// next request.
    fn settle_allowance(&mut self) {
        let left = (self.tokens + self.lent - self.fallback_total).clamp(0.0, self.allowance);
        self.tokens -= left;
        self.allowance_due += self.allowance - left;
        self.allowance = 0.0;
    }

    /// True once a refusal stopped the bucket ([`LocalBucket::on_refusal`]).
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// Stops admitting: every queued acquisition is returned to be refused.
    /// The bucket still reports its consumption through [`poll`]; it asks
    /// for no more tokens.
    ///
    /// [`poll`]: LocalBucket::poll
    pub fn close(&mut self) -> Vec<WaiterId> {
        self.closed = true;
        self.queued_tokens = 0.0;
        self.waiters.drain(..).map(|w| w.id).collect()
    }

    /// True once closed, with nothing in flight and nothing left to report,
    /// or once refused (nothing it could send would be taken).
    pub fn is_finished(&self) -> bool {
        self.refused
            || self.closed
                && self.in_flight.is_none()
                && !self.has_report()
                && (self.returned || self.returnable(self.last_advance) <= RETURN_EPSILON)
    }

    /// What a closed bucket gives back: the tokens it holds and what its
    /// trickle has yet to deliver, net of debt.
    fn returnable(&self, now: Timestamp) -> f64 {
        let trickle = self.trickle.as_ref().map_or(0.0, |t| t.undelivered(now));
        (self.tokens + trickle - self.debt).max(0.0)
    }

    /// While tokens are lent (see [`lend`]), the level of the lent tokens
    /// below which a request becomes due: the driver's fast path wakes the
    /// driver when it goes below. `None` while no level can make a request
    /// due (one is in flight, a trickle runs, or the bucket is closed).
    ///
    /// [`lend`]: LocalBucket::lend
    pub fn low_water(&self) -> Option<f64> {
        if self.closed
            || self.in_flight.is_some()
            || self.trickle.is_some()
            || self.last_request_at.is_none()
        {
            return None;
        }
        let horizon = self.config.low_tokens_horizon.as_secs_f64();
        Some(self.usage_rate * horizon + self.debt - self.tokens)
    }

    /// The tokens acquisition `id` waits for, if it is queued.
    pub fn queued(&self, id: WaiterId) -> Option<f64> {
        self.waiters.iter().find(|w| w.id == id).map(|w| w.tokens)
    }

    /// Consumption charged but not yet in a request.
    pub fn unreported(&self) -> &Consumption {
        &self.unreported
    }

    /// The bucket as of its last event (an acquisition, a poll, an
    /// answer); [`LocalBucket::status_at`] brings it to a time first.
    pub fn status(&self) -> LocalBucketStatus {
        LocalBucketStatus {
            tokens: self.tokens + self.lent,
            debt: self.debt,
            trickle_rate: self.trickle.as_ref().map_or(0.0, |t| t.rate),
            fallback_active: self.fallback_active,
            fallback_rate: self.fallback_rate,
            waiters: self.waiters.len(),
            queued_tokens: self.queued_tokens,
            usage_rate: self.usage_rate,
            request_in_flight: self.in_flight.is_some(),
            granted_tokens: self.granted_total,
            charged_tokens: self.charged_total,
            discarded_tokens: self.discarded_total,
            fallback_tokens: self.fallback_total,
        }
    }

    /// The bucket at `now`: what a trickle, the fallback rate or the
    /// repayment of a debt moved since its last event is counted, as the
    /// next acquisition would count it. Waiters are admitted by the next
    /// [`LocalBucket::poll`], not here.
    pub fn status_at(&mut self, now: Timestamp) -> LocalBucketStatus {
        self.advance(now);
        self.status()
    }

    /// The pod's shares: usage EWMA plus the age-weighted backlog.
    pub fn shares(&self, now: Timestamp) -> f64 {
        let scale = self.config.backlog_time_scale.as_secs_f64();
        let backlog: f64 = self
            .waiters
            .iter()
            .map(|w| {
                let exponent = (now.seconds_since(w.since) / scale).min(MAX_BACKLOG_EXPONENT);
                w.tokens * exponent.exp()
            })
            .sum();
        (self.usage_rate + self.config.backlog_factor * backlog).min(MAX_SHARES)
    }

    fn charge(&mut self, tokens: f64) {
        self.tokens -= tokens;
        self.charged_total += tokens;
        self.unreported
            .add(&Consumption::from_request_units(tokens));
    }

    /// The level the bucket must reach to admit `tokens`: all of them, unless
    /// the bucket can never hold that many (a trickle's cap, or the fallback
    /// level), in which case as much as it can hold.
    fn admission_level(&self, tokens: f64) -> f64 {
        let ceiling = match (&self.trickle, self.fallback_active) {
            (Some(trickle), _) => trickle.cap,
            (None, true) => self.fallback_cap(),
            (None, false) => f64::INFINITY,
        };
        if ceiling > 0.0 {
            tokens.min(ceiling)
        } else {
            tokens
        }
    }

    fn fallback_cap(&self) -> f64 {
        self.fallback_rate * self.config.low_tokens_horizon.as_secs_f64()
    }

    /// Delivers trickle and fallback tokens, pays debt and folds usage into
    /// its average, up to `now`.
    fn advance(&mut self, now: Timestamp) {
        let from = self.last_advance;
        if now <= from {
            return;
        }
        let elapsed = now.seconds_since(from);
        self.last_advance = now;

        // Debt first: what it takes makes room under a trickle's cap.
        if self.debt > 0.0 {
            let paid = (self.debt_rate * elapsed).min(self.debt);
            self.tokens -= paid;
            self.debt -= paid;
            if self.debt <= 1e-9 {
                self.debt = 0.0;
                self.debt_rate = 0.0;
            }
        }

        if let Some(trickle) = &self.trickle {
            let delivered = trickle.rate * trickle.until.min(now).seconds_since(from);
            let cap = trickle.cap;
            let ends = trickle.until <= now;
            self.add_capped(delivered, cap);
            if ends {
                self.trickle = None;
                // What it delivered and the pod still holds, the server
                // does not count until the pod says so.
                self.unreported_holding = true;
            }
        } else if self.fallback_active {
            let before = self.tokens;
            self.add_capped(self.fallback_rate * elapsed, self.fallback_cap());
            let given = (self.tokens - before).max(0.0);
            self.fallback_total += given;
            self.fallback_tokens_due += given;
        }

        let since_tick = now.seconds_since(self.last_tick);
        if since_tick >= USAGE_TICK.as_secs_f64() {
            // One EWMA step per whole tick, all with the rate seen since the
            // last one: the average moves towards it as far as that many
            // steps would have moved it.
            let alpha = self.config.usage_smoothing;
            let ticks = (since_tick / USAGE_TICK.as_secs_f64()).floor().min(1000.0);
            let latest = self.demand_since_tick / since_tick;
            self.usage_rate = latest + (self.usage_rate - latest) * (1.0 - alpha).powf(ticks);
            self.demand_since_tick = 0.0;
            self.last_tick = now;
        }

        if let Some(in_flight) = &self.in_flight
            && now.duration_since(in_flight.first_sent_at) >= self.config.fallback_after
        {
            self.fallback_active = true;
            self.fallback_since.get_or_insert(
                in_flight
                    .first_sent_at
                    .saturating_add(self.config.fallback_after),
            );
        }
    }

    /// Adds `delivered` tokens, keeping at most `cap` unused (lent ones count).
    /// A cap of zero means none.
    fn add_capped(&mut self, delivered: f64, cap: f64) {
        let room = if cap > 0.0 {
            (cap - self.lent - self.tokens).max(0.0)
        } else {
            f64::INFINITY
        };
        let kept = delivered.min(room);
        self.discarded_total += delivered - kept;
        self.tokens += kept;
    }

    fn admit_waiters(&mut self) -> Vec<WaiterId> {
        let mut admitted = Vec::new();
        while let Some(head) = self.waiters.front() {
            if self.tokens < self.admission_level(head.tokens) {
                break;
            }
            let tokens = head.tokens;
            if let Some(waiter) = self.waiters.pop_front() {
                admitted.push(waiter.id);
            }
            self.queued_tokens = (self.queued_tokens - tokens).max(0.0);
            self.charge(tokens);
        }
        if self.waiters.is_empty() {
            self.queued_tokens = 0.0;
        }
        admitted
    }

    /// Tokens on hand now and due from the current trickle, net of debt.
    fn on_hand(&self, now: Timestamp) -> f64 {
        let trickle = self.trickle.as_ref().map_or(0.0, |t| t.undelivered(now));
        self.tokens + self.lent + trickle - self.debt
    }

    /// Something the server must hear of within `report_interval`:
    /// consumption not yet reported, or initial allowance used and not yet
    /// charged.
    fn has_report(&self) -> bool {
        self.unreported != Consumption::default() || self.allowance_due > 0.0
    }

    /// The buffer a pod holds beyond a period of its usage: at most its
    /// part of what the tenant's bucket holds, as the server last said.
    fn buffer(&self) -> f64 {
        self.initial_allowance
            .map_or(self.config.buffer_tokens, |part| {
                self.config.buffer_tokens.min(part)
            })
    }

    /// What the pod wants on hand: a period of its usage, its buffer and
    /// what is queued.
    fn want(&self) -> f64 {
        let period = self.config.target_request_period.as_secs_f64();
        self.usage_rate * period + self.buffer() + self.queued_tokens
    }

    /// Tokens the pod holds that the server granted: on hand, net of
    /// debt, less what is left of the initial allowance (never granted).
    fn held(&self) -> f64 {
        (self.tokens + self.lent - self.debt - self.allowance).max(0.0)
    }

    /// Tokens on hand beyond what the pod wants, taken out to give back
    /// (none while the initial allowance is unsettled: it was never
    /// granted).
    fn excess_to_return(&mut self) -> f64 {
        if self.allowance > 0.0 {
            return 0.0;
        }
        let excess = self.tokens - self.debt - self.want();
        if excess <= RETURN_EPSILON {
            return 0.0;
        }
        self.tokens -= excess;
        excess
    }

    /// What to ask for: the initial allowance, until the first answer
    /// settles it, is not counted as on hand.
    fn tokens_needed(&self, now: Timestamp) -> f64 {
        let want = self.want();
        (want - (self.on_hand(now) - self.allowance)).clamp(0.0, MAX_TOKENS)
    }

    /// True when a trickle delivers into a full bucket that nobody waits
    /// on, at more than [`TRICKLE_OUTRUN_FACTOR`] times the pod's use: its
    /// demand fell, and what arrives beyond the cap would be discarded,
    /// lost to the tenant.
    fn trickle_outran(&self) -> bool {
        let Some(trickle) = &self.trickle else {
            return false;
        };
        trickle.cap > 0.0
            && self.waiters.is_empty()
            && self.tokens + self.lent >= trickle.cap - RETURN_EPSILON
            && trickle.rate > TRICKLE_OUTRUN_FACTOR * self.usage_rate
    }

    /// Ends the trickle, if any, and returns what it had yet to deliver
    /// (folded into a new grant, or given back when it outran the pod's
    /// use).
    fn end_trickle(&mut self, now: Timestamp) -> f64 {
        self.trickle
            .take()
            .map_or(0.0, |trickle| trickle.undelivered(now).max(0.0))
    }

    fn request_due(&self, now: Timestamp) -> bool {
        if self.refused {
            return false;
        }
        let Some(last) = self.last_request_at else {
            return true; // the first request: before the allowance runs out
        };
        let reporting =
            self.has_report() && now.duration_since(last) >= self.config.report_interval;
        // Fallback tokens are charged as soon as the server answers again.
        let charging = self.fallback_tokens_due > 0.0;
        if self.closed {
            return self.has_report()
                || charging
                || (!self.returned && self.returnable(now) > RETURN_EPSILON);
        }
        if reporting || charging {
            return true;
        }
        if self.empty_until.is_some_and(|until| now < until) {
            return false;
        }
        if self.trickle_outran() {
            return true;
        }
        if self.unreported_holding && self.held() > 0.5 * self.buffer() {
            return true;
        }
        if self.tokens_needed(now) <= 0.0 {
            return false;
        }
        if let Some(trickle) = &self.trickle {
            // A trickle covers the period it was sized for; ask again only
            // shortly before it ends (anticipation), not on every shortfall.
            return now >= trickle.renew_at;
        }
        let horizon = self.config.low_tokens_horizon.as_secs_f64();
        let low = self.tokens + self.lent - self.debt < self.usage_rate * horizon;
        low || !self.waiters.is_empty()
    }

    /// How long the pod has been running on its fallback rate (the span
    /// its fallback tokens were used in), if it is or was since its last
    /// request.
    fn fallback_span(&self, now: Timestamp) -> Option<Duration> {
        self.fallback_since
            .map(|since| now.duration_since(since).min(MAX_FALLBACK_DURATION))
    }

    fn next_request(&mut self, now: Timestamp) -> Option<TokenBucketRequest> {
        let fallback_span = self.fallback_span(now);
        if let Some(in_flight) = self.in_flight.as_mut() {
            // A retry: the same request, once its backoff is over.
            let retry_at = in_flight.retry_at?;
            if now < retry_at {
                return None;
            }
            in_flight.retry_at = None;
            in_flight.sent_at = now;
            // A retry carries the fallback used since the first attempt: if
            // that attempt never reached the bucket, the bucket is charged
            // for it before it grants, not a request later (the first
            // request back after an outage is such a retry). If it did,
            // the answer says what was charged and the rest stays due.
            let room = (MAX_TOKENS - in_flight.request.fallback_tokens).max(0.0);
            let late = self.fallback_tokens_due.min(room);
            self.fallback_tokens_due -= late;
            if late > 0.0 {
                in_flight.request.fallback_tokens += late;
                if let Some(span) = fallback_span {
                    in_flight.request.fallback_duration = span;
                }
            }
            return Some(in_flight.request.clone());
        }
        if !self.request_due(now) {
            return None;
        }
        // A pod whose trickle outran its use asks for nothing more: it
        // ends the trickle and gives back its rest.
        let outran = !self.closed && self.trickle_outran();
        let requested = if self.closed || outran {
            0.0
        } else {
            self.tokens_needed(now)
        };
        // Fallback tokens are charged with every request, the last included,
        // and so is the initial allowance the pod used (over no time: no
        // refill the bucket lost pays for it).
        let fallback = std::mem::take(&mut self.fallback_tokens_due);
        let fallback_duration = if fallback > 0.0 {
            fallback_span.unwrap_or_default()
        } else {
            Duration::ZERO
        };
        let fallback = fallback + std::mem::take(&mut self.allowance_due);
        if !self.fallback_active {
            self.fallback_since = None;
        }
        let returned_tokens = if !self.closed {
            let rest = if outran { self.end_trickle(now) } else { 0.0 };
            rest + self.excess_to_return()
        } else if !self.returned {
            // The final report gives back what the pod will never use.
            let returned = self.returnable(now);
            self.returned = true;
            self.trickle = None;
            self.tokens = 0.0;
            self.debt = 0.0;
            self.debt_rate = 0.0;
            returned
        } else {
            0.0
        };
        self.seq += 1;
        let request = TokenBucketRequest {
            instance_id: self.instance_id,
            lease: self.lease.clone(),
            seq: self.seq,
            requested_tokens: requested,
            // A pod shutting down wants nothing more: its shares must not
            // hold back the others until the server times it out.
            shares: if self.closed { 0.0 } else { self.shares(now) },
            target_request_period: self.config.target_request_period,
            consumption: std::mem::take(&mut self.unreported),
            next_live_instance_id: None,
            returned_tokens,
            held_tokens: self.held(),
            fallback_tokens: fallback,
            fallback_duration,
        };
        self.last_request_at = Some(now);
        self.unreported_holding = false;
        self.in_flight = Some(InFlight {
            request: request.clone(),
            first_sent_at: now,
            sent_at: now,
            retry_at: None,
            failures: 0,
        });
        Some(request)
    }

    fn wake_at(&self, now: Timestamp) -> Option<Timestamp> {
        // Only moments still ahead: anything already due was handled by
        // this poll, and waking for it again would spin.
        let mut wake: Option<Timestamp> = None;
        let mut at = |t: Timestamp| {
            if t > now {
                wake = Some(wake.map_or(t, |w| w.min(t)));
            }
        };
        at(self.last_tick.saturating_add(USAGE_TICK));
        if let Some(in_flight) = &self.in_flight {
            if let Some(retry) = in_flight.retry_at {
                at(retry);
            }
            if !self.fallback_active {
                at(in_flight
                    .first_sent_at
                    .saturating_add(self.config.fallback_after));
            }
        } else {
            if let Some(until) = self.empty_until {
                at(until);
            }
            if let Some(last) = self.last_request_at
                && self.has_report()
            {
                at(last.saturating_add(self.config.report_interval));
            }
        }
        if let Some(trickle) = &self.trickle {
            at(trickle.renew_at);
            at(trickle.until);
        }
        if let Some(head) = self.waiters.front() {
            let incoming = match (&self.trickle, self.fallback_active) {
                (Some(trickle), _) => trickle.rate,
                (None, true) => self.fallback_rate,
                (None, false) => 0.0,
            };
            let short = self.admission_level(head.tokens) - self.tokens;
            if incoming > 0.0 && short > 0.0 {
                let secs = (short / incoming).min(MAX_TARGET_REQUEST_PERIOD.as_secs_f64());
                // A millisecond late rather than early: no wasted wake-ups.
                at(now.saturating_add(Duration::from_secs_f64(secs) + Duration::from_millis(1)));
            }
        }
        wake
    }
}

#[cfg(test)]
mod tests;
