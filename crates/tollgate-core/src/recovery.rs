//! Settling what a crashed process owed its tenants' global buckets.
//!
//! A pod's local bucket reports its consumption in its next request; what
//! it admitted since its last request lives in its memory only. A pod
//! process that dies loses it, and its callers learn nothing either. The
//! agent (`tollgate agent`), which admits work for many pods, cannot lose
//! it: its callers were answered, and billing must count what they were
//! given. So it writes a journal, and this module is the journal's
//! arithmetic, with no IO:
//!
//! - [`BucketLedger`] follows one bucket of one incarnation: the
//!   consumption its answered calls acknowledged (and gave back), the
//!   consumption its requests carried, its last request and whether that
//!   was answered. The journal replays its records into ledgers.
//! - [`BucketLedger::orphan`] says what a dead incarnation still owes: an
//!   [`Orphan`], or nothing.
//! - [`Orphan::settling_requests`] says how to pay it without counting
//!   anything twice: the last request sent again first (the server answers
//!   a request it applied from its record and counts nothing; one that
//!   never arrived is applied now), then what was never sent, in requests
//!   that ask for nothing, under the same lease with the next sequence
//!   numbers. Both go before the next incarnation's first request, whose
//!   greater lease ends the old one.
//!
//! Consumption acknowledged but never journaled (a kill between the
//! admission and its record) may still have gone out in a request: the
//! unsent amount is computed counter by counter and never below zero, so
//! such work is counted once, by the request that carried it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::consumption::{Consumption, MAX_REPORTED_CPU_MICROS, MAX_REPORTED_REQUEST_UNIT_MICROS};
use crate::global_bucket::{InstanceId, TokenBucketRequest};
use crate::validate::{DEFAULT_TARGET_REQUEST_PERIOD, MAX_COUNTER};

/// One bucket of one incarnation, as its journal tells it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BucketLedger {
    /// What answered calls took or charged.
    pub acknowledged: Consumption,
    /// Request units given back by answered calls (`Return`).
    pub returned_micros: u64,
    /// What the incarnation's requests carried, each sequence number once.
    pub sent: Consumption,
    /// The last request sent (its latest attempt).
    pub last_request: Option<TokenBucketRequest>,
    /// True once the server answered the last request.
    pub last_answered: bool,
}

impl BucketLedger {
    /// An answered call took or charged `consumption`.
    pub fn acknowledge(&mut self, consumption: &Consumption) {
        self.acknowledged.add(consumption);
    }

    /// An answered call gave `micros` request units back.
    pub fn give_back(&mut self, micros: u64) {
        self.returned_micros = self.returned_micros.saturating_add(micros);
    }

    /// `request` is about to be sent. A new sequence number adds its
    /// consumption to what was sent; a retry (the same number) replaces the
    /// last request only: its consumption is the first attempt's.
    pub fn sending(&mut self, request: &TokenBucketRequest) {
        let retry = self
            .last_request
            .as_ref()
            .is_some_and(|last| last.seq == request.seq && last.lease == request.lease);
        if !retry {
            self.sent.add(&request.consumption);
        }
        self.last_request = Some(request.clone());
        self.last_answered = false;
    }

    /// The server answered request `seq` (of this incarnation's lease).
    pub fn answered(&mut self, seq: u64) {
        if self
            .last_request
            .as_ref()
            .is_some_and(|last| last.seq == seq)
        {
            self.last_answered = true;
        }
    }

    /// Acknowledged, less given back, less sent: what no request carried.
    pub fn unsent(&self) -> Consumption {
        let mut owed = self.acknowledged;
        owed.request_unit_micros = owed
            .request_unit_micros
            .saturating_sub(self.returned_micros);
        owed.saturating_sub(&self.sent)
    }

    /// What the incarnation owes once its process is gone: `None` if its
    /// last request was answered and every acknowledged call was in a
    /// request. An incarnation that never sent a request has no lease the
    /// server knows: `fresh` gives one (greater than any before it and
    /// smaller than the next incarnation's), with `instance_id`.
    pub fn orphan(
        &self,
        instance_id: InstanceId,
        fresh: impl FnOnce() -> Vec<u8>,
    ) -> Option<Orphan> {
        let unsent = self.unsent();
        let unanswered = self.last_request.as_ref().filter(|_| !self.last_answered);
        if unanswered.is_none() && unsent == Consumption::default() {
            return None;
        }
        let (instance_id, lease) = match &self.last_request {
            Some(last) => (last.instance_id, last.lease.clone()),
            None => (instance_id, fresh()),
        };
        Some(Orphan {
            instance_id,
            lease,
            next_seq: self.last_request.as_ref().map_or(1, |last| last.seq + 1),
            replay: unanswered.cloned(),
            unsent,
            target_request_period: self
                .last_request
                .as_ref()
                .map_or(DEFAULT_TARGET_REQUEST_PERIOD, |last| {
                    last.target_request_period
                }),
        })
    }
}

/// What a dead incarnation of one bucket still owes the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Orphan {
    pub instance_id: InstanceId,
    pub lease: Vec<u8>,
    /// The sequence number of the first request after `replay`.
    pub next_seq: u64,
    /// The last request, if no answer to it was recorded.
    pub replay: Option<TokenBucketRequest>,
    /// Consumption no request carried.
    pub unsent: Consumption,
    pub target_request_period: Duration,
}

