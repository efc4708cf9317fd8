//! Organisation rows this replica is drawing on, and the draws its pods'
//! transactions left for a transaction of their own.
//!
//! A draw locks its organisation's head row with `SKIP LOCKED`: a row
//! another transaction holds is skipped (see `tollgate_core::transaction`).
//! With a thousand members due in one period, most of this replica's
//! transactions would otherwise pay a round trip only to find the row
//! held by another of its own, and the row, held by one transaction at a
//! time, would take fewer draws a second than a thousand members need. So:
//!
//! - A **latch** is taken before the lock is asked for and held until the
//!   transaction ends; a row latched here is skipped exactly as if the
//!   database had said it was held, without asking. Other replicas still
//!   meet `SKIP LOCKED`. The latch decides nothing the lock does not.
//! - A draw skipped for a held row (latched here or locked elsewhere) is
//!   **owed**: a worker that can latch the organisation's row makes the
//!   owed draws of its members in one transaction of their own, without
//!   pod requests, so that one locking of the row serves many draws. A
//!   draw owed but not made (the row held again, the transaction failed)
//!   is still due, and its bucket's next request draws or owes it again.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Mutex, PoisonError};

use tollgate_core::validate::BucketKey;

/// The organisation rows this replica's transactions have latched, and
/// the draws owed on them.
#[derive(Default)]
pub(super) struct DrawLatches {
    held: Mutex<HashSet<BucketKey>>,
    /// Per organisation bucket, the member buckets whose draws are owed.
    owed: Mutex<BTreeMap<BucketKey, BTreeSet<BucketKey>>>,
}

/// The latches one transaction holds, released when it is dropped (once
/// the transaction has ended).
pub(super) struct Latched<'a> {
    latches: &'a DrawLatches,
    keys: Mutex<Vec<BucketKey>>,
}

impl DrawLatches {
    /// A transaction's latches, none held yet.
    pub(super) fn none(&self) -> Latched<'_> {
        Latched {
            latches: self,
            keys: Mutex::new(Vec::new()),
        }
    }

    /// Owes the draws of `draws`, each a member bucket and its
    /// organisation's bucket.
    pub(super) fn owe<'k>(&self, draws: impl IntoIterator<Item = &'k (BucketKey, BucketKey)>) {
        let mut owed = self.owed.lock().unwrap_or_else(PoisonError::into_inner);
        for (member, parent) in draws {
            owed.entry(parent.clone())
                .or_default()
                .insert(member.clone());
        }
    }

    /// The owed draws of one organisation bucket whose row no transaction
    /// of this replica holds, at most `max` of them, with its latch; or
    /// `None` if there are none such.
    pub(super) fn take_owed(&self, max: usize) -> Option<(Latched<'_>, Vec<BucketKey>)> {
        let mut owed = self.owed.lock().unwrap_or_else(PoisonError::into_inner);
        let latched = self.none();
        let parent = owed
            .keys()
            .find(|parent| latched.take(std::slice::from_ref(parent)).is_empty())?
            .clone();
        let members = owed.get_mut(&parent)?;
        let taken: Vec<BucketKey> = members.iter().take(max.max(1)).cloned().collect();
        for member in &taken {
            members.remove(member);
        }
        if members.is_empty() {
            owed.remove(&parent);
        }
        Some((latched, taken))
    }

    #[cfg(test)]
    fn owed(&self) -> usize {
        let owed = self.owed.lock().unwrap_or_else(PoisonError::into_inner);
        owed.values().map(BTreeSet::len).sum()
    }
}

impl Latched<'_> {
    /// Latches those of `keys` no other transaction of this replica holds
    /// and returns the others: held elsewhere, to be treated as busy.
    /// Keys this transaction already holds count as latched.
    pub(super) fn take(&self, keys: &[BucketKey]) -> BTreeSet<BucketKey> {
        let mut mine = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let mut held = self
            .latches
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut busy = BTreeSet::new();
        for key in keys {
            if mine.contains(key) {
                continue;
            }
            if held.insert(key.clone()) {
                mine.push(key.clone());
            } else {
                busy.insert(key.clone());
            }
        }
        busy
    }
}

impl Drop for Latched<'_> {
    fn drop(&mut self) {
        let mine = self.keys.get_mut().unwrap_or_else(PoisonError::into_inner);
        if mine.is_empty() {
            return;
        }
        let mut held = self
            .latches
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for key in mine.iter() {
            held.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::validate::TenantId;

    fn key(tenant: &str) -> BucketKey {
        BucketKey::request_units(TenantId::parse("tenant_id", tenant).expect("a valid id"))
    }

    #[test]
    fn a_latched_row_is_busy_for_others_until_its_transaction_ends() {
        let latches = DrawLatches::default();
        let first = latches.none();
        assert!(first.take(&[key("acme"), key("labs")]).is_empty());
        assert!(first.take(&[key("acme")]).is_empty(), "its own latch");
        let second = latches.none();
        assert_eq!(
            second.take(&[key("acme"), key("other")]),
            BTreeSet::from([key("acme")])
        );
        drop(first);
        let third = latches.none();
        assert_eq!(third.take(&[key("acme"), key("labs")]), BTreeSet::new());
        drop(second);
        assert_eq!(
            latches.none().take(&[key("other")]),
            BTreeSet::new(),
            "released with the transaction"
        );
    }

    #[test]
    fn owed_draws_go_to_a_worker_that_can_latch_their_organisation() {
        let latches = DrawLatches::default();
        let (acme, labs) = (key("acme"), key("labs"));
        let members: Vec<(BucketKey, BucketKey)> = (0..5)
            .map(|i| (key(&format!("m{i}")), acme.clone()))
            .chain([(key("x"), labs.clone())])
            .collect();
        latches.owe(&members);
        latches.owe(&members[..1]);
        assert_eq!(latches.owed(), 6, "owed once each");

        let pod = latches.none();
        assert!(pod.take(std::slice::from_ref(&acme)).is_empty());
        let (drawer, taken) = latches.take_owed(10).expect("labs is free");
        assert_eq!(taken, vec![key("x")], "acme is held: labs's draws");
        assert!(latches.take_owed(10).is_none(), "both held");
        drop(drawer);
        drop(pod);

        let (drawer, taken) = latches.take_owed(3).expect("acme is free");
        assert_eq!(taken.len(), 3, "at most the batch's size");
        assert_eq!(
            latches.none().take(std::slice::from_ref(&acme)),
            BTreeSet::from([acme.clone()]),
            "the drawer holds acme's latch"
        );
        assert!(latches.take_owed(3).is_none());
        drop(drawer);
        let (_, rest) = latches.take_owed(3).expect("the rest");
        assert_eq!(rest.len(), 2);
        assert_eq!(latches.owed(), 0);
    }
}
