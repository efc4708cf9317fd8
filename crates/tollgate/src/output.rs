//! How a command prints its result: text for people, or with `--json` one
//! JSON document for scripts.
//!
//! Every command that prints a result builds one view of it, a `Serialize`
//! value, and hands it to [`print`] with the function that turns it into
//! text. Nothing else writes a result to stdout, so with `--json` stdout
//! holds exactly one JSON document, or nothing when the command fails (its
//! error goes to stderr and the exit code is non-zero). The one command
//! whose stdout is data rather than a result is `export` without `--out`:
//! the export itself, its summary on stderr.
//!
//! The JSON conventions, the same for every command:
//! - field names are snake_case, and name the unit where there is one;
//! - numbers are JSON numbers: tokens, rates and request units as floats,
//!   counts and ids as integers;
//! - timestamps are RFC 3339 strings in UTC with milliseconds
//!   (`2026-01-02T03:04:05.678Z`), or `null` when unknown ([`rfc3339`]);
//! - durations are floats of seconds in fields ending in `_seconds`
//!   (`silent_for_seconds`, `trickle_duration_seconds`, `warmup_seconds`;
//!   [`seconds`]). The bench's latency percentiles are the exception: whole
//!   microseconds from its histogram, under `latency_us`;
//! - rates are per second (`refill_rate`, `fallback_rate` in tokens/s).

use std::fmt::{self, Display};
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;

/// Prints `value` as one pretty-printed JSON document when `json` is set,
/// else as the text `human` makes of it, and a final newline.
///
/// Writing to a closed stdout (`tollgate … | head -1`) is an error rather
/// than a panic; `main` ends the command quietly on it.
pub fn print<T: Serialize, H: Display>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T) -> H,
) -> anyhow::Result<()> {
    let mut text = if json {
        serde_json::to_string_pretty(value).context("encode the result as JSON")?
    } else {
        human(value).to_string()
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("write the result to stdout")
}

/// A protobuf timestamp as RFC 3339 in UTC with milliseconds; `None` when
/// unset or before 1970.
pub fn rfc3339(t: Option<prost_types::Timestamp>) -> Option<String> {
    let t = t?;
    let secs = u64::try_from(t.seconds).ok()?;
    let nanos = u32::try_from(t.nanos).ok()?;
    let time = UNIX_EPOCH.checked_add(Duration::new(secs, nanos))?;
    Some(humantime::format_rfc3339_millis(time).to_string())
}

/// A protobuf duration in seconds; 0 when unset.
pub fn seconds(d: Option<prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

/// An amount (tokens, a rate, seconds) as people read it: at most two
/// decimals, without trailing zeros (`200.14`, `50`, `0.5`). `--json`
/// keeps the exact number.
pub fn amount(x: f64) -> String {
    let text = format!("{x:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    // -0.001 rounds to "-0.00": no sign on a zero.
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

/// Rows shown as columns two spaces apart, each as wide as its widest
/// cell; as text, one line per row without a final newline.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(rows: impl IntoIterator<Item = Vec<String>>) -> Self {
        Table {
            rows: rows.into_iter().collect(),
        }
    }

    /// A table whose first row is `names`, for [`Table::push`] to fill.
    pub fn with_header(names: &[&str]) -> Self {
        Table::new([names.iter().map(|&name| name.to_owned()).collect()])
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }
}

/// A two-column row of a key-value table.
pub fn field(key: &str, value: String) -> Vec<String> {
    vec![key.to_owned(), value]
}

impl Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for (i, row) in self.rows.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            write!(f, "{}", line.join("  ").trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_are_as_wide_as_their_widest_cell() {
        let table = Table::new([
            field("granted tokens", "1".into()),
            field("rate", "2".into()),
        ]);
        assert_eq!(table.to_string(), "granted tokens  1\nrate            2");
    }

    #[test]
    fn amounts_read_with_at_most_two_decimals_and_no_trailing_zeros() {
        assert_eq!(amount(200.066_919_999_999_98), "200.07");
        assert_eq!(amount(50.0), "50");
        assert_eq!(amount(0.5), "0.5");
        assert_eq!(amount(20_000.0), "20000");
        assert_eq!(amount(-0.001), "0");
        assert_eq!(amount(-12.345), "-12.35");
    }

    #[test]
    fn timestamps_are_rfc3339_with_milliseconds_and_durations_seconds() {
        let t = prost_types::Timestamp {
            seconds: 1_767_322_045,
            nanos: 678_000_000,
        };
        assert_eq!(
            rfc3339(Some(t)).as_deref(),
            Some("2026-01-02T02:47:25.678Z")
        );
        assert_eq!(rfc3339(None), None);
        let d = prost_types::Duration {
            seconds: 2,
            nanos: 500_000_000,
        };
        assert_eq!(seconds(Some(d)), 2.5);
        assert_eq!(seconds(None), 0.0);
    }
}
