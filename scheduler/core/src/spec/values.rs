//! The scalar values of the workflow format: names, environment variable names, durations and
//! instants. Each is checked the same way wherever it appears (a file, a trigger, a flag).

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

/// Parses a duration of the workflow format into milliseconds: `500ms`, `45s`, `10m`, `2h`,
/// `1h30m`, `90d` (units from largest to smallest, each at most once; a day is 24 hours), or a
/// whole number of seconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let invalid = || {
        format!(
            "invalid duration \"{text}\": expected a form like 500ms, 45s, 10m, 2h, 1h30m, \
             90d or a whole number of seconds"
        )
    };
    let too_large = || format!("duration \"{text}\" is too large");
    let s = text.trim();
    if s.is_empty() {
        return Err(invalid());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = s.parse().map_err(|_| too_large())?;
        return seconds.checked_mul(1_000).ok_or_else(too_large);
    }
    // Units in the only order they may appear, with their length in milliseconds.
    const UNITS: [(&str, u64); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let mut total: u64 = 0;
    let mut next_unit = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let letters = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || letters == 0 {
            return Err(invalid());
        }
        let unit = &rest[digits..digits + letters];
        let Some(position) = UNITS[next_unit..].iter().position(|(u, _)| *u == unit) else {
            return Err(invalid());
        };
        let (_, unit_ms) = UNITS[next_unit + position];
        next_unit += position + 1;
        let amount: u64 = rest[..digits].parse().map_err(|_| too_large())?;
        total = amount
            .checked_mul(unit_ms)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(too_large)?;
        rest = &rest[digits + letters..];
    }
    Ok(total)
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
