//! Serializable views of the protobuf messages, for `-o json` and `-o yaml`. The generated
//! types do not derive `Serialize`, and a view lets the output use names and shapes meant for
//! people: enum names without their prefix, RFC 3339 times, ordered maps.

use std::collections::BTreeMap;

use ax_proto::v1 as pb;
use serde::Serialize;

use crate::output::{rfc3339, version_or_unknown};

/// `RUN_STATE_SUCCESS` → `SUCCESS`; an enum value this build does not know stays visible.
fn enum_name(name: Option<&'static str>, prefix: &str, raw: i32) -> String {
    match name {
        Some(name) => name.strip_prefix(prefix).unwrap_or(name).to_string(),
        None => format!("UNKNOWN({raw})"),
    }
}

pub fn run_state(raw: i32) -> String {
    enum_name(
        pb::RunState::try_from(raw).ok().map(|s| s.as_str_name()),
        "RUN_STATE_",
        raw,
    )
}

pub fn instance_state(raw: i32) -> String {
    let state = pb::InstanceState::try_from(raw)
        .ok()
        .map(|s| s.as_str_name());
    enum_name(state, "INSTANCE_STATE_", raw)
}

pub fn trigger_kind(raw: i32) -> String {
    let kind = pb::TriggerKind::try_from(raw).ok().map(|s| s.as_str_name());
    enum_name(kind, "TRIGGER_KIND_", raw)
}

pub fn worker_state(raw: i32) -> String {
    let state = pb::WorkerState::try_from(raw).ok().map(|s| s.as_str_name());
    enum_name(state, "WORKER_STATE_", raw)
}

pub fn apply_outcome(raw: i32) -> String {
    let outcome = pb::ApplyOutcome::try_from(raw)
        .ok()
        .map(|s| s.as_str_name());
    enum_name(outcome, "APPLY_OUTCOME_", raw)
}

pub fn log_stream(raw: i32) -> String {
    enum_name(
        pb::LogStream::try_from(raw).ok().map(|s| s.as_str_name()),
        "LOG_STREAM_",
        raw,
    )
}

