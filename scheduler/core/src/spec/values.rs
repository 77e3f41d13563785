//! The scalar values of the workflow format: names, environment variable names, durations and
//! instants. Each is checked the same way wherever it appears (a file, a trigger, a flag).

use super::model::Retention;
use crate::duration::{self, DurationError};

/// Whether `name` is a valid workflow, app or task name: `[a-z0-9][a-z0-9_.-]{0,63}`.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_lowercase() || first.is_ascii_digit() => {}
        _ => return false,
    }
    bytes.len() <= 64
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        })
}

/// Whether `name` is a valid environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_valid_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_alphabetic() || *first == b'_' => {}
        _ => return false,
    }
    bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// `90d`, `12h`, … (a duration with a unit, more than zero) or `forever`: a workflow's
/// `retention` and the scheduler's default ones. A bare number is refused although durations
/// elsewhere read it as seconds: `90` meant as days would delete a history within minutes.
pub fn parse_retention(text: &str) -> Result<Retention, String> {
    let text = text.trim();
    if text == "forever" {
        return Ok(Retention::Forever);
    }
    let keep = duration::parse_with_unit(text).map_err(|err| match err {
        DurationError::TooLarge(_) => err.to_string(),
        _ => format!("{err} (or forever to keep every run)"),
    })?;
    match u64::try_from(keep.as_millis()) {
        Ok(0) => Err("must be more than zero (forever keeps every run)".into()),
        Ok(ms) => Ok(Retention::Keep { ms }),
        Err(_) => Err(DurationError::TooLarge(text.to_string()).to_string()),
    }
}

/// The last instant of a range given as [`parse_instant`] reads it, inclusive: a bare date
/// (`2026-01-31`) stands for that whole day, so its end is the last millisecond before the next
/// day begins in `tz`; any other form is the instant itself.
pub fn parse_range_end(text: &str, tz: chrono_tz::Tz) -> Option<crate::Millis> {
    let text = text.trim();
    match chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        Ok(date) => {
            let next = date.succ_opt()?.format("%Y-%m-%d").to_string();
            parse_instant(&next, tz).map(|start| start - 1)
        }
        Err(_) => parse_instant(text, tz),
    }
}

/// Reads `2026-01-31`, `2026-01-31T08:30`, `2026-01-31T08:30:00` (wall time in `tz`; a time in
/// a spring-forward gap moves to after the gap, a repeated one takes its first occurrence) or an
/// RFC 3339 instant with its own offset.
pub fn parse_instant(text: &str, tz: chrono_tz::Tz) -> Option<crate::Millis> {
    use chrono::{NaiveDate, NaiveDateTime, TimeZone};
    let text = text.trim();
    if let Ok(instant) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(instant.timestamp_millis());
    }
    let naive = if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        date.and_hms_opt(0, 0, 0)?
    } else {
        [
            "%Y-%m-%dT%H:%M:%S",
            "%Y-%m-%dT%H:%M",
            "%Y-%m-%d %H:%M:%S",
            "%Y-%m-%d %H:%M",
        ]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())?
    };
    // Walk forward out of a DST gap a minute at a time (gaps are at most a few hours).
    (0..=24 * 60).find_map(|minutes| {
        tz.from_local_datetime(&(naive + chrono::Duration::minutes(minutes)))
            .earliest()
            .map(|t| t.timestamp_millis())
    })
}
