//! A purge of history a bounded step at a time: the step, where it stopped, and what it
//! deleted.

use ax_core::Millis;
use ax_core::ids::{RunId, WorkflowId};

/// One step of a purge of history (retention, `axctl purge`): the ended runs of one workflow
/// that ended before `ended_before`, taken in end order after `after`, a bounded batch at a
/// time. See [`Store::purge_runs`](crate::Store::purge_runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeStep {
    pub workflow_id: WorkflowId,
    /// Runs that ended (SUCCESS, FAILED or CANCELLED) before this instant go.
    pub ended_before: Millis,
    /// Where the previous step of the same pass stopped; `None` for the first step.
    pub after: Option<PurgeCursor>,
    /// Runs per step, at most.
    pub max_runs: u32,
    /// Rows per step besides the runs' own (instances, attempts, log chunks, decisions), at
    /// most, except that a step always takes at least one instance.
    pub max_rows: u32,
    /// Count what the step would delete; delete nothing.
    pub dry_run: bool,
}

/// A position in a workflow's ended runs: end time, then run id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PurgeCursor {
    pub finished_at: Millis,
    pub run: RunId,
}

/// Rows a purge deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeCounts {
    pub runs: u64,
    pub instances: u64,
    pub attempts: u64,
    pub log_chunks: u64,
    pub decisions: u64,
}

impl PurgeCounts {
    /// Every row, runs included.
    pub fn rows(&self) -> u64 {
        self.runs + self.instances + self.attempts + self.log_chunks + self.decisions
    }
}

impl std::ops::AddAssign for PurgeCounts {
    fn add_assign(&mut self, other: PurgeCounts) {
        self.runs += other.runs;
        self.instances += other.instances;
        self.attempts += other.attempts;
        self.log_chunks += other.log_chunks;
        self.decisions += other.decisions;
    }
}

/// What one [`Store::purge_runs`](crate::Store::purge_runs) step did, and where the next one
/// starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeProgress {
    pub counts: PurgeCounts,
    /// `None` when no ended run past the cutoff is left after this step (in a dry run: after the
    /// runs it counted).
    pub next: Option<PurgeCursor>,
}
