//! Organisation rows this replica is drawing on, and the draws a worker's
//! transactions skipped, owed to its next transaction.
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
//!   **owed** to the worker whose transaction skipped it: its next
//!   transaction, if the row is not latched by then, locks the owed
//!   members' buckets with its own and makes their draws with its own
//!   pods', so that one locking of the row serves many draws. The
//!   members are of the worker's own tenants, whose rows no other worker
//!   of the replica locks. A draw owed but not made (the row held again,
//!   the transaction failed) is still due, and its bucket's next request
//!   draws or owes it again.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Mutex, PoisonError};

use tollgate_core::validate::BucketKey;

/// The organisation rows this replica's transactions have latched.
#[derive(Default)]
pub(super) struct DrawLatches {
    held: Mutex<HashSet<BucketKey>>,
}

/// How many transactions try an owed draw whose organisation's row they
/// find held each time, before it is left to its bucket's next request.
const OWED_TRIES: u32 = 3;

/// A draw a transaction skipped for a held organisation row.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Skipped {
    pub(super) member: BucketKey,
    pub(super) parent: BucketKey,
    /// The database held the row (a transaction of another replica, or a
    /// change of the tree), rather than a transaction of this replica,
    /// which lets go of its latch within its transaction: only such a try
    /// counts towards [`OWED_TRIES`].
    pub(super) in_database: bool,
}

impl Skipped {
    /// The skipped ones of `draws` (member bucket, organisation bucket):
    /// those whose organisation rows were latched in this replica
    /// (`latched`) or held in the database (`held`).
    pub(super) fn of<'a>(
        draws: &'a [(BucketKey, BucketKey)],
        latched: &'a BTreeSet<BucketKey>,
        held: &'a BTreeSet<BucketKey>,
    ) -> impl Iterator<Item = Skipped> + 'a {
        draws
            .iter()
            .filter(|(_, parent)| latched.contains(parent) || held.contains(parent))
            .map(|(member, parent)| Skipped {
                member: member.clone(),
                parent: parent.clone(),
                in_database: held.contains(parent),
            })
    }
}

/// The draws a worker's transactions skipped for a held organisation row,
/// owed to its next transactions.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// Member bucket → its organisation's bucket, and how many of the
    /// worker's transactions tried it since it was owed.
    draws: BTreeMap<BucketKey, (BucketKey, u32)>,
}

impl Owed {
    pub(super) fn is_empty(&self) -> bool {
        self.draws.is_empty()
    }

    /// The owed draws whose organisation rows `latched`, the worker's
    /// next transaction's latches, could take (no other transaction of
    /// this replica holds them): for that transaction to make.
    pub(super) fn latch(&self, latched: &Latched<'_>) -> Vec<BucketKey> {
        let parents: BTreeSet<BucketKey> = self
            .draws
            .values()
            .map(|(parent, _)| parent.clone())
            .collect();
        let parents: Vec<BucketKey> = parents.into_iter().collect();
        let busy = latched.take(&parents);
        self.draws
            .iter()
            .filter(|(_, (parent, _))| !busy.contains(parent))
            .map(|(member, _)| member.clone())
            .collect()
    }

    /// After a transaction that tried `attempted` (none if it failed):
    /// those it did not skip again are made or no longer due; those it
    /// did stay owed, up to [`OWED_TRIES`] tries the database refused;
    /// the draws it `skipped` are owed.
    pub(super) fn settle(&mut self, attempted: &[BucketKey], skipped: Vec<Skipped>) {
        let skipped: BTreeMap<BucketKey, Skipped> =
            skipped.into_iter().map(|s| (s.member.clone(), s)).collect();
        for member in attempted {
            match (self.draws.get_mut(member), skipped.get(member)) {
                (Some(_), Some(again)) if !again.in_database => {}
                (Some((_, tries)), Some(_)) if *tries + 1 < OWED_TRIES => *tries += 1,
                _ => {
                    self.draws.remove(member);
                }
            }
        }
        for (member, s) in skipped {
            if !attempted.contains(&member) {
                self.draws.entry(member).or_insert((s.parent, 0));
            }
        }
    }
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

    /// Whether a transaction of this replica holds `key`'s latch now.
    #[cfg(test)]
    fn is_latched(&self, key: &BucketKey) -> bool {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
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
    fn an_owed_draw_is_tried_while_its_row_is_free_and_at_most_three_times() {
        let latches = DrawLatches::default();
        let (acme, labs) = (key("acme"), key("labs"));
        let skip = |member: &str, parent: &BucketKey, in_database: bool| Skipped {
            member: key(member),
            parent: parent.clone(),
            in_database,
        };
        let mut owed = Owed::default();
        owed.settle(
            &[],
            vec![
                skip("a", &acme, false),
                skip("b", &acme, false),
                skip("x", &labs, true),
            ],
        );
        let holding_acme = latches.none();
        holding_acme.take(std::slice::from_ref(&acme));
        let next = latches.none();
        assert_eq!(owed.latch(&next), vec![key("x")], "acme is held");
        assert!(
            latches.is_latched(&labs),
            "latched for the next transaction"
        );
        drop((holding_acme, next));
        let next = latches.none();
        let all = owed.latch(&next);
        assert_eq!(all.len(), 3);
        drop(next);
        let free = |owed: &Owed| owed.latch(&latches.none());
        // a is drawn; b and x are skipped again, b for a latch of this
        // replica (never counted), x by the database: after three tries
        // x is left to its bucket's next request.
        let again = || vec![skip("b", &acme, false), skip("x", &labs, true)];
        owed.settle(&all, again());
        assert_eq!(free(&owed), vec![key("b"), key("x")]);
        for _ in 0..5 {
            owed.settle(&[key("b"), key("x")], again());
        }
        assert_eq!(free(&owed), vec![key("b")], "{owed:?}");
        owed.settle(&[key("b")], Vec::new());
        assert!(owed.is_empty(), "{owed:?}");
        // A failed transaction leaves them to their next requests.
        owed.settle(&[], vec![skip("c", &acme, true)]);
        owed.settle(&[key("c")], Vec::new());
        assert!(owed.is_empty());
    }

    #[test]
    fn a_latch_is_seen_while_held() {
        let latches = DrawLatches::default();
        let drawing = latches.none();
        assert!(!latches.is_latched(&key("acme")));
        drawing.take(&[key("acme")]);
        assert!(latches.is_latched(&key("acme")));
        drop(drawing);
        assert!(!latches.is_latched(&key("acme")));
    }
}
