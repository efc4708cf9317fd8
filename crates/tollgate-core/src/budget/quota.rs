//! Calendar quotas on bucket definitions: at most so many tokens per day,
//! week or month, on top of a bucket's rate ("10 emails a second, and
//! 100 000 a month"); on a per-key bucket, per key ("each API key 10 000
//! calls a month").
//!
//! A quota's cycles are a budget's ([`CycleRule`]: calendar days in an
//! IANA time zone, cut by the store's clock). On a shared bucket a quota
//! is the bucket's budget with `at_limit` stop ([`Quota::as_budget`]),
//! enforced in the transaction that grants tokens. A per-key check takes its
//! tokens from the key's bucket and from the key's quota in the same
//! transaction, or from neither: the tokens a key is allowed in a cycle
//! never exceed the quota, exactly. A key's use of its quota is kept in
//! its row ([`QuotaUse`]) with the cycle's end, so the row stays until the
//! cycle is over even when the bucket has refilled; a row whose cycle has
//! ended counts as unused.

use serde::{Deserialize, Serialize};

use super::{AtLimit, Budget, Cycle, CycleRule};
use crate::time::Timestamp;
use crate::validate::{self, InvalidInput, MAX_TOKENS};

/// At most `amount` tokens per cycle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    pub amount: f64,
    pub cycle: CycleRule,
}

impl Quota {
    /// Checks the amount (above 0) and the cycle, naming the field at
    /// fault under `quota`.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let within = |e: InvalidInput| e.within("quota");
        validate::non_negative("amount", self.amount, MAX_TOKENS).map_err(within)?;
        if self.amount <= 0.0 {
            return Err(within(InvalidInput::new(
                "amount",
                "must be more than 0 tokens per cycle",
            )));
        }
        self.cycle.validate().map_err(|e| within(e.within("cycle")))
    }

    /// The quota of a shared bucket, as the bucket's budget: its tokens
    /// granted per cycle stop at the amount (`at_limit` stop), with no
    /// alerts. An explicit budget on the bucket (its tier's or its
    /// tenant's) takes its place.
    pub fn as_budget(&self) -> Budget {
        Budget {
            amount: self.amount,
            cycle: self.cycle.clone(),
            at_limit: AtLimit::Stop,
            thresholds: Vec::new(),
            price: None,
            enforce: true,
        }
    }

    /// The cycle `now` lies in. A time out of the calendar's range (beyond
    /// the year 9999) has no cycle: the quota then allows nothing.
    pub fn cycle_at(&self, now: Timestamp) -> Option<Cycle> {
        self.cycle.cycle_at(now).ok()
    }

    /// The cycle a check at `now` takes from: the cycle of `now`, unless
    /// the key last took in a later one (a clock that stepped back, another
    /// replica's, say), which it then stays in: as a bucket's refill never
    /// moves back, a quota never counts a cycle again.
    pub fn cycle_of(&self, used: Option<&QuotaUse>, now: Timestamp) -> Option<Cycle> {
        let cycle = self.cycle_at(now)?;
        match used {
            Some(u) if u.cycle_end > cycle.end => {
                let last = u
                    .cycle_end
                    .saturating_sub(std::time::Duration::from_micros(1));
                self.cycle_at(last).filter(|c| c.end == u.cycle_end)
            }
            _ => Some(cycle),
        }
    }

    /// What is left of the quota in `cycle`, given what the key used in
    /// the cycle it last took from (`None`: nothing yet).
    pub fn left(&self, used: Option<&QuotaUse>, cycle: &Cycle) -> f64 {
        (self.amount - QuotaUse::used_in(used, cycle)).max(0.0)
    }
}

/// What a key took from its quota in one cycle.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaUse {
    /// The end of the cycle the tokens were taken in.
    pub cycle_end: Timestamp,
    pub used: f64,
}

impl QuotaUse {
    /// The tokens `used` counts in `cycle`: none if it was another cycle's.
    pub fn used_in(used: Option<&QuotaUse>, cycle: &Cycle) -> f64 {
        used.filter(|u| u.cycle_end == cycle.end)
            .map_or(0.0, |u| u.used)
    }

    /// True if the use still counts at `now`: some tokens, and its cycle
    /// not over.
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.used > 0.0 && now < self.cycle_end
    }
}

/// What an answer says of a quota.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaAnswer {
    /// Tokens left in the cycle after the check.
    pub remaining: f64,
    /// When the cycle ends and the quota is whole again.
    pub resets_at: Timestamp,
    /// How long that is after the check.
    pub reset_after: std::time::Duration,
}
