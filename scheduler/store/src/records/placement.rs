//! First attempts placed in the transaction that creates them: the attempt on offer, the
//! node's [`Placement`] that answers from memory, and the attempt created DISPATCHED.

use std::collections::BTreeMap;

use ax_core::Millis;
use ax_core::ids::{InstanceId, RunId, WorkflowId};

/// A first attempt the store is about to create in a transaction: what a node needs to choose
/// its worker (see [`Placement`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewAttempt {
    pub instance_id: InstanceId,
    pub run_id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow_version: u32,
    pub task: String,
    pub priority: i32,
    pub created_at: Millis,
}

/// Chooses, inside the transaction that creates a first attempt (a run's root task, or a task
/// whose upstreams have just succeeded), the worker it goes to now. A placed attempt is created
/// DISPATCHED with its attempt row, as a claim would leave it, so a task that can start at once
/// costs one commit between becoming ready and its dispatch instead of two (the creation, then
/// the dispatcher's claim). The caller sends it after the commit. `place` is called while the
/// transaction holds its locks: it must answer from memory. A transaction retried after a
/// deadlock calls it again for new instance ids; only the attempts returned with the result
/// were created.
pub trait Placement: Send {
    /// The node that claims what it places.
    fn node_id(&self) -> &str;
    /// The worker for `attempt` when it can go now; `None` leaves it WAITING.
    fn place(&mut self, attempt: &NewAttempt) -> Option<String>;
}

/// Places nothing: every first attempt is created WAITING.
pub struct NoPlacement;

impl Placement for NoPlacement {
    fn node_id(&self) -> &str {
        ""
    }

    fn place(&mut self, _: &NewAttempt) -> Option<String> {
        None
    }
}

/// A first attempt created DISPATCHED to `worker_id`, with what its dispatch carries.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedAttempt {
    pub attempt: NewAttempt,
    pub worker_id: String,
    pub dispatched_at: Millis,
    pub logical_time: Millis,
    pub params: BTreeMap<String, String>,
    /// What the run tells its handlers (`AX_RUN_STATE`, `AX_FAILED_TASKS`) once they started.
    pub run_env: BTreeMap<String, String>,
    /// The outputs of the run's tasks that succeeded and passed some on, by task.
    pub run_outputs: BTreeMap<String, ax_core::outputs::Outputs>,
}
