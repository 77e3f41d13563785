//! The scheduler's decisions, as pure functions of their inputs and `now`.
//!
//! Architecture invariant: this crate does no I/O. It depends on no async runtime, no gRPC, no
//! SQL, no Redis client and no random number generator (a tidy test in `ax-scheduler` checks
//! `Cargo.toml`). Time comes in as an argument (`Millis` since the Unix epoch), and so do random
//! numbers (placement's `random`, retry jitter's `unit_random`), so every rule is tested with a
//! fake clock and chosen draws.

pub mod access;
pub mod admission;
pub mod app_scope;
pub mod audit_text;
pub mod condition;
pub mod connections;
pub mod cron;
pub mod crontab_import;
pub mod cross_site;
pub mod dag;
pub mod deadline;
pub mod decision;
pub mod dependency;
pub mod dispatch_plan;
pub mod duration;
pub mod failure_audit;
pub mod firing;
pub mod for_each;
pub mod ids;
pub mod layout;
pub mod limits;
pub mod liveness;
pub mod mark;
pub mod mask;
pub mod outputs;
pub mod params;
pub mod placement;
pub mod release;
pub mod render;
pub mod retention;
pub mod retry;
pub mod run;
pub mod shard;
pub mod spec;
pub mod spread;
pub mod state;
pub mod sub_workflow;
pub mod task_status;
pub mod trigger_rule;
pub mod why;
pub mod worker_scope;
pub mod workflow_set;

/// Milliseconds since the Unix epoch, UTC. The one representation of an instant in ax.
pub type Millis = i64;

/// An instant as people and logs read it: RFC 3339 in UTC, to the second
/// (`2026-11-30T02:30:00Z`); the raw number when it is out of chrono's range.
pub fn rfc3339(at: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(at).map_or_else(
        || at.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// A span of time as people read it, to its two largest units: `850ms`, `4.2s`, `45s`,
/// `3m05s`, `1h`, `2h07m`, `3d04h`. Negative spans read as `0ms`.
pub fn humane_duration(ms: i64) -> String {
    let ms = ms.max(0);
    let secs = ms / 1000;
    let pair = |big: i64, big_unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit}{small:02}{small_unit}")
        }
    };
    match secs {
        _ if ms < 1000 => format!("{ms}ms"),
        0..60 if ms % 1000 == 0 => format!("{secs}s"),
        0..60 => format!("{:.1}s", ms as f64 / 1000.0),
        60..3600 => pair(secs / 60, "m", secs % 60, "s"),
        3600..86400 => pair(secs / 3600, "h", secs % 3600 / 60, "m"),
        _ => pair(secs / 86400, "d", secs % 86400 / 3600, "h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_and_durations_read_as_people_write_them() {
        assert_eq!(rfc3339(1_767_225_600_000), "2026-01-01T00:00:00Z");
        assert_eq!(humane_duration(850), "850ms");
        assert_eq!(humane_duration(4_200), "4.2s");
        assert_eq!(humane_duration(45_000), "45s");
        assert_eq!(humane_duration(185_000), "3m05s");
        assert_eq!(humane_duration(3_600_000), "1h");
        assert_eq!(humane_duration(2 * 3_600_000 + 7 * 60_000), "2h07m");
        assert_eq!(humane_duration(3 * 86_400_000 + 4 * 3_600_000), "3d04h");
        assert_eq!(humane_duration(2 * 86_400_000), "2d");
        assert_eq!(humane_duration(-5), "0ms");
    }
}
