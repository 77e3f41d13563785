//! Workflows as stored: a version with its spec and source, the light head a list reads, the
//! outcome of an apply, and a schedule whose fire time has come; batches of files applied
//! together, and workflows deleted (`sql/workflow_sets.rs`).

use ax_core::Millis;
use ax_core::ids::{RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;

#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    pub id: WorkflowId,
    pub name: String,
    /// Starts at 1; a new version is stored only when the applied spec differs.
    pub version: u32,
    pub spec: WorkflowSpec,
    /// The workflow file's text as applied.
    pub source: String,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A workflow and its latest version number, without the version's spec: what a list of many
/// workflows reads before it takes their specs from a cache (versions never change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowHead {
    pub id: WorkflowId,
    pub name: String,
    pub version: u32,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    Created,
    Updated,
    Unchanged,
}

/// A cron schedule whose next fire time has come.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSchedule {
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub cron: String,
    pub timezone: String,
    pub next_fire_at: Millis,
}

/// One workflow file of a batch apply: its spec, its text and its schedule's next cron fire
/// (None when not cron-triggered).
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    pub spec: &'a WorkflowSpec,
    pub source: &'a str,
    pub next_fire_at: Option<Millis>,
}

/// What applying a file would do now, read without writing (a dry run's answer).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedApply {
    pub outcome: ApplyOutcome,
    /// The latest stored version's number and text; None for a new workflow.
    pub stored: Option<(u32, String)>,
}

/// A workflow a delete or prune removes (or would remove).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoneWorkflow {
    pub id: WorkflowId,
    pub name: String,
    pub app: String,
    /// Its latest version.
    pub version: u32,
}

/// A workflow that cannot be deleted yet: its unfinished runs (RUNNING or QUEUED), the oldest
/// first, at most [`BUSY_RUNS_LISTED`] of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyWorkflow {
    pub name: String,
    pub runs: Vec<(RunId, RunState)>,
}

/// How many unfinished runs a refused delete names per workflow.
pub const BUSY_RUNS_LISTED: usize = 20;

/// A prune's candidates: the workflows it would delete and, of those, the ones whose
/// unfinished runs refuse it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrunePlan {
    pub gone: Vec<GoneWorkflow>,
    pub busy: Vec<BusyWorkflow>,
}

/// The answer of a batch apply.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchApplied {
    /// Every file stored (in the order given), and the pruned workflows deleted, in one
    /// transaction.
    Applied {
        applied: Vec<(WorkflowRecord, ApplyOutcome)>,
        deleted: Vec<GoneWorkflow>,
    },
    /// Nothing stored: workflows the prune would delete have unfinished runs.
    Busy(Vec<BusyWorkflow>),
}

/// The answer of a delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    Deleted(GoneWorkflow),
    /// Nothing changed: the workflow has unfinished runs.
    Busy(BusyWorkflow),
    /// No live workflow has that id (never was, or deleted already).
    NotFound,
}
