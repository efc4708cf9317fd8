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

use super::{IdealTick, Queue};
use crate::record::Record;
use crate::workload::{LimitsSpec, Workload};

/// The delayed ideal's run of `workload`, under `limits`, from the
/// `ideal`'s.
pub fn simulate_delayed(workload: &Workload, limits: &LimitsSpec, ideal: &Record) -> Record {
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
