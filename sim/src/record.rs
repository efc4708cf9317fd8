//! What a run records: per-pod series at the workload's sample resolution,
//! the bucket level, and the distribution of waits. An organisation's run
//! records each tenant apart ([`TreeRecord`]), so that every tenant, and
//! every organisation as the sum of its tenants, is measured as a tenant
//! is.

use serde::Serialize;

/// Token-weighted distribution of how long admitted work waited.
///
/// One bin per millisecond up to the workload's `max_wait`: waits are
/// bounded by it, and a millisecond is finer than any tick.
#[derive(Clone, Debug)]
pub struct WaitHistogram {
    bins: Vec<f64>,
    total: f64,
    waited: f64,
    max: f64,
}

/// Percentiles of a [`WaitHistogram`], in seconds, weighted by tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WaitSummary {
    /// Share of admitted tokens that waited at all (1 ms or more).
    pub throttled: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

const BIN_SECS: f64 = 0.001;

impl WaitHistogram {
    pub fn new(max_wait_secs: f64) -> WaitHistogram {
        let bins = (max_wait_secs / BIN_SECS).ceil() as usize + 2;
        WaitHistogram {
            bins: vec![0.0; bins],
            total: 0.0,
            waited: 0.0,
            max: 0.0,
        }
    }

    pub fn record(&mut self, wait_secs: f64, tokens: f64) {
        if tokens.is_nan() || tokens <= 0.0 {
            return;
        }
        let wait = wait_secs.max(0.0);
        let bin = ((wait / BIN_SECS) as usize).min(self.bins.len() - 1);
        self.bins[bin] += tokens;
        self.total += tokens;
        if bin > 0 {
            self.waited += tokens;
        }
        self.max = self.max.max(wait);
    }

    /// Adds `other`'s waits (of the same `max_wait`) to these.
    pub fn merge(&mut self, other: &WaitHistogram) {
        for (bin, more) in self.bins.iter_mut().zip(&other.bins) {
            *bin += more;
        }
        self.total += other.total;
        self.waited += other.waited;
        self.max = self.max.max(other.max);
    }

    pub fn summary(&self) -> WaitSummary {
        if self.total <= 0.0 {
            return WaitSummary::default();
        }
        let quantile = |q: f64| {
            let target = q * self.total;
            let mut seen = 0.0;
            for (i, weight) in self.bins.iter().enumerate() {
                seen += weight;
                if seen >= target && *weight > 0.0 {
                    return i as f64 * BIN_SECS;
                }
            }
            self.max
        };
        WaitSummary {
            throttled: self.waited / self.total,
            p50: quantile(0.5),
            p90: quantile(0.9),
            p99: quantile(0.99),
            max: self.max,
        }
    }
}

/// One run (of a policy, or of the ideal bucket) as recorded.
#[derive(Clone, Debug)]
pub struct Record {
    /// Seconds per sample.
    pub sample_secs: f64,
    /// End of each sample interval, seconds.
    pub times: Vec<f64>,
    /// `[pod][sample]`: tokens the pod's work asked for in the interval.
    pub demand: Vec<Vec<f64>>,
    /// `[pod][sample]`: tokens admitted to the pod's work in the interval.
    pub admitted: Vec<Vec<f64>>,
    /// Tokens in the (global or ideal) bucket at the end of each interval.
    pub level: Vec<f64>,
    pub waits: WaitHistogram,
    /// Tokens of work that gave up waiting, or was refused at shutdown.
    pub timed_out: f64,
    /// Token-bucket requests the server answered (retries included).
    pub server_requests: u64,
    /// Requests that failed at the pod (lost, timed out, server down).
    pub failed_requests: u64,
    /// Pod-minutes of pods running (between joining and leaving).
    pub pod_minutes: f64,
    /// Tokens pods gave themselves while on fallback.
    pub fallback_tokens: f64,
    /// What the outages allow beyond the stated bound, in tokens: per
    /// outage, `(F − R)⁺ · L + n · A`, with `F` the most the pods' fallback
    /// rates summed to while it lasted (a pod not yet answered counts at
    /// its initial allowance per target period), `L` its length, and `n ·
    /// A` the initial allowances of the pods that started during it.
    pub outage_excess: f64,
    /// With a budget: where its cycle stood at the end.
    pub budget: Option<BudgetOutcome>,
}

