//! Durations as people write them: one grammar for workflow files, the scheduler's flags,
//! environment and file, the worker's flags, token lifetimes and axctl, with one error text.
//! The Python SDK reads the same grammar (`sdk/python/src/ax_sdk/duration.py`); both are
//! tested against the same table of forms (`tests/durations.json`).
//!
//! ```text
//! duration = number | part { [spaces] part }   a bare number is seconds
//! part     = number [spaces] unit              units from the largest, each at most once
//! number   = ["+"] digits ["." [digits]] | ["+"] "." digits
//! unit     = "d" | "h" | "m" | "s" | "ms"      a day is 24 hours
//! ```
//!
//! Spaces around the whole are ignored. `500ms`, `1.5s`, `10 m`, `1h30m`, `1d 12h`, `90`, `0.25`
//! all read; a duration is exact to the nanosecond and at most `u64::MAX` milliseconds.

use std::time::Duration;

/// Why a text is not a duration. Its message quotes the text as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error(
        "invalid duration \"{0}\": expected a form like 500ms, 1.5s, 10m, 2h, 1h30m, 90d or a \
         number of seconds"
    )]
    Invalid(String),
    #[error("duration \"{0}\" is too large")]
    TooLarge(String),
    /// A bare number where a unit is required ([`parse_with_unit`]).
    #[error("\"{0}\" has no unit: give one, e.g. 90d, 12h, 30m")]
    NoUnit(String),
}

const NANOS_PER_MS: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Units in the only order they may appear, with their length in nanoseconds.
const UNITS: [(&str, u128); 5] = [
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("ms", NANOS_PER_MS),
];

/// Reads a duration of the grammar above.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_string());
    let too_large = || DurationError::TooLarge(text.to_string());
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    let mut next_unit = 0;
    let mut first = true;
    while !rest.is_empty() {
        let (number, after) = split_number(rest).ok_or_else(invalid)?;
        let after_spaces = after.trim_start();
        let letters = after_spaces
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        let (unit_nanos, next) = if letters == 0 {
            // A bare number is seconds, and only on its own.
            if !(first && after_spaces.is_empty()) {
                return Err(invalid());
            }
            (NANOS_PER_SEC, "")
        } else {
            let unit = &after_spaces[..letters];
            let position = UNITS[next_unit..]
                .iter()
                .position(|(name, _)| *name == unit)
                .ok_or_else(invalid)?;
            next_unit += position + 1;
            (UNITS[next_unit - 1].1, after_spaces[letters..].trim_start())
        };
        let nanos = number.nanos(unit_nanos).ok_or_else(too_large)?;
        total = total.checked_add(nanos).ok_or_else(too_large)?;
        rest = next;
        first = false;
    }
    if total / NANOS_PER_MS > u128::from(u64::MAX) {
        return Err(too_large());
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| too_large())?;
    Ok(Duration::new(secs, (total % NANOS_PER_SEC) as u32))
}

/// [`parse`] in whole milliseconds (a fraction of one is dropped).
pub fn parse_ms(text: &str) -> Result<u64, DurationError> {
    // `parse` caps a duration at u64::MAX milliseconds.
    parse(text).map(|duration| duration.as_millis() as u64)
}

/// [`parse`], refusing a bare number: where a duration deletes or keeps something for long
/// (`retention`, `--older-than`, a token's `--expires`), `90` meant as days must not read as
/// 90 seconds.
pub fn parse_with_unit(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    if !trimmed.is_empty()
        && trimmed
            .trim_start_matches('+')
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.')
        && trimmed.bytes().any(|b| b.is_ascii_digit())
    {
        return Err(DurationError::NoUnit(trimmed.to_string()));
    }
    parse(text)
}

/// A duration as [`parse`] reads it back exactly: `1500ms`, `0.000000250s`.
pub fn format(duration: Duration) -> String {
    if duration.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}.{:09}s", duration.as_secs(), duration.subsec_nanos())
    }
}

/// A number of the grammar: its whole part and the digits of its fraction.
struct Number<'a> {
    whole: &'a str,
    fraction: &'a str,
}

