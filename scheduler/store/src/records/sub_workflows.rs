//! Sub-workflows: a `run_workflow` task's child run to start, and the waits the sweep settles.

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;

use super::runs::RunRecord;

/// The start of a WAITING `run_workflow` task's attempt (`Store::start_sub_workflow`). What to
/// start (the workflow, the params' templates, the app it must be of) the store reads from the
/// task's definition, in the start's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubWorkflowStart {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    /// The node that starts it, on the attempt's row.
    pub node_id: String,
    pub now: Millis,
}

/// What a start did.
#[derive(Debug, Clone, PartialEq)]
pub enum SubWorkflowStarted {
    /// The attempt is RUNNING and waits on this child run (boxed: a run record is large).
    Started { child: Box<RunRecord> },
    /// The instance is no longer WAITING as that attempt: nothing was done.
    NotWaiting,
    /// No child could be started: the attempt ended FAILED with this reason.
    Failed { reason: String },
}

/// A parent attempt's wait on its child run, with both sides as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubWorkflowWait {
    pub parent_instance_id: InstanceId,
    pub parent_attempt: Attempt,
    pub parent_run_id: RunId,
    pub child_run_id: RunId,
    pub child_workflow: String,
    pub child_state: RunState,
    /// The parent's instance is RUNNING as this attempt.
    pub parent_waiting: bool,
    /// When the parent's instance started its current attempt.
    pub parent_started_at: Option<Millis>,
    /// The parent task's `timeout:`, which bounds its wait for the child.
    pub parent_timeout_ms: Option<std::num::NonZeroU64>,
    /// Both sides had ended and the sweep closed it.
    pub closed: bool,
}

impl SubWorkflowWait {
    /// Where the parent's side stands at `now` (`ax_core::sub_workflow::ParentSide`).
    pub fn parent_side(&self, now: Millis) -> ax_core::sub_workflow::ParentSide {
        ax_core::sub_workflow::ParentSide::of(
            self.parent_waiting,
            self.parent_started_at,
            self.parent_timeout_ms,
            now,
        )
    }
}
