//! Server time. Timestamps are UTC and travel as RFC 3339 with exactly three
//! fractional digits and a `Z`, so that their string order is their time
//! order — the due index sorts on the string.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::OffsetDateTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Timestamp(OffsetDateTime);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an RFC 3339 timestamp: {0}")]
pub struct InvalidTimestamp(pub String);

const FIXED: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// 9999-12-31T23:59:59.999Z: beyond it the fixed-width form (and with it
/// string order = time order) would break.
const MAX_MS: i64 = 253_402_300_799_999;

impl Timestamp {
    /// Times are kept within 1970..=9999; arithmetic that would leave that
    /// range saturates at its ends instead of panicking.
    pub fn from_unix_millis(ms: i64) -> Self {
        let ms = ms.clamp(0, MAX_MS);
        Self(OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).expect("clamped into range"))
    }
    pub fn unix_millis(&self) -> i64 {
        (self.0.unix_timestamp_nanos() / 1_000_000) as i64
    }
    pub fn unix_seconds(&self) -> i64 {
        self.0.unix_timestamp()
    }
    /// Parses any RFC 3339 time and normalises it to UTC milliseconds.
    pub fn parse(s: &str) -> Result<Self, InvalidTimestamp> {
        let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| InvalidTimestamp(s.to_owned()))?;
        let ms = t.unix_timestamp_nanos() / 1_000_000;
        if !(0..=i128::from(MAX_MS)).contains(&ms) {
            return Err(InvalidTimestamp(format!("{s} (must be between 1970 and 9999 in UTC)")));
        }
        Ok(Self::from_unix_millis(ms as i64))
    }
    pub fn plus(&self, d: Duration) -> Self {
        Self::from_unix_millis(self.unix_millis().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }
    pub fn minus(&self, d: Duration) -> Self {
        Self::from_unix_millis(self.unix_millis().saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }
    /// How long from `self` until `later`; zero if `later` is not later.
    pub fn until(&self, later: Timestamp) -> Duration {
        Duration::from_millis(later.unix_millis().saturating_sub(self.unix_millis()).max(0) as u64)
    }
    /// `YYYY-MM-DDTHH:MM:SS` rounded *up* to the next whole second, in UTC:
    /// the form EventBridge Scheduler's `at()` takes. Rounding up means a
    /// wake-up is never scheduled before the deadline it stands for.
    pub fn scheduler_at(&self) -> String {
        let ms = self.unix_millis();
        let secs = ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0);
        let t = OffsetDateTime::from_unix_timestamp(secs).expect("in range");
        t.format(format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]")).expect("formattable")
    }
}

/// A UTC calendar day: the unit of a day's reconciliation, spelled
/// `YYYY-MM-DD` (the prefix of every timestamp of that day, so a day and a
/// timestamp compare as strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Day(i64);

const MS_PER_DAY: i64 = 86_400_000;

impl Day {
    /// The day `at` falls on.
    pub fn of(at: Timestamp) -> Self {
        Self(at.unix_millis().div_euclid(MS_PER_DAY))
    }
    /// Parses `YYYY-MM-DD`.
    pub fn parse(s: &str) -> Result<Self, InvalidTimestamp> {
        if s.len() != 10 {
            return Err(InvalidTimestamp(format!("{s} (a day is YYYY-MM-DD)")));
        }
        Timestamp::parse(&format!("{s}T00:00:00Z")).map(Self::of)
    }
    /// Its first millisecond.
    pub fn start(&self) -> Timestamp {
        Timestamp::from_unix_millis(self.0 * MS_PER_DAY)
    }
    /// The first millisecond of the next day (the window is `[start, end)`).
    pub fn end(&self) -> Timestamp {
        Timestamp::from_unix_millis((self.0 + 1) * MS_PER_DAY)
    }
    pub fn previous(&self) -> Self {
        Self(self.0 - 1)
    }
    /// Whether `at` falls on this day.
    pub fn holds(&self, at: Timestamp) -> bool {
        Self::of(at) == *self
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.start().to_string()[..10])
    }
}

impl TryFrom<String> for Day {
    type Error = InvalidTimestamp;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Day> for String {
    fn from(d: Day) -> Self {
        d.to_string()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.format(FIXED).expect("formattable"))
    }
}
impl TryFrom<String> for Timestamp {
    type Error = InvalidTimestamp;
    fn try_from(s: String) -> Result<Self, InvalidTimestamp> {
        Self::parse(&s)
    }
}
impl From<Timestamp> for String {
    fn from(t: Timestamp) -> String {
        t.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_order_is_time_order() {
        let a = Timestamp::from_unix_millis(1_700_000_000_005);
        let b = Timestamp::from_unix_millis(1_700_000_000_040);
        assert_eq!(a.to_string(), "2023-11-14T22:13:20.005Z");
        assert!(a.to_string() < b.to_string());
        assert_eq!(Timestamp::parse(&a.to_string()).unwrap(), a);
    }

    #[test]
    fn offsets_are_normalised_to_utc() {
        let t = Timestamp::parse("2026-01-01T08:00:00+08:00").unwrap();
        assert_eq!(t.to_string(), "2026-01-01T00:00:00.000Z");
    }

    #[test]
    fn times_outside_1970_to_9999_are_refused_not_a_panic() {
        assert!(Timestamp::parse("9999-12-31T23:59:59-23:59").is_err());
        assert!(Timestamp::parse("1969-12-31T23:59:59Z").is_err());
        assert!(Timestamp::parse("9999-12-31T23:59:59.999Z").is_ok());
        let end = Timestamp::parse("9999-12-31T23:59:59.999Z").unwrap();
        assert_eq!(end.plus(Duration::from_secs(u64::MAX)), end);
    }

    #[test]
    fn scheduler_time_rounds_up_to_the_next_second() {
        assert_eq!(Timestamp::parse("2026-01-01T00:00:00.001Z").unwrap().scheduler_at(), "2026-01-01T00:00:01");
        assert_eq!(Timestamp::parse("2026-01-01T00:00:00.000Z").unwrap().scheduler_at(), "2026-01-01T00:00:00");
    }

    #[test]
    fn a_day_is_its_utc_date_and_holds_its_own_milliseconds_only() {
        let d = Day::parse("2026-12-02").unwrap();
        assert_eq!(d.to_string(), "2026-12-02");
        assert_eq!(d.start().to_string(), "2026-12-02T00:00:00.000Z");
        assert_eq!(d.end().to_string(), "2026-12-03T00:00:00.000Z");
        assert!(d.holds(d.end().minus(Duration::from_millis(1))) && !d.holds(d.end()));
        assert_eq!(d.previous().to_string(), "2026-12-01");
        assert!(Day::parse("2026-12-2").is_err() && Day::parse("2026-13-01").is_err());
    }
}
