//! Organisations: how a parent bucket's refill is shared by its children.
//!
//! An organisation owns tenants (and other organisations) and has buckets
//! of its own. For each bucket name it limits, its children's buckets of
//! that name draw their refill from its bucket, as pods draw theirs from a
//! tenant's bucket: once per target period each child asks for the rate it
//! wants, and the parent answers the rate it may have until the next
//! period. This module is the parent's rule for those answers, in the
//! manner of Linux's HTB and YARN's hierarchical queues:
//!
//! 1. **Guarantees first.** Each child gets its guaranteed rate, or what
//!    it wants if that is less (a guarantee is reserved only while its
//!    child wants it). If the guarantees wanted exceed the parent's rate,
//!    they are cut in proportion.
//! 2. **Borrowing by shares.** What is left goes to the children that want
//!    more, in proportion to their shares, each up to the least of what it
//!    wants and its ceiling (its own limits); what one cannot take is
//!    offered again to the others (water-filling), so no capacity stays
//!    idle while a child below its ceiling wants more.
//! 3. **Ceilings always.** No child gets more than its ceiling, nor more
//!    than it wants.
//!
//! [`allocate`] is a pure function of the parent's rate and the children's
//! asks; the properties above are checked by property tests. How the asks
//! are carried and the answers kept (a child's row draws on its parent's
//! once per period, never per pod request) is the grant protocol of the
//! global bucket, one level up.

use serde::{Deserialize, Serialize};

/// What one child asks of its parent for a period.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildAsk {
    /// The refill rate the child wants, tokens per second (what its pods
    /// asked for, over the period).
    pub wants: f64,
    /// The rate reserved for it while it wants it.
    pub guaranteed: f64,
    /// The most it may have: its own bucket's refill rate.
    pub ceiling: f64,
    /// Its weight when what is left is lent out.
    pub shares: f64,
}

impl ChildAsk {
    /// The most this child can take: what it wants, at most its ceiling.
    fn cap(&self) -> f64 {
        clean(self.wants).min(clean(self.ceiling))
    }
}

