//! Input checks shared by every edge.
//!
//! Bad input must never change state, so every value that arrives from the
//! network, the CLI or a configuration file is checked here before any state
//! machine runs. An [`InvalidInput`] names the field in the wire contract's
//! terms (`consumption_since_last_request.read_bytes`), so the operator or pod
//! author sees exactly what to fix.
//!
//! The upper bounds are far beyond any real workload; they exist so that an
//! absurd value (a unit mix-up, an uninitialised variable) is refused instead
//! of poisoning a tenant's totals, and so that sums stay exact in an `f64`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most tokens any single value may hold (a quadrillion).
pub const MAX_TOKENS: f64 = 1e15;
/// The highest refill rate, in tokens per second.
pub const MAX_REFILL_RATE: f64 = 1e12;
/// The highest value of any integer counter in one consumption report.
pub const MAX_COUNTER: u64 = 1 << 53;
/// The most CPU seconds one consumption report may carry (about 30 years).
pub const MAX_CPU_SECONDS: f64 = 1e9;
/// Bounds of a pod's target request period.
pub const MIN_TARGET_REQUEST_PERIOD: Duration = Duration::from_millis(10);
pub const MAX_TARGET_REQUEST_PERIOD: Duration = Duration::from_secs(300);
/// The target request period when a request does not say.
pub const DEFAULT_TARGET_REQUEST_PERIOD: Duration = Duration::from_secs(10);
/// Longest instance lease, in bytes.
pub const MAX_LEASE_LEN: usize = 256;
/// Longest tenant id, in bytes.
pub const MAX_TENANT_ID_LEN: usize = 128;
/// Highest sequence number (stores keep it as a signed 64-bit integer).
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// A value that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidInput {
    /// The field's name in the wire contract, with a dotted path for nested fields.
    pub field: String,
    pub reason: String,
}

impl InvalidInput {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error, with `prefix.` put before the field name.
    pub fn within(self, prefix: &str) -> Self {
        InvalidInput {
            field: format!("{prefix}.{}", self.field),
            reason: self.reason,
        }
    }
}

/// Checks that `value` is finite and within `[0, max]`.
pub fn non_negative(field: &str, value: f64, max: f64) -> Result<(), InvalidInput> {
    if value.is_nan() {
        return Err(InvalidInput::new(field, "must be a number, got NaN"));
    }
    if value.is_infinite() {
        return Err(InvalidInput::new(
            field,
            format!("must be finite, got {value}"),
        ));
    }
    if value < 0.0 {
        return Err(InvalidInput::new(
            field,
            format!("must be >= 0, got {value}"),
        ));
    }
    if value > max {
        return Err(InvalidInput::new(
            field,
            format!("must be <= {max:e}, got {value:e}"),
        ));
    }
    Ok(())
}

/// Checks that a target request period is within the accepted range.
pub fn target_request_period(field: &str, period: Duration) -> Result<(), InvalidInput> {
    if !(MIN_TARGET_REQUEST_PERIOD..=MAX_TARGET_REQUEST_PERIOD).contains(&period) {
        return Err(InvalidInput::new(
            field,
            format!(
                "must be between {MIN_TARGET_REQUEST_PERIOD:?} and {MAX_TARGET_REQUEST_PERIOD:?}, got {period:?}"
            ),
        ));
    }
    Ok(())
}

/// Checks that an integer counter is at most `max`.
pub fn counter(field: &str, value: u64, max: u64) -> Result<(), InvalidInput> {
    if value > max {
        return Err(InvalidInput::new(
            field,
            format!("must be <= {max}, got {value}"),
        ));
    }
    Ok(())
}

/// A validated tenant id: 1 to 128 characters from `[A-Za-z0-9._:-]`.
///
/// The alphabet keeps ids safe as Prometheus label values, file names, URL
/// path segments and SQL text, and makes two ids equal only if they look equal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantId(String);

impl TenantId {
    pub fn parse(field: &str, id: &str) -> Result<TenantId, InvalidInput> {
        if id.is_empty() {
            return Err(InvalidInput::new(field, "must not be empty"));
        }
        if id.len() > MAX_TENANT_ID_LEN {
            return Err(InvalidInput::new(
                field,
                format!(
                    "must be at most {MAX_TENANT_ID_LEN} characters, got {}",
                    id.len()
                ),
            ));
        }
        if let Some(c) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return Err(InvalidInput::new(
                field,
                format!("may contain only A-Z a-z 0-9 . _ : -, found {c:?}"),
            ));
        }
        Ok(TenantId(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for TenantId {
    type Error = InvalidInput;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        TenantId::parse("tenant_id", &s)
    }
}

impl From<TenantId> for String {
    fn from(id: TenantId) -> String {
        id.0
    }
}

/// Checks a bucket name. Only the tenant's request-unit bucket (the empty
/// name) exists in this version; any other name is refused rather than
/// silently mapped onto it.
pub fn bucket(field: &str, name: &str) -> Result<(), InvalidInput> {
    if name.is_empty() {
        Ok(())
    } else {
        Err(InvalidInput::new(
            field,
            format!(
                "unknown bucket {name:?}: this server serves only the tenant's request-unit bucket (empty name)"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids_are_checked() {
        assert!(TenantId::parse("tenant_id", "acme-prod.eu:1_a").is_ok());
        let cases = [
            ("", "must not be empty"),
            ("a b", "found ' '"),
            ("é", "found 'é'"),
            ("x/y", "found '/'"),
        ];
        for (id, reason) in cases {
            let err = TenantId::parse("tenant_id", id).expect_err(id);
            assert_eq!(err.field, "tenant_id");
            assert!(err.reason.contains(reason), "{id:?}: {err}");
        }
        let long = "a".repeat(MAX_TENANT_ID_LEN + 1);
        assert!(TenantId::parse("tenant_id", &long).is_err());
        assert!(TenantId::parse("tenant_id", &long[1..]).is_ok());
    }

    #[test]
    fn numbers_must_be_finite_non_negative_and_bounded() {
        assert!(non_negative("x", 0.0, 1.0).is_ok());
        assert!(non_negative("x", 1.0, 1.0).is_ok());
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5, 1.5] {
            let err = non_negative("x", bad, 1.0).expect_err("must be refused");
            assert_eq!(err.field, "x");
        }
        assert!(counter("c", MAX_COUNTER, MAX_COUNTER).is_ok());
        assert!(counter("c", MAX_COUNTER + 1, MAX_COUNTER).is_err());
    }

    #[test]
    fn only_the_default_bucket_exists() {
        assert!(bucket("bucket", "").is_ok());
        let err = bucket("bucket", "schedule-email").expect_err("unknown bucket");
        assert!(err.reason.contains("schedule-email"));
    }

    #[test]
    fn nested_fields_get_a_path() {
        let err = InvalidInput::new("read_bytes", "bad").within("consumption_since_last_request");
        assert_eq!(
            err.to_string(),
            "consumption_since_last_request.read_bytes: bad"
        );
    }
}
