//! What pods report they consumed.
//!
//! Pods send deltas (consumption since their previous request); the global
//! bucket keeps cumulative totals since the tenant was created. Operators
//! bill from those totals, so they are exact:
//! - every quantity is an integer: request units and CPU seconds are
//!   counted in micro-units (millionths), converted once at the edge, so the
//!   stored total is the sum of what pods reported, to the last micro-unit,
//!   whatever the number of reports;
//! - totals only grow: deltas are validated non-negative and totals add
//!   saturating at [`MAX_TOTAL`] (2^63 − 1, the range of a SQL BIGINT, so
//!   every store keeps the same number), so a total never wraps around and a
//!   billing system reading it never sees it go backwards.

use serde::{Deserialize, Serialize};

use crate::validate::{
    self, InvalidInput, MAX_COUNTER, MAX_TOTAL, MICROS_PER_UNIT, to_micros, units,
};

/// Resource consumption: a delta in requests, a cumulative total in state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Consumption {
    /// Request units, in millionths of a unit.
    pub request_unit_micros: u64,
    pub read_batches: u64,
    pub read_requests: u64,
    pub read_bytes: u64,
    pub write_batches: u64,
    pub write_requests: u64,
    pub write_bytes: u64,
    /// CPU time, in microseconds.
    pub cpu_micros: u64,
    pub egress_bytes: u64,
}

/// The most request units one report may carry, in micro-units.
pub const MAX_REPORTED_REQUEST_UNIT_MICROS: u64 =
    (validate::MAX_REPORTED_REQUEST_UNITS * MICROS_PER_UNIT) as u64;
/// The most CPU time one report may carry, in microseconds.
pub const MAX_REPORTED_CPU_MICROS: u64 = (validate::MAX_CPU_SECONDS * MICROS_PER_UNIT) as u64;

impl Consumption {
    /// Consumption of `request_units` (rounded to the nearest micro-unit)
    /// and nothing else counted.
    pub fn from_request_units(request_units: f64) -> Self {
        Consumption {
            request_unit_micros: to_micros(request_units),
            ..Consumption::default()
        }
    }

    /// Request units, as a (possibly rounded) number of units.
    pub fn request_units(&self) -> f64 {
        units(self.request_unit_micros)
    }

    /// CPU time, as a (possibly rounded) number of seconds.
    pub fn cpu_seconds(&self) -> f64 {
        units(self.cpu_micros)
    }

