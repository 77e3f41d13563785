//! The scheduler's decisions, as pure functions of their inputs and `now`.
//!
//! Architecture invariant: this crate does no I/O. It depends on no async runtime, no gRPC, no
//! SQL and no Redis client (a tidy test in `ax-scheduler` checks `Cargo.toml`). Time comes in as
//! an argument (`Millis` since the Unix epoch), so every rule is tested with a fake clock.

pub mod cron;
pub mod dag;
pub mod decision;
pub mod dependency;
pub mod firing;
pub mod ids;
pub mod limits;
pub mod liveness;
pub mod params;
pub mod placement;
pub mod render;
pub mod retry;
pub mod run;
pub mod shard;
pub mod spec;
pub mod state;
pub mod task_status;
pub mod why;

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