fn sorted(map: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[derive(Debug, Serialize)]
pub struct ScheduleView {
    pub trigger: String,
    pub cron: String,
    pub timezone: String,
    pub misfire: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub max_catch_up: u32,
    pub overlap: String,
    pub max_active_runs: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
pub struct TaskView {
    pub name: String,
    pub command: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_dir: String,
    pub timeout_ms: u64,
    pub retries: u32,
    pub retry_backoff_ms: u64,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub upstream: Vec<String>,
}

impl From<&pb::TaskSpec> for TaskView {
    fn from(t: &pb::TaskSpec) -> Self {
        TaskView {
            name: t.name.clone(),
            command: t.command.clone(),
            argv: t.argv.clone(),
            env: sorted(&t.env),
            working_dir: t.working_dir.clone(),
            timeout_ms: t.timeout_ms,
            retries: t.retries,
            retry_backoff_ms: t.retry_backoff_ms,
            labels: sorted(&t.labels),
            priority: t.priority,
            upstream: t.upstream.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct WorkflowView {
    pub name: String,
    pub app: String,
    pub owner: String,
    pub description: String,
    pub version: u32,
    pub schedule: Option<ScheduleView>,
    pub paused: bool,
    pub tasks: Vec<TaskView>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    pub next_fires: Vec<String>,
    /// The params it declares, in file order; left out when it declares none (and of a list).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamView>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
}

/// A declared param (`params:` in the workflow file).
#[derive(Debug, Serialize)]
pub struct ParamView {
    pub name: String,
    pub description: String,
    /// None (null) when the param has no default; an empty default is `""`.
    pub default: Option<String>,
    pub required: bool,
    pub choices: Vec<String>,
}

impl From<&pb::WorkflowParam> for ParamView {
    fn from(p: &pb::WorkflowParam) -> Self {
        ParamView {
            name: p.name.clone(),
            description: p.description.clone(),
            default: p.has_default.then(|| p.default_value.clone()),
            required: p.required,
            choices: p.choices.clone(),
        }
    }
}

impl From<&pb::Workflow> for WorkflowView {
    fn from(w: &pb::Workflow) -> Self {
        WorkflowView {
            name: w.name.clone(),
            app: w.app.clone(),
            owner: w.owner.clone(),
            description: w.description.clone(),
            version: w.version,
            schedule: w.schedule.as_ref().map(|s| ScheduleView {
                trigger: trigger_kind(s.trigger),
                cron: s.cron.clone(),
                timezone: s.timezone.clone(),
                misfire: s.misfire.clone(),
                max_catch_up: s.max_catch_up,
                overlap: s.overlap.clone(),
                max_active_runs: s.max_active_runs,
                start: (s.start_at_ms != 0)
                    .then(|| rfc3339(s.start_at_ms))
                    .flatten(),
                end: (s.end_at_ms != 0).then(|| rfc3339(s.end_at_ms)).flatten(),
            }),
            paused: w.paused,
            tasks: w.tasks.iter().map(TaskView::from).collect(),
            created_at: rfc3339(w.created_at_ms),
            updated_at: rfc3339(w.updated_at_ms),
            next_fires: w
                .next_fires_ms
                .iter()
                .filter_map(|ms| rfc3339(*ms))
                .collect(),
            params: w.params.iter().map(ParamView::from).collect(),
            source: w.source.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ApplyView {
    pub outcome: String,
    pub warnings: Vec<String>,
    pub workflow: Option<WorkflowView>,
}

impl From<&pb::ApplyWorkflowResponse> for ApplyView {
    fn from(r: &pb::ApplyWorkflowResponse) -> Self {
        ApplyView {
            outcome: apply_outcome(r.outcome),
            warnings: r.warnings.clone(),
            workflow: r.workflow.as_ref().map(WorkflowView::from),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct CountsView {
    pub waiting: u32,
    pub dispatched: u32,
    pub running: u32,
    pub success: u32,
    pub failed: u32,
    pub timeout: u32,
    pub cancelled: u32,
    pub skipped: u32,
    pub upstream_failed: u32,
    pub not_created: u32,
}

impl From<&pb::InstanceCounts> for CountsView {
    fn from(c: &pb::InstanceCounts) -> Self {
        CountsView {
            waiting: c.waiting,
            dispatched: c.dispatched,
            running: c.running,
            success: c.success,
            failed: c.failed,
            timeout: c.timeout,
            cancelled: c.cancelled,
            skipped: c.skipped,
            upstream_failed: c.upstream_failed,
            not_created: c.not_created,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct RunView {
    pub id: i64,
    pub workflow: String,
    pub workflow_version: u32,
    pub state: String,
    pub trigger: String,
    pub logical_time: Option<String>,
    pub idempotency_key: String,
    pub params: BTreeMap<String, String>,
    pub triggered_by: String,
    pub created_at: Option<String>,
    pub finished_at: Option<String>,
    pub counts: CountsView,
    /// Only for a run with a deadline, and once it was missed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_missed_at: Option<String>,
    /// Only for a run a `run_workflow` task started: that task's run and name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<i64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub parent_task: String,
    /// The runs this run's `run_workflow` tasks started (`get run` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub child_run_ids: Vec<i64>,
}

impl From<&pb::Run> for RunView {
    fn from(r: &pb::Run) -> Self {
        RunView {
            id: r.id,
            workflow: r.workflow.clone(),
            workflow_version: r.workflow_version,
            state: run_state(r.state),
            trigger: trigger_kind(r.trigger),
            logical_time: rfc3339(r.logical_time_ms),
            idempotency_key: r.idempotency_key.clone(),
            params: sorted(&r.params),
            triggered_by: r.triggered_by.clone(),
            created_at: rfc3339(r.created_at_ms),
            finished_at: rfc3339(r.finished_at_ms),
            counts: r.counts.as_ref().map(CountsView::from).unwrap_or_default(),
            deadline_at: rfc3339(r.deadline_at_ms),
            deadline_missed_at: rfc3339(r.deadline_missed_at_ms),
            parent_run_id: (r.parent_run_id != 0).then_some(r.parent_run_id),
            parent_task: r.parent_task.clone(),
            child_run_ids: r.child_run_ids.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TriggerView {
    pub created: bool,
    pub run: Option<RunView>,
}

/// A run together with its instances, for `get run ID`.
#[derive(Debug, Serialize)]
pub struct RunDetailView {
    #[serde(flatten)]
    pub run: RunView,
    pub instances: Vec<InstanceView>,
    /// Every task of the run, with `pending` or `upstream_failed` for those without an instance.
    pub tasks: Vec<TaskStatusView>,
}

#[derive(Debug, Serialize)]
pub struct TaskStatusView {
    pub task: String,
    pub status: String,
    /// None when the task has no instance.
    pub instance_id: Option<i64>,
    /// A mapped task's items (`for_each`), counted by state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemCountsView>,
}

impl From<&pb::TaskStatus> for TaskStatusView {
    fn from(t: &pb::TaskStatus) -> Self {
        TaskStatusView {
            task: t.task.clone(),
            status: t.status.clone(),
            instance_id: (t.instance_id > 0).then_some(t.instance_id),
            items: t.items.as_ref().map(ItemCountsView::from),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ItemCountsView {
    pub total: u32,
    pub states: BTreeMap<String, u32>,
    pub first_failures: Vec<InstanceView>,
}

impl From<&pb::ItemCounts> for ItemCountsView {
    fn from(c: &pb::ItemCounts) -> Self {
        ItemCountsView {
            total: c.total,
            states: c.states.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            first_failures: c.first_failures.iter().map(InstanceView::from).collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AttemptView {
    pub attempt: u32,
    pub state: String,
    pub worker_id: String,
    pub dispatched_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub pid: u32,
    pub log_lines: u64,
    pub message: String,
    pub outputs: std::collections::BTreeMap<String, String>,
}

impl From<&pb::Attempt> for AttemptView {
    fn from(a: &pb::Attempt) -> Self {
        AttemptView {
            attempt: a.attempt,
            state: instance_state(a.state),
            worker_id: a.worker_id.clone(),
            dispatched_at: rfc3339(a.dispatched_at_ms),
            started_at: rfc3339(a.started_at_ms),
            finished_at: rfc3339(a.finished_at_ms),
            exit_code: a.exit_code,
            signal: a.signal,
            pid: a.pid,
            log_lines: a.log_lines,
            message: a.message.clone(),
            outputs: a
                .outputs
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct InstanceView {
    pub id: i64,
    pub run_id: i64,
    pub workflow: String,
    pub task: String,
    pub state: String,
    pub attempt: u32,
    pub worker_id: String,
    pub priority: i32,
    pub created_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    /// An item of a mapped task: the element it runs on and its 0-based index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_index: Option<u32>,
    pub attempts: Vec<AttemptView>,
}

impl From<&pb::Instance> for InstanceView {
    fn from(i: &pb::Instance) -> Self {
        InstanceView {
            id: i.id,
            run_id: i.run_id,
            workflow: i.workflow.clone(),
            task: i.task.clone(),
            state: instance_state(i.state),
            attempt: i.attempt,
            worker_id: i.worker_id.clone(),
            priority: i.priority,
            created_at: rfc3339(i.created_at_ms),
            started_at: rfc3339(i.started_at_ms),
            finished_at: rfc3339(i.finished_at_ms),
            exit_code: i.exit_code,
            item: i.item.clone(),
            item_index: i.item.as_ref().map(|_| i.shard_index),
            attempts: i.attempts.iter().map(AttemptView::from).collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct WorkerView {
    pub id: String,
    pub state: String,
    pub hostname: String,
    pub version: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub running: u32,
    pub started_at: Option<String>,
    pub last_heartbeat: Option<String>,
    pub scheduler_node: String,
}

impl From<&pb::WorkerInfo> for WorkerView {
    fn from(w: &pb::WorkerInfo) -> Self {
        WorkerView {
            id: w.id.clone(),
            state: worker_state(w.state),
            hostname: w.hostname.clone(),
            version: w.version.clone(),
            labels: sorted(&w.labels),
            capacity: w.capacity,
            running: w.running,
            started_at: rfc3339(w.started_at_ms),
            last_heartbeat: rfc3339(w.last_heartbeat_ms),
            scheduler_node: w.scheduler_node.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct NodeView {
    pub node_id: String,
    pub live: bool,
    pub address: String,
    pub version: String,
    pub started_at: Option<String>,
    pub renewed_at: Option<String>,
    pub expires_at: Option<String>,
    /// The node's clock minus the store's.
    pub clock_offset_ms: i64,
    pub workers: u32,
    /// The node's workers that are not dead, counted by their release (`unknown` for a worker
    /// that sent none): how far a rolling upgrade of the workers has gone.
    pub worker_versions: BTreeMap<String, u32>,
    /// `name=limit` pairs.
    pub pools: String,
    /// Now on the store's clock, which the lease times are judged against.
    pub store_now: Option<String>,
    /// The release that migrated the store's schema, its highest migration and the oldest
    /// release that may run on it; empty when the store records none.
    pub schema_release: String,
    pub schema_migration: i64,
    pub schema_oldest_release: String,
}

impl NodeView {
    pub fn new(
        node: &pb::NodeInfo,
        list: &pb::ListNodesResponse,
        workers: &[pb::WorkerInfo],
    ) -> Self {
        let mut worker_versions = BTreeMap::new();
        for worker in workers
            .iter()
            .filter(|w| w.scheduler_node == node.node_id && w.state != pb::WorkerState::Dead as i32)
        {
            *worker_versions
                .entry(version_or_unknown(&worker.version))
                .or_insert(0) += 1;
        }
        NodeView {
            node_id: node.node_id.clone(),
            live: node.live,
            address: node.address.clone(),
            version: node.version.clone(),
            started_at: rfc3339(node.started_at_ms),
            renewed_at: rfc3339(node.renewed_at_ms),
            expires_at: rfc3339(node.expires_at_ms),
            clock_offset_ms: node.clock_offset_ms,
            workers: node.workers,
            worker_versions,
            pools: node.pools.clone(),
            store_now: rfc3339(list.store_now_ms),
            schema_release: list.schema_release.clone(),
            schema_migration: list.schema_migration,
            schema_oldest_release: list.schema_oldest_release.clone(),
        }
    }
}

/// One log line, for `logs -o json` (one object per line, so it streams).
#[derive(Debug, Serialize)]
pub struct LogLineView {
    pub attempt: u32,
    pub seq: u64,
    pub stream: String,
    pub at: Option<String>,
    pub text: String,
}

impl LogLineView {
    pub fn new(attempt: u32, line: &pb::StoredLogLine) -> Self {
        LogLineView {
            attempt,
            seq: line.seq,
            stream: log_stream(line.stream),
            at: rfc3339(line.at_ms),
            text: line.text.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_names_lose_their_prefix_and_unknown_values_stay_visible() {
        assert_eq!(run_state(pb::RunState::Success as i32), "SUCCESS");
        assert_eq!(instance_state(pb::InstanceState::Timeout as i32), "TIMEOUT");
        assert_eq!(trigger_kind(pb::TriggerKind::Cron as i32), "CRON");
        assert_eq!(run_state(99), "UNKNOWN(99)");
    }
}
