//! The delayed ideal: the best a protocol whose pods learn their share
//! once a period can do.
//!
//! Tokens come from the ideal's bucket: in every sample interval, the
//! tokens the ideal admitted, plus what the delayed ideal could not give
//! out before and its bucket would still hold (at most the burst limit
//! less the ideal's level). They are split between the pods by what each
//! got from the ideal over the target period before (in the first period,
//! before anything could be learnt, by what it gets from the ideal then):
//! the split of a policy that knew every pod's ideal rate but, like any
//! pod that asks once a period, learnt it as the last period's average. A
//! pod whose part is more than its work leaves the rest to the others by
//! the same split; what no pod with a part can take goes to the pods with
//! work left, in proportion to it, as a pod that runs out asks at once.
//! Each pod's work is served oldest first from its own queue, and work
//! that has waited the workload's `max_wait` gives up, as it does at the
//! pods and at the ideal.
//!
//! So it admits what the ideal admits, up to the tokens its bucket keeps
//! for work that is not there, and only the split is late: after a change
//! of demand, its allocation follows a period behind. It runs on the
//! ideal's record and needs no bucket of its own: its level is the
//! ideal's. The goals judge a policy against it where the ideal itself is
//! out of reach of any once-a-period protocol ([`crate::check`]).
//!
//! It runs without the workload's faults. [`simulate_delayed_under_outages`]
//! runs it through the workload's outages as a protocol that never fails
//! open must: while the server is down no pod learns anything, so each
//! serves its work from its part of the refill rate (the parts sum to
//! `R`) and from its part of what the bucket held when the outage began
//! (as if handed out before), split once for the whole outage
//! ([`OutageSplit`]); a part its pod has no work for is lost to the
//! others, and the tokens nobody drew stay in the bucket for afterwards,
//! up to the burst. It shows what the outages alone cost the best
//! protocol like ours; the checks do not judge by it.

use std::time::Duration;

use tollgate_core::global_bucket;

use super::{IdealTick, Queue};
use crate::record::Record;
use crate::workload::{LimitsSpec, Workload};

/// The delayed ideal's run of `workload`, under `limits`, from the
/// `ideal`'s.
pub fn simulate_delayed(workload: &Workload, limits: &LimitsSpec, ideal: &Record) -> Record {
    simulate(workload, limits, ideal, None)
}

/// How the delayed ideal splits the tokens of an outage between its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutageSplit {
    /// As the pods' fallback rates are split
    /// ([`global_bucket::fallback_fraction`]), from the shares learnt
    /// before the outage: what a pod can know.
    Fallback,
    /// By what the ideal gave each pod over the outage: a split no
    /// protocol can know when the server goes down, so a bound on every
    /// protocol whose pods' fallback rates sum to the refill rate.
    Foresight,
}

/// The delayed ideal's run through `workload`'s outages, their tokens
/// split by `split` (the module's doc).
pub fn simulate_delayed_under_outages(
    workload: &Workload,
    limits: &LimitsSpec,
    ideal: &Record,
    split: OutageSplit,
) -> Record {
    simulate(workload, limits, ideal, Some(split))
}

