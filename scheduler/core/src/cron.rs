//! Cron schedules in the crontab dialect users already write, evaluated in a time zone.
//!
//! # Dialect (Vixie cron)
//! - Five fields `minute hour day-of-month month day-of-week`, or six with a leading `second`
//!   field. Five-field expressions fire at second 0.
//! - Each field is `*` or a comma-separated list of items; an item is a value, a range `a-b`, or
//!   either of those or `*` followed by a step `/n`. A single value with a step (`5/15`) means
//!   "from 5 to the field's maximum, every 15", as most crontabs in the wild accept it.
//! - Months may be named `JAN`–`DEC` and weekdays `SUN`–`SAT`, case-insensitively.
//! - Day-of-week runs 0–7, where both 0 and 7 are Sunday. A range may end on Sunday written as
//!   `SUN` or `0` (`FRI-SUN`), which reads as ending on 7.
//! - Macros: `@yearly` (= `@annually`), `@monthly`, `@weekly`, `@daily` (= `@midnight`),
//!   `@hourly`. `@reboot` has no meaning for a cluster scheduler and is refused.
//! - Day matching: when both day-of-month and day-of-week are restricted (neither field starts
//!   with `*`), a day matches if EITHER matches; otherwise both must match. This is Vixie cron's
//!   rule, so `0 0 13 * FRI` fires on every 13th and on every Friday, while `0 0 */2 * FRI` fires
//!   only on odd-numbered Fridays. `?` is accepted in the two day fields as a synonym of `*`.
//! - An expression that can never fire (`0 0 30 2 *`) is refused when parsed. `0 0 29 2 *` is
//!   valid and fires in leap years.
//!
//! # Time zones and daylight saving time: the one rule
//! A schedule is evaluated on the local wall clock of its time zone.
//! - A wall time that does not exist (the spring-forward gap) fires once, at the first instant
//!   after the gap, that is the instant the clocks jump. Several slots inside one gap collapse
//!   into that single fire (together with a slot at the first wall time after the gap, if the
//!   schedule has one); it never fires twice.
//! - A wall time that occurs twice (the fall-back overlap) fires only at its first occurrence.
//!
//! So a fire is never doubled and never silently lost. In `America/New_York` on 2026-03-08 a
//! daily `30 2 * * *` job fires at 03:00 EDT (07:00Z); on 2026-11-01 a daily `30 1 * * *` job
//! fires at 01:30 EDT (05:30Z) and not again at 01:30 EST (06:30Z).
//!
//! # How
//! The fields are parsed here (so errors name the field) into sets of values and handed to the
//! `cron` crate as explicit lists in its own dialect (seconds field required, weekdays 1–7 from
//! Sunday, day fields always ANDed); the OR case becomes two crate schedules whose earlier fire
//! wins. The crate walks naive wall-clock times, with `Utc` standing in for the naive clock, and
//! each wall time is then mapped to an instant in the zone by the rule above. The crate stops
//! at the end of the year 2100, after which `next_after` returns `None`.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::Millis;

/// Why a cron expression or a time zone name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("empty cron expression")]
    Empty,
    #[error(
        "cron expression \"{expression}\" has {count} fields; expected 5 (minute hour \
         day-of-month month day-of-week) or 6 (a leading second field, then those 5)"
    )]
    FieldCount { expression: String, count: usize },
    #[error(
        "unknown cron macro \"{0}\"; expected one of @yearly, @annually, @monthly, @weekly, \
         @daily, @midnight, @hourly"
    )]
    UnknownMacro(String),
    /// One field is malformed; `field` is its name (`minute`, `day-of-week`, ...).
    #[error("{field} field \"{text}\": {reason}")]
    Field {
        field: &'static str,
        text: String,
        reason: String,
    },
    #[error(
        "cron expression \"{0}\" never fires: no calendar date matches its day-of-month, month \
         and day-of-week"
    )]
    NeverFires(String),
    #[error("unknown time zone \"{0}\"; expected an IANA name such as UTC or Asia/Shanghai")]
    UnknownTimezone(String),
    /// The translated expression was refused by the `cron` crate; this is a bug in ax.
    #[error("cron expression \"{expression}\" could not be compiled: {reason}")]
    Compile { expression: String, reason: String },
}

