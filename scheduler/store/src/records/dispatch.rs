//! What dispatch reads and writes: the waiting instances with what their dispatch carries, a
//! node's share of the queue, a claim, and the attempts the store believes are on workers.

use std::collections::BTreeMap;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::state::InstanceState;

use crate::InstanceRecord;

/// A WAITING instance whose backoff has passed, with what a dispatch needs from its run.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingInstance {
    pub instance: InstanceRecord,
    pub logical_time: Millis,
    pub params: BTreeMap<String, String>,
    /// What the run tells its handlers (`AX_RUN_STATE`, `AX_FAILED_TASKS`) once they started.
    pub run_env: BTreeMap<String, String>,
    /// The outputs of the run's tasks that succeeded and passed some on, by task.
    pub run_outputs: BTreeMap<String, ax_core::outputs::Outputs>,
    /// Set for a shard of a sharded broadcast (see [`Store::fan_out`](crate::Store::fan_out)).
    pub shard: Option<Shard>,
}

/// A child of a fan-out: a shard of a sharded task (pinned to its worker), or an item of a
/// mapped task (`for_each`: the item it runs on, any worker). Which one, of how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub parent: InstanceId,
    pub index: u32,
    pub total: u32,
    /// The worker a shard is pinned to; `None` for an item.
    pub worker: Option<String>,
    /// The item's `AX_ITEM`; `None` for a shard.
    pub item: Option<String>,
}

/// The decision to send one attempt to one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchClaim {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    pub worker_id: String,
    pub node_id: String,
    pub at: Millis,
    /// The concurrency limits the instance counts against (`ax_core::limits::limits_for`);
    /// the claim is refused when one of them is full.
    pub limits: Vec<ax_core::limits::Limit>,
}

/// An attempt the store believes is on a worker (DISPATCHED or RUNNING), with what the
/// liveness rules of `ax_core::liveness` need.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveAttempt {
    pub instance_id: InstanceId,
    pub run_id: RunId,
    pub attempt: Attempt,
    pub state: InstanceState,
    pub worker_id: Option<String>,
    /// The scheduler node that dispatched the attempt.
    pub dispatched_by: Option<String>,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub last_heartbeat_at: Option<Millis>,
    /// The task's timeout in its workflow version.
    pub timeout_ms: Option<std::num::NonZeroU64>,
}

/// One node's share of the WAITING queue, so that nodes do not all claim the same instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueShare {
    pub nodes: u32,
    pub index: u32,
}