/// A simulated budget's cycle at the end of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetOutcome {
    pub amount: f64,
    /// Tokens the server granted in the cycle.
    pub granted: f64,
    /// Granted plus fallback tokens charged: what the cap holds.
    pub spend: f64,
    /// Seconds from the start when the spend reached the amount.
    pub reached_at: Option<f64>,
}

impl Record {
    pub fn new(pods: usize, sample_secs: f64, max_wait_secs: f64) -> Record {
        Record {
            sample_secs,
            times: Vec::new(),
            demand: vec![Vec::new(); pods],
            admitted: vec![Vec::new(); pods],
            level: Vec::new(),
            waits: WaitHistogram::new(max_wait_secs),
            timed_out: 0.0,
            server_requests: 0,
            failed_requests: 0,
            pod_minutes: 0.0,
            fallback_tokens: 0.0,
            outage_excess: 0.0,
            budget: None,
        }
    }

    /// Closes a sample interval ending at `t`.
    pub fn push_sample(&mut self, t: f64, demand: &mut [f64], admitted: &mut [f64], level: f64) {
        self.times.push(t);
        for (series, value) in self.demand.iter_mut().zip(demand.iter_mut()) {
            series.push(std::mem::take(value));
        }
        for (series, value) in self.admitted.iter_mut().zip(admitted.iter_mut()) {
            series.push(std::mem::take(value));
        }
        self.level.push(level);
    }

    pub fn pods(&self) -> usize {
        self.admitted.len()
    }

    /// Total admitted per sample, all pods together.
    pub fn admitted_total(&self) -> Vec<f64> {
        sum_rows(&self.admitted, self.times.len())
    }

    pub fn demand_total(&self) -> Vec<f64> {
        sum_rows(&self.demand, self.times.len())
    }
}

/// A run of an organisation (or of its ideal): one record per tenant,
/// and every bucket's level.
#[derive(Clone, Debug)]
pub struct TreeRecord {
    /// Per tenant, in the tree's order: its node in the tree
    /// ([`crate::workload::Tree`]) and its pods' record (their level that
    /// of the tenant's bucket).
    pub tenants: Vec<(usize, Record)>,
    /// Per node of the tree: its bucket's level at each sample.
    pub levels: Vec<Vec<f64>>,
    /// Per node: the draws its bucket made on its organisation's (0 for
    /// the top, and for the ideal, which draws continuously).
    pub draws: Vec<u64>,
}

impl TreeRecord {
    /// The record of `node`: its tenants' records put together (pods in
    /// the tree's order, counts summed, waits merged) with its own
    /// bucket's level.
    pub fn scope(&self, tree: &crate::workload::Tree, node: usize) -> Record {
        let parts: Vec<&Record> = self
            .tenants
            .iter()
            .filter(|(t, _)| tree.is_below(*t, node))
            .map(|(_, r)| r)
            .collect();
        let mut out = match parts.first() {
            Some(first) => Record {
                times: first.times.clone(),
                ..Record::new(0, first.sample_secs, 0.0)
            },
            None => Record::new(0, 1.0, 0.0),
        };
        if let Some(first) = parts.first() {
            out.waits = WaitHistogram {
                bins: vec![0.0; first.waits.bins.len()],
                total: 0.0,
                waited: 0.0,
                max: 0.0,
            };
        }
        for part in parts {
            out.demand.extend(part.demand.iter().cloned());
            out.admitted.extend(part.admitted.iter().cloned());
            out.waits.merge(&part.waits);
            out.timed_out += part.timed_out;
            out.server_requests += part.server_requests;
            out.failed_requests += part.failed_requests;
            out.pod_minutes += part.pod_minutes;
            out.fallback_tokens += part.fallback_tokens;
        }
        out.level = self.levels.get(node).cloned().unwrap_or_default();
        out
    }
}

fn sum_rows(rows: &[Vec<f64>], len: usize) -> Vec<f64> {
    let mut total = vec![0.0; len];
    for row in rows {
        for (t, v) in total.iter_mut().zip(row) {
            *t += v;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_percentiles_are_weighted_by_tokens() {
        let mut h = WaitHistogram::new(10.0);
        h.record(0.0, 90.0);
        h.record(2.0, 9.0);
        h.record(5.0, 1.0);
        let s = h.summary();
        assert_eq!(s.p50, 0.0);
        assert!((s.p99 - 2.0).abs() < 1e-9, "{s:?}");
        assert_eq!(s.max, 5.0);
        assert!((s.throttled - 0.1).abs() < 1e-12);
    }
}
