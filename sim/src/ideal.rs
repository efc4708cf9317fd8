//! The ideal reference: one token bucket, instantly synchronised, serving
//! every pod's demand.
//!
//! It is what the distributed bucket tries to be. Demand waits in one queue
//! for the whole tenant and is served oldest first; demand that arrived in
//! the same tick shares what is available in proportion to its size. Work
//! waiting longer than the workload's `max_wait` gives up, as it does at the
//! pods. The refill is `refill_rate` per second; what demand leaves of it
//! is kept up to `burst_limit` (a bucket of burst 0 admits its refill rate
//! to demand that waits for it, and holds nothing).
//!
//! An organisation's reference is [`tree::IdealTree`]: the organisation's
//! bucket split between its members instantly by the server's rule, each
//! tenant serving its own queue as this bucket does.

use std::collections::VecDeque;

use crate::workload::{LimitsSpec, Workload};

pub mod delayed;
pub mod tree;

/// Demand of one tick still waiting: `(pod, tokens)` pairs.
#[derive(Debug)]
struct Arrival {
    at: f64,
    remaining: Vec<(usize, f64)>,
    total: f64,
}

/// Demand waiting for tokens, oldest first: one ideal bucket's queue.
#[derive(Debug, Default)]
struct Queue {
    arrivals: VecDeque<Arrival>,
}

impl Queue {
    /// Demand of the pods in `gone` gives up.
    fn drop_gone(&mut self, gone: &[usize], out: &mut IdealTick) {
        if gone.is_empty() {
            return;
        }
        for arrival in &mut self.arrivals {
            arrival.remaining.retain(|&(pod, tokens)| {
                if gone.contains(&pod) {
                    out.timed_out.push((pod, tokens));
                    false
                } else {
                    true
                }
            });
            arrival.total = arrival.remaining.iter().map(|&(_, t)| t).sum();
        }
        self.arrivals.retain(|a| !a.remaining.is_empty());
    }

    /// Queues the demand of a tick at `now`.
    fn push(&mut self, now: f64, arrivals: Vec<(usize, f64)>) {
        let total: f64 = arrivals.iter().map(|&(_, t)| t).sum();
        if total > 0.0 {
            self.arrivals.push_back(Arrival {
                at: now,
                remaining: arrivals,
                total,
            });
        }
    }

    /// Serves the queue from `tokens`, oldest first, ties in proportion.
    fn serve(&mut self, tokens: &mut f64, now: f64, out: &mut IdealTick) {
        while let Some(front) = self.arrivals.front_mut() {
            if *tokens <= 0.0 {
                break;
            }
            let wait = now - front.at;
            if *tokens >= front.total {
                *tokens -= front.total;
                for &(pod, tokens) in &front.remaining {
                    out.admitted.push((pod, tokens, wait));
                }
                self.arrivals.pop_front();
            } else {
                // Ties split in proportion to what each pod waits for.
                let fraction = *tokens / front.total;
                for (pod, tokens) in &mut front.remaining {
                    let served = *tokens * fraction;
                    *tokens -= served;
                    out.admitted.push((*pod, served, wait));
                }
                front.total -= *tokens;
                *tokens = 0.0;
            }
        }
    }

    /// Demand that has waited `max_wait` at `now` gives up.
    fn expire(&mut self, now: f64, max_wait: f64, out: &mut IdealTick) {
        while let Some(front) = self.arrivals.front() {
            // A tick's demand gives up once it has waited `max_wait`; the
            // pods cancel at the same age.
            if now - front.at + 1e-9 < max_wait {
                break;
            }
            if let Some(expired) = self.arrivals.pop_front() {
                out.timed_out.extend(expired.remaining);
            }
        }
    }

    /// Tokens of demand waiting.
    fn waiting(&self) -> f64 {
        self.arrivals.iter().map(|a| a.total).sum()
    }
}

/// The ideal bucket between ticks.
#[derive(Debug)]
pub struct IdealBucket {
    refill_rate: f64,
    burst_limit: f64,
    max_wait: f64,
    tokens: f64,
    last: f64,
    queue: Queue,
}

/// What one tick of the ideal bucket did.
#[derive(Debug, Default)]
pub struct IdealTick {
    /// `(pod, tokens admitted, seconds they waited)`.
    pub admitted: Vec<(usize, f64, f64)>,
    /// `(pod, tokens that gave up)`.
    pub timed_out: Vec<(usize, f64)>,
}

impl IdealBucket {
    pub fn new(workload: &Workload, limits: &LimitsSpec) -> IdealBucket {
        IdealBucket {
            refill_rate: limits.refill_rate,
            burst_limit: limits.burst_limit,
            max_wait: workload.max_wait.as_secs_f64(),
            tokens: limits.initial(),
            last: 0.0,
            queue: Queue::default(),
        }
    }

