//! Runs, their task instances and attempts as stored, the run to create and who asked for it,
//! and the counts of one run or of what is active store-wide.

use std::collections::BTreeMap;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::TriggerKind;
use ax_core::state::InstanceState;

use crate::Shard;

#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub state: RunState,
    pub trigger: TriggerKind,
    pub logical_time: Millis,
    pub idempotency_key: Option<String>,
    pub params: BTreeMap<String, String>,
    pub triggered_by: String,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    pub cancel_requested: bool,
    /// The key of keyed concurrency (`concurrency.key` over the params); `None` when the
    /// workflow had no key when the run was created.
    pub run_key: Option<String>,
    /// By when the run must have ended (`deadline:`); `None` without one, or while a duration
    /// deadline waits for the run to leave the queue.
    pub deadline_at: Option<Millis>,
    /// When a node judged the deadline missed; set once.
    pub deadline_missed_at: Option<Millis>,
    /// For a run a `run_workflow` task started: that task's run and instance.
    pub parent_run_id: Option<RunId>,
    pub parent_instance_id: Option<InstanceId>,
}

/// What a list of runs is narrowed to, besides its workflows. Every field left at its default
/// narrows nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub state: Option<RunState>,
    pub trigger: Option<TriggerKind>,
    /// Runs whose logical time is at or after this.
    pub logical_from: Option<Millis>,
    /// Runs whose logical time is at or before this.
    pub logical_to: Option<Millis>,
}

impl RunFilter {
    /// Only runs in `state`, when given.
    pub fn state(state: Option<RunState>) -> RunFilter {
        RunFilter {
            state,
            ..RunFilter::default()
        }
    }
}

/// A run to create. Unique per (workflow, dedup key): a second create with the same key returns
/// the first run and creates nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub workflow_id: WorkflowId,
    pub workflow_version: u32,
    pub trigger: TriggerKind,
    pub logical_time: Millis,
    /// `cron:<logical ms>` for cron fires, `key:<idempotency key>` for keyed triggers,
    /// `dep:<logical ms>` for a run started by its upstream workflows, none else.
    pub dedup_key: Option<String>,
    pub idempotency_key: Option<String>,
    pub params: BTreeMap<String, String>,
    pub triggered_by: String,
    pub now: Millis,
    /// For a run someone asked for (a manual or API trigger): who asked. A new run then gets
    /// its `trigger` audit row (by `triggered_by`, on `workflow/<name>`) in its own
    /// transaction.
    pub audit_from: Option<Caller>,
}

/// Where a call came from, as its audit row records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client's address.
    pub remote: String,
    /// The name of the token it came with; empty without authentication.
    pub token: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    pub id: InstanceId,
    pub run_id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub task: String,
    pub state: InstanceState,
    /// The current attempt: the fencing token every report must carry.
    pub attempt: Attempt,
    pub worker_id: Option<String>,
    pub priority: i32,
    /// A retry waits until this instant (its backoff).
    pub not_before: Millis,
    pub created_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub exit_code: Option<i32>,
    /// Set on a shard of a `sharded_broadcast` task: its parent instance, index, total and the
    /// worker it is pinned to.
    pub shard: Option<Shard>,
}

/// One try of an instance; never erased by a retry.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    pub state: InstanceState,
    pub worker_id: Option<String>,
    /// The scheduler node that dispatched it.
    pub node_id: Option<String>,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub pid: Option<u32>,
    pub log_lines: u64,
    pub message: String,
    /// What a successful attempt passed on (`$AX_OUTPUT`).
    pub outputs: ax_core::outputs::Outputs,
}

/// An instance that was DISPATCHED or RUNNING when it was cancelled: its worker must kill it.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelledAttempt {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    pub worker_id: Option<String>,
}

/// What is active in the whole store now, for a node's gauges (`Store::active_counts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ActiveCounts {
    pub waiting: u64,
    pub dispatched: u64,
    pub running: u64,
    /// Runs in the run queue (QUEUED): its depth.
    pub queued_runs: u64,
    pub running_runs: u64,
    /// Since when the oldest WAITING instance has been ready to go (its creation, or the end
    /// of its retry backoff), when one is.
    pub oldest_ready_since: Option<Millis>,
}

/// WAITING instances in the whole store, and by the app of their workflow when asked
/// (`Store::waiting_counts`), for a node's bounds on them (`ax_core::admission`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WaitingCounts {
    pub total: u64,
    /// Empty when not asked for.
    pub by_app: std::collections::HashMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceCounts {
    pub waiting: u32,
    pub dispatched: u32,
    pub running: u32,
    pub success: u32,
    pub failed: u32,
    pub timeout: u32,
    pub cancelled: u32,
    pub skipped: u32,
    pub upstream_failed: u32,
    /// Tasks of the run's workflow version with no instance yet.
    pub not_created: u32,
}