    /// Checks a delta reported by a pod: not absurd.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let counters = [
            (
                "request_unit_micros",
                self.request_unit_micros,
                MAX_REPORTED_REQUEST_UNIT_MICROS,
            ),
            ("read_batches", self.read_batches, MAX_COUNTER),
            ("read_requests", self.read_requests, MAX_COUNTER),
            ("read_bytes", self.read_bytes, MAX_COUNTER),
            ("write_batches", self.write_batches, MAX_COUNTER),
            ("write_requests", self.write_requests, MAX_COUNTER),
            ("write_bytes", self.write_bytes, MAX_COUNTER),
            ("cpu_micros", self.cpu_micros, MAX_REPORTED_CPU_MICROS),
            ("egress_bytes", self.egress_bytes, MAX_COUNTER),
        ];
        // The common case, every counter in range, without building an
        // error: this runs on every batch a pod's KV interceptor sees.
        if counters.iter().all(|(_, value, max)| value <= max) {
            return Ok(());
        }
        for (field, value, max) in counters {
            validate::counter(field, value, max)?;
        }
        Ok(())
    }

    /// Every counter, by its name.
    pub fn counters(&self) -> [(&'static str, u64); 9] {
        [
            ("request_unit_micros", self.request_unit_micros),
            ("read_batches", self.read_batches),
            ("read_requests", self.read_requests),
            ("read_bytes", self.read_bytes),
            ("write_batches", self.write_batches),
            ("write_requests", self.write_requests),
            ("write_bytes", self.write_bytes),
            ("cpu_micros", self.cpu_micros),
            ("egress_bytes", self.egress_bytes),
        ]
    }

    /// The consumption of these counters' values, in the order of
    /// [`Consumption::counters`].
    pub fn from_counters(values: [u64; 9]) -> Self {
        let [
            request_unit_micros,
            read_batches,
            read_requests,
            read_bytes,
            write_batches,
            write_requests,
            write_bytes,
            cpu_micros,
            egress_bytes,
        ] = values;
        Consumption {
            request_unit_micros,
            read_batches,
            read_requests,
            read_bytes,
            write_batches,
            write_requests,
            write_bytes,
            cpu_micros,
            egress_bytes,
        }
    }

    /// Adds a (validated) delta to these totals, each saturating at [`MAX_TOTAL`].
    pub fn add(&mut self, delta: &Consumption) {
        let add = |total: &mut u64, delta: u64| {
            *total = total.saturating_add(delta).min(MAX_TOTAL);
        };
        add(&mut self.request_unit_micros, delta.request_unit_micros);
        add(&mut self.read_batches, delta.read_batches);
        add(&mut self.read_requests, delta.read_requests);
        add(&mut self.read_bytes, delta.read_bytes);
        add(&mut self.write_batches, delta.write_batches);
        add(&mut self.write_requests, delta.write_requests);
        add(&mut self.write_bytes, delta.write_bytes);
        add(&mut self.cpu_micros, delta.cpu_micros);
        add(&mut self.egress_bytes, delta.egress_bytes);
    }

    /// What `self` holds beyond `other`, counter by counter, none below
    /// zero.
    pub fn saturating_sub(&self, other: &Consumption) -> Consumption {
        Consumption {
            request_unit_micros: self
                .request_unit_micros
                .saturating_sub(other.request_unit_micros),
            read_batches: self.read_batches.saturating_sub(other.read_batches),
            read_requests: self.read_requests.saturating_sub(other.read_requests),
            read_bytes: self.read_bytes.saturating_sub(other.read_bytes),
            write_batches: self.write_batches.saturating_sub(other.write_batches),
            write_requests: self.write_requests.saturating_sub(other.write_requests),
            write_bytes: self.write_bytes.saturating_sub(other.write_bytes),
            cpu_micros: self.cpu_micros.saturating_sub(other.cpu_micros),
            egress_bytes: self.egress_bytes.saturating_sub(other.egress_bytes),
        }
    }

    /// True if every total in `self` is at least the one in `earlier`.
    pub fn dominates(&self, earlier: &Consumption) -> bool {
        self.request_unit_micros >= earlier.request_unit_micros
            && self.read_batches >= earlier.read_batches
            && self.read_requests >= earlier.read_requests
            && self.read_bytes >= earlier.read_bytes
            && self.write_batches >= earlier.write_batches
            && self.write_requests >= earlier.write_requests
            && self.write_bytes >= earlier.write_bytes
            && self.cpu_micros >= earlier.cpu_micros
            && self.egress_bytes >= earlier.egress_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_and_saturate_at_the_bigint_range() {
        let mut total = Consumption {
            read_bytes: MAX_TOTAL - 1,
            egress_bytes: u64::MAX,
            ..Consumption::default()
        };
        let delta = Consumption {
            request_unit_micros: 2_500_000,
            read_bytes: 10,
            write_requests: 3,
            cpu_micros: 250_000,
            egress_bytes: 1,
            ..Consumption::default()
        };
        total.add(&delta);
        assert_eq!(total.read_bytes, MAX_TOTAL);
        assert_eq!(total.egress_bytes, MAX_TOTAL);
        assert_eq!(total.request_units(), 2.5);
        assert_eq!(total.write_requests, 3);
        assert_eq!(total.cpu_seconds(), 0.25);
    }

    #[test]
    fn counters_and_from_counters_are_one_order() {
        let values: [u64; 9] = std::array::from_fn(|i| 10 + i as u64);
        let consumption = Consumption::from_counters(values);
        assert_eq!(consumption.counters().map(|(_, v)| v), values);
        assert_eq!(consumption.request_unit_micros, 10);
        assert_eq!(consumption.egress_bytes, 18);
    }

    #[test]
    fn fractional_request_units_sum_exactly() {
        let mut total = Consumption::default();
        for _ in 0..2_000 {
            total.add(&Consumption::from_request_units(0.1));
        }
        assert_eq!(total.request_unit_micros, 200_000_000);
        assert_eq!(total.request_units(), 200.0);

        // At a total of 1e16 micro-units, one more unit still counts.
        let mut large = Consumption {
            request_unit_micros: 10_000_000_000_000_000,
            ..Consumption::default()
        };
        large.add(&Consumption::from_request_units(1.0));
        assert_eq!(large.request_unit_micros, 10_000_000_001_000_000);
    }

    #[test]
    fn deltas_are_validated_field_by_field() {
        assert!(Consumption::default().validate().is_ok());
        let absurd_ru = Consumption {
            request_unit_micros: MAX_REPORTED_REQUEST_UNIT_MICROS + 1,
            ..Consumption::default()
        };
        assert_eq!(
            absurd_ru.validate().expect_err("absurd").field,
            "request_unit_micros"
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
