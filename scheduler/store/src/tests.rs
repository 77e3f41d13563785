//! The store's tests, one file per subject. Every conformance scenario is written once against
//! [`Store`](crate::Store) and runs, through `conformance!` (`support.rs`), on SQLite (a fresh
//! file per test) and on MySQL/MariaDB when `AX_TEST_MYSQL_URL` is set (a fresh database per
//! test, dropped afterwards); without it they are reported ignored (`build.rs`), and under
//! `CI=true` they run and fail instead.

#[macro_use]
mod support;

mod access;
mod admission;
mod advance;
mod advance_cost;
mod audit;
mod cancel;
mod claims;
mod conditions;
mod deadlines;
mod decisions;
mod dependents;
mod dispatch;
mod endings;
mod engine;
mod fan_out;
mod grid;
mod group_cost;
mod interleavings;
mod logs;
mod marks;
mod nodes;
mod open;
mod outputs;
mod placement;
mod purge;
mod queue;
mod release;
mod reports;
mod reruns;
mod runs;
mod sub_workflows;
mod trigger_rules;
mod workers;
mod workflow_sets;
mod workflows;
