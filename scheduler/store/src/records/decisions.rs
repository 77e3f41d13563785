//! A scheduling decision kept to be explained later (`axctl why`).

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::ids::{InstanceId, RunId, WorkflowId};

/// A scheduling decision worth explaining later (`axctl why`): see [`ax_core::decision`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRecord {
    /// When it was decided.
    pub at: Millis,
    pub workflow_id: WorkflowId,
    /// The instant the decision is about: a cron slot's logical time, or `at`.
    pub slot_at: Millis,
    pub run_id: Option<RunId>,
    pub instance_id: Option<InstanceId>,
    pub task: Option<String>,
    pub kind: DecisionKind,
    /// One line for a person: "previous run 41 still running", "no live worker with gpu=a100".
    pub detail: String,
    /// The scheduler node that decided.
    pub node_id: String,
}