/// A non-negative finite number, or 0.
fn clean(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

/// Relative slack of the water-filling's sums.
const ROUNDING: f64 = 1e-12;

/// The rate each child gets of the parent's `rate`, in the children's
/// order: guarantees first (cut in proportion if they exceed the rate),
/// then what is left by shares among the children that want more, each up
/// to the least of what it wants and its ceiling.
pub fn allocate(rate: f64, children: &[ChildAsk]) -> Vec<f64> {
    let rate = clean(rate);
    let caps: Vec<f64> = children.iter().map(ChildAsk::cap).collect();
    // 1. Guarantees, each at most the child's cap.
    let floors: Vec<f64> = children
        .iter()
        .zip(&caps)
        .map(|(c, &cap)| clean(c.guaranteed).min(cap))
        .collect();
    let floor_sum: f64 = floors.iter().sum();
    if floor_sum >= rate {
        let scale = if floor_sum > 0.0 {
            rate / floor_sum
        } else {
            0.0
        };
        return floors.iter().map(|f| f * scale).collect();
    }
    let mut given = floors;
    let mut left = rate - floor_sum;
    // 2. Water-filling by shares over the children still below their cap.
    // Each round either hands out all that is left or fills at least one
    // child to its cap, so it ends within as many rounds as children.
    loop {
        let open: Vec<usize> = (0..children.len())
            .filter(|&i| caps[i] - given[i] > caps[i] * ROUNDING)
            .collect();
        if open.is_empty() || left <= rate * ROUNDING {
            break;
        }
        let weights: Vec<f64> = open
            .iter()
            .map(|&i| {
                let s = clean(children[i].shares);
                // A child with no shares still borrows, last and least:
                // the smallest positive weight keeps it from starving
                // while capacity sits idle.
                if s > 0.0 { s } else { f64::MIN_POSITIVE }
            })
            .collect();
        let total: f64 = weights.iter().sum();
        // The largest fill level (rate per share) no open child passes.
        let level = open
            .iter()
            .zip(&weights)
            .map(|(&i, w)| (caps[i] - given[i]) / w)
            .fold(left / total, f64::min);
        let mut handed = 0.0;
        for (&i, w) in open.iter().zip(&weights) {
            let more = (level * w).min(caps[i] - given[i]);
            given[i] += more;
            handed += more;
        }
        left -= handed;
        if handed <= 0.0 {
            break;
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ask(wants: f64, guaranteed: f64, ceiling: f64, shares: f64) -> ChildAsk {
        ChildAsk {
            wants,
            guaranteed,
            ceiling,
            shares,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn two_busy_children_split_by_shares_and_an_idle_one_lends_everything() {
        let busy = |shares| ask(1_000.0, 0.0, 1_000.0, shares);
        let got = allocate(100.0, &[busy(1.0), busy(3.0)]);
        assert!(close(got[0], 25.0) && close(got[1], 75.0), "{got:?}");
        // The first goes idle: the second gets the whole rate.
        let got = allocate(100.0, &[ask(0.0, 0.0, 1_000.0, 1.0), busy(3.0)]);
        assert!(close(got[0], 0.0) && close(got[1], 100.0), "{got:?}");
    }

    #[test]
    fn a_guarantee_is_met_first_and_a_ceiling_is_never_passed() {
        // A guarantees 60 but wants 40; B is capped at 30; C takes the rest.
        let got = allocate(
            100.0,
            &[
                ask(40.0, 60.0, 1_000.0, 1.0),
                ask(500.0, 0.0, 30.0, 10.0),
                ask(500.0, 0.0, 1_000.0, 1.0),
            ],
        );
        assert!(close(got[0], 40.0), "{got:?}");
        assert!(close(got[1], 30.0), "{got:?}");
        assert!(close(got[2], 30.0), "{got:?}");
        // Guarantees wanted beyond the rate are cut in proportion.
        let got = allocate(
            90.0,
            &[ask(100.0, 60.0, 100.0, 1.0), ask(200.0, 120.0, 200.0, 1.0)],
        );
        assert!(close(got[0], 30.0) && close(got[1], 60.0), "{got:?}");
    }

    fn children() -> impl Strategy<Value = Vec<ChildAsk>> {
        proptest::collection::vec(
            (0.0f64..500.0, 0.0f64..100.0, 0.0f64..400.0, 0.0f64..5.0)
                .prop_map(|(w, g, c, s)| ask(w, g, c, s)),
            1..12,
        )
    }

    proptest! {
        /// Whatever the asks: the children together get at most the rate;
        /// each at most its cap (wants, ceiling); each at least its wanted
        /// guarantee when the guarantees fit; and no capacity is left idle
        /// while a child below its cap wants more (work conserving).
        #[test]
        fn allocations_keep_the_rules(rate in 0.0f64..1_000.0, children in children()) {
            let got = allocate(rate, &children);
            prop_assert_eq!(got.len(), children.len());
            let sum: f64 = got.iter().sum();
            prop_assert!(sum <= rate * (1.0 + 1e-9) + 1e-9, "{sum} > {rate}");
            let caps: Vec<f64> = children.iter().map(ChildAsk::cap).collect();
            for (g, cap) in got.iter().zip(&caps) {
                prop_assert!(*g >= 0.0 && *g <= cap * (1.0 + 1e-9) + 1e-12, "{g} beyond {cap}");
            }
            let floors: Vec<f64> = children.iter().zip(&caps).map(|(c, cap)| c.guaranteed.min(*cap)).collect();
            if floors.iter().sum::<f64>() <= rate {
                for (g, f) in got.iter().zip(&floors) {
                    prop_assert!(*g >= f * (1.0 - 1e-9) - 1e-12, "{g} under its guarantee {f}");
                }
            }
            let cap_sum: f64 = caps.iter().sum();
            prop_assert!(
                close(sum, rate.min(cap_sum)) || sum >= rate.min(cap_sum) * (1.0 - 1e-9),
                "idle capacity: gave {sum} of {rate}, caps {cap_sum}"
            );
        }

        /// Among children that are not at their cap and have equal shares
        /// and no guarantee, the split is equal (max-min fair).
        #[test]
        fn equal_children_get_equal_rates(rate in 1.0f64..1_000.0, n in 2usize..10) {
            let children = vec![ask(1e6, 0.0, 1e6, 1.0); n];
            let got = allocate(rate, &children);
            for g in &got {
                prop_assert!(close(*g, rate / n as f64), "{got:?}");
            }
        }
    }
}
