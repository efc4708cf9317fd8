//! Spend budgets per billing cycle: how many tokens a bucket may be granted
//! in a cycle on the calendar, and what happens at the limit.
//!
//! A budget belongs to one bucket (its head row carries it, so the
//! transaction that grants tokens enforces it, on every store alike):
//! - **The cycle** ([`cycle`]): monthly on an anchor day, weekly on an
//!   anchor weekday, or daily, in an IANA time zone, cut by the store's
//!   clock as refills are.
//! - **Spend** is what the cycle granted: tokens the server granted, plus
//!   tokens pods charged for running on their fallback rate (granted by
//!   the pods themselves while the server was unreachable).
//! - **Enforced in the grant.** [`BucketBudget::cap`] is the most the next
//!   grant may hand out; the global bucket cuts its grant, trickles
//!   included, to it. Before the limit the cap is what remains of the
//!   amount, so the server never grants more than the amount in a cycle.
//!   At the limit:
//!   - `notify`: no cap; the thresholds alert, nothing else changes.
//!   - `stop`: the cap is zero until the next cycle.
//!   - `throttle`: the bucket runs at the baseline limits (its own are
//!     kept aside and come back with the next cycle), starting empty, with
//!     the trickles it had handed out forgiven (the budget paid for them),
//!     and the cap is the amount plus the baseline rate times the time
//!     since the limit was reached and one target request period ahead,
//!     minus the spend: so spend ≤ amount + baseline rate × (time past the
//!     limit + one period), exactly, whatever the pods do. (The period
//!     ahead lets the baseline go out as trickles, each a period of refill
//!     granted at once; cut to the refill accrued so far, every grant would
//!     be a sliver and pods would ask again at once, a storm of requests.)
//!
//!   Tokens charged for a fallback come after the fact: they can take the
//!   spend beyond the cap (and only lower later caps). A grant the cap cuts
//!   goes out over the request's whole target period
//!   (`global_bucket::request`), so a pod at its budget asks about once a
//!   period, as without one, rather than at once for slivers.
//! - **Thresholds** fire once per cycle each, in the transaction that
//!   crossed them, as [`BudgetEvent`]s the store keeps for delivery: on the
//!   spend (percent of the amount), or on the forecast.
//! - **Forecast**: the spend plus the recent spend rate times what is left
//!   of the cycle. The rate is an exponentially decaying average with a
//!   one-hour time constant ([`RATE_TIME_CONSTANT`]), carried across
//!   cycles.
//! - **The cycle's record** ([`CycleUsage`]): tokens granted, tokens
//!   charged for fallbacks, and every consumption counter the pods reported
//!   in the cycle, exactly (the same sums as the bucket's totals, over the
//!   cycle). When a request finds its cycle over, [`BucketBudget::roll`]
//!   closes it into a [`CycleRecord`] the store keeps, and starts the cycle
//!   of now. A cycle nobody used leaves no record.
//! - **A change mid-cycle** ([`BucketBudget::change`]) applies to what
//!   remains of the cycle: the spend so far counts against the new amount.
//!   A change of the cycle itself closes the current one now (a short
//!   record), and the next runs from now to the new rule's next boundary,
//!   so records still tile time.

pub mod cycle;
pub mod delivery;
pub mod quota;

use serde::{Deserialize, Serialize};

pub use cycle::{Cycle, CycleRule, OutOfCalendar, Period, Weekday};
pub use quota::{Quota, QuotaAnswer, QuotaUse};

use crate::consumption::Consumption;
use crate::global_bucket::{BucketState, Limits};
use crate::time::Timestamp;
use crate::validate::{self, InvalidInput, MAX_TOKENS};

/// How long a closed cycle's record is kept unless the server is told
/// otherwise: 13 months of 30.44 days (396 days), so last year's same
/// month is still there.
pub const DEFAULT_RECORD_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(396 * 86_400);

