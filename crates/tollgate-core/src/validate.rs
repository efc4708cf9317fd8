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
//! of poisoning a tenant's totals. Every bound is documented in the `.proto`
//! files, field by field.
//!
//! Error messages quote what they refuse, but never at length: a value is
//! echoed in at most [`MAX_ECHO_CHARS`] characters and a number in its
//! shortest form, so a hostile input cannot make an error larger than the
//! metadata a gRPC client accepts.
//!
//! Names follow one rule (`check_name`: characters from
//! `[A-Za-z0-9._:-]`): a [`TenantId`] has 1 to 128 of them, a
//! [`BucketName`] none (the request-unit bucket,
//! [`BucketName::REQUEST_UNITS`]) or 1 to 64, a [`TierName`] and a
//! [`TableName`] 1 to 64. A [`BucketKey`] (tenant and bucket) shows as
//! `tenant` or `tenant/bucket`, the form page tokens use. A pod's target
//! request period lies between 10 ms and 5 min, 10 s when it does not say.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most tokens any single value may hold (a quadrillion).
pub const MAX_TOKENS: f64 = 1e15;
/// The most request units one consumption report may carry (a trillion).
pub const MAX_REPORTED_REQUEST_UNITS: f64 = 1e12;
/// Micro-units (millionths) in one request unit or one CPU second: the
/// resolution at which consumption is counted, exactly, as integers.
pub const MICROS_PER_UNIT: f64 = 1e6;
/// The highest value a cumulative total reaches: totals saturate here
/// instead of wrapping (2^63 − 1, the range of a SQL BIGINT).
pub const MAX_TOTAL: u64 = i64::MAX as u64;
/// The most characters of a refused value an error message quotes.
pub const MAX_ECHO_CHARS: usize = 64;
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
/// Longest tenant id, in characters (all ASCII).
pub const MAX_TENANT_ID_LEN: usize = 128;
/// Longest bucket or tier name, in characters (all ASCII).
pub const MAX_NAME_LEN: usize = 64;
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

    /// The same error, its field renamed by `rename`: for an API that
    /// carries the same values in fields of other names.
    pub fn renamed(self, rename: impl FnOnce(&str) -> String) -> Self {
        InvalidInput {
            field: rename(&self.field),
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
            format!("must be >= 0, got {}", number(value)),
        ));
    }
    if value > max {
        return Err(InvalidInput::new(
            field,
            format!("must be <= {}, got {}", number(max), number(value)),
        ));
    }
    Ok(())
}

/// A quantity the wire carries both as a double (`field`, in units) and
/// exactly as an integer (`micros_field`, in millionths), as micro-units.
///
/// The double is rounded to the nearest micro-unit. A request may set
/// either form, or both if they agree; both are bounded by `max` units.
pub fn micros(
    field: &str,
    value: f64,
    micros_field: &str,
    micros: u64,
    max: f64,
) -> Result<u64, InvalidInput> {
    non_negative(field, value, max)?;
    // `max` is far below 2^64 micro-units, so the conversions are exact enough.
    counter(micros_field, micros, to_micros(max))?;
    let rounded = to_micros(value);
    match (rounded, micros) {
        (0, exact) => Ok(exact),
        (rounded, 0) => Ok(rounded),
        // The double agrees if it is the exact value as a double would
        // round it (above 2^53 micro-units, not every integer is a double).
        (rounded, exact) if rounded.abs_diff(exact) <= exact >> 52 => Ok(exact),
        (_, exact) => Err(InvalidInput::new(
            micros_field,
            format!(
                "{exact} disagrees with {field} ({}); set one of the two, or both to the same amount",
                number(value)
            ),
        )),
    }
}

/// A non-negative quantity in micro-units, rounded to the nearest;
/// negative or NaN gives 0 and huge values saturate (callers validate first).
pub fn to_micros(value: f64) -> u64 {
    (value * MICROS_PER_UNIT).round() as u64
}

/// Micro-units as a (possibly rounded) number of units.
pub fn units(micros: u64) -> f64 {
    micros as f64 / MICROS_PER_UNIT
}

/// A number as an error message shows it, exactly but briefly: plainly
/// from 1e-4 to a million, else in scientific notation (`1e15`,
/// `-1e-300`, not 300 zeros).
pub fn number(value: f64) -> String {
    let magnitude = value.abs();
    if value == 0.0 || (1e-4..1e6).contains(&magnitude) || !value.is_finite() {
        value.to_string()
    } else {
        format!("{value:e}")
    }
}