    /// Tokens in the bucket as of the last tick.
    pub fn tokens(&self) -> f64 {
        self.tokens
    }

    /// Advances to `now` (seconds), adds this tick's `arrivals`, serves what
    /// the bucket allows and drops what waited too long. Pods in `gone` have
    /// left: their waiting demand gives up.
    pub fn tick(&mut self, now: f64, arrivals: Vec<(usize, f64)>, gone: &[usize]) -> IdealTick {
        let mut out = IdealTick::default();
        // The refill since the last tick flowed to demand that waited or
        // arrived meanwhile as it came; only what is left over is capped at
        // the burst (so a bucket of burst 0 still admits its refill rate).
        let ceiling = self.tokens.max(self.burst_limit);
        if self.tokens < self.burst_limit || self.burst_limit == 0.0 {
            let elapsed = (now - self.last).max(0.0);
            self.tokens += self.refill_rate * elapsed;
        }
        self.last = now;
        self.queue.drop_gone(gone, &mut out);
        self.queue.push(now, arrivals);
        self.queue.serve(&mut self.tokens, now, &mut out);
        self.tokens = self.tokens.min(ceiling);
        self.queue.expire(now, self.max_wait, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(rate: f64, burst: f64) -> IdealBucket {
        let workload = Workload::parse(&format!(
            "name: t\nduration: 60s\nmax_wait: 5s\nlimits: {{ refill_rate: {rate}, burst_limit: {burst} }}\npods: [ {{ demand: [ {{ constant: 1 }} ] }} ]\n"
        ))
        .expect("valid");
        IdealBucket::new(&workload, workload.limits.as_ref().expect("limits"))
    }

    fn admitted_by(tick: &IdealTick, pod: usize) -> f64 {
        tick.admitted
            .iter()
            .filter(|a| a.0 == pod)
            .map(|a| a.1)
            .sum()
    }

    #[test]
    fn serves_at_once_while_tokens_last_then_at_the_refill_rate() {
        let mut b = bucket(10.0, 100.0);
        let t = b.tick(0.0, vec![(0, 60.0)], &[]);
        assert_eq!(admitted_by(&t, 0), 60.0);
        let t = b.tick(1.0, vec![(0, 60.0)], &[]);
        // 40 left + 10 refilled.
        assert_eq!(admitted_by(&t, 0), 50.0);
        let t = b.tick(2.0, vec![], &[]);
        assert_eq!(admitted_by(&t, 0), 10.0);
        assert_eq!(t.admitted[0].2, 1.0, "waited a second");
    }

    #[test]
    fn a_bucket_of_burst_zero_admits_its_refill_rate_and_holds_nothing() {
        let mut b = bucket(10.0, 0.0);
        let t = b.tick(0.0, vec![(0, 30.0)], &[]);
        assert_eq!(admitted_by(&t, 0), 0.0);
        let t = b.tick(1.0, vec![], &[]);
        assert_eq!(admitted_by(&t, 0), 10.0);
        // Nothing waits: the refill is not kept.
        let t = b.tick(2.0, vec![], &[]);
        assert_eq!(admitted_by(&t, 0), 10.0);
        let _ = b.tick(3.0, vec![], &[]);
        assert_eq!(b.tokens(), 0.0);
        let t = b.tick(4.0, vec![(0, 5.0)], &[]);
        assert_eq!(admitted_by(&t, 0), 5.0);
        assert_eq!(b.tokens(), 0.0);
    }

    #[test]
    fn oldest_first_and_ties_split_in_proportion() {
        let mut b = bucket(10.0, 100.0);
        b.tick(0.0, vec![(0, 100.0)], &[]);
        b.tick(1.0, vec![(0, 30.0), (1, 10.0)], &[]);
        let t = b.tick(2.0, vec![(2, 5.0)], &[]);
        // The refill of each second goes to the older arrival, split 3:1;
        // the newer one waits.
        assert!((admitted_by(&t, 0) - 7.5).abs() < 1e-9);
        assert!((admitted_by(&t, 1) - 2.5).abs() < 1e-9);
        assert_eq!(admitted_by(&t, 2), 0.0);
    }

    #[test]
    fn refill_pauses_at_the_burst_limit_and_old_demand_gives_up() {
        let mut b = bucket(10.0, 100.0);
        b.tick(100.0, vec![], &[]);
        assert_eq!(b.tokens(), 100.0);
        b.tick(100.0, vec![(0, 1000.0)], &[]);
        let mut timed_out = 0.0;
        for s in 1..=5 {
            let t = b.tick(100.0 + f64::from(s), vec![], &[]);
            timed_out += t.timed_out.iter().map(|x| x.1).sum::<f64>();
        }
        // 100 at once + 50 over 5 s; the rest gave up at 5 s.
        assert!((timed_out - 850.0).abs() < 1e-9, "{timed_out}");
    }
}