/// The thresholds a budget alerts at unless told otherwise, in percent of
/// its amount.
pub const DEFAULT_THRESHOLDS: [u32; 4] = [50, 75, 90, 100];
/// The highest threshold, in percent.
pub const MAX_THRESHOLD_PERCENT: u32 = 1_000;
/// The most thresholds one budget may have.
pub const MAX_THRESHOLDS: usize = 16;
/// The spend rate behind the forecast decays with this time constant.
pub const RATE_TIME_CONSTANT: std::time::Duration = std::time::Duration::from_secs(3_600);
/// Relative slack when comparing a spend with a target: sums of doubles
/// may land a rounding error short of an amount they were cut to reach.
const ROUNDING: f64 = 1e-12;

/// A bucket's budget, as an operator sets it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Tokens per cycle.
    pub amount: f64,
    pub cycle: CycleRule,
    pub at_limit: AtLimit,
    /// Sorted, each once.
    pub thresholds: Vec<Threshold>,
    /// For display only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// False: shadow mode. Past the amount, `throttle` and `stop` act as
    /// `notify` (alerts only), and [`BudgetView::shadow_excess`] says what
    /// they would have held back.
    #[serde(default = "enforced", skip_serializing_if = "is_enforced")]
    pub enforce: bool,
}

/// Serde's default of an `enforce` field (a budget's, a bucket
/// definition's): left out, it is enforced, as before shadow mode.
pub(crate) fn enforced() -> bool {
    true
}

/// Enforced is left out when written, so a stored row reads as before.
pub(crate) fn is_enforced(enforce: &bool) -> bool {
    *enforce
}

/// What happens once a cycle's spend reaches the amount.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum AtLimit {
    /// Alerts only.
    Notify,
    /// The bucket runs at these limits until the next cycle.
    Throttle { baseline: Limits },
    /// No more tokens until the next cycle.
    Stop,
}

impl AtLimit {
    pub fn name(&self) -> &'static str {
        match self {
            AtLimit::Notify => "notify",
            AtLimit::Throttle { .. } => "throttle",
            AtLimit::Stop => "stop",
        }
    }
}

/// What a threshold is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// The cycle's spend so far.
    Spend,
    /// The spend expected at the cycle's end.
    Forecast,
}

impl Measure {
    pub fn name(self) -> &'static str {
        match self {
            Measure::Spend => "spend",
            Measure::Forecast => "forecast",
        }
    }
}

/// An alert when a measure reaches a percentage of the amount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Threshold {
    pub on: Measure,
    pub percent: u32,
}

impl Threshold {
    pub fn spend(percent: u32) -> Self {
        Threshold {
            on: Measure::Spend,
            percent,
        }
    }

    /// `75` (on the spend) or `forecast:75`: how the CLI and events name it.
    pub fn label(&self) -> String {
        match self.on {
            Measure::Spend => self.percent.to_string(),
            Measure::Forecast => format!("forecast:{}", self.percent),
        }
    }

    /// Reads a [`Threshold::label`].
    pub fn parse(field: &str, label: &str) -> Result<Threshold, InvalidInput> {
        let (on, percent) = match label.trim().strip_prefix("forecast:") {
            Some(rest) => (Measure::Forecast, rest),
            None => (Measure::Spend, label.trim()),
        };
        let percent = percent.trim_end_matches('%').parse::<u32>().map_err(|_| {
            InvalidInput::new(
                field,
                format!(
                    "{label:?} is not a threshold: a whole percentage such as 75, or forecast:100"
                ),
            )
        })?;
        let threshold = Threshold { on, percent };
        threshold.validate(field)?;
        Ok(threshold)
    }

    fn validate(&self, field: &str) -> Result<(), InvalidInput> {
        if !(1..=MAX_THRESHOLD_PERCENT).contains(&self.percent) {
            return Err(InvalidInput::new(
                field,
                format!(
                    "a threshold is a percentage from 1 to {MAX_THRESHOLD_PERCENT}, got {}",
                    self.percent
                ),
            ));
        }
        Ok(())
    }
}

/// A price per million tokens, shown beside the spend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub per_million_tokens: f64,
    /// An ISO 4217 code: three capital letters (`USD`, `EUR`).
    pub currency: String,
}

impl Price {
    /// What `tokens` cost.
    pub fn of(&self, tokens: f64) -> f64 {
        tokens / 1e6 * self.per_million_tokens
    }
}

