//! Request ids: the answer to every call that named one, kept so that a
//! retry learns what happened instead of taking or charging again.
//!
//! A caller whose call failed without an answer (the connection broke, the
//! agent restarted) cannot know whether its tokens were taken. Calling
//! again with the same `request_id` tells it: the first answer comes back
//! and nothing is taken twice. The rules, per (tenant, request id):
//!
//! - a repeat of an answered call (the same [`Call`]: bucket, tokens and
//!   every other parameter) gets the stored [`Answer`];
//! - a repeat with other parameters is refused (INVALID_ARGUMENT,
//!   `request_id`): it is a different call under a used name;
//! - a repeat while the first call is still being answered (an acquire
//!   still waiting) is ABORTED: retry later;
//! - a call that failed, or whose caller went away before it was answered,
//!   leaves nothing: its retry is a new call;
//! - answers are kept [`KEEP_FOR`] (10 minutes), and at most
//!   [`MAX_REMEMBERED`] (1 000 000) of them, the oldest dropped first.
//!
//! Request ids are per tenant: one tenant's ids never meet another's.
//! Everything kept is plain data ([`Remembered`], serde), with times as
//! Unix milliseconds, so the journal can write each answer as it is made
//! and load them back at start ([`Answers::restore`]).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::TenantId;

use crate::calls::{Answer, Call};

/// How long an answer is kept for its retries.
pub const KEEP_FOR: Duration = Duration::from_secs(600);

/// The most answers kept; beyond, the oldest are dropped first.
pub const MAX_REMEMBERED: usize = 1_000_000;

/// The longest request id, in characters.
pub const MAX_REQUEST_ID_CHARS: usize = 128;

/// One answer kept for the retries of its call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Remembered {
    pub tenant: TenantId,
    pub request_id: String,
    /// The call as it was made: a retry must make the same.
    pub call: Call,
    pub answer: Answer,
    /// When it was answered, Unix milliseconds.
    pub answered_at_ms: u64,
}

/// What to do with a call that names a request id.
#[derive(Debug, PartialEq)]
pub enum Begin {
    /// First seen: make the call, then [`Answers::finish`] or
    /// [`Answers::abandon`] it.
    Fresh,
    /// Answered before: this is the answer; do nothing else.
    Replay(Answer),
    /// The id was used for another call.
    Mismatch,
    /// The first call with this id is still being answered.
    InProgress,
}

type Key = (TenantId, String);

enum Entry {
    InProgress(Call),
    Answered(Remembered),
}

/// The answers kept, by (tenant, request id).
#[derive(Default)]
pub struct Answers {
    entries: HashMap<Key, Entry>,
    /// Answered keys in the order they were answered (the order they are
    /// dropped in), with their answer times.
    order: VecDeque<(Key, u64)>,
    keep_for_ms: u64,
    capacity: usize,
}

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answers")
            .field("answered", &self.order.len())
            .field("in_progress", &(self.entries.len() - self.order.len()))
            .finish()
    }
}

impl Answers {
    /// Keeps answers [`KEEP_FOR`], at most [`MAX_REMEMBERED`].
    pub fn new() -> Answers {
        Answers::with_limits(KEEP_FOR, MAX_REMEMBERED)
    }

    pub fn with_limits(keep_for: Duration, capacity: usize) -> Answers {
        Answers {
            entries: HashMap::new(),
            order: VecDeque::new(),
            keep_for_ms: u64::try_from(keep_for.as_millis()).unwrap_or(u64::MAX),
            capacity,
        }
    }

    /// Answers kept now.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// `call` under `request_id` of `tenant`, at `now_ms`: see [`Begin`].
    /// A fresh call is marked in progress until it is finished or
    /// abandoned.
    pub fn begin(
        &mut self,
        tenant: &TenantId,
        request_id: &str,
        call: &Call,
        now_ms: u64,
    ) -> Begin {
        self.expire(now_ms);
        let key = (tenant.clone(), request_id.to_owned());
        match self.entries.get(&key) {
            Some(Entry::Answered(kept)) if kept.call == *call => Begin::Replay(kept.answer.clone()),
            Some(Entry::Answered(_)) => Begin::Mismatch,
            Some(Entry::InProgress(first)) if first == call => Begin::InProgress,
            Some(Entry::InProgress(_)) => Begin::Mismatch,
            None => {
                self.entries.insert(key, Entry::InProgress(call.clone()));
                Begin::Fresh
            }
        }
    }

    /// The call begun under `request_id` was answered: keep its answer.
    pub fn finish(&mut self, remembered: Remembered) {
        self.restore(remembered);
    }

    /// The call begun under `request_id` ended without an answer (it
    /// failed, or its caller went away): forget it, so a retry is new.
    pub fn abandon(&mut self, tenant: &TenantId, request_id: &str) {
        let key = (tenant.clone(), request_id.to_owned());
        if let Some(Entry::InProgress(_)) = self.entries.get(&key) {
            self.entries.remove(&key);
        }
    }

