//! Billing cycles on the calendar: which cycle an instant lies in.
//!
//! A cycle starts at the first instant of a local day in a time zone named
//! by IANA name, and ends where the next one starts:
//! - **monthly**, on an anchor day of the month (1–31); a month shorter
//!   than the anchor starts its cycle on its last day (anchor 31: January
//!   31, February 28 or 29, March 31, April 30, …);
//! - **weekly**, on an anchor weekday;
//! - **daily**.
//!
//! The first instant of a local day is usually midnight; where a time zone
//! skips midnight (a daylight-saving change at 00:00), it is the first
//! instant after the gap, and where midnight happens twice, the first. So a
//! cycle of a day is 23 or 25 hours long around a change, and cycles tile
//! time: every instant lies in exactly one cycle, and each cycle's end is
//! the next one's start (a property test in `budget/tests.rs`).
//!
//! Time zones come from the IANA database built into the binary, not the
//! host's, so every replica and every machine cuts cycles at the same
//! instants.

use jiff::ToSpan;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::validate::InvalidInput;

/// How often a cycle starts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "every", rename_all = "kebab-case")]
pub enum Period {
    /// On this day of every month (1–31; the last day of a shorter month).
    Monthly { anchor_day: u8 },
    /// On this day of every week.
    Weekly { anchor_weekday: Weekday },
    /// Every day.
    Daily,
}

/// A day of the week.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    pub const ALL: [Weekday; 7] = [
        Weekday::Monday,
        Weekday::Tuesday,
        Weekday::Wednesday,
        Weekday::Thursday,
        Weekday::Friday,
        Weekday::Saturday,
        Weekday::Sunday,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Weekday::Monday => "monday",
            Weekday::Tuesday => "tuesday",
            Weekday::Wednesday => "wednesday",
            Weekday::Thursday => "thursday",
            Weekday::Friday => "friday",
            Weekday::Saturday => "saturday",
            Weekday::Sunday => "sunday",
        }
    }

    /// The weekday named `name` (its English name, any case).
    pub fn parse(name: &str) -> Option<Weekday> {
        Weekday::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(name))
    }

    /// Days after Monday (0 to 6).
    fn days_from_monday(self) -> i8 {
        match self {
            Weekday::Monday => 0,
            Weekday::Tuesday => 1,
            Weekday::Wednesday => 2,
            Weekday::Thursday => 3,
            Weekday::Friday => 4,
            Weekday::Saturday => 5,
            Weekday::Sunday => 6,
        }
    }
}

/// When cycles start: a period and the time zone its days are counted in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CycleRule {
    #[serde(flatten)]
    pub period: Period,
    /// An IANA time zone name (`UTC`, `Europe/Paris`, `America/New_York`).
    pub time_zone: String,
}

/// One cycle: from `start` (included) to `end` (excluded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cycle {
    pub start: Timestamp,
    pub end: Timestamp,
}

impl Cycle {
    /// True if `at` lies in the cycle.
    pub fn contains(&self, at: Timestamp) -> bool {
        self.start <= at && at < self.end
    }

    /// How far through the cycle `at` is, from 0 to 1.
    pub fn elapsed_fraction(&self, at: Timestamp) -> f64 {
        let length = self.end.seconds_since(self.start);
        if length <= 0.0 {
            return 1.0;
        }
        (at.seconds_since(self.start) / length).clamp(0.0, 1.0)
    }
}

/// An instant outside the years the calendar covers (−9999 to 9999).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{at:?} lies outside the calendar's range (years -9999 to 9999)")]
pub struct OutOfCalendar {
    pub at: Timestamp,
}

impl CycleRule {
    /// A rule in UTC.
    pub fn utc(period: Period) -> Self {
        CycleRule {
            period,
            time_zone: "UTC".to_owned(),
        }
    }

    /// Checks the anchor and the time zone, naming the field at fault.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if let Period::Monthly { anchor_day } = self.period
            && !(1..=31).contains(&anchor_day)
        {
            return Err(InvalidInput::new(
                "anchor_day",
                format!("must be a day of the month from 1 to 31, got {anchor_day}"),
            ));
        }
        self.zone().map(|_| ())
    }

    fn zone(&self) -> Result<TimeZone, InvalidInput> {
        TimeZone::get(&self.time_zone).map_err(|_| {
            InvalidInput::new(
                "time_zone",
                format!(
                    "{:?} is not an IANA time zone name (e.g. UTC, Europe/Paris, America/New_York)",
                    self.time_zone
                ),
            )
        })
    }

    /// The cycle `at` lies in.
    ///
    /// A rule that does not validate (an unknown time zone, an anchor out
    /// of range) is read as the nearest valid one: UTC, the anchor clamped
    /// to 1–31. Rules are validated where they enter, so a stored rule
    /// always validates; this keeps a bucket running if the built-in time
    /// zone database ever drops a name.
    pub fn cycle_at(&self, at: Timestamp) -> Result<Cycle, OutOfCalendar> {
        let zone = self.zone().unwrap_or(TimeZone::UTC);
        let out = || OutOfCalendar { at };
        let instant = jiff::Timestamp::from_microsecond(at.unix_micros()).map_err(|_| out())?;
        let today = instant.to_zoned(zone.clone()).date();
        let starts = |day: Date| day_start(day, &zone).ok_or_else(out);
        match self.period {
            Period::Daily => {
                let next = today.tomorrow().map_err(|_| out())?;
                Ok(Cycle {
                    start: starts(today)?,
                    end: starts(next)?,
                })
            }
            Period::Weekly { anchor_weekday } => {
                let back = (today.weekday().to_monday_zero_offset()
                    - anchor_weekday.days_from_monday())
                .rem_euclid(7);
                let first = today
                    .checked_sub(i64::from(back).days())
                    .map_err(|_| out())?;
                let next = first.checked_add(7.days()).map_err(|_| out())?;
                Ok(Cycle {
                    start: starts(first)?,
                    end: starts(next)?,
                })
            }
            Period::Monthly { anchor_day } => {
                let anchor = anchor_day.clamp(1, 31);
                let month = today.first_of_month();
                let this_start = starts(anchor_in(month, anchor))?;
                let (first, next) = if at >= this_start {
                    (month, month.checked_add(1.month()).map_err(|_| out())?)
                } else {
                    (month.checked_sub(1.month()).map_err(|_| out())?, month)
                };
                Ok(Cycle {
                    start: starts(anchor_in(first, anchor))?,
                    end: starts(anchor_in(next, anchor))?,
                })
            }
        }
    }
}

/// The anchor day in the month of `first_of_month`, or its last day if the
/// month is shorter.
fn anchor_in(first_of_month: Date, anchor: u8) -> Date {
    let day = i8::try_from(anchor)
        .unwrap_or(31)
        .min(first_of_month.days_in_month());
    first_of_month
        .with()
        .day(day)
        .build()
        .unwrap_or(first_of_month)
}

/// The first instant of `day` in `zone`.
fn day_start(day: Date, zone: &TimeZone) -> Option<Timestamp> {
    let zoned = day.to_zoned(zone.clone()).ok()?.start_of_day().ok()?;
    Some(Timestamp::from_unix_micros(
        zoned.timestamp().as_microsecond(),
    ))
}
