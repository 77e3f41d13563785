//! The answers to a manual retry of one instance and to the two reruns of a run (its failed
//! part, or from one task down).

use ax_core::ids::InstanceId;
use ax_core::state::InstanceState;

use crate::InstanceRecord;

/// The answer to a manual retry of one instance.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per manual retry: size does not matter here
pub enum ManualRetry {
    /// The instance is WAITING again as its next attempt; its run is running again.
    Retried(InstanceRecord),
    /// Only FAILED, TIMEOUT and CANCELLED instances can be retried.
    NotRetryable(InstanceState),
    NotFound,
    /// The instance is a shard: its sharded task's instance `parent` is what is retried (it
    /// fans out again).
    Shard {
        parent: InstanceId,
    },
    /// A sharded task's instance that ended on a failed shard while `unfinished` shards still
    /// go: retried now, it would fan out beside them.
    ShardsActive {
        unfinished: u32,
    },
    /// A mapped task (`for_each`) that ended before it fanned out (its list was refused): it
    /// has no items to retry; a rerun from the task above it reads the list again.
    NotFannedOut,
}

/// The answer to `rerun_failed` (`axctl rerun RUN --failed`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RerunFailed {
    /// The instances now WAITING as their next attempt.
    pub retried: Vec<InstanceId>,
    /// Failed sharded tasks' instances left alone because shards of them still go: (instance,
    /// unfinished shards).
    pub shards_active: Vec<(InstanceId, u32)>,
}

/// The answer to `rerun_from` (`axctl rerun RUN --from TASK`).
#[derive(Debug, Clone, PartialEq)]
pub enum RerunFrom {
    /// The task's instance is WAITING as its next attempt; `pending` are the instances below it
    /// that ran before and now wait for their upstreams again (PENDING). The run is running.
    Rerun {
        again: InstanceId,
        pending: Vec<InstanceId>,
    },
    RunNotFound,
    /// No such task in the run's workflow version; `tasks` are its tasks in file order.
    UnknownTask {
        tasks: Vec<String>,
    },
    /// The task has no finished instance to run again (`None`: never created because an upstream
    /// did not succeed; `Some(PENDING)`: it waits for an upstream rerun).
    NotRun {
        state: Option<InstanceState>,
    },
    /// Instances of the task or below it are still waiting, dispatched or running.
    Active {
        busy: Vec<(String, InstanceState)>,
    },
    /// Sharded tasks of the task or below it still have shards going (task, how many): their
    /// instance ended on a failed shard while the others still run.
    ShardsActive {
        shards: Vec<(String, u32)>,
    },
    /// The task maps over a list (`for_each`) and ended before it fanned out: it has no items
    /// to run again; a rerun from the task above it reads the list again.
    NotFannedOut,
}

/// The answer to `rerun_tasks` (a selection of tasks, each with everything below it).
#[derive(Debug, Clone, PartialEq)]
pub enum RerunSelection {
    /// The chosen tasks no other chosen task is above are WAITING as their next attempt
    /// (`again`); `pending` are the instances below them (chosen or not) that ran before and
    /// wait for their upstreams again. The run is running.
    Rerun {
        again: Vec<InstanceId>,
        pending: Vec<InstanceId>,
    },
    /// Nothing changed: `task` of the selection cannot run again, `why` as for a rerun from it
    /// alone.
    Refused { task: String, why: RerunFrom },
}