impl Budget {
    /// A budget of `amount` tokens per `cycle`, the default thresholds and
    /// no price.
    pub fn new(amount: f64, cycle: CycleRule, at_limit: AtLimit) -> Self {
        Budget {
            amount,
            cycle,
            at_limit,
            thresholds: DEFAULT_THRESHOLDS.map(Threshold::spend).to_vec(),
            price: None,
            enforce: true,
        }
    }

    /// What is done past the amount: `at_limit`, or in shadow mode
    /// `notify`.
    pub fn action(&self) -> AtLimit {
        if self.enforce {
            self.at_limit
        } else {
            AtLimit::Notify
        }
    }

    /// Checks every field, naming the one at fault; sorts the thresholds
    /// and drops repeats.
    pub fn validated(mut self) -> Result<Self, InvalidInput> {
        validate::non_negative("amount", self.amount, MAX_TOKENS)?;
        if self.amount <= 0.0 {
            return Err(InvalidInput::new(
                "amount",
                "must be more than 0 tokens per cycle",
            ));
        }
        self.cycle.validate()?;
        if let AtLimit::Throttle { baseline } = &self.at_limit {
            baseline.validate().map_err(|e| e.within("baseline"))?;
        }
        if self.thresholds.len() > MAX_THRESHOLDS {
            return Err(InvalidInput::new(
                "thresholds",
                format!(
                    "at most {MAX_THRESHOLDS} thresholds, got {}",
                    self.thresholds.len()
                ),
            ));
        }
        for threshold in &self.thresholds {
            threshold.validate("thresholds")?;
        }
        self.thresholds.sort();
        self.thresholds.dedup();
        if let Some(price) = &self.price {
            validate::non_negative("price.per_million_tokens", price.per_million_tokens, 1e12)?;
            let code = price.currency.as_bytes();
            if code.len() != 3 || !code.iter().all(u8::is_ascii_uppercase) {
                return Err(InvalidInput::new(
                    "price.currency",
                    format!(
                        "must be an ISO 4217 code of three capital letters (USD, EUR), got {:?}",
                        price.currency
                    ),
                ));
            }
        }
        Ok(self)
    }
}

/// What a cycle granted and what the pods reported in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CycleUsage {
    /// Tokens the server granted.
    pub granted_tokens: f64,
    /// Tokens pods charged for running on their fallback rate.
    pub fallback_tokens: f64,
    /// What the pods reported they consumed, every counter.
    pub consumption: Consumption,
}

impl CycleUsage {
    /// The spend the budget counts: granted and fallback tokens.
    pub fn spend(&self) -> f64 {
        self.granted_tokens + self.fallback_tokens
    }
}

/// A closed cycle: the billing record the store keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CycleRecord {
    pub cycle: Cycle,
    /// The budget's amount when the cycle closed.
    pub amount: f64,
    pub usage: CycleUsage,
    /// When the spend reached the amount, if it did.
    pub limit_reached_at: Option<Timestamp>,
}

/// A threshold crossed: written in the transaction that crossed it, sent
/// to the webhooks once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetEvent {
    pub cycle: Cycle,
    pub threshold: Threshold,
    pub amount: f64,
    pub spend: f64,
    pub forecast: f64,
    pub at: Timestamp,
}

/// The budget's state in the current cycle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetState {
    pub cycle: Cycle,
    pub usage: CycleUsage,
    /// Thresholds that fired in this cycle.
    pub fired: Vec<Threshold>,
    /// When the spend reached the amount in this cycle.
    pub limit_reached_at: Option<Timestamp>,
    /// Under `throttle` past the limit: the bucket's own limits, back at
    /// the next cycle (the bucket runs at the baseline meanwhile).
    pub own_limits: Option<Limits>,
    /// The recent spend rate, tokens per second, as of `rate_at`.
    pub rate: f64,
    pub rate_at: Timestamp,
}

/// A budget and its state: what a bucket's head row carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketBudget {
    pub budget: Budget,
    pub state: BudgetState,
}