/// Parses an IANA time zone name (`UTC`, `Europe/Berlin`, `Asia/Shanghai`).
pub fn parse_timezone(name: &str) -> Result<Tz, CronError> {
    name.parse::<Tz>()
        .map_err(|_| CronError::UnknownTimezone(name.to_string()))
}

/// A parsed cron expression, ready to compute fire times in any time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    expression: String,
    /// One crate schedule, or two for the day-of-month OR day-of-week case. A wall time is a
    /// fire time when any of them matches it.
    schedules: Vec<cron::Schedule>,
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.expression == other.expression
    }
}

impl Eq for CronSchedule {}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expression)
    }
}

impl FromStr for CronSchedule {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CronSchedule::parse(s)
    }
}

/// Upper bound on the wall-clock candidates examined by one `next_after` call. Candidates are
/// only skipped inside a fall-back overlap (at most a few hours of per-second slots), so the cap
/// is never reached by a real schedule; it exists so that no input can make the loop spin.
const MAX_CANDIDATES: usize = 200_000;

impl CronSchedule {
    /// Parses an expression in the dialect described in the module documentation.
    pub fn parse(expr: &str) -> Result<CronSchedule, CronError> {
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(CronError::Empty);
        }
        let expanded: String;
        let body = if let Some(name) = trimmed.strip_prefix('@') {
            expanded = expand_macro(name)
                .ok_or_else(|| CronError::UnknownMacro(trimmed.to_string()))?
                .to_string();
            expanded.as_str()
        } else {
            trimmed
        };

        let fields: Vec<&str> = body.split_whitespace().collect();
        let (second_text, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            count => {
                return Err(CronError::FieldCount {
                    expression: expr.to_string(),
                    count,
                });
            }
        };
        let seconds = parse_field(&SECOND, second_text)?;
        let minutes = parse_field(&MINUTE, rest[0])?;
        let hours = parse_field(&HOUR, rest[1])?;
        let days_of_month = parse_field(&DAY_OF_MONTH, rest[2])?;
        let months = parse_field(&MONTH, rest[3])?;
        let days_of_week = parse_field(&DAY_OF_WEEK, rest[4])?;

        let sec = render(&seconds, &SECOND);
        let min = render(&minutes, &MINUTE);
        let hour = render(&hours, &HOUR);
        let dom = render(&days_of_month, &DAY_OF_MONTH);
        let month = render(&months, &MONTH);
        let dow = render_weekdays(&days_of_week);

        let dom_restricted = !is_unrestricted(rest[2]);
        let dow_restricted = !is_unrestricted(rest[4]);
        let day_pairs = if dom_restricted && dow_restricted {
            vec![(dom, "*".to_string()), ("*".to_string(), dow)]
        } else {
            vec![(dom, dow)]
        };

        let mut schedules = Vec::with_capacity(day_pairs.len());
        for (dom, dow) in day_pairs {
            let translated = format!("{sec} {min} {hour} {dom} {month} {dow}");
            let schedule =
                cron::Schedule::from_str(&translated).map_err(|error| CronError::Compile {
                    expression: expr.to_string(),
                    reason: format!("\"{translated}\": {error}"),
                })?;
            schedules.push(schedule);
        }
        let schedule = CronSchedule {
            expression: trimmed.to_string(),
            schedules,
        };

