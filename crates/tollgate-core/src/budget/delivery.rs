//! Delivering budget events to webhooks: which events are due, who holds
//! one, and when a failed one is tried again.
//!
//! An event is kept by the store with its [`Delivery`]. Any server may
//! deliver it: it *claims* the event (its claim runs until a lease ends,
//! so a server that dies mid-delivery leaves an event another takes up
//! when the lease is over), posts it to each webhook that has not
//! acknowledged it yet, and *settles* the claim with the webhooks that
//! acknowledged. An event is delivered once every webhook configured has
//! acknowledged it; until then it is tried again after a delay that
//! doubles with each failed attempt, up to a ceiling ([`Backoff`]).
//!
//! Acknowledgements are facts and always count, even from a server whose
//! claim has lapsed; the schedule (attempts, the next try) is the current
//! claimant's. Delivery is at least once: a server killed between a
//! webhook's answer and the settlement posts the event again, with the
//! same [`idempotency_key`], which receivers deduplicate on. A new cycle's
//! event has a new key; an event of a cycle is never made twice (the
//! store keeps one per bucket, cycle and threshold).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::BudgetEvent;
use crate::Timestamp;

/// How far an event's delivery has gone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// Webhooks that acknowledged the event.
    #[serde(default)]
    pub delivered_to: Vec<String>,
    /// When every configured webhook had.
    #[serde(default)]
    pub delivered_at: Option<Timestamp>,
    /// Attempts that left a webhook unacknowledged.
    #[serde(default)]
    pub attempts: u32,
    /// Not tried again before this.
    #[serde(default)]
    pub next_attempt_at: Timestamp,
    /// A server holds the event until this (its claim).
    #[serde(default)]
    pub claimed_until: Timestamp,
    /// Why the last attempt failed.
    #[serde(default)]
    pub last_error: String,
}

/// The delay before an event whose delivery failed is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// After the first failure.
    pub first: Duration,
    /// The longest delay; doubling stops there.
    pub max: Duration,
}

impl Default for Backoff {
    /// 1 s, doubling up to 10 minutes: a receiver down for an hour is
    /// tried about a dozen times, and again within 10 minutes of its
    /// return.
    fn default() -> Self {
        Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The delay after the `attempts`-th failed attempt (1 for the first).
    pub fn delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }
}

/// What came of posting a claimed event to the webhooks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attempt {
    /// Webhooks that acknowledged it (a 2xx answer).
    pub acknowledged: Vec<String>,
    /// Why the others did not, if any did not.
    pub error: Option<String>,
}

impl Delivery {
    /// True if the event is not delivered, its next try has come and no
    /// server holds it at `now`. (One every webhook configured has
    /// acknowledged, as after a webhook was removed from the
    /// configuration, is due too: its settlement marks it delivered.)
    pub fn is_due(&self, now: Timestamp) -> bool {
        self.delivered_at.is_none() && self.next_attempt_at <= now && self.claimed_until <= now
    }

    /// The webhooks of `webhooks` that have not acknowledged the event.
    pub fn waiting_for<'a>(&self, webhooks: &'a [String]) -> Vec<&'a String> {
        webhooks
            .iter()
            .filter(|url| !self.delivered_to.contains(url))
            .collect()
    }

    /// Claims the event at `now` for `lease`; answers the claim, which
    /// [`Delivery::settle`] is given back.
    pub fn claim(&mut self, now: Timestamp, lease: Duration) -> Timestamp {
        self.claimed_until = now.saturating_add(lease);
        self.claimed_until
    }

    /// Settles the claim `claim` with what came of the attempt, at `now`:
    /// the acknowledgements count whoever made them; if the claim is still
    /// the event's, the event is delivered (every one of `webhooks`
    /// acknowledged) or scheduled again after `backoff`, and released.
    pub fn settle(
        &mut self,
        claim: Timestamp,
        attempt: &Attempt,
        webhooks: &[String],
        backoff: &Backoff,
        now: Timestamp,
    ) {
        for url in &attempt.acknowledged {
            if !self.delivered_to.contains(url) {
                self.delivered_to.push(url.clone());
            }
        }
        if self.delivered_at.is_none() && self.waiting_for(webhooks).is_empty() {
            self.delivered_at = Some(now);
        }
        if self.claimed_until != claim {
            // Another server took it up after the lease: its schedule.
            return;
        }
        self.claimed_until = Timestamp::EPOCH;
        if self.delivered_at.is_none() {
            self.attempts = self.attempts.saturating_add(1);
            self.next_attempt_at = now.saturating_add(backoff.delay(self.attempts));
            self.last_error = attempt.error.clone().unwrap_or_default();
        } else {
            self.last_error.clear();
        }
    }
}

