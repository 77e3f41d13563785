//! Deadlines: by when a run of a workflow must have ended (`deadline:` in its file).
//!
//! A deadline is either a wall-clock time in the schedule's zone, on the run's logical date or
//! a number of days after it (`06:30`, `+1d 06:30`), or a duration from the run's start (`2h`,
//! `90m`): when it left the run queue, which for most runs is when it was created. A run that has
//! not ended by its deadline misses it once: the scheduler records a `deadline_missed` decision,
//! alerts, and with `on_deadline: cancel` cancels the run (`ax-scheduler`'s `deadlines.rs`).
//!
//! A wall-clock time maps to an instant by the cron rule (`crate::cron`): a time in a
//! spring-forward gap is the instant the clocks jump, a repeated one its first occurrence. A
//! wall-clock deadline at or before the logical time can never be met; for a cron schedule the
//! file is refused at apply ([`first_slot_not_before`]), for a triggered run it is missed at once.

use std::fmt;

use chrono::{DateTime, Days, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use crate::Millis;
use crate::cron::{CronSchedule, resolve_wall_time};
use crate::duration::{self, DurationError};
use crate::spec::TriggerKind;

/// By when a run must have ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Deadline {
    /// `[+Nd ]HH:MM`: at this wall-clock time in the schedule's zone, `days` after the run's
    /// logical date.
    WallClock { days: u32, hour: u32, minute: u32 },
    /// `2h`: this long after the run started (more than zero).
    AfterStart { ms: u64 },
}

/// What a missed deadline does besides its decision, alert and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDeadline {
    /// Nothing more: the run goes on (the default).
    #[default]
    Alert,
    /// The run is cancelled, its running tasks killed.
    Cancel,
}

impl OnDeadline {
    pub fn as_str(self) -> &'static str {
        match self {
            OnDeadline::Alert => "alert",
            OnDeadline::Cancel => "cancel",
        }
    }
}

/// The most days a wall-clock deadline may lie after the logical date.
pub const MAX_DAYS: u32 = 366;

/// Reads `06:30`, `+1d 06:30` (days `+0d` to `+366d`) or a duration with a unit (`2h`, `90m`,
/// `1h30m`). The error says what was expected.
pub fn parse(text: &str) -> Result<Deadline, String> {
    let text = text.trim();
    if text.contains(':') {
        return parse_wall_clock(text);
    }
    let expected = || {
        format!(
            "invalid deadline \"{text}\": expected a time of day (06:30), days after the logical \
             date and a time (+1d 06:30) or a duration from the run's start (2h, 90m)"
        )
    };
    let ms = match duration::parse_with_unit(text) {
        Ok(length) => u64::try_from(length.as_millis()).map_err(|_| expected())?,
        Err(err @ (DurationError::TooLarge(_) | DurationError::NoUnit(_))) => {
            return Err(format!("{err}, or a time of day such as 06:30"));
        }
        Err(DurationError::Invalid(_)) => return Err(expected()),
    };
    if ms == 0 {
        return Err("must be more than zero".into());
    }
    Ok(Deadline::AfterStart { ms })
}

fn parse_wall_clock(text: &str) -> Result<Deadline, String> {
    let invalid = || {
        format!(
            "invalid deadline \"{text}\": expected HH:MM (06:30), optionally after a number of \
             days (+1d 06:30)"
        )
    };
    let (days, time) = match text.strip_prefix('+') {
        Some(rest) => {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let after = rest[digits..].strip_prefix('d').ok_or_else(invalid)?;
            if digits == 0 || !after.starts_with(' ') {
                return Err(invalid());
            }
            let days: u32 = rest[..digits].parse().map_err(|_| invalid())?;
            if days > MAX_DAYS {
                return Err(format!(
                    "deadline \"{text}\": at most +{MAX_DAYS}d after the logical date"
                ));
            }
            (days, after.trim_start())
        }
        None => (0, text),
    };
    let (hour, minute) = time.split_once(':').ok_or_else(invalid)?;
    let digits = |part: &str, lengths: &[usize]| {
        lengths.contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(hour, &[1, 2]) || !digits(minute, &[2]) {
        return Err(invalid());
    }
    let (hour, minute): (u32, u32) = (
        hour.parse().map_err(|_| invalid())?,
        minute.parse().map_err(|_| invalid())?,
    );
    if hour > 23 || minute > 59 {
        return Err(format!(
            "invalid deadline \"{text}\": {hour:02}:{minute:02} is not a time of day (00:00 to \
             23:59)"
        ));
    }
    Ok(Deadline::WallClock { days, hour, minute })
}

impl fmt::Display for Deadline {
    /// As a file writes it: `06:30`, `+1d 06:30`, `2h`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Deadline::WallClock {
                days: 0,
                hour,
                minute,
            } => write!(f, "{hour:02}:{minute:02}"),
            Deadline::WallClock { days, hour, minute } => {
                write!(f, "+{days}d {hour:02}:{minute:02}")
            }
            Deadline::AfterStart { ms } => f.write_str(&crate::humane_duration(
                i64::try_from(ms).unwrap_or(i64::MAX),
            )),
        }
    }
}