        // Every combination of month, day-of-month and day-of-week that the calendar allows at
        // all occurs between 2000 and 2100, so a schedule with no wall-clock fire in that span
        // never fires.
        let reference = Utc.with_ymd_and_hms(1999, 12, 31, 23, 59, 59).single();
        if reference
            .and_then(|r| schedule.next_wall_after(&r))
            .is_none()
        {
            return Err(CronError::NeverFires(expr.to_string()));
        }
        Ok(schedule)
    }

    /// The expression as the user wrote it, without surrounding whitespace.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The first fire strictly after `after`, evaluated on the wall clock of `tz` by the rule in
    /// the module documentation. `None` past the year 2100.
    pub fn next_after(&self, after: Millis, tz: Tz) -> Option<Millis> {
        let after_utc = DateTime::<Utc>::from_timestamp_millis(after)?;
        let local = after_utc.with_timezone(&tz).naive_local();
        let mut cursor = Utc.from_utc_datetime(&local);
        for _ in 0..MAX_CANDIDATES {
            let wall = self.next_wall_after(&cursor)?;
            let instant = resolve_wall_time(tz, wall.naive_utc())?;
            // A candidate at or before `after` is the first occurrence of a repeated wall time
            // whose second occurrence we are already past; by the rule it has fired.
            if instant > after {
                return Some(instant);
            }
            cursor = wall;
        }
        None
    }

    /// The next `n` fires strictly after `after`, in order.
    pub fn next_n(&self, after: Millis, tz: Tz, n: usize) -> Vec<Millis> {
        let mut fires = Vec::with_capacity(n.min(1024));
        let mut cursor = after;
        while fires.len() < n {
            match self.next_after(cursor, tz) {
                Some(next) => {
                    fires.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        fires
    }

    /// The next matching naive wall time strictly after `cursor` (a naive time held as UTC).
    fn next_wall_after(&self, cursor: &DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.schedules
            .iter()
            .filter_map(|schedule| schedule.after(cursor).next())
            .min()
    }
}

/// Maps a wall time in `tz` to an instant: the instant itself when it is unique, the first one
/// when the wall time occurs twice, and the instant the clocks jump when it falls in a gap.
pub(crate) fn resolve_wall_time(tz: Tz, wall: NaiveDateTime) -> Option<Millis> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(instant) => Some(instant.timestamp_millis()),
        LocalResult::Ambiguous(first, _) => Some(first.timestamp_millis()),
        LocalResult::None => gap_end(tz, wall),
    }
}

/// The smallest instant (whole seconds, as every zone transition is) whose wall time in `tz` is
/// at or after `wall`. UTC offsets lie within −12 h and +14 h, so the answer lies within the
/// window searched here; the one transition that made the gap is the only one in it.
fn gap_end(tz: Tz, wall: NaiveDateTime) -> Option<Millis> {
    let reaches = |seconds: i64| -> bool {
        DateTime::<Utc>::from_timestamp(seconds, 0)
            .map(|instant| instant.with_timezone(&tz).naive_local() >= wall)
            .unwrap_or(false)
    };
    let as_utc = wall.and_utc().timestamp();
    let mut low = as_utc - 15 * 3600;
    let mut high = as_utc + 13 * 3600;
    if reaches(low) || !reaches(high) {
        return None;
    }
    // Invariant: `reaches(low)` is false and `reaches(high)` is true.
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if reaches(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    Some(high * 1000)
}

/// The five fields a macro stands for (`daily` → `0 0 * * *`), its name without the `@`, in
/// any case.
pub fn expand_macro(name: &str) -> Option<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        "yearly" | "annually" => Some("0 0 1 1 *"),
        "monthly" => Some("0 0 1 * *"),
        "weekly" => Some("0 0 * * 0"),
        "daily" | "midnight" => Some("0 0 * * *"),
        "hourly" => Some("0 * * * *"),
        _ => None,
    }
}

/// Vixie cron treats a day field as unrestricted when its text starts with `*`, even `*/2`.
fn is_unrestricted(text: &str) -> bool {
    text.starts_with('*') || text.starts_with('?')
}

struct FieldKind {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// Value of the first entry of `names`.
    names_start: u32,
    /// Whether `?` may stand for `*` (the two day fields).
    allows_any: bool,
}

const SECOND: FieldKind = FieldKind {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
    names_start: 0,
    allows_any: false,
};
const MINUTE: FieldKind = FieldKind {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    names_start: 0,
    allows_any: false,
};
const HOUR: FieldKind = FieldKind {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    names_start: 0,
    allows_any: false,
};
const DAY_OF_MONTH: FieldKind = FieldKind {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
    names_start: 0,
    allows_any: true,
};
const MONTH: FieldKind = FieldKind {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
    names_start: 1,
    allows_any: false,
};
const DAY_OF_WEEK: FieldKind = FieldKind {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
    names_start: 0,
    allows_any: true,
};