/// Where a budget stands in its cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The spend has not reached the amount.
    Under,
    /// Past the amount under `notify`.
    Over,
    /// Past the amount under `throttle`: the bucket runs at the baseline.
    Throttled,
    /// Past the amount under `stop`.
    Stopped,
}

impl Standing {
    pub fn name(self) -> &'static str {
        match self {
            Standing::Under => "under",
            Standing::Over => "over",
            Standing::Throttled => "throttled",
            Standing::Stopped => "stopped",
        }
    }
}

/// A budget as it stands at a moment, its cycle brought up to it without
/// writing anything: what operators read.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetView {
    pub budget: Budget,
    /// The current cycle so far.
    pub cycle: Cycle,
    pub usage: CycleUsage,
    pub limit_reached_at: Option<Timestamp>,
    /// The cycle the head row still holds though it is over (the next
    /// request writes its record): listed among the closed ones.
    pub unwritten: Option<CycleRecord>,
    pub forecast: f64,
    pub rate: f64,
    /// What the next grant may hand out; `None` under `notify`.
    pub remaining: Option<f64>,
    pub standing: Standing,
    /// In shadow mode past the amount under `throttle` or `stop`: the
    /// tokens spent beyond what enforcing would have allowed (what it
    /// would have held back); `None` when enforced or under `notify`.
    pub shadow_excess: Option<f64>,
    pub fired: Vec<Threshold>,
    /// The bucket's own limits.
    pub own_limits: Limits,
}

fn reached(value: f64, target: f64) -> bool {
    value >= target - target.abs() * ROUNDING
}

impl BucketBudget {
    /// A budget starting now, in the cycle `now` lies in.
    pub fn start(budget: Budget, now: Timestamp) -> Result<Self, OutOfCalendar> {
        let cycle = budget.cycle.cycle_at(now)?;
        Ok(BucketBudget {
            budget,
            state: BudgetState {
                cycle,
                usage: CycleUsage::default(),
                fired: Vec::new(),
                limit_reached_at: None,
                own_limits: None,
                rate: 0.0,
                rate_at: now,
            },
        })
    }

    /// False once a `stop` budget is reached: a pod cut off from the
    /// server must not run on a fallback rate the budget no longer has.
    pub fn fallback_allowed(&self) -> bool {
        !(matches!(self.budget.action(), AtLimit::Stop) && self.state.limit_reached_at.is_some())
    }

    /// The budget as it stands at `now`, for a bucket in `bucket`'s state.
    pub fn view(&self, bucket: &BucketState, now: Timestamp) -> BudgetView {
        let mut budget = self.clone();
        let mut state = bucket.clone();
        let unwritten = budget.roll(&mut state, now);
        let cap = budget.cap(now);
        let standing = match (budget.state.limit_reached_at, budget.budget.action()) {
            (None, _) => Standing::Under,
            (Some(_), AtLimit::Notify) => Standing::Over,
            (Some(_), AtLimit::Throttle { .. }) => Standing::Throttled,
            (Some(_), AtLimit::Stop) => Standing::Stopped,
        };
        BudgetView {
            forecast: budget.forecast(now),
            rate: budget.rate_at(now),
            remaining: cap.is_finite().then_some(cap),
            own_limits: budget.own_limits(&state),
            standing,
            shadow_excess: budget.shadow_excess(now),
            cycle: budget.state.cycle,
            usage: budget.state.usage,
            limit_reached_at: budget.state.limit_reached_at,
            fired: budget.state.fired,
            unwritten,
            budget: budget.budget,
        }
    }

    /// True while the bucket runs at a throttle's baseline.
    pub fn throttled(&self) -> bool {
        self.state.own_limits.is_some()
    }

    /// The bucket's own limits: those it runs at, or under a throttle the
    /// ones kept aside.
    pub fn own_limits(&self, state: &BucketState) -> Limits {
        self.state.own_limits.unwrap_or(state.limits)
    }

    /// Closes the cycle if `now` is past it, and starts the cycle of `now`
    /// (a throttled bucket gets its own limits back). A clock behind the
    /// cycle's start changes nothing.
    pub fn roll(&mut self, bucket: &mut BucketState, now: Timestamp) -> Option<CycleRecord> {
        if now < self.state.cycle.end {
            return None;
        }
        let next = self.budget.cycle.cycle_at(now).ok()?;
        Some(self.close(bucket, next))
    }

