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