/// Parses one field into the set of values it selects. Day-of-week 7 is folded into 0.
fn parse_field(kind: &FieldKind, text: &str) -> Result<BTreeSet<u32>, CronError> {
    let error = |reason: String| CronError::Field {
        field: kind.name,
        text: text.to_string(),
        reason,
    };
    let mut values = BTreeSet::new();
    for item in text.split(',') {
        if item.is_empty() {
            return Err(error("empty list item".to_string()));
        }
        let (base, step) = match item.split_once('/') {
            Some((base, step_text)) => {
                let step = step_text
                    .parse::<u32>()
                    .map_err(|_| error(format!("step \"{step_text}\" is not a number")))?;
                if step == 0 {
                    return Err(error("step must be at least 1".to_string()));
                }
                (base, Some(step))
            }
            None => (item, None),
        };
        let (start, end) = if base == "*" || (kind.allows_any && base == "?") {
            (kind.min, kind.max)
        } else if let Some((start_text, end_text)) = base.split_once('-') {
            let start = parse_value(kind, text, start_text)?;
            let mut end = parse_value(kind, text, end_text)?;
            // `FRI-SUN` and `5-0` end on Sunday, which is 7 at the end of a range.
            if kind.name == DAY_OF_WEEK.name && end == 0 && start > 0 {
                end = 7;
            }
            if start > end {
                return Err(error(format!(
                    "range {start_text}-{end_text} runs backwards"
                )));
            }
            (start, end)
        } else {
            let value = parse_value(kind, text, base)?;
            match step {
                Some(_) => (value, kind.max),
                None => (value, value),
            }
        };
        let step = step.unwrap_or(1) as usize;
        values.extend((start..=end).step_by(step));
    }
    if kind.name == DAY_OF_WEEK.name && values.remove(&7) {
        values.insert(0);
    }
    Ok(values)
}

/// One value of a field: a number within the field's range, or a name where the field has names.
fn parse_value(kind: &FieldKind, field_text: &str, value_text: &str) -> Result<u32, CronError> {
    let error = |reason: String| CronError::Field {
        field: kind.name,
        text: field_text.to_string(),
        reason,
    };
    let value = if value_text.bytes().all(|b| b.is_ascii_digit()) && !value_text.is_empty() {
        value_text.parse::<u32>().unwrap_or(u32::MAX)
    } else {
        let lower = value_text.to_ascii_lowercase();
        match kind.names.iter().position(|name| *name == lower) {
            Some(index) => kind.names_start + index as u32,
            None if kind.names.is_empty() => {
                return Err(error(format!("\"{value_text}\" is not a number")));
            }
            None => {
                return Err(error(format!(
                    "\"{value_text}\" is not a number or one of {}",
                    kind.names.join(" ").to_uppercase()
                )));
            }
        }
    };
    if value < kind.min || value > kind.max {
        // The message names the value only when the field holds more than that value.
        let which = if field_text == value_text {
            String::new()
        } else {
            format!("{value_text} ")
        };
        return Err(error(format!(
            "value {which}out of range {}-{}",
            kind.min, kind.max
        )));
    }
    Ok(value)
}

/// A value set in the crate's dialect: `*` when it covers the whole field, else an explicit list.
fn render(values: &BTreeSet<u32>, kind: &FieldKind) -> String {
    if values.len() == (kind.max - kind.min + 1) as usize {
        return "*".to_string();
    }
    join(values.iter().copied())
}

/// Weekdays (0 = Sunday) in the crate's numbering, 1 = Sunday to 7 = Saturday.
fn render_weekdays(days: &BTreeSet<u32>) -> String {
    if days.len() == 7 {
        return "*".to_string();
    }
    join(days.iter().map(|day| day + 1))
}

