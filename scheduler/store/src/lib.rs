//! The store of record: workflows, runs, task instances and their attempts, log lines, node
//! leases, workers, tokens, secrets, decisions and audit rows, on MySQL (shared by any number of
//! scheduler nodes) or SQLite (one node).
//!
//! Only this crate knows SQL. Every instance transition is a conditional update keyed by
//! (instance, attempt, from-state); the decisions themselves (is the transition legal, is a
//! downstream task ready, does the run end, when does a retry start) come from `ax-core`.
//!
//! Callers hold one [`Store`] (from [`open`]). Its methods live by subject in `sql/`, each
//! beside its SQL with a doc comment that says what it guarantees: `workflows.rs` (and their
//! schedules), `run_create.rs`, `runs.rs`, `cancel.rs`, `rerun.rs`, `dispatch.rs`, `reports.rs`,
//! `logs.rs`, `workers.rs`, `gauges.rs`, `nodes.rs`, `audit.rs`, `access.rs`, `decisions.rs`,
//! `dependents.rs`, `deadlines.rs`, `purge.rs` and `workflow_sets.rs` (batches of files, deletes). The
//! records they take and give live by subject in `records/` and are re-exported here.

use std::sync::Arc;

mod records;
mod sql;
#[cfg(test)]
mod tests;

pub use records::access::{NewToken, SecretRecord, TokenRecord};
pub use records::admission::WaitingBounds;
pub use records::audit::{AuditFilter, AuditRecord};
pub use records::deadlines::{DeadlineMiss, MissedDeadline};
pub use records::decisions::DecisionRecord;
pub use records::dispatch::{ActiveAttempt, DispatchClaim, QueueShare, Shard, WaitingInstance};
pub use records::grid::{GridCell, GridParts};
pub use records::items::{FIRST_FAILURES, ItemPage, ItemSummary, MAX_ITEM_PAGE};
pub use records::logs::{LogChunk, LogStream, MispackedLines, StoredLine};
pub use records::marks::MarkAnswer;
pub use records::nodes::{LeaseClaim, NodeLease};
pub use records::placement::{NewAttempt, NoPlacement, PlacedAttempt, Placement};
pub use records::purge::{PurgeCounts, PurgeCursor, PurgeProgress, PurgeStep};
pub use records::reports::{Applied, AttemptEnd, Report, ReportResult};
pub use records::reruns::{ManualRetry, RerunFailed, RerunFrom, RerunSelection};
pub use records::runs::{
    ActiveCounts, AttemptRecord, Caller, CancelledAttempt, InstanceCounts, InstanceRecord, NewRun,
    RunFilter, RunRecord, WaitingCounts,
};
pub use records::sub_workflows::{SubWorkflowStart, SubWorkflowStarted, SubWorkflowWait};
pub use records::workers::WorkerRecord;
pub use records::workflows::{
    ApplyOutcome, BUSY_RUNS_LISTED, BatchApplied, BatchItem, BusyWorkflow, Deleted, DueSchedule,
    GoneWorkflow, PlannedApply, PrunePlan, WorkflowHead, WorkflowRecord,
};
pub use sql::Store;
pub use sql::engine::Engine;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported store url {0:?}: expected sqlite://PATH or mysql://USER@HOST/DB")]
    UnsupportedUrl(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database cannot serve ax as it is (read-only, keys missing).
    #[error("{0}")]
    Unusable(String),
}

impl StoreError {
    /// The database could not be reached (connection lost or refused, pool exhausted or
    /// closed), as opposed to a statement it refused.
    pub fn is_unreachable(&self) -> bool {
        sql::db_errors::is_unreachable(self)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    MySql,
}

/// Opens the store at `url` (`sqlite://PATH` or `mysql://…`) and runs its migrations.
pub async fn open(url: &str) -> Result<Arc<Store>> {
    open_with(url, &StoreOptions::default()).await
}

/// [`open`] with `options`.
pub async fn open_with(url: &str, options: &StoreOptions) -> Result<Arc<Store>> {
    Ok(Arc::new(Store::connect_with(url, options).await?))
}

/// How a store's connections behave.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// MySQL: how long the server keeps a session that sends nothing (`wait_timeout`, whole
    /// seconds, at least 1) before it drops it and rolls back its open transaction. A node cut
    /// off from the database in the middle of a transaction holds that transaction's row locks
    /// for this long, and every other node needing those rows waits for it.
    pub silent_client_timeout: std::time::Duration,
    /// MySQL: decide as on a multi-primary cluster member (writing the rows a decision locks)
    /// whatever the server is; a member is detected and needs no option. Tests run a single
    /// server so, to check what that adds.
    pub write_locked_rows: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            silent_client_timeout: std::time::Duration::from_secs(10),
            write_locked_rows: false,
        }
    }
}