fn simulate(
    workload: &Workload,
    limits: &LimitsSpec,
    ideal: &Record,
    outages: Option<OutageSplit>,
) -> Record {
    let sample = ideal.sample_secs;
    let period = workload.client.config().target_request_period.as_secs_f64();
    let samples = ((period / sample).round() as usize).max(1);
    let max_wait = workload.max_wait.as_secs_f64();
    let burst = limits.burst_limit;
    let pods = ideal.pods();
    let mut out = Record::new(pods, sample, max_wait);
    out.pod_minutes = ideal.pod_minutes;
    // One queue per pod: the ideal's queue, each arrival one pod's.
    let mut queues: Vec<Queue> = (0..pods).map(|_| Queue::default()).collect();
    let mut learnt = vec![0.0; pods];
    let mut demand = vec![0.0; pods];
    let mut admitted = vec![0.0; pods];
    let mut carry = 0.0;
    // While the server is down: each pod's part of the refill per sample,
    // and of what the bucket held when it went down, not yet drawn.
    let mut frozen: Option<(Vec<f64>, Vec<f64>)> = None;
    for (k, &now) in ideal.times.iter().enumerate() {
        let mut supply = carry;
        for p in 0..pods {
            demand[p] = ideal.demand[p][k];
            queues[p].push(now, vec![(p, demand[p])]);
            supply += ideal.admitted[p][k];
            learnt[p] = if k < samples {
                ideal.admitted[p][k]
            } else {
                ideal.admitted[p][k - samples..k].iter().sum()
            };
        }
        let work: Vec<f64> = queues.iter().map(Queue::waiting).collect();
        let down = |j: usize| {
            workload.outage_at(Duration::from_secs_f64(
                (ideal.times[j] - sample / 2.0).max(0.0),
            ))
        };
        let outage = outages.filter(|_| down(k));
        if outage.is_none() {
            frozen = None;
        }
        let parts = if let Some(how) = outage {
            let (rates, held) = frozen.get_or_insert_with(|| {
                let fractions: Vec<f64> = match how {
                    OutageSplit::Fallback => {
                        let total: f64 = learnt.iter().sum();
                        let live = u32::try_from(pods).unwrap_or(u32::MAX);
                        learnt
                            .iter()
                            .map(|&l| {
                                let share = if total > 0.0 { l / total } else { 0.0 };
                                global_bucket::fallback_fraction(share, live)
                            })
                            .collect()
                    }
                    OutageSplit::Foresight => {
                        let end = (k..ideal.times.len())
                            .find(|&j| !down(j))
                            .unwrap_or(ideal.times.len());
                        let given: Vec<f64> = (0..pods)
                            .map(|p| ideal.admitted[p][k..end].iter().sum())
                            .collect();
                        let total: f64 = given.iter().sum();
                        given
                            .iter()
                            .map(|&g| {
                                if total > 0.0 {
                                    g / total
                                } else {
                                    1.0 / pods as f64
                                }
                            })
                            .collect()
                    }
                };
                let level = k
                    .checked_sub(1)
                    .and_then(|j| ideal.level.get(j))
                    .copied()
                    .unwrap_or(0.0)
                    .max(0.0);
                let rates = fractions
                    .iter()
                    .map(|f| f * limits.refill_rate * sample)
                    .collect();
                let held = fractions.iter().map(|f| f * level).collect();
                (rates, held)
            });
            let parts: Vec<f64> = (0..pods)
                .map(|p| (rates[p] + held[p]).min(work[p]))
                .collect();
            for p in 0..pods {
                held[p] -= (parts[p] - rates[p]).max(0.0);
            }
            parts
        } else {
            let mut parts = split(supply, &learnt, &work);
            let left = work
                .iter()
                .zip(&parts)
                .map(|(w, g)| w - g)
                .collect::<Vec<f64>>();
            let rest = supply - parts.iter().sum::<f64>();
            let waiting: f64 = left.iter().sum();
            if rest > 0.0 && waiting > 0.0 {
                let fraction = (rest / waiting).min(1.0);
                for (part, l) in parts.iter_mut().zip(&left) {
                    *part += l * fraction;
                }
            }
            parts
        };
        let given: f64 = parts.iter().sum();
        let mut tick = IdealTick::default();
        for (queue, &part) in queues.iter_mut().zip(&parts) {
            let mut part = part;
            queue.serve(&mut part, now, &mut tick);
            queue.expire(now, max_wait, &mut tick);
        }
        for (p, tokens, wait) in tick.admitted {
            admitted[p] += tokens;
            out.waits.record(wait, tokens);
        }
        out.timed_out += tick.timed_out.iter().map(|&(_, t)| t).sum::<f64>();
        let level = ideal.level.get(k).copied().unwrap_or(0.0);
        carry = (supply - given).clamp(0.0, (burst - level).max(0.0));
        out.push_sample(now, &mut demand, &mut admitted, level);
    }
    // Work still queued at the end is refused at shutdown, as the pods'.
    out.timed_out += queues.iter().map(Queue::waiting).sum::<f64>();
    out
}