fn join(values: impl Iterator<Item = u32>) -> String {
    values
        .map(|value| value.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, Timelike, Weekday};

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Millis {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .unwrap()
            .timestamp_millis()
    }

    fn utc(ms: Millis) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(ms).unwrap()
    }

    fn tz(name: &str) -> Tz {
        parse_timezone(name).unwrap()
    }

    /// The next `n` fires of `expr` after `after`, as RFC 3339 UTC strings.
    fn fires(expr: &str, zone: &str, after: Millis, n: usize) -> Vec<String> {
        let schedule = CronSchedule::parse(expr).unwrap();
        schedule
            .next_n(after, tz(zone), n)
            .into_iter()
            .map(|ms| utc(ms).format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .collect()
    }

    fn error(expr: &str) -> String {
        CronSchedule::parse(expr).unwrap_err().to_string()
    }

    #[test]
    fn five_fields_fire_at_second_zero() {
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("30 2 * * *", "UTC", after, 2),
            ["2026-01-01T02:30:00Z", "2026-01-02T02:30:00Z"]
        );
    }

    #[test]
    fn six_fields_have_a_leading_second() {
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("15 30 2 * * *", "UTC", after, 2),
            ["2026-01-01T02:30:15Z", "2026-01-02T02:30:15Z"]
        );
    }

    #[test]
    fn month_and_weekday_names_are_case_insensitive() {
        // 2026-01-01 is a Thursday.
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("0 9 * JAN,jul mon-FRI", "UTC", after, 3),
            [
                "2026-01-01T09:00:00Z",
                "2026-01-02T09:00:00Z",
                "2026-01-05T09:00:00Z"
            ]
        );
        let july = fires("0 9 * Jul Sat", "UTC", after, 1);
        assert_eq!(july, ["2026-07-04T09:00:00Z"]);
    }

    #[test]
    fn steps_over_star_and_ranges() {
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("*/15 * * * *", "UTC", after, 5),
            [
                "2026-01-01T00:15:00Z",
                "2026-01-01T00:30:00Z",
                "2026-01-01T00:45:00Z",
                "2026-01-01T01:00:00Z",
                "2026-01-01T01:15:00Z"
            ]
        );
        let minutes: Vec<u32> = CronSchedule::parse("1-30/5 * * * *")
            .unwrap()
            .next_n(after, Tz::UTC, 7)
            .into_iter()
            .map(|ms| utc(ms).minute())
            .collect();
        assert_eq!(minutes, [1, 6, 11, 16, 21, 26, 1]);
        // A single value with a step runs to the end of the field.
        assert_eq!(
            fires("50/5 * * * *", "UTC", after, 3),
            [
                "2026-01-01T00:50:00Z",
                "2026-01-01T00:55:00Z",
                "2026-01-01T01:50:00Z"
            ]
        );
    }

    #[test]
    fn macros_expand_to_their_schedules() {
        // 2026-03-15 is a Sunday.
        let after = at(2026, 3, 15, 10, 20, 0);
        let cases = [
            ("@yearly", "2027-01-01T00:00:00Z"),
            ("@annually", "2027-01-01T00:00:00Z"),
            ("@monthly", "2026-04-01T00:00:00Z"),
            ("@weekly", "2026-03-22T00:00:00Z"),
            ("@daily", "2026-03-16T00:00:00Z"),
            ("@midnight", "2026-03-16T00:00:00Z"),
            ("@hourly", "2026-03-15T11:00:00Z"),
            ("@HOURLY", "2026-03-15T11:00:00Z"),
        ];
        for (expr, expected) in cases {
            assert_eq!(fires(expr, "UTC", after, 1), [expected], "{expr}");
        }
        assert!(error("@reboot").contains("unknown cron macro \"@reboot\""));
    }

    #[test]
    fn zero_and_seven_are_both_sunday() {
        let after = at(2026, 1, 1, 0, 0, 0);
        let zero = fires("0 0 * * 0", "UTC", after, 4);
        assert_eq!(zero, fires("0 0 * * 7", "UTC", after, 4));
        assert_eq!(zero, fires("0 0 * * SUN", "UTC", after, 4));
        for ms in CronSchedule::parse("0 0 * * 7")
            .unwrap()
            .next_n(after, Tz::UTC, 4)
        {
            assert_eq!(utc(ms).weekday(), Weekday::Sun);
        }
        assert_eq!(zero[0], "2026-01-04T00:00:00Z");
        // A range may end on Sunday written as 0 or SUN.
        let weekend = fires("0 0 * * FRI-SUN", "UTC", after, 3);
        assert_eq!(
            weekend,
            [
                "2026-01-02T00:00:00Z",
                "2026-01-03T00:00:00Z",
                "2026-01-04T00:00:00Z"
            ]
        );
        assert_eq!(weekend, fires("0 0 * * 5-0", "UTC", after, 3));
        assert_eq!(weekend, fires("0 0 * * 5-7", "UTC", after, 3));
    }

    #[test]
    fn one_to_five_is_monday_to_friday() {
        // 2026-01-03 is a Saturday.
        let after = at(2026, 1, 3, 0, 0, 0);
        let days: Vec<Weekday> = CronSchedule::parse("0 8 * * 1-5")
            .unwrap()
            .next_n(after, Tz::UTC, 6)
            .into_iter()
            .map(|ms| utc(ms).weekday())
            .collect();
        use Weekday::*;
        assert_eq!(days, [Mon, Tue, Wed, Thu, Fri, Mon]);
    }

    #[test]
    fn restricted_day_of_month_and_week_are_ored() {
        // Every Friday and every 13th; Friday 2026-02-13 fires once.
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("0 0 13 * FRI", "UTC", after, 9),
            [
                "2026-01-02T00:00:00Z",
                "2026-01-09T00:00:00Z",
                "2026-01-13T00:00:00Z",
                "2026-01-16T00:00:00Z",
                "2026-01-23T00:00:00Z",
                "2026-01-30T00:00:00Z",
                "2026-02-06T00:00:00Z",
                "2026-02-13T00:00:00Z",
                "2026-02-20T00:00:00Z"
            ]
        );
    }

    #[test]
    fn a_star_prefixed_day_field_means_and() {
        // `*/2` starts with `*`, so odd-numbered days that are also Fridays.
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("0 0 */2 * FRI", "UTC", after, 3),
            [
                "2026-01-09T00:00:00Z",
                "2026-01-23T00:00:00Z",
                "2026-02-13T00:00:00Z"
            ]
        );
        // With day-of-week `*` only the day of month counts.
        assert_eq!(
            fires("0 0 13 * *", "UTC", after, 1),
            ["2026-01-13T00:00:00Z"]
        );
    }

    #[test]
    fn field_errors_name_the_field() {
        assert_eq!(
            error("0 0 * * 8"),
            "day-of-week field \"8\": value out of range 0-7"
        );
        assert_eq!(
            error("0 0 * * 1,8"),
            "day-of-week field \"1,8\": value 8 out of range 0-7"
        );
        assert_eq!(
            error("60 * * * *"),
            "minute field \"60\": value out of range 0-59"
        );
        assert_eq!(
            error("* 24 * * *"),
            "hour field \"24\": value out of range 0-23"
        );
        assert_eq!(
            error("* * 0 * *"),
            "day-of-month field \"0\": value out of range 1-31"
        );
        assert_eq!(
            error("* * * 13 *"),
            "month field \"13\": value out of range 1-12"
        );
        assert_eq!(
            error("61 * * * * *"),
            "second field \"61\": value out of range 0-59"
        );
        assert_eq!(
            error("*/0 * * * *"),
            "minute field \"*/0\": step must be at least 1"
        );
        assert_eq!(
            error("*/x * * * *"),
            "minute field \"*/x\": step \"x\" is not a number"
        );
        assert_eq!(
            error("30-10 * * * *"),
            "minute field \"30-10\": range 30-10 runs backwards"
        );
        assert_eq!(
            error("1,,2 * * * *"),
            "minute field \"1,,2\": empty list item"
        );
        assert_eq!(
            error("x * * * *"),
            "minute field \"x\": \"x\" is not a number"
        );
        assert_eq!(
            error("* * * FOO *"),
            "month field \"FOO\": \"FOO\" is not a number or one of \
             JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC"
        );
        assert_eq!(
            error("? * * * *"),
            "minute field \"?\": \"?\" is not a number"
        );
        assert_eq!(error("   "), "empty cron expression");
    }

    #[test]
    fn wrong_field_counts_are_refused_with_the_count() {
        assert!(
            error("* * * *").contains("has 4 fields"),
            "{}",
            error("* * * *")
        );
        assert!(error("* * * * * * *").contains("has 7 fields"));
        assert!(error("*").contains("has 1 fields"));
    }

    #[test]
    fn expressions_that_never_fire_are_refused() {
        assert_eq!(
            error("0 0 30 2 *"),
            "cron expression \"0 0 30 2 *\" never fires: no calendar date matches its \
             day-of-month, month and day-of-week"
        );
        assert!(error("0 0 31 4,6,9,11 *").contains("never fires"));
        // February 29th exists in leap years.
        let leap = fires("0 0 29 2 *", "UTC", at(2026, 1, 1, 0, 0, 0), 2);
        assert_eq!(leap, ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]);
        // With a restricted weekday the OR rule makes it fire on Mondays too.
        assert!(CronSchedule::parse("0 0 30 2 MON").is_ok());
    }

    #[test]
    fn shanghai_is_eight_hours_ahead() {
        let after = at(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            fires("0 9 * * *", "Asia/Shanghai", after, 2),
            ["2026-01-01T01:00:00Z", "2026-01-02T01:00:00Z"]
        );
        // Midnight in Shanghai is 16:00Z the day before.
        assert_eq!(
            fires("@daily", "Asia/Shanghai", after, 1),
            ["2026-01-01T16:00:00Z"]
        );
    }

    #[test]
    fn spring_forward_gap_fires_once_when_the_clocks_jump() {
        // New York: 2026-03-08 02:00 EST (07:00Z) jumps to 03:00 EDT.
        let after = at(2026, 3, 7, 12, 0, 0);
        assert_eq!(
            fires("30 2 * * *", "America/New_York", after, 3),
            [
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z",
                "2026-03-10T06:30:00Z"
            ]
        );
    }

    #[test]
    fn every_minute_skips_the_gap_and_fires_at_three() {
        let zone = tz("America/New_York");
        let schedule = CronSchedule::parse("* * * * *").unwrap();
        let fired = schedule.next_n(at(2026, 3, 8, 6, 58, 0), zone, 3);
        assert_eq!(
            fired,
            [
                at(2026, 3, 8, 6, 59, 0),
                at(2026, 3, 8, 7, 0, 0),
                at(2026, 3, 8, 7, 1, 0)
            ]
        );
        let local: Vec<String> = fired
            .iter()
            .map(|ms| utc(*ms).with_timezone(&zone).format("%H:%M %Z").to_string())
            .collect();
        assert_eq!(local, ["01:59 EST", "03:00 EDT", "03:01 EDT"]);
        // Over the whole night no fire has a local hour of 2, and none repeats.
        let night = schedule.next_n(at(2026, 3, 8, 4, 0, 0), zone, 200);
        assert!(night.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(
            night
                .iter()
                .all(|ms| utc(*ms).with_timezone(&zone).hour() != 2)
        );
        assert_eq!(
            night
                .iter()
                .filter(|ms| **ms == at(2026, 3, 8, 7, 0, 0))
                .count(),
            1
        );
    }

    #[test]
    fn several_gap_slots_collapse_into_one_fire() {
        let zone = tz("America/New_York");
        let schedule = CronSchedule::parse("0,15,30,45 2 * * *").unwrap();
        assert_eq!(
            schedule.next_n(at(2026, 3, 8, 0, 0, 0), zone, 2),
            [at(2026, 3, 8, 7, 0, 0), at(2026, 3, 9, 6, 0, 0)]
        );
        // Per second: the last second before the jump, then the jump, then on.
        let per_second = CronSchedule::parse("* * * * * *").unwrap();
        assert_eq!(
            per_second.next_n(at(2026, 3, 8, 6, 59, 58), zone, 3),
            [
                at(2026, 3, 8, 6, 59, 59),
                at(2026, 3, 8, 7, 0, 0),
                at(2026, 3, 8, 7, 0, 1)
            ]
        );
    }

    #[test]
    fn a_missing_midnight_fires_when_the_day_begins() {
        // São Paulo, 2018-11-04: 00:00 -03 jumped to 01:00 -02, so midnight never happened.
        assert_eq!(
            fires("@daily", "America/Sao_Paulo", at(2018, 11, 3, 12, 0, 0), 2),
            ["2018-11-04T03:00:00Z", "2018-11-05T02:00:00Z"]
        );
    }

    #[test]
    fn fall_back_fires_only_the_first_occurrence() {
        // New York: 2026-11-01 02:00 EDT (06:00Z) falls back to 01:00 EST.
        let after = at(2026, 10, 31, 12, 0, 0);
        assert_eq!(
            fires("30 1 * * *", "America/New_York", after, 2),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
        // Hourly: 01:00 EDT once, then 02:00 EST.
        assert_eq!(
            fires(
                "0 * * * *",
                "America/New_York",
                at(2026, 11, 1, 4, 30, 0),
                3
            ),
            [
                "2026-11-01T05:00:00Z",
                "2026-11-01T07:00:00Z",
                "2026-11-01T08:00:00Z"
            ]
        );
        // From inside the second 01:xx hour nothing fires until 02:00 EST.
        assert_eq!(
            fires(
                "0 * * * *",
                "America/New_York",
                at(2026, 11, 1, 6, 30, 0),
                1
            ),
            ["2026-11-01T07:00:00Z"]
        );
    }

    #[test]
    fn per_second_schedule_from_inside_the_overlap_skips_the_repeated_hour() {
        // At 06:00:00Z the wall clock reads 01:00:00 EST for the second time; all of 01:xx:xx
        // has fired already, so the next fire is 02:00:00 EST.
        let zone = tz("America/New_York");
        let schedule = CronSchedule::parse("* * * * * *").unwrap();
        assert_eq!(
            schedule.next_after(at(2026, 11, 1, 6, 0, 0), zone),
            Some(at(2026, 11, 1, 7, 0, 0))
        );
        assert_eq!(
            schedule.next_after(at(2026, 11, 1, 5, 59, 58), zone),
            Some(at(2026, 11, 1, 5, 59, 59))
        );
    }

    #[test]
    fn per_second_fires_every_second_strictly_after() {
        let schedule = CronSchedule::parse("* * * * * *").unwrap();
        let after = at(2026, 1, 1, 0, 0, 0) + 500;
        assert_eq!(
            schedule.next_n(after, Tz::UTC, 3),
            [
                at(2026, 1, 1, 0, 0, 1),
                at(2026, 1, 1, 0, 0, 2),
                at(2026, 1, 1, 0, 0, 3)
            ]
        );
        // Exactly on a fire time, the next one comes.
        assert_eq!(
            schedule.next_after(at(2026, 1, 1, 0, 0, 1), Tz::UTC),
            Some(at(2026, 1, 1, 0, 0, 2))
        );
        let before = at(2026, 1, 1, 0, 0, 0) - 1;
        assert_eq!(
            schedule.next_after(before, Tz::UTC),
            Some(at(2026, 1, 1, 0, 0, 0))
        );
    }

    #[test]
    fn next_n_returns_n_fires_in_order() {
        let fired = fires("0 12 * * MON", "UTC", at(2026, 1, 1, 0, 0, 0), 5);
        assert_eq!(
            fired,
            [
                "2026-01-05T12:00:00Z",
                "2026-01-12T12:00:00Z",
                "2026-01-19T12:00:00Z",
                "2026-01-26T12:00:00Z",
                "2026-02-02T12:00:00Z"
            ]
        );
        assert!(fires("0 12 * * MON", "UTC", at(2026, 1, 1, 0, 0, 0), 0).is_empty());
    }

    #[test]
    fn nothing_fires_past_2100() {
        let schedule = CronSchedule::parse("@yearly").unwrap();
        assert_eq!(schedule.next_after(at(2100, 6, 1, 0, 0, 0), Tz::UTC), None);
        assert!(schedule.next_n(at(2099, 6, 1, 0, 0, 0), Tz::UTC, 5).len() == 1);
    }

    #[test]
    fn expression_and_time_zones() {
        let schedule = CronSchedule::parse(" @daily ").unwrap();
        assert_eq!(schedule.expression(), "@daily");
        assert_eq!(schedule.to_string(), "@daily");
        assert_eq!(
            parse_timezone("Asia/Shanghai").unwrap(),
            chrono_tz::Asia::Shanghai
        );
        assert_eq!(parse_timezone("UTC").unwrap(), Tz::UTC);
        assert_eq!(
            parse_timezone("Mars/Olympus").unwrap_err().to_string(),
            "unknown time zone \"Mars/Olympus\"; expected an IANA name such as UTC or Asia/Shanghai"
        );
    }
}