/// The key a receiver deduplicates on: the same for every post of one
/// event (`tenant/bucket/cycle start/threshold`, the cycle's start in
/// microseconds since the Unix epoch), different for every event.
pub fn idempotency_key(tenant: &str, bucket: &str, event: &BudgetEvent) -> String {
    format!(
        "{tenant}/{bucket}/{}/{}",
        event.cycle.start.unix_micros(),
        event.threshold.label()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks() -> Vec<String> {
        vec!["http://a/".to_owned(), "http://b/".to_owned()]
    }

    fn at(secs: f64) -> Timestamp {
        Timestamp::from_secs_f64(secs)
    }

    #[test]
    fn backoff_doubles_to_its_ceiling() {
        let b = Backoff::default();
        let delays: Vec<u64> = (1..=12).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn a_claimed_event_is_not_due_until_its_lease_ends() {
        let mut d = Delivery::default();
        assert!(d.is_due(at(10.0)));
        d.claim(at(10.0), Duration::from_secs(60));
        assert!(!d.is_due(at(69.0)));
        assert!(d.is_due(at(70.0)));
    }

    #[test]
    fn a_partial_attempt_waits_for_the_rest_and_backs_off() {
        let mut d = Delivery::default();
        let claim = d.claim(at(10.0), Duration::from_secs(60));
        let attempt = Attempt {
            acknowledged: vec!["http://a/".to_owned()],
            error: Some("http://b/: 503".to_owned()),
        };
        d.settle(claim, &attempt, &hooks(), &Backoff::default(), at(11.0));
        assert_eq!(d.delivered_to, ["http://a/"]);
        assert_eq!(d.delivered_at, None);
        assert_eq!(d.attempts, 1);
        assert_eq!(d.next_attempt_at, at(12.0));
        assert_eq!(d.waiting_for(&hooks()), [&"http://b/".to_owned()]);
        assert!(!d.is_due(at(11.5)));
        assert!(d.is_due(at(12.0)));
        let claim = d.claim(at(12.0), Duration::from_secs(60));
        let rest = Attempt {
            acknowledged: vec!["http://b/".to_owned()],
            error: None,
        };
        d.settle(claim, &rest, &hooks(), &Backoff::default(), at(12.5));
        assert_eq!(d.delivered_at, Some(at(12.5)));
        assert!(!d.is_due(at(1e6)));
    }

    #[test]
    fn a_lapsed_claim_counts_its_acknowledgements_but_not_its_schedule() {
        let mut d = Delivery::default();
        let old = d.claim(at(10.0), Duration::from_secs(60));
        let new = d.claim(at(70.0), Duration::from_secs(60));
        let failed = Attempt {
            acknowledged: vec!["http://a/".to_owned()],
            error: Some("timeout".to_owned()),
        };
        d.settle(old, &failed, &hooks(), &Backoff::default(), at(75.0));
        assert_eq!(d.delivered_to, ["http://a/"]);
        assert_eq!(d.claimed_until, new, "the new claimant still holds it");
        assert_eq!(d.attempts, 0);
    }

    #[test]
    fn a_webhook_removed_from_the_configuration_is_not_waited_for() {
        let mut d = Delivery {
            delivered_to: vec!["http://a/".to_owned()],
            ..Delivery::default()
        };
        let only_a = vec!["http://a/".to_owned()];
        assert!(d.is_due(at(1.0)));
        assert!(d.waiting_for(&only_a).is_empty());
        let claim = d.claim(at(1.0), Duration::from_secs(5));
        d.settle(
            claim,
            &Attempt::default(),
            &only_a,
            &Backoff::default(),
            at(2.0),
        );
        assert_eq!(d.delivered_at, Some(at(2.0)));
    }
}
