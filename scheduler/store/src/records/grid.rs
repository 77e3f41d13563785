//! A workflow's recent runs read as a matrix of cells (`sql/grid.rs`): what the web UI's grid
//! draws.

use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::state::InstanceState;

/// Which parts of the cells to read besides their states: each is a read of its own, skipped
/// for a workflow that has no task of its kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GridParts {
    /// The items of mapped tasks (`for_each`), counted by state.
    pub items: bool,
    /// The child runs of `run_workflow` tasks.
    pub child_runs: bool,
}

/// One cell: a task's own instance in a run (never a shard or an item).
#[derive(Debug, Clone, PartialEq)]
pub struct GridCell {
    pub run: RunId,
    pub task: String,
    pub instance: InstanceId,
    pub state: InstanceState,
    pub attempt: Attempt,
    /// The child run the current attempt started (a `run_workflow` task), with
    /// [`GridParts::child_runs`].
    pub child_run: Option<RunId>,
    /// A mapped task's items of its latest fan-out by state, in the states' order (states
    /// without items left out), with [`GridParts::items`]; empty for a task without items.
    pub items: Vec<(InstanceState, u32)>,
}
