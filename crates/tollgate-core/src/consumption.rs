//! What pods report they consumed.
//!
//! Pods send deltas (consumption since their previous request); the global
//! bucket keeps cumulative totals since the tenant was created. Totals only
//! grow: deltas are validated non-negative and counters add saturating, so a
//! total never wraps around and a billing system reading it never sees it
//! go backwards.

use serde::{Deserialize, Serialize};

use crate::validate::{self, InvalidInput, MAX_COUNTER, MAX_CPU_SECONDS, MAX_TOKENS};

/// Resource consumption: a delta in requests, a cumulative total in state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Consumption {
    pub request_units: f64,
    pub read_batches: u64,
    pub read_requests: u64,
    pub read_bytes: u64,
    pub write_batches: u64,
    pub write_requests: u64,
    pub write_bytes: u64,
    pub cpu_seconds: f64,
    pub egress_bytes: u64,
}

impl Consumption {
    /// Consumption of `request_units` and nothing else counted.
    pub fn from_tokens(request_units: f64) -> Self {
        Consumption {
            request_units,
            ..Consumption::default()
        }
    }

    /// Checks a delta reported by a pod: finite, non-negative, not absurd.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate::non_negative("request_units", self.request_units, MAX_TOKENS)?;
        validate::non_negative("cpu_seconds", self.cpu_seconds, MAX_CPU_SECONDS)?;
        let counters = [
            ("read_batches", self.read_batches),
            ("read_requests", self.read_requests),
            ("read_bytes", self.read_bytes),
            ("write_batches", self.write_batches),
            ("write_requests", self.write_requests),
            ("write_bytes", self.write_bytes),
            ("egress_bytes", self.egress_bytes),
        ];
        for (field, value) in counters {
            validate::counter(field, value, MAX_COUNTER)?;
        }
        Ok(())
    }

    /// Adds a (validated, non-negative) delta to these totals.
    pub fn add(&mut self, delta: &Consumption) {
        self.request_units += delta.request_units;
        self.read_batches = self.read_batches.saturating_add(delta.read_batches);
        self.read_requests = self.read_requests.saturating_add(delta.read_requests);
        self.read_bytes = self.read_bytes.saturating_add(delta.read_bytes);
        self.write_batches = self.write_batches.saturating_add(delta.write_batches);
        self.write_requests = self.write_requests.saturating_add(delta.write_requests);
        self.write_bytes = self.write_bytes.saturating_add(delta.write_bytes);
        self.cpu_seconds += delta.cpu_seconds;
        self.egress_bytes = self.egress_bytes.saturating_add(delta.egress_bytes);
    }

    /// True if every total in `self` is at least the one in `earlier`.
    pub fn dominates(&self, earlier: &Consumption) -> bool {
        self.request_units >= earlier.request_units
            && self.read_batches >= earlier.read_batches
            && self.read_requests >= earlier.read_requests
            && self.read_bytes >= earlier.read_bytes
            && self.write_batches >= earlier.write_batches
            && self.write_requests >= earlier.write_requests
            && self.write_bytes >= earlier.write_bytes
            && self.cpu_seconds >= earlier.cpu_seconds
            && self.egress_bytes >= earlier.egress_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_and_saturate() {
        let mut total = Consumption {
            read_bytes: u64::MAX - 1,
            ..Consumption::default()
        };
        let delta = Consumption {
            request_units: 2.5,
            read_bytes: 10,
            write_requests: 3,
            cpu_seconds: 0.25,
            ..Consumption::default()
        };
        total.add(&delta);
        assert_eq!(total.read_bytes, u64::MAX);
        assert_eq!(total.request_units, 2.5);
        assert_eq!(total.write_requests, 3);
        assert_eq!(total.cpu_seconds, 0.25);
    }

    #[test]
    fn deltas_are_validated_field_by_field() {
        assert!(Consumption::default().validate().is_ok());
        let nan_ru = Consumption {
            request_units: f64::NAN,
            ..Consumption::default()
        };
        assert_eq!(nan_ru.validate().expect_err("NaN").field, "request_units");
        let negative_cpu = Consumption {
            cpu_seconds: -1.0,
            ..Consumption::default()
        };
        assert_eq!(
            negative_cpu.validate().expect_err("negative").field,
            "cpu_seconds"
        );
        let absurd_bytes = Consumption {
            write_bytes: u64::MAX,
            ..Consumption::default()
        };
        assert_eq!(
            absurd_bytes.validate().expect_err("absurd").field,
            "write_bytes"
        );
    }
}