/// A value as an error message quotes it: the whole value if it is short,
/// else its first [`MAX_ECHO_CHARS`] characters and its length.
pub fn quote(value: &str) -> String {
    let mut chars = value.char_indices();
    match chars.nth(MAX_ECHO_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes in all)", &value[..cut], value.len()),
    }
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

/// Checks a duration as the wire carries it (`google.protobuf.Duration`),
/// strictly: seconds >= 0 and nanos in [0, 1e9). A negative or
/// unnormalized duration (`1 s + 2e9 ns`, `1 s − 1 ns`) is refused, not
/// normalized into something the sender did not write.
pub fn wire_duration(field: &str, seconds: i64, nanos: i32) -> Result<Duration, InvalidInput> {
    if seconds < 0 || !(0..1_000_000_000).contains(&nanos) {
        return Err(InvalidInput::new(
            field,
            format!(
                "must be a non-negative duration with nanos in [0, 999999999], got {seconds} s {nanos} ns"
            ),
        ));
    }
    // Both checked non-negative above.
    Ok(Duration::new(seconds.unsigned_abs(), nanos.unsigned_abs()))
}

/// Checks a name: at most `max` characters from `[A-Za-z0-9._:-]`, and
/// not empty unless `may_be_empty`. The one rule for every name a client
/// chooses (tenant ids, bucket names, tier names).
///
/// The alphabet keeps names safe as Prometheus label values, file names,
/// URL path segments, TOML keys and SQL text, and makes two names equal only
/// if they look equal.
fn check_name(field: &str, name: &str, max: usize, may_be_empty: bool) -> Result<(), InvalidInput> {
    if name.is_empty() && !may_be_empty {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    let chars = name.chars().count();
    if chars > max {
        return Err(InvalidInput::new(
            field,
            format!("must be at most {max} characters, got {chars}"),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(InvalidInput::new(
            field,
            format!("may contain only A-Z a-z 0-9 . _ : -, found {c:?}"),
        ));
    }
    Ok(())
}

/// A validated tenant id: 1 to 128 characters from `[A-Za-z0-9._:-]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantId(String);

impl TenantId {
    pub fn parse(field: &str, id: &str) -> Result<TenantId, InvalidInput> {
        check_name(field, id, MAX_TENANT_ID_LEN, false)?;
        Ok(TenantId(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A validated bucket name: empty, or 1 to 64 characters from
/// `[A-Za-z0-9._:-]`.
///
/// A tenant owns one bucket per rate-limited action (`schedule-email`).
/// The empty name is the tenant's request-unit bucket, the one every pod
/// built before buckets had names uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BucketName(String);

impl BucketName {
    /// The tenant's request-unit bucket.
    pub const REQUEST_UNITS: BucketName = BucketName(String::new());

    pub fn parse(field: &str, name: &str) -> Result<BucketName, InvalidInput> {
        check_name(field, name, MAX_NAME_LEN, true)?;
        Ok(BucketName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True for the tenant's request-unit bucket (the empty name).
    pub fn is_request_units(&self) -> bool {
        self.0.is_empty()
    }
}

/// A validated tier name: 1 to 64 characters from `[A-Za-z0-9._:-]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TierName(String);

impl TierName {
    pub fn parse(field: &str, name: &str) -> Result<TierName, InvalidInput> {
        check_name(field, name, MAX_NAME_LEN, false)?;
        Ok(TierName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A validated table name: 1 to 64 characters from `[A-Za-z0-9._:-]`.
///
/// The table of a per-partition limit ([`crate::partition`]): whatever the
/// tenant's service calls a table, a collection or a keyspace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TableName(String);

impl TableName {
    pub fn parse(field: &str, name: &str) -> Result<TableName, InvalidInput> {
        check_name(field, name, MAX_NAME_LEN, false)?;
        Ok(TableName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One bucket of one tenant: what every bucket operation is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BucketKey {
    pub tenant: TenantId,
    pub bucket: BucketName,
}

impl BucketKey {
    pub fn new(tenant: TenantId, bucket: BucketName) -> Self {
        BucketKey { tenant, bucket }
    }

    /// The tenant's request-unit bucket.
    pub fn request_units(tenant: TenantId) -> Self {
        BucketKey {
            tenant,
            bucket: BucketName::REQUEST_UNITS,
        }
    }
}

/// `tenant` for the request-unit bucket, `tenant/bucket` otherwise.
impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bucket.is_request_units() {
            write!(f, "{}", self.tenant)
        } else {
            write!(f, "{}/{}", self.tenant, self.bucket)
        }
    }
}

macro_rules! name_conversions {
    ($name:ident, $field:literal) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidInput;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                $name::parse($field, &s)
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }
    };
}

name_conversions!(TenantId, "tenant_id");
name_conversions!(BucketName, "bucket");
name_conversions!(TierName, "tier");
name_conversions!(TableName, "table");

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
    fn bucket_and_tier_names_are_checked() {
        let empty = BucketName::parse("bucket", "").expect("empty bucket");
        assert!(empty.is_request_units());
        assert_eq!(empty, BucketName::REQUEST_UNITS);
        assert!(BucketName::parse("bucket", "schedule-email").is_ok());
        let err = TierName::parse("tier", "").expect_err("empty tier");
        assert_eq!(err.field, "tier");
        for bad in ["a b", "x/y", "é"] {
            assert_eq!(BucketName::parse("b", bad).expect_err(bad).field, "b");
            assert_eq!(TierName::parse("t", bad).expect_err(bad).field, "t");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(BucketName::parse("bucket", &long).is_err());
        assert!(TierName::parse("tier", &long[1..]).is_ok());
        let tenant = TenantId::parse("tenant_id", "t1").expect("tenant");
        let key = BucketKey::new(
            tenant.clone(),
            BucketName::parse("b", "mail").expect("name"),
        );
        assert_eq!(key.to_string(), "t1/mail");
        assert_eq!(BucketKey::request_units(tenant).to_string(), "t1");
        assert_eq!(String::from(key.bucket), "mail");
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
    fn tenant_id_length_counts_characters_not_bytes() {
        let err = TenantId::parse("tenant_id", &"é".repeat(65)).expect_err("not ASCII");
        assert!(err.reason.contains("found 'é'"), "{err}");
        let err = TenantId::parse("tenant_id", &"é".repeat(129)).expect_err("too long");
        assert!(err.reason.contains("got 129"), "{err}");
    }

    #[test]
    fn errors_quote_long_values_briefly() {
        let name = "b".repeat(100_000);
        let err = BucketName::parse("bucket", &name).expect_err("too long");
        assert!(err.to_string().len() < 100, "{err}");
        assert!(quote(&name).contains("100000 bytes in all"));
        assert!(quote(&name).len() < 100);
        assert_eq!(quote("short"), "\"short\"");
        let err = non_negative("x", -1e-300, 1.0).expect_err("negative");
        assert!(err.reason.ends_with("got -1e-300"), "{err}");
        assert!(err.to_string().len() < 40, "{err}");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1e15), "1e15");
        assert_eq!(number(0.001), "0.001");
    }

    #[test]
    fn wire_durations_must_be_normalized_and_non_negative() {
        assert_eq!(
            wire_duration("d", 1, 500_000_000).expect("valid"),
            Duration::from_millis(1500)
        );
        for (seconds, nanos) in [(1, 2_000_000_000), (1, -1), (-1, 0), (0, 1_000_000_000)] {
            let err = wire_duration("d", seconds, nanos).expect_err("refused");
            assert_eq!(err.field, "d");
        }
    }

    #[test]
    fn quantities_convert_to_exact_micro_units() {
        assert_eq!(micros("ru", 0.1, "ru_micros", 0, 1e12), Ok(100_000));
        assert_eq!(micros("ru", 0.0, "ru_micros", 7, 1e12), Ok(7));
        assert_eq!(
            micros("ru", 1e12, "ru_micros", 0, 1e12),
            Ok(1_000_000_000_000_000_000)
        );
        let both = micros("ru", 1.0, "ru_micros", 7, 1e12).expect_err("disagree");
        assert_eq!(both.field, "ru_micros");
        assert_eq!(
            micros("ru", 1.5, "ru_micros", 1_500_000, 1e12),
            Ok(1_500_000)
        );
        let nan = micros("ru", f64::NAN, "ru_micros", 0, 1e12).expect_err("NaN");
        assert_eq!(nan.field, "ru");
        let large = micros("ru", 0.0, "ru_micros", u64::MAX, 1e12).expect_err("too large");
        assert_eq!(large.field, "ru_micros");
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