impl Deadline {
    /// The instant of a run's deadline: a wall-clock one from its logical time, a duration
    /// from its start (`None` while it has not started: a queued run).
    pub fn instant(
        &self,
        logical_time: Millis,
        tz: Tz,
        started_at: Option<Millis>,
    ) -> Option<Millis> {
        match *self {
            Deadline::WallClock { days, hour, minute } => {
                wall_clock_instant(days, hour, minute, logical_time, tz)
            }
            Deadline::AfterStart { ms } => {
                started_at.map(|start| start.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
            }
        }
    }

    /// [`Deadline::instant`] in the zone named `timezone`, UTC when it names none (a stored
    /// spec's zone was checked when it was applied).
    pub fn instant_in_zone(
        &self,
        logical_time: Millis,
        timezone: &str,
        started_at: Option<Millis>,
    ) -> Option<Millis> {
        let tz = timezone.parse().unwrap_or(chrono_tz::UTC);
        self.instant(logical_time, tz, started_at)
    }

    /// Whether a run started by `trigger` has this deadline: a backfill slot is late by
    /// design, so a wall-clock deadline (long past for last month's slots) does not hold for
    /// it; a duration does, as for any run.
    pub fn applies_to(&self, trigger: TriggerKind) -> bool {
        !matches!(
            (self, trigger),
            (Deadline::WallClock { .. }, TriggerKind::Backfill)
        )
    }

    /// The duration from the run's start, for a deadline that is one.
    pub fn after_start_ms(&self) -> Option<u64> {
        match *self {
            Deadline::AfterStart { ms } => Some(ms),
            Deadline::WallClock { .. } => None,
        }
    }
}

/// `hour:minute` on the date `days` after `logical_time`'s date in `tz`.
fn wall_clock_instant(
    days: u32,
    hour: u32,
    minute: u32,
    logical_time: Millis,
    tz: Tz,
) -> Option<Millis> {
    let logical = DateTime::<Utc>::from_timestamp_millis(logical_time)?.with_timezone(&tz);
    let date = logical
        .date_naive()
        .checked_add_days(Days::new(u64::from(days)))?;
    let wall = date.and_time(NaiveTime::from_hms_opt(hour, minute, 0)?);
    resolve_wall_time(tz, wall)
}

/// The days after a reference date [`first_slot_not_before`] looks at: two years, so every
/// month, weekday, day of month and a 29 February come by, with the zone's DST changes.
const CHECKED_DAYS: u64 = 731;
/// The first day checked: 2027-01-01 (00:00 UTC), so the answer does not depend on today.
const CHECKED_FROM: Millis = 1_798_761_600_000;

/// A cron slot whose run could never meet a same-day wall-clock `deadline`: the first one, over
/// two years, that falls at or after the deadline on its own date in `tz` (DST days included).
/// `None` when every slot is before its deadline, or the deadline is a duration or on a later
/// day (always after a slot of its logical date).
pub fn first_slot_not_before(deadline: &Deadline, cron: &CronSchedule, tz: Tz) -> Option<Millis> {
    let Deadline::WallClock {
        days: 0,
        hour,
        minute,
    } = *deadline
    else {
        return None;
    };
    let first = DateTime::<Utc>::from_timestamp_millis(CHECKED_FROM)?.date_naive();
    for offset in 0..CHECKED_DAYS {
        let date = first.checked_add_days(Days::new(offset))?;
        let noon = tz
            .from_local_datetime(&date.and_time(NaiveTime::from_hms_opt(12, 0, 0)?))
            .earliest()?
            .timestamp_millis();
        let Some(due) = wall_clock_instant(0, hour, minute, noon, tz) else {
            continue;
        };
        // The first slot at or after the deadline: a problem when it is on the same date.
        let slot = cron.next_after(due - 1, tz)?;
        let slot_date = DateTime::<Utc>::from_timestamp_millis(slot)?
            .with_timezone(&tz)
            .date_naive();
        if slot_date == date {
            return Some(slot);
        }
    }
    None
}

/// Whether a run not ended and due at `deadline_at` has missed it at `now` (both on the
/// store's clock): the deadline itself counts as missed.
pub fn is_missed(deadline_at: Option<Millis>, ended: bool, now: Millis) -> bool {
    !ended && deadline_at.is_some_and(|at| at <= now)
}

/// The text of a missed deadline, for its decision and alert: the deadline as written, its
/// instant in the zone named `timezone` (UTC when it names none), and what follows.
pub fn missed_text(
    deadline: Option<&Deadline>,
    deadline_at: Millis,
    timezone: &str,
    action: OnDeadline,
) -> String {
    let tz: Tz = timezone.parse().unwrap_or(chrono_tz::UTC);
    let at = crate::why::format_time(deadline_at, tz);
    let written = deadline.map_or_else(String::new, |d| format!("deadline {d} "));
    let follows = match action {
        OnDeadline::Alert => "the run goes on",
        OnDeadline::Cancel => "the run is cancelled (on_deadline: cancel)",
    };
    format!("{written}({at}) passed before the run ended; {follows}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHANGHAI: Tz = chrono_tz::Asia::Shanghai;
    const NEW_YORK: Tz = chrono_tz::America::New_York;

    fn at(text: &str) -> Millis {
        DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp_millis())
            .unwrap_or_else(|err| panic!("{text}: {err}"))
    }

    fn wall(days: u32, hour: u32, minute: u32) -> Deadline {
        Deadline::WallClock { days, hour, minute }
    }

    /// What a `deadline:` reads as, or its refusal.
    #[test]
    fn parse_table() {
        let ok: &[(&str, Deadline)] = &[
            ("06:30", wall(0, 6, 30)),
            ("6:30", wall(0, 6, 30)),
            ("00:00", wall(0, 0, 0)),
            ("23:59", wall(0, 23, 59)),
            ("+1d 06:30", wall(1, 6, 30)),
            ("+0d 06:30", wall(0, 6, 30)),
            ("+2d   18:05", wall(2, 18, 5)),
            (" +366d 00:00 ", wall(366, 0, 0)),
            ("2h", Deadline::AfterStart { ms: 7_200_000 }),
            ("90m", Deadline::AfterStart { ms: 5_400_000 }),
            ("1h30m", Deadline::AfterStart { ms: 5_400_000 }),
            ("1d", Deadline::AfterStart { ms: 86_400_000 }),
            ("2s", Deadline::AfterStart { ms: 2_000 }),
        ];
        for (text, expected) in ok {
            assert_eq!(parse(text).as_ref(), Ok(expected), "{text}");
        }
        let refused: &[(&str, &str)] = &[
            (
                "24:00",
                "invalid deadline \"24:00\": 24:00 is not a time of day (00:00 to 23:59)",
            ),
            (
                "06:60",
                "invalid deadline \"06:60\": 06:60 is not a time of day (00:00 to 23:59)",
            ),
            (
                "06:3",
                "invalid deadline \"06:3\": expected HH:MM (06:30), optionally after a number of days (+1d 06:30)",
            ),
            (
                "06:30:00",
                "invalid deadline \"06:30:00\": expected HH:MM (06:30), optionally after a number of days (+1d 06:30)",
            ),
            (
                "+1d06:30",
                "invalid deadline \"+1d06:30\": expected HH:MM (06:30), optionally after a number of days (+1d 06:30)",
            ),
            (
                "+d 06:30",
                "invalid deadline \"+d 06:30\": expected HH:MM (06:30), optionally after a number of days (+1d 06:30)",
            ),
            (
                "+1h 06:30",
                "invalid deadline \"+1h 06:30\": expected HH:MM (06:30), optionally after a number of days (+1d 06:30)",
            ),
            (
                "+367d 06:30",
                "deadline \"+367d 06:30\": at most +366d after the logical date",
            ),
            (
                "-1d 06:30",
                "invalid deadline \"-1d 06:30\": expected HH:MM (06:30), optionally after a number of days (+1d 06:30)",
            ),
            ("0s", "must be more than zero"),
            (
                "90",
                "\"90\" has no unit: give one, e.g. 90d, 12h, 30m, or a time of day such as 06:30",
            ),
            (
                "soon",
                "invalid deadline \"soon\": expected a time of day (06:30), days after the logical date and a time (+1d 06:30) or a duration from the run's start (2h, 90m)",
            ),
            (
                "",
                "invalid deadline \"\": expected a time of day (06:30), days after the logical date and a time (+1d 06:30) or a duration from the run's start (2h, 90m)",
            ),
        ];
        for (text, expected) in refused {
            assert_eq!(parse(text), Err(expected.to_string()), "{text}");
        }
    }

    #[test]
    fn display_reads_back() {
        for text in ["06:30", "+1d 06:30", "2h", "1h30m", "45s"] {
            let deadline = parse(text).unwrap();
            assert_eq!(deadline.to_string(), text);
            assert_eq!(parse(&deadline.to_string()), Ok(deadline));
        }
    }

    /// A run's deadline instant: (deadline, logical time, zone, start, expected).
    #[test]
    fn instant_table() {
        type Row = (
            &'static str,
            &'static str,
            Tz,
            Option<&'static str>,
            Option<&'static str>,
        );
        let rows: &[Row] = &[
            // The logical date in the zone, not in UTC: 2026-03-01 02:00 CST is 03-01.
            (
                "06:30",
                "2026-02-28T18:00:00Z",
                SHANGHAI,
                None,
                Some("2026-02-28T22:30:00Z"),
            ),
            (
                "+1d 06:30",
                "2026-02-28T18:00:00Z",
                SHANGHAI,
                None,
                Some("2026-03-01T22:30:00Z"),
            ),
            (
                "06:30",
                "2026-06-01T02:00:00Z",
                chrono_tz::UTC,
                None,
                Some("2026-06-01T06:30:00Z"),
            ),
            // Across the end of a month and of a year.
            (
                "+1d 01:00",
                "2026-12-31T23:00:00Z",
                chrono_tz::UTC,
                None,
                Some("2027-01-01T01:00:00Z"),
            ),
            (
                "+2d 00:00",
                "2028-02-28T10:00:00Z",
                chrono_tz::UTC,
                None,
                Some("2028-03-01T00:00:00Z"),
            ),
            // Spring forward in New York (2026-03-08, 02:00 → 03:00): a deadline in the gap is
            // the instant the clocks jump; one after it is on the new offset.
            (
                "02:30",
                "2026-03-08T05:00:00Z",
                NEW_YORK,
                None,
                Some("2026-03-08T07:00:00Z"),
            ),
            (
                "06:30",
                "2026-03-08T05:00:00Z",
                NEW_YORK,
                None,
                Some("2026-03-08T10:30:00Z"),
            ),
            (
                "06:30",
                "2026-03-07T05:00:00Z",
                NEW_YORK,
                None,
                Some("2026-03-07T11:30:00Z"),
            ),
            // The day before: one more day lands after the change.
            (
                "+1d 06:30",
                "2026-03-07T05:00:00Z",
                NEW_YORK,
                None,
                Some("2026-03-08T10:30:00Z"),
            ),
            // Fall back (2026-11-01, 02:00 → 01:00): a repeated time is its first occurrence.
            (
                "01:30",
                "2026-11-01T04:00:00Z",
                NEW_YORK,
                None,
                Some("2026-11-01T05:30:00Z"),
            ),
            (
                "06:30",
                "2026-11-01T04:00:00Z",
                NEW_YORK,
                None,
                Some("2026-11-01T11:30:00Z"),
            ),
            // A duration counts from the start, whatever the logical time; none before it.
            (
                "2h",
                "2026-01-01T00:00:00Z",
                SHANGHAI,
                Some("2026-01-05T10:00:00Z"),
                Some("2026-01-05T12:00:00Z"),
            ),
            ("90m", "2026-01-01T00:00:00Z", SHANGHAI, None, None),
            // A duration over a DST change is elapsed time, not wall time.
            (
                "3h",
                "2026-03-08T05:00:00Z",
                NEW_YORK,
                Some("2026-03-08T06:00:00Z"),
                Some("2026-03-08T09:00:00Z"),
            ),
        ];
        for (text, logical, tz, started, expected) in rows {
            let deadline = parse(text).unwrap();
            let got = deadline.instant(at(logical), *tz, started.map(at));
            assert_eq!(got, expected.map(at), "{text} for {logical} in {tz}");
        }
    }

    /// Which cron schedules a same-day wall-clock deadline refuses: (cron, zone, deadline,
    /// the first slot refused).
    #[test]
    fn slots_at_or_after_the_deadline_table() {
        type Row = (&'static str, Tz, &'static str, Option<&'static str>);
        let rows: &[Row] = &[
            ("30 2 * * *", SHANGHAI, "06:30", None),
            ("0 7 * * *", SHANGHAI, "06:30", Some("2026-12-31T23:00:00Z")),
            // At the deadline itself is refused: it cannot be met.
            (
                "30 6 * * *",
                chrono_tz::UTC,
                "06:30",
                Some("2027-01-01T06:30:00Z"),
            ),
            ("29 6 * * *", chrono_tz::UTC, "06:30", None),
            // Any slot of the day counts, the latest one decides.
            (
                "0 1,8 * * *",
                chrono_tz::UTC,
                "06:30",
                Some("2027-01-01T08:00:00Z"),
            ),
            ("0 * * * *", chrono_tz::UTC, "23:59", None),
            (
                "* * * * *",
                chrono_tz::UTC,
                "23:59",
                Some("2027-01-01T23:59:00Z"),
            ),
            // Only some days: the first Monday of 2027 is 01-04.
            (
                "0 7 * * MON",
                chrono_tz::UTC,
                "06:30",
                Some("2027-01-04T07:00:00Z"),
            ),
            (
                "0 7 29 2 *",
                chrono_tz::UTC,
                "06:30",
                Some("2028-02-29T07:00:00Z"),
            ),
            // Next-day deadlines and durations are always after their slot.
            ("0 23 * * *", chrono_tz::UTC, "+1d 00:00", None),
            ("0 23 * * *", chrono_tz::UTC, "2h", None),
            // DST: a 02:30 slot and a 02:45 deadline both fall in the gap of 2027-03-14 and
            // become 03:00: that day could not be met.
            (
                "30 2 * * *",
                NEW_YORK,
                "02:45",
                Some("2027-03-14T07:00:00Z"),
            ),
            ("30 1 * * *", NEW_YORK, "01:45", None),
        ];
        for (cron, tz, text, expected) in rows {
            let schedule = CronSchedule::parse(cron).unwrap();
            let deadline = parse(text).unwrap();
            assert_eq!(
                first_slot_not_before(&deadline, &schedule, *tz),
                expected.map(at),
                "{cron} in {tz} with {text}"
            );
        }
    }

    #[test]
    fn a_backfill_slot_has_no_wall_clock_deadline_but_keeps_a_duration() {
        let wall = parse("06:30").unwrap();
        let duration = parse("2h").unwrap();
        for trigger in [
            TriggerKind::Cron,
            TriggerKind::Manual,
            TriggerKind::Api,
            TriggerKind::Dependency,
        ] {
            assert!(wall.applies_to(trigger), "{trigger}");
            assert!(duration.applies_to(trigger), "{trigger}");
        }
        assert!(!wall.applies_to(TriggerKind::Backfill));
        assert!(duration.applies_to(TriggerKind::Backfill));
    }

    #[test]
    fn missed_at_the_deadline_and_only_while_not_ended() {
        assert!(!is_missed(None, false, 10));
        assert!(!is_missed(Some(11), false, 10));
        assert!(is_missed(Some(10), false, 10));
        assert!(is_missed(Some(9), false, 10));
        assert!(!is_missed(Some(9), true, 10));
    }

    #[test]
    fn the_missed_text_says_what_follows() {
        let deadline = parse("06:30").unwrap();
        assert_eq!(
            missed_text(
                Some(&deadline),
                at("2026-01-01T22:30:00Z"),
                "Asia/Shanghai",
                OnDeadline::Cancel
            ),
            "deadline 06:30 (2026-01-02 06:30:00 CST) passed before the run ended; the run is \
             cancelled (on_deadline: cancel)"
        );
        assert_eq!(
            missed_text(None, at("2026-01-01T22:30:00Z"), "UTC", OnDeadline::Alert),
            "(2026-01-01 22:30:00 UTC) passed before the run ended; the run goes on"
        );
    }
}