    fn close(&mut self, bucket: &mut BucketState, next: Cycle) -> CycleRecord {
        if let Some(limits) = self.state.own_limits.take() {
            bucket.limits = limits;
        }
        let usage = std::mem::take(&mut self.state.usage);
        let record = CycleRecord {
            cycle: self.state.cycle,
            amount: self.budget.amount,
            usage,
            limit_reached_at: self.state.limit_reached_at.take(),
        };
        self.state.cycle = next;
        self.state.fired.clear();
        record
    }

    /// The most the next grant may hand out, in tokens.
    pub fn cap(&self, now: Timestamp) -> f64 {
        self.cap_with_lead(now, std::time::Duration::ZERO)
    }

    /// What remains at `now` of the amount (plus, past the limit under
    /// `throttle`, the baseline's refill until `lead` after now).
    fn cap_with_lead(&self, now: Timestamp, lead: std::time::Duration) -> f64 {
        let spend = self.state.usage.spend();
        (self.allowed_under(self.budget.action(), now, lead) - spend).max(0.0)
    }

    /// What `action` allows spent this cycle by `now` (and `lead` more of
    /// a throttle's baseline).
    fn allowed_under(&self, action: AtLimit, now: Timestamp, lead: std::time::Duration) -> f64 {
        match (action, self.state.limit_reached_at) {
            (AtLimit::Notify, _) => f64::INFINITY,
            (AtLimit::Throttle { baseline }, Some(reached_at)) => {
                self.budget.amount
                    + baseline.refill_rate * (now.seconds_since(reached_at) + lead.as_secs_f64())
            }
            (AtLimit::Throttle { .. } | AtLimit::Stop, _) => self.budget.amount,
        }
    }

    /// In shadow mode, what enforcing `at_limit` would have held back of
    /// the spend by `now`.
    fn shadow_excess(&self, now: Timestamp) -> Option<f64> {
        if self.budget.enforce || self.budget.at_limit == AtLimit::Notify {
            return None;
        }
        let allowed = self.allowed_under(self.budget.at_limit, now, std::time::Duration::ZERO);
        Some((self.state.usage.spend() - allowed).max(0.0))
    }

    /// The most a grant at `now` to a pod renewing every `period` may hand
    /// out: [`BucketBudget::cap`], and under `throttle` past the limit one
    /// period of the baseline's refill more. A throttled bucket hands out
    /// its baseline as trickles, each taken from a period of future refill
    /// at once; without the lead, every trickle would be cut to the refill
    /// accrued so far, and pods would ask again at once, over and over.
    pub fn grant_cap(&self, now: Timestamp, period: std::time::Duration) -> f64 {
        self.cap_with_lead(now, period)
    }

    /// The spend rate at `now`, tokens per second.
    pub fn rate_at(&self, now: Timestamp) -> f64 {
        let decay =
            (-now.seconds_since(self.state.rate_at) / RATE_TIME_CONSTANT.as_secs_f64()).exp();
        self.state.rate * decay
    }

    /// The spend expected at the cycle's end.
    pub fn forecast(&self, now: Timestamp) -> f64 {
        let left = self.state.cycle.end.seconds_since(now);
        self.state.usage.spend() + self.rate_at(now) * left
    }

    /// Counts what a request was granted, charged and reported, and fires
    /// the thresholds it crossed (their events, in order). At the limit under `throttle`, switches
    /// `bucket` to the baseline: its own limits kept aside, empty, its
    /// trickles' commitments forgiven.
    pub fn record(
        &mut self,
        bucket: &mut BucketState,
        granted: f64,
        fallback: f64,
        consumption: &Consumption,
        now: Timestamp,
    ) -> Vec<BudgetEvent> {
        let usage = &mut self.state.usage;
        usage.granted_tokens += granted;
        usage.fallback_tokens += fallback;
        usage.consumption.add(consumption);
        let spent = granted + fallback;
        if spent > 0.0 {
            self.state.rate = self.rate_at(now) + spent / RATE_TIME_CONSTANT.as_secs_f64();
            self.state.rate_at = self.state.rate_at.max(now);
        }
        if self.state.limit_reached_at.is_none()
            && reached(self.state.usage.spend(), self.budget.amount)
        {
            self.state.limit_reached_at = Some(now);
            if let AtLimit::Throttle { baseline } = self.budget.action() {
                self.throttle(bucket, baseline);
            }
        }
        self.fire(now)
    }