impl Number<'_> {
    /// The number times `unit` nanoseconds, to the nanosecond; `None` past `u128`.
    fn nanos(&self, unit: u128) -> Option<u128> {
        let whole = if self.whole.is_empty() {
            0
        } else {
            self.whole.parse::<u128>().ok()?
        };
        // Digits past the 18th are below a nanosecond for every unit.
        let fraction = &self.fraction[..self.fraction.len().min(18)];
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            let scale = 10u128.pow(fraction.len() as u32);
            fraction.parse::<u128>().ok()? * unit / scale
        };
        whole.checked_mul(unit)?.checked_add(fraction_nanos)
    }
}

/// The number at the start of `text` and what follows it; `None` when `text` does not start
/// with one.
fn split_number(text: &str) -> Option<(Number<'_>, &str)> {
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    let whole_len = unsigned.bytes().take_while(u8::is_ascii_digit).count();
    let whole = &unsigned[..whole_len];
    let after_whole = &unsigned[whole_len..];
    let (fraction, rest) = match after_whole.strip_prefix('.') {
        Some(after_point) => {
            let len = after_point.bytes().take_while(u8::is_ascii_digit).count();
            (&after_point[..len], &after_point[len..])
        }
        None => ("", after_whole),
    };
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    Some((Number { whole, fraction }, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forms every parser before this one accepted and the forms they refused, shared with
    /// the Python SDK's tests: each row is the text, then the nanoseconds it reads as or the
    /// error it gives ("invalid", "too large"), then where the form comes from.
    const FORMS: &str = include_str!("../tests/durations.json");

    #[test]
    fn every_form_reads_as_the_table_says() {
        let rows: Vec<(String, serde_json::Value, String)> =
            serde_json::from_str(FORMS).expect("the table is JSON");
        assert!(rows.len() > 50, "{} rows", rows.len());
        for (text, want, from) in rows {
            let got = parse(&text);
            match want {
                serde_json::Value::Number(nanos) => {
                    let nanos = nanos.as_u64().expect("whole nanoseconds") as u128;
                    let want = Duration::new(
                        (nanos / NANOS_PER_SEC) as u64,
                        (nanos % NANOS_PER_SEC) as u32,
                    );
                    assert_eq!(got, Ok(want), "{text:?} ({from})");
                    assert_eq!(parse(&format(want)), Ok(want), "{text:?} formatted");
                }
                serde_json::Value::String(error) if error == "invalid" => {
                    assert_eq!(got, Err(DurationError::Invalid(text.clone())), "{text:?}");
                }
                serde_json::Value::String(error) if error == "too large" => {
                    assert_eq!(got, Err(DurationError::TooLarge(text.clone())), "{text:?}");
                }
                other => panic!("{text:?}: unknown expectation {other}"),
            }
        }
    }

    #[test]
    fn errors_quote_the_text_and_show_the_forms() {
        assert_eq!(
            parse("soon").unwrap_err().to_string(),
            "invalid duration \"soon\": expected a form like 500ms, 1.5s, 10m, 2h, 1h30m, 90d \
             or a number of seconds"
        );
        assert_eq!(
            parse("99999999999999999h").unwrap_err().to_string(),
            "duration \"99999999999999999h\" is too large"
        );
        assert_eq!(
            parse_with_unit(" 90 ").unwrap_err().to_string(),
            "\"90\" has no unit: give one, e.g. 90d, 12h, 30m"
        );
    }

    #[test]
    fn the_largest_duration_is_u64_max_milliseconds() {
        let max = format!("{}ms", u64::MAX);
        assert_eq!(parse_ms(&max), Ok(u64::MAX));
        let past = format!("{}ms", u128::from(u64::MAX) + 1);
        assert_eq!(parse(&past), Err(DurationError::TooLarge(past.clone())));
        assert_eq!(parse_ms("1.9ms"), Ok(1));
    }

    #[test]
    fn a_unit_can_be_required() {
        for bare in ["90", "1.5", "+7", " 30 "] {
            assert!(
                matches!(parse_with_unit(bare), Err(DurationError::NoUnit(_))),
                "{bare}"
            );
        }
        assert_eq!(parse_with_unit("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert!(matches!(
            parse_with_unit("a while"),
            Err(DurationError::Invalid(_))
        ));
    }

    #[test]
    fn formatting_reads_back_exactly() {
        for duration in [
            Duration::ZERO,
            Duration::from_millis(1500),
            Duration::from_nanos(250),
            Duration::new(86_400 * 90, 1),
            Duration::from_millis(u64::MAX),
        ] {
            assert_eq!(parse(&format(duration)), Ok(duration), "{duration:?}");
        }
    }
}
