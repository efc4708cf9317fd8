//! What work costs, in request units (tokens).
//!
//! A pod gates its work on tokens, but its work is reads, writes, CPU and
//! bytes sent. The cost model turns one into the other. Its defaults are
//! CockroachDB's, so a tenant moving from CockroachDB Serverless sees the same
//! numbers.
//!
//! What can be known before a request (its kind, how many requests a batch
//! holds, the bytes it writes) is charged before it is sent, and gates it.
//! What is only known afterwards (bytes read, CPU used, bytes sent to the
//! user) is charged after the fact and may put the pod's bucket in debt.

use serde::{Deserialize, Serialize};

use crate::consumption::Consumption;
use crate::validate::{self, InvalidInput, MAX_TOKENS, to_micros};

const MIB: f64 = 1024.0 * 1024.0;

/// Request units per unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Per read batch (one round trip carrying read requests).
    pub read_batch: f64,
    /// Per read request in a batch.
    pub read_request: f64,
    /// Per MiB read, charged after the response.
    pub read_payload_per_mib: f64,
    /// Per write batch.
    pub write_batch: f64,
    /// Per write request in a batch.
    pub write_request: f64,
    /// Per MiB written, charged before the request.
    pub write_payload_per_mib: f64,
    /// Per CPU-second used by the pod, charged after the fact.
    pub cpu_per_second: f64,
    /// Per MiB sent to the pod's users, charged after the fact.
    pub egress_per_mib: f64,
}

impl Default for CostModel {
    /// CockroachDB's defaults.
    fn default() -> Self {
        CostModel {
            read_batch: 0.5,
            read_request: 0.125,
            read_payload_per_mib: 16.0,
            write_batch: 1.0,
            write_request: 1.0,
            write_payload_per_mib: 1024.0,
            cpu_per_second: 333.3,
            egress_per_mib: 1024.0,
        }
    }
}

/// One batch of requests a pod is about to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// `requests` reads in one round trip.
    Read { requests: u64 },
    /// `requests` writes carrying `bytes` of payload in one round trip.
    Write { requests: u64, bytes: u64 },
}

impl CostModel {
    /// Checks every coefficient: finite and non-negative.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let fields = [
            ("read_batch", self.read_batch),
            ("read_request", self.read_request),
            ("read_payload_per_mib", self.read_payload_per_mib),
            ("write_batch", self.write_batch),
            ("write_request", self.write_request),
            ("write_payload_per_mib", self.write_payload_per_mib),
            ("cpu_per_second", self.cpu_per_second),
            ("egress_per_mib", self.egress_per_mib),
        ];
        for (field, value) in fields {
            validate::non_negative(field, value, MAX_TOKENS).map_err(|e| e.within("cost_model"))?;
        }
        Ok(())
    }

    /// What a batch costs before it is sent: its request units and counters.
    pub fn before(&self, batch: Batch) -> Consumption {
        match batch {
            Batch::Read { requests } => Consumption {
                request_unit_micros: to_micros(
                    self.read_batch + self.read_request * requests as f64,
                ),
                read_batches: 1,
                read_requests: requests,
                ..Consumption::default()
            },
            Batch::Write { requests, bytes } => Consumption {
                request_unit_micros: to_micros(
                    self.write_batch
                        + self.write_request * requests as f64
                        + self.write_payload_per_mib * bytes as f64 / MIB,
                ),
                write_batches: 1,
                write_requests: requests,
                write_bytes: bytes,
                ..Consumption::default()
            },
        }
    }

    /// What a response costs once it has arrived: the bytes it read.
    pub fn after_read(&self, bytes: u64) -> Consumption {
        Consumption {
            request_unit_micros: to_micros(self.read_payload_per_mib * bytes as f64 / MIB),
            read_bytes: bytes,
            ..Consumption::default()
        }
    }

    /// What CPU time used by the pod costs.
    pub fn cpu(&self, seconds: f64) -> Consumption {
        Consumption {
            request_unit_micros: to_micros(self.cpu_per_second * seconds),
            cpu_micros: to_micros(seconds),
            ..Consumption::default()
        }
    }

    /// What bytes sent to the pod's users cost.
    pub fn egress(&self, bytes: u64) -> Consumption {
        Consumption {
            request_unit_micros: to_micros(self.egress_per_mib * bytes as f64 / MIB),
            egress_bytes: bytes,
            ..Consumption::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_cockroachdbs() {
        let model = CostModel::default();
        // A read batch of 4 requests: 0.5 + 4 × 0.125.
        let read = model.before(Batch::Read { requests: 4 });
        assert_eq!(read.request_units(), 1.0);
        assert_eq!((read.read_batches, read.read_requests), (1, 4));
        // 1 MiB read afterwards: 16 RU.
        assert_eq!(model.after_read(1 << 20).request_units(), 16.0);
        // A write batch of 2 requests and 512 KiB: 1 + 2 + 512.
        let write = model.before(Batch::Write {
            requests: 2,
            bytes: 512 << 10,
        });
        assert_eq!(write.request_units(), 515.0);
        assert_eq!(
            (write.write_batches, write.write_requests, write.write_bytes),
            (1, 2, 512 << 10)
        );
        assert_eq!(model.cpu(3.0).request_units(), 999.9);
        assert_eq!(model.cpu(3.0).cpu_seconds(), 3.0);
        assert_eq!(model.egress(2 << 20).request_units(), 2048.0);
        assert_eq!(model.egress(2 << 20).egress_bytes, 2 << 20);
    }

    #[test]
    fn every_coefficient_is_validated() {
        assert!(CostModel::default().validate().is_ok());
        let bad = CostModel {
            write_payload_per_mib: f64::NAN,
            ..CostModel::default()
        };
        let err = bad.validate().expect_err("NaN coefficient");
        assert_eq!(err.field, "cost_model.write_payload_per_mib");
        let negative = CostModel {
            cpu_per_second: -1.0,
            ..CostModel::default()
        };
        assert!(negative.validate().is_err());
    }
}
