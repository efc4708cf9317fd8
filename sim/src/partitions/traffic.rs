//! Where and when a pod's operations arrive.
//!
//! Each pod has one source per hot spot it names and one for its cold
//! traffic, each with its own generator (seeded by the workload seed, the
//! pod and the source), so a pod sends the same operations to the same
//! partitions at the same times in every mode.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};

use crate::workload::partitions::{Arrivals, ColdSpec, HotSpot};

/// The stream tag of arrival generators (apart from the demand noise's and
/// the network's).
const ARRIVAL_STREAM: u64 = 1 << 62;

/// Where a source's operations go.
#[derive(Debug)]
pub enum Target {
    /// Hot spot number `spot` of the workload's.
    Hot { spot: usize, on: HotSpot },
    /// A cold spread; `normaliser` is its [`ColdSpec::normaliser`].
    Cold {
        spec: ColdSpec,
        normaliser: f64,
        zipf: Option<Zipf<f64>>,
    },
}

/// One stream of a pod's operations.
#[derive(Debug)]
pub struct Source {
    pub target: Target,
    pub rate: f64,
    poisson: bool,
    /// When its next operation arrives, seconds.
    pub next: f64,
    rng: ChaCha8Rng,
}

/// The partition an operation goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A hot spot's partition at that time.
    Hot { spot: usize, partition: u64 },
    /// The cold partition of this rank (0: the most popular).
    Cold { rank: u64 },
}

impl Source {
    /// Source `index` of pod `pod`, sending from `start` (seconds).
    pub fn new(
        target: Target,
        rate: f64,
        arrivals: Arrivals,
        seed: u64,
        pod: usize,
        index: usize,
        start: f64,
    ) -> Source {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(ARRIVAL_STREAM | ((pod as u64) << 8) | (index as u64 & 0xff));
        let poisson = arrivals == Arrivals::Poisson;
        let mut source = Source {
            target,
            rate,
            poisson,
            next: f64::INFINITY,
            rng,
        };
        if rate > 0.0 {
            source.next = start
                + if poisson {
                    source.gap()
                } else {
                    // Evenly spaced, at a phase of the pod's own.
                    source.rng.random::<f64>() / rate
                };
        }
        source
    }

    fn gap(&mut self) -> f64 {
        if self.poisson {
            -(1.0 - self.rng.random::<f64>()).ln() / self.rate
        } else {
            1.0 / self.rate
        }
    }

    /// Where the operation arriving now (at `self.next`) goes; moves on to
    /// the next arrival.
    pub fn take(&mut self) -> Destination {
        let t = self.next;
        let destination = match &self.target {
            Target::Hot { spot, on } => Destination::Hot {
                spot: *spot,
                partition: on.partition_at(std::time::Duration::from_secs_f64(t)),
            },
            Target::Cold { spec, zipf, .. } => {
                let rank = match zipf {
                    // Zipf draws ranks from 1.
                    Some(z) => (z.sample(&mut self.rng) as u64).saturating_sub(1),
                    None => self.rng.random_range(0..spec.partitions),
                };
                Destination::Cold {
                    rank: rank.min(spec.partitions - 1),
                }
            }
        };
        self.next = t + self.gap();
        destination
    }
}

/// A cold spread's target, with its Zipf sampler.
pub fn cold_target(spec: &ColdSpec, normaliser: f64) -> Target {
    let zipf = spec
        .zipf
        .and_then(|s| Zipf::new(spec.partitions as f64, s).ok());
    Target::Cold {
        spec: spec.clone(),
        normaliser,
        zipf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cold(zipf: Option<f64>) -> Source {
        let spec = ColdSpec {
            rate: 1000.0,
            partitions: 100,
            zipf,
        };
        let norm = spec.normaliser();
        Source::new(
            cold_target(&spec, norm),
            1000.0,
            Arrivals::Poisson,
            1,
            0,
            0,
            0.0,
        )
    }

    #[test]
    fn arrivals_come_at_the_rate_and_the_same_seed_repeats_them() {
        for arrivals in [Arrivals::Poisson, Arrivals::Even] {
            let spot = HotSpot {
                partition: 0,
                moving: None,
            };
            let mut s = Source::new(
                Target::Hot { spot: 0, on: spot },
                500.0,
                arrivals,
                9,
                3,
                1,
                10.0,
            );
            let mut n = 0;
            let mut times = Vec::new();
            while s.next < 110.0 {
                times.push(s.next);
                s.take();
                n += 1;
            }
            assert!((n as f64 - 50_000.0).abs() < 1_000.0, "{arrivals:?}: {n}");
            assert!(times[0] >= 10.0);
            let mut again = Source::new(
                Target::Hot { spot: 0, on: spot },
                500.0,
                arrivals,
                9,
                3,
                1,
                10.0,
            );
            assert_eq!(again.next, times[0]);
            again.take();
            assert_eq!(again.next, times[1]);
        }
    }

    #[test]
    fn zipf_ranks_follow_their_weights() {
        let mut s = cold(Some(1.0));
        let mut counts = [0u32; 100];
        for _ in 0..200_000 {
            match s.take() {
                Destination::Cold { rank } => counts[rank as usize] += 1,
                other => panic!("{other:?}"),
            }
        }
        let spec = ColdSpec {
            rate: 1.0,
            partitions: 100,
            zipf: Some(1.0),
        };
        let norm = spec.normaliser();
        for k in [0u64, 1, 9, 99] {
            let expected = spec.weight(k, norm) * 200_000.0;
            let got = f64::from(counts[k as usize]);
            assert!(
                (got - expected).abs() < 5.0 * expected.sqrt() + 5.0,
                "rank {k}: {got} against {expected:.0}"
            );
        }
        let mut uniform = cold(None);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..10_000 {
            if let Destination::Cold { rank } = uniform.take() {
                seen.insert(rank);
            }
        }
        assert_eq!(seen.len(), 100);
    }
}