impl Orphan {
    /// The requests that settle the orphan, to send in order, each until
    /// it is answered: the unanswered request again, then the unsent
    /// consumption, split so that no request carries more than one report
    /// may (`Consumption::validate`).
    pub fn settling_requests(&self) -> Vec<TokenBucketRequest> {
        let mut requests: Vec<TokenBucketRequest> = self.replay.iter().cloned().collect();
        let mut left = self.unsent;
        let mut seq = self.next_seq;
        while left != Consumption::default() {
            let part = Consumption {
                request_unit_micros: left
                    .request_unit_micros
                    .min(MAX_REPORTED_REQUEST_UNIT_MICROS),
                read_batches: left.read_batches.min(MAX_COUNTER),
                read_requests: left.read_requests.min(MAX_COUNTER),
                read_bytes: left.read_bytes.min(MAX_COUNTER),
                write_batches: left.write_batches.min(MAX_COUNTER),
                write_requests: left.write_requests.min(MAX_COUNTER),
                write_bytes: left.write_bytes.min(MAX_COUNTER),
                cpu_micros: left.cpu_micros.min(MAX_REPORTED_CPU_MICROS),
                egress_bytes: left.egress_bytes.min(MAX_COUNTER),
            };
            left = left.saturating_sub(&part);
            requests.push(TokenBucketRequest {
                instance_id: self.instance_id,
                lease: self.lease.clone(),
                seq,
                requested_tokens: 0.0,
                // Gone: its shares must not hold back the live instances.
                shares: 0.0,
                target_request_period: self.target_request_period,
                consumption: part,
                next_live_instance_id: None,
                returned_tokens: 0.0,
                held_tokens: 0.0,
                fallback_tokens: 0.0,
                fallback_duration: Duration::ZERO,
            });
            seq += 1;
        }
        requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(seq: u64, request_units: f64) -> TokenBucketRequest {
        TokenBucketRequest {
            instance_id: 7,
            lease: vec![1, 2, 3],
            seq,
            requested_tokens: 10.0,
            shares: 1.0,
            target_request_period: Duration::from_secs(10),
            consumption: Consumption::from_request_units(request_units),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            held_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: Duration::ZERO,
        }
    }

    fn units(n: f64) -> Consumption {
        Consumption::from_request_units(n)
    }

    #[test]
    fn an_incarnation_whose_last_request_was_answered_and_carried_everything_owes_nothing() {
        let mut ledger = BucketLedger::default();
        ledger.acknowledge(&units(5.0));
        ledger.sending(&request(1, 5.0));
        ledger.answered(1);
        assert_eq!(ledger.orphan(7, || vec![9]), None);
    }

    #[test]
    fn an_unanswered_request_is_sent_again_as_it_was_then_the_rest_follows() {
        let mut ledger = BucketLedger::default();
        ledger.acknowledge(&units(5.0));
        ledger.sending(&request(1, 5.0));
        ledger.answered(1);
        ledger.acknowledge(&units(3.0));
        ledger.sending(&request(2, 3.0));
        // A retry carries the same consumption: sent counts it once.
        let mut retry = request(2, 3.0);
        retry.fallback_tokens = 1.5;
        ledger.sending(&retry);
        ledger.acknowledge(&units(4.0));
        let orphan = ledger.orphan(7, || vec![9]).expect("owes");
        assert_eq!(orphan.unsent, units(4.0));
        let requests = orphan.settling_requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0], retry, "the latest attempt, verbatim");
        assert_eq!(requests[1].seq, 3);
        assert_eq!(requests[1].lease, vec![1, 2, 3]);
        assert_eq!(requests[1].consumption, units(4.0));
        assert_eq!(requests[1].requested_tokens, 0.0);
        assert_eq!(requests[1].shares, 0.0);
        assert!(requests.iter().all(|r| r.validate().is_ok()));
    }

    #[test]
    fn an_incarnation_that_never_sent_reports_under_a_fresh_lease_from_seq_one() {
        let mut ledger = BucketLedger::default();
        ledger.acknowledge(&units(2.5));
        let orphan = ledger.orphan(42, || vec![8, 8]).expect("owes");
        assert_eq!((orphan.instance_id, orphan.lease.clone()), (42, vec![8, 8]));
        let requests = orphan.settling_requests();
        assert_eq!(requests.len(), 1);
        assert_eq!((requests[0].seq, requests[0].consumption), (1, units(2.5)));
    }

    #[test]
    fn given_back_tokens_are_not_owed_and_nothing_goes_below_zero() {
        let mut ledger = BucketLedger::default();
        ledger.acknowledge(&units(5.0));
        ledger.give_back(units(2.0).request_unit_micros);
        // A request carried more than was journaled (a call admitted, sent,
        // then killed before its record): nothing more is owed for it.
        ledger.sending(&request(1, 4.0));
        ledger.answered(1);
        assert_eq!(ledger.unsent(), Consumption::default());
        assert_eq!(ledger.orphan(7, || vec![9]), None);
    }

    #[test]
    fn a_huge_debt_is_split_into_valid_reports() {
        let mut ledger = BucketLedger::default();
        let huge = Consumption {
            request_unit_micros: MAX_REPORTED_REQUEST_UNIT_MICROS * 2 + 1,
            cpu_micros: 5,
            ..Consumption::default()
        };
        ledger.acknowledge(&huge);
        let requests = ledger
            .orphan(1, || vec![1])
            .expect("owes")
            .settling_requests();
        assert_eq!(requests.len(), 3);
        assert!(requests.iter().all(|r| r.consumption.validate().is_ok()));
        let mut total = Consumption::default();
        for r in &requests {
            total.add(&r.consumption);
        }
        assert_eq!(total, huge);
        assert_eq!(
            requests.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
    }
}