    fn throttle(&mut self, bucket: &mut BucketState, baseline: Limits) {
        if self.state.own_limits.is_none() {
            self.state.own_limits = Some(bucket.limits);
        }
        bucket.limits = baseline;
        bucket.tokens = 0.0;
        bucket.committed_tokens = 0.0;
        bucket.committed_rate = 0.0;
    }

    /// Fires the thresholds reached and not fired yet in this cycle: their
    /// events, in order.
    fn fire(&mut self, now: Timestamp) -> Vec<BudgetEvent> {
        let spend = self.state.usage.spend();
        let forecast = self.forecast(now);
        let mut events = Vec::new();
        for threshold in &self.budget.thresholds {
            let value = match threshold.on {
                Measure::Spend => spend,
                Measure::Forecast => forecast,
            };
            let target = self.budget.amount * f64::from(threshold.percent) / 100.0;
            if reached(value, target) && !self.state.fired.contains(threshold) {
                self.state.fired.push(*threshold);
                events.push(BudgetEvent {
                    cycle: self.state.cycle,
                    threshold: *threshold,
                    amount: self.budget.amount,
                    spend,
                    forecast,
                    at: now,
                });
            }
        }
        events
    }

    /// Replaces the budget mid-cycle (a cycle already over is closed
    /// first). The spend so far counts against the new amount; thresholds
    /// already fired stay fired (the new amount may fire others at the
    /// next grant). A new cycle rule closes the current cycle now and the
    /// next one runs to the new rule's next boundary. A throttled bucket
    /// whose new budget is not reached gets its own limits back. Returns
    /// the cycles closed, oldest first.
    pub fn change(
        &mut self,
        bucket: &mut BucketState,
        budget: Budget,
        now: Timestamp,
    ) -> Result<Vec<CycleRecord>, OutOfCalendar> {
        let mut records: Vec<CycleRecord> = self.roll(bucket, now).into_iter().collect();
        if budget.cycle != self.budget.cycle {
            let end = budget.cycle.cycle_at(now)?.end;
            let start = now.max(self.state.cycle.start);
            let mut record = self.close(bucket, Cycle { start, end });
            record.cycle.end = start;
            records.push(record);
        }
        self.budget = budget;
        let still_reached = reached(self.state.usage.spend(), self.budget.amount);
        match (still_reached, self.budget.action()) {
            (true, AtLimit::Throttle { baseline }) => {
                self.state.limit_reached_at.get_or_insert(now);
                if self.throttled() {
                    bucket.limits = baseline;
                } else {
                    self.throttle(bucket, baseline);
                }
            }
            (true, _) => {
                self.state.limit_reached_at.get_or_insert(now);
                self.unthrottle(bucket);
            }
            (false, _) => {
                self.state.limit_reached_at = None;
                self.unthrottle(bucket);
            }
        }
        Ok(records)
    }

    /// Ends the budget now: the records of the cycle it was in (closed at
    /// `now`) and of one already over, oldest first; the bucket back at
    /// its own limits.
    pub fn end(mut self, bucket: &mut BucketState, now: Timestamp) -> Vec<CycleRecord> {
        let mut records: Vec<CycleRecord> = self.roll(bucket, now).into_iter().collect();
        let next = Cycle {
            start: now,
            end: now,
        };
        let mut record = self.close(bucket, next);
        record.cycle.end = now.max(record.cycle.start);
        records.push(record);
        records
    }

    fn unthrottle(&mut self, bucket: &mut BucketState) {
        if let Some(limits) = self.state.own_limits.take() {
            bucket.limits = limits;
        }
    }
}

#[cfg(test)]
mod tests;