    /// Keeps an answer made earlier (by this process, or by the one before
    /// it, read back from the journal). Answers must come in the order they
    /// were made.
    pub fn restore(&mut self, remembered: Remembered) {
        let key = (remembered.tenant.clone(), remembered.request_id.clone());
        let at = remembered.answered_at_ms;
        if let Some(Entry::Answered(_)) = self
            .entries
            .insert(key.clone(), Entry::Answered(remembered))
        {
            // Replaced an answer still queued for dropping: drop its
            // place in the queue too, or it would take the new one early.
            self.order.retain(|(queued, _)| *queued != key);
        }
        self.order.push_back((key, at));
        self.expire(at);
    }

    /// Every answer kept, oldest first (for the journal's snapshots).
    pub fn remembered(&self) -> impl Iterator<Item = &Remembered> {
        self.order
            .iter()
            .filter_map(|(key, _)| match self.entries.get(key) {
                Some(Entry::Answered(kept)) => Some(kept),
                _ => None,
            })
    }

    /// Drops the answers older than the keeping time at `now_ms`, and the
    /// oldest beyond the capacity.
    fn expire(&mut self, now_ms: u64) {
        while let Some((_, at)) = self.order.front() {
            let old = now_ms.saturating_sub(*at) >= self.keep_for_ms;
            if !old && self.order.len() <= self.capacity {
                break;
            }
            if let Some((key, _)) = self.order.pop_front() {
                self.entries.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::BucketName;

    fn tenant(id: &str) -> TenantId {
        TenantId::parse("tenant", id).expect("valid")
    }

    fn charge(tokens: f64) -> Call {
        Call::Charge {
            bucket: BucketName::parse("bucket", "emails").expect("valid"),
            tokens,
        }
    }

    fn answered(tenant_id: &str, id: &str, call: Call, at: u64) -> Remembered {
        Remembered {
            tenant: tenant(tenant_id),
            request_id: id.to_owned(),
            call,
            answer: Answer::Charged,
            answered_at_ms: at,
        }
    }

    #[test]
    fn a_repeat_gets_the_first_answer_and_another_call_is_a_mismatch() {
        let mut answers = Answers::new();
        let acme = tenant("acme");
        assert_eq!(answers.begin(&acme, "r1", &charge(5.0), 0), Begin::Fresh);
        assert_eq!(
            answers.begin(&acme, "r1", &charge(5.0), 1),
            Begin::InProgress
        );
        assert_eq!(answers.begin(&acme, "r1", &charge(6.0), 1), Begin::Mismatch);
        answers.finish(answered("acme", "r1", charge(5.0), 2));
        assert_eq!(
            answers.begin(&acme, "r1", &charge(5.0), 3),
            Begin::Replay(Answer::Charged)
        );
        assert_eq!(answers.begin(&acme, "r1", &charge(6.0), 3), Begin::Mismatch);
        // Another tenant's ids are its own.
        assert_eq!(
            answers.begin(&tenant("globex"), "r1", &charge(6.0), 3),
            Begin::Fresh
        );
    }

    #[test]
    fn an_abandoned_call_leaves_nothing() {
        let mut answers = Answers::new();
        let acme = tenant("acme");
        assert_eq!(answers.begin(&acme, "r1", &charge(5.0), 0), Begin::Fresh);
        answers.abandon(&acme, "r1");
        assert_eq!(answers.begin(&acme, "r1", &charge(7.0), 1), Begin::Fresh);
        // Abandoning never forgets an answer.
        answers.finish(answered("acme", "r1", charge(7.0), 2));
        answers.abandon(&acme, "r1");
        assert_eq!(
            answers.begin(&acme, "r1", &charge(7.0), 3),
            Begin::Replay(Answer::Charged)
        );
    }

    #[test]
    fn answers_are_kept_ten_minutes_and_the_oldest_go_first() {
        let mut answers = Answers::with_limits(KEEP_FOR, 3);
        let acme = tenant("acme");
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            answers.begin(&acme, id, &charge(1.0), i as u64);
            answers.finish(answered("acme", id, charge(1.0), i as u64));
        }
        assert_eq!(answers.len(), 3, "capacity 3: the oldest dropped");
        assert_eq!(answers.begin(&acme, "a", &charge(2.0), 4), Begin::Fresh);
        answers.abandon(&acme, "a");
        assert_eq!(
            answers.begin(&acme, "b", &charge(1.0), 4),
            Begin::Replay(Answer::Charged)
        );
        // Ten minutes after "b" was answered (at 1 ms), it is gone.
        let later = 1 + KEEP_FOR.as_millis() as u64;
        assert_eq!(answers.begin(&acme, "b", &charge(9.0), later), Begin::Fresh);
        assert_eq!(
            answers.begin(&acme, "d", &charge(1.0), later),
            Begin::Replay(Answer::Charged)
        );
    }

    #[test]
    fn restored_answers_replay_and_round_trip_as_json() {
        let mut answers = Answers::new();
        let kept = answered("acme", "r9", charge(3.5), 100);
        let json = serde_json::to_string(&kept).expect("serialize");
        let back: Remembered = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, kept);
        answers.restore(back);
        assert_eq!(
            answers.begin(&tenant("acme"), "r9", &charge(3.5), 200),
            Begin::Replay(Answer::Charged)
        );
        assert_eq!(answers.remembered().count(), 1);
    }
}