/// `supply` split in proportion to `weights`, no part above its `cap`:
/// what a capped part leaves goes to the others, by their weights. Parts
/// of weight 0 get nothing; so what the capped parts cannot take, and
/// what no weight asks for, is left over.
fn split(supply: f64, weights: &[f64], caps: &[f64]) -> Vec<f64> {
    let mut parts = vec![0.0; weights.len()];
    // Filled in order of cap per weight: each part that its cap limits
    // below the level shared by the rest is filled to its cap.
    let mut order: Vec<usize> = (0..weights.len())
        .filter(|&p| weights[p] > 0.0 && caps[p] > 0.0)
        .collect();
    order.sort_by(|&a, &b| (caps[a] / weights[a]).total_cmp(&(caps[b] / weights[b])));
    let mut left = supply;
    let mut weight: f64 = order.iter().map(|&p| weights[p]).sum();
    for (i, &p) in order.iter().enumerate() {
        let level = left / weight;
        if caps[p] <= level * weights[p] {
            parts[p] = caps[p];
            left -= caps[p];
            weight -= weights[p];
        } else {
            for &q in &order[i..] {
                parts[q] = level * weights[q];
            }
            break;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(max_wait: &str) -> Workload {
        Workload::parse(&format!(
            "name: t\nduration: 40s\nsample: 1s\nmax_wait: {max_wait}\nlimits: {{ refill_rate: 10, burst_limit: 0 }}\npods:\n  - count: 2\n    demand: [ {{ constant: 10 }} ]\n",
        ))
        .expect("valid")
    }

    fn limits() -> LimitsSpec {
        LimitsSpec {
            refill_rate: 10.0,
            burst_limit: 0.0,
            initial_tokens: None,
            budget: None,
        }
    }

    /// A record of pods asking `demand` and given `admitted`, per 1 s
    /// sample (`[pod][sample]`).
    fn ideal(demand: &[Vec<f64>], admitted: &[Vec<f64>]) -> Record {
        let mut r = Record::new(demand.len(), 1.0, 60.0);
        for k in 0..demand[0].len() {
            let mut d: Vec<f64> = demand.iter().map(|s| s[k]).collect();
            let mut a: Vec<f64> = admitted.iter().map(|s| s[k]).collect();
            r.push_sample((k + 1) as f64, &mut d, &mut a, 0.0);
        }
        r
    }

    #[test]
    fn a_split_fills_capped_parts_and_shares_the_rest_by_weight() {
        let parts = split(100.0, &[1.0, 1.0, 2.0], &[10.0, 100.0, 100.0]);
        assert_eq!(parts, vec![10.0, 30.0, 60.0]);
        // Nothing for a weight of 0, and what every cap leaves is left.
        let parts = split(100.0, &[1.0, 0.0, 1.0], &[20.0, 50.0, 30.0]);
        assert_eq!(parts, vec![20.0, 0.0, 30.0]);
    }

    #[test]
    fn the_split_follows_the_ideal_a_period_late_and_the_total_at_once() {
        // Both pods always want more than the 10/s the ideal admits; the
        // ideal gives it all to the first for 20 s, then to the second.
        let demand = vec![vec![20.0; 40]; 2];
        let first: Vec<f64> = (0..40).map(|k| if k < 20 { 10.0 } else { 0.0 }).collect();
        let second: Vec<f64> = first.iter().map(|a| 10.0 - a).collect();
        let r = simulate_delayed(
            &workload("60s"),
            &limits(),
            &ideal(&demand, &[first, second]),
        );
        // Learnt over the target period (10 s) before: all to the first
        // until 20 s, then moving by a tenth a second.
        assert_eq!(r.admitted[0][..21], [10.0; 21]);
        assert!((r.admitted[0][25] - 5.0).abs() < 1e-9);
        assert_eq!(r.admitted[1][30..], [10.0; 10]);
        // The total is the ideal's at every sample.
        assert!(r.admitted_total().iter().all(|&t| (t - 10.0).abs() < 1e-9));
    }

    #[test]
    fn a_part_its_pod_has_no_work_for_goes_to_a_pod_with_work() {
        // The ideal gave the first pod 10/s; it stops asking at 10 s and
        // the second starts: the second gets the tokens at once.
        let d0: Vec<f64> = (0..20).map(|k| if k < 10 { 10.0 } else { 0.0 }).collect();
        let d1: Vec<f64> = d0.iter().map(|d| 10.0 - d).collect();
        let r = simulate_delayed(
            &workload("60s"),
            &limits(),
            &ideal(&[d0.clone(), d1.clone()], &[d0, d1]),
        );
        assert_eq!(r.admitted[1][10..], [10.0; 10]);
        assert_eq!(r.timed_out, 0.0);
    }

    #[test]
    fn through_an_outage_each_pod_keeps_its_split_and_no_more() {
        // The ideal gives both pods 5/s for 20 s, then everything to the
        // second; the server is down from 20 s to 30 s. The split stays
        // even through the outage, the first pod's half unused and not
        // lent, and follows the ideal a period late once it is over.
        let mut w = workload("60s");
        w.outages.push(crate::workload::Outage {
            start: Duration::from_secs(20),
            duration: Duration::from_secs(10),
        });
        let d0: Vec<f64> = (0..40).map(|k| if k < 20 { 5.0 } else { 0.0 }).collect();
        let d1: Vec<f64> = d0.iter().map(|d| 10.0 - d).collect();
        let ideal = ideal(&[d0.clone(), d1.clone()], &[d0, d1]);
        let down = simulate_delayed_under_outages(&w, &limits(), &ideal, OutageSplit::Fallback);
        assert!(
            down.admitted[1][20..30]
                .iter()
                .all(|&a| (a - 5.0).abs() < 1e-9)
        );
        assert!(down.admitted[0][20..30].iter().all(|&a| a == 0.0));
        let up = simulate_delayed(&w, &limits(), &ideal);
        assert!(
            up.admitted[1][20..30]
                .iter()
                .all(|&a| (a - 10.0).abs() < 1e-9)
        );
        // What the second pod could not get waits and, with no burst to
        // draw on, is served at the refill rate once the server is back.
        let total = |r: &Record| r.admitted_total().iter().sum::<f64>();
        assert!(total(&down) < total(&up));
        // Split by what the ideal gave over the outage, nothing is lost.
        let foresight =
            simulate_delayed_under_outages(&w, &limits(), &ideal, OutageSplit::Foresight);
        assert_eq!(foresight.admitted, up.admitted);
    }

    #[test]
    fn an_outage_s_pods_draw_their_part_of_what_the_bucket_held() {
        // Two pods asking 10/s each of a 10/s bucket that holds 40 tokens
        // when the server goes down at 20 s for 10 s: each pod runs on
        // 5/s plus its 20 held tokens.
        let mut w = workload("60s");
        w.outages.push(crate::workload::Outage {
            start: Duration::from_secs(20),
            duration: Duration::from_secs(10),
        });
        let demand = vec![vec![10.0; 40]; 2];
        let mut r = ideal(&demand, &[vec![5.0; 40], vec![5.0; 40]]);
        r.level = vec![40.0; 40];
        let mut limits = limits();
        limits.burst_limit = 40.0;
        let down = simulate_delayed_under_outages(&w, &limits, &r, OutageSplit::Fallback);
        for p in 0..2 {
            let outage: f64 = down.admitted[p][20..30].iter().sum();
            assert!((outage - 70.0).abs() < 1e-9, "pod {p}: {outage}");
        }
    }

    #[test]
    fn work_that_waits_max_wait_gives_up() {
        // 100 tokens asked at once, none given by the ideal: they give up
        // after 3 s, and nothing is left to refuse at the end.
        let mut demand = vec![0.0; 20];
        demand[0] = 100.0;
        let r = simulate_delayed(
            &workload("3s"),
            &limits(),
            &ideal(&[demand, vec![0.0; 20]], &[vec![0.0; 20], vec![0.0; 20]]),
        );
        assert_eq!(r.admitted_total().iter().sum::<f64>(), 0.0);
        assert_eq!(r.timed_out, 100.0);
    }
}
