//! The ideal token bucket: one bucket, instantly synchronised, serving
//! every pod's demand.
//!
//! It is what the distributed bucket tries to be, and the reference both
//! the simulator (`tollgate-sim`) and the impact preview ([`crate::impact`])
//! measure against. Demand waits in one queue for the whole tenant and is
//! served oldest first; demand that arrived in the same tick shares what is
//! available in proportion to its size. Work waiting longer than `max_wait`
//! gives up, as it does at the pods. The refill is `refill_rate` per second;
//! what demand leaves of it is kept up to `burst_limit` (a bucket of burst 0
//! admits its refill rate to demand that waits for it, and holds nothing).
//! Time is seconds, passed in.

use std::collections::VecDeque;

/// Demand of one tick still waiting: `(pod, tokens)` pairs.
#[derive(Debug)]
struct Arrival {
    at: f64,
    remaining: Vec<(usize, f64)>,
    total: f64,
}

/// Demand waiting for tokens, oldest first: one ideal bucket's queue.
#[derive(Debug, Default)]
pub struct Queue {
    arrivals: VecDeque<Arrival>,
}

impl Queue {
    /// Demand of the pods in `gone` gives up.
    pub fn drop_gone(&mut self, gone: &[usize], out: &mut IdealTick) {
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
    pub fn push(&mut self, now: f64, arrivals: Vec<(usize, f64)>) {
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
    pub fn serve(&mut self, tokens: &mut f64, now: f64, out: &mut IdealTick) {
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
    pub fn expire(&mut self, now: f64, max_wait: f64, out: &mut IdealTick) {
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
    pub fn waiting(&self) -> f64 {
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
    /// A bucket refilling at `refill_rate` tokens per second up to
    /// `burst_limit`, holding `initial_tokens` at time 0, whose demand gives
    /// up after waiting `max_wait` seconds.
    pub fn new(
        refill_rate: f64,
        burst_limit: f64,
        initial_tokens: f64,
        max_wait: f64,
    ) -> IdealBucket {
        IdealBucket {
            refill_rate,
            burst_limit,
            max_wait,
            tokens: initial_tokens,
            last: 0.0,
            queue: Queue::default(),
        }
    }

    /// Tokens in the bucket as of the last tick.
    pub fn tokens(&self) -> f64 {
        self.tokens
    }

    /// From now on, refill at `refill_rate` up to `burst_limit`, holding
    /// `tokens` (a budget's limit reached: the baseline, or nothing). What
    /// waits keeps waiting.
    pub fn reconfigure(&mut self, refill_rate: f64, burst_limit: f64, tokens: f64) {
        self.refill_rate = refill_rate;
        self.burst_limit = burst_limit;
        self.tokens = tokens;
    }

    /// Holds at most `most` tokens (what a budget has left).
    pub fn cap_tokens(&mut self, most: f64) {
        self.tokens = self.tokens.min(most.max(0.0));
    }

    /// Nothing waits.
    pub fn is_idle(&self) -> bool {
        self.queue.arrivals.is_empty()
    }

    /// Demand arriving evenly at `rate` tokens per second from the last
    /// tick to `now`, when nothing waits and the bucket holds enough
    /// throughout: all of it admitted as it comes, without waiting, in one
    /// step (the level moves by the refill less the demand, kept up to the
    /// burst). Returns false, changing nothing, when something waits or the
    /// bucket would run dry: tick through that span instead. A replay of
    /// long quiet spans costs a step each this way.
    pub fn flow(&mut self, now: f64, rate: f64) -> bool {
        let elapsed = (now - self.last).max(0.0);
        if !self.is_idle() || rate < 0.0 {
            return false;
        }
        let net = (self.refill_rate - rate) * elapsed;
        let tokens = if net >= 0.0 {
            // Rising: refill pauses at the burst (a fuller bucket only
            // drains towards it).
            (self.tokens + net).min(self.tokens.max(self.burst_limit))
        } else {
            self.tokens + net
        };
        if tokens < 0.0 {
            return false;
        }
        self.tokens = tokens;
        self.last = now;
        true
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
        IdealBucket::new(rate, burst, burst, 5.0)
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
    fn flow_admits_what_the_bucket_covers_in_one_step_and_nothing_else() {
        let mut b = bucket(10.0, 100.0);
        // 15/s for 10 s: 100 + 100 refilled covers 150.
        assert!(b.flow(10.0, 15.0));
        assert!((b.tokens() - 50.0).abs() < 1e-9);
        // 20/s for 10 s would need 200 of 50 + 100.
        assert!(!b.flow(20.0, 20.0));
        assert!((b.tokens() - 50.0).abs() < 1e-9, "unchanged");
        // Under the refill rate the level rises to the burst and stays.
        assert!(b.flow(100.0, 5.0));
        assert_eq!(b.tokens(), 100.0);
        // Nothing flows past waiting demand.
        b.tick(101.0, vec![(0, 1000.0)], &[]);
        assert!(!b.flow(102.0, 0.0));
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
