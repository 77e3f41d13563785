//! Store records and messages to workers as protobuf messages. Protobuf types stop at the
//! gRPC layer.

use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::run::RunState;
use ax_core::spec::{MisfirePolicy, ScheduleSpec, TaskSpec, TriggerKind, WorkflowSpec};
use ax_core::state::InstanceState;
use ax_proto::v1 as pb;
use ax_store::{
    AttemptRecord, InstanceCounts, InstanceRecord, ItemSummary, RunRecord, StoreError,
    WorkflowHead, WorkflowRecord,
};
use tonic::Status;

use crate::to_worker::{Refusal, ToWorker};

pub fn store_status(err: StoreError) -> Status {
    match err {
        StoreError::NotFound(what) => Status::not_found(format!("{what} not found")),
        StoreError::Database(_) => Status::unavailable(err.to_string()),
        other => Status::internal(other.to_string()),
    }
}

pub fn instance_state(state: InstanceState) -> pb::InstanceState {
    match state {
        InstanceState::Waiting => pb::InstanceState::Waiting,
        InstanceState::Dispatched => pb::InstanceState::Dispatched,
        InstanceState::Running => pb::InstanceState::Running,
        InstanceState::Success => pb::InstanceState::Success,
        InstanceState::Failed => pb::InstanceState::Failed,
        InstanceState::Timeout => pb::InstanceState::Timeout,
        InstanceState::Cancelled => pb::InstanceState::Cancelled,
        InstanceState::Pending => pb::InstanceState::Pending,
        InstanceState::Skipped => pb::InstanceState::Skipped,
        InstanceState::UpstreamFailed => pb::InstanceState::UpstreamFailed,
    }
}

pub fn run_state(state: RunState) -> pb::RunState {
    match state {
        RunState::Running => pb::RunState::Running,
        RunState::Queued => pb::RunState::Queued,
        RunState::Success => pb::RunState::Success,
        RunState::Failed => pb::RunState::Failed,
        RunState::Cancelled => pb::RunState::Cancelled,
    }
}

pub fn run_state_from(state: i32) -> Result<Option<RunState>, Status> {
    match pb::RunState::try_from(state) {
        Ok(pb::RunState::Unspecified) => Ok(None),
        Ok(pb::RunState::Running) => Ok(Some(RunState::Running)),
        Ok(pb::RunState::Success) => Ok(Some(RunState::Success)),
        Ok(pb::RunState::Failed) => Ok(Some(RunState::Failed)),
        Ok(pb::RunState::Cancelled) => Ok(Some(RunState::Cancelled)),
        Ok(pb::RunState::Queued) => Ok(Some(RunState::Queued)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown run state {state}"
        ))),
    }
}

/// A list's trigger filter: `None` for UNSPECIFIED (any).
pub fn trigger_from(kind: i32) -> Result<Option<TriggerKind>, Status> {
    match pb::TriggerKind::try_from(kind) {
        Ok(pb::TriggerKind::Unspecified) => Ok(None),
        Ok(pb::TriggerKind::Cron) => Ok(Some(TriggerKind::Cron)),
        Ok(pb::TriggerKind::Manual) => Ok(Some(TriggerKind::Manual)),
        Ok(pb::TriggerKind::Api) => Ok(Some(TriggerKind::Api)),
        Ok(pb::TriggerKind::Dependency) => Ok(Some(TriggerKind::Dependency)),
        Ok(pb::TriggerKind::Backfill) => Ok(Some(TriggerKind::Backfill)),
        Ok(pb::TriggerKind::Parent) => Ok(Some(TriggerKind::Parent)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown trigger kind {kind}"
        ))),
    }
}

pub fn trigger(kind: TriggerKind) -> pb::TriggerKind {
    match kind {
        TriggerKind::Cron => pb::TriggerKind::Cron,
        TriggerKind::Manual => pb::TriggerKind::Manual,
        TriggerKind::Api => pb::TriggerKind::Api,
        TriggerKind::Dependency => pb::TriggerKind::Dependency,
        TriggerKind::Backfill => pb::TriggerKind::Backfill,
        TriggerKind::Parent => pb::TriggerKind::Parent,
    }
}

fn task(task: &TaskSpec) -> pb::TaskSpec {
    pb::TaskSpec {
        name: task.name.clone(),
        command: task.command.clone(),
        argv: task.argv.clone(),
        env: task.env.clone().into_iter().collect(),
        working_dir: task.working_dir.clone().unwrap_or_default(),
        timeout_ms: task.timeout_ms.map_or(0, std::num::NonZeroU64::get),
        retries: task.retries,
        retry_backoff_ms: task.retry_backoff_ms,
        labels: task.labels.clone().into_iter().collect(),
        priority: task.priority,
        upstream: task.upstream.clone(),
        concurrency: task.concurrency,
        pool: task.pool.clone().unwrap_or_default(),
        routing: task.routing.as_str().to_string(),
    }
}

/// The next fire times of a cron workflow inside its start/end window (none when paused or not
/// cron-triggered).
fn next_fires_of(schedule: &ScheduleSpec, paused: bool, now: i64, count: usize) -> Vec<i64> {
    let Some(expression) = schedule.cron.as_deref() else {
        return Vec::new();
    };
    if paused {
        return Vec::new();
    }
    match (
        CronSchedule::parse(expression),
        parse_timezone(&schedule.timezone),
    ) {
        (Ok(cron), Ok(tz)) => ax_core::firing::upcoming(&cron, tz, now, window(schedule), count),
        _ => Vec::new(),
    }
}

/// The schedule's start/end window.
pub fn window(schedule: &ScheduleSpec) -> ax_core::firing::Window {
    ax_core::firing::Window {
        start_at: schedule.start_at,
        end_at: schedule.end_at,
    }
}

fn schedule(schedule: &ScheduleSpec) -> pb::Schedule {
    pb::Schedule {
        trigger: trigger(schedule.trigger) as i32,
        cron: schedule.cron.clone().unwrap_or_default(),
        timezone: schedule.timezone.clone(),
        misfire: schedule.misfire.name().to_string(),
        max_catch_up: match schedule.misfire {
            MisfirePolicy::CatchUp { max } => max,
            _ => 0,
        },
        overlap: schedule.overlap.as_str().to_string(),
        max_active_runs: schedule.max_active_runs,
        start_at_ms: schedule.start_at.unwrap_or(0),
        end_at_ms: schedule.end_at.unwrap_or(0),
        after: schedule.after.clone(),
    }
}

pub fn workflow(record: &WorkflowRecord, now: i64) -> pb::Workflow {
    pb::Workflow {
        tasks: record.spec.tasks.iter().map(task).collect(),
        source: record.source.clone(),
        params: record.spec.params.iter().map(declared_param).collect(),
        ..workflow_summary(record, now)
    }
}

/// A declared param (`params:` of the workflow file), as a trigger form reads it.
pub fn declared_param(param: &ax_core::spec::ParamSpec) -> pb::WorkflowParam {
    pb::WorkflowParam {
        name: param.name.clone(),
        description: param.description.clone(),
        default_value: param.default.clone().unwrap_or_default(),
        has_default: param.default.is_some(),
        required: param.required,
        choices: param.choices.clone(),
    }
}

/// A workflow without its tasks and source, as a list shows it.
pub fn workflow_summary(record: &WorkflowRecord, now: i64) -> pb::Workflow {
    let head = WorkflowHead {
        id: record.id,
        name: record.name.clone(),
        version: record.version,
        paused: record.paused,
        created_at: record.created_at,
        updated_at: record.updated_at,
    };
    head_summary(&head, &record.spec, now)
}

/// A workflow without its tasks and source, from its head and its version's spec (cached).
pub fn head_summary(head: &WorkflowHead, spec: &WorkflowSpec, now: i64) -> pb::Workflow {
    pb::Workflow {
        name: head.name.clone(),
        app: spec.app.clone(),
        owner: spec.owner.clone(),
        description: spec.description.clone(),
        version: head.version,
        schedule: Some(schedule(&spec.schedule)),
        concurrency: Some(pb::Concurrency {
            max_running_tasks: spec.concurrency.max_running_tasks,
            key: spec.concurrency.key.clone().unwrap_or_default(),
            max_runs_per_key: spec.concurrency.max_runs_per_key,
        }),
        paused: head.paused,
        tasks: Vec::new(),
        created_at_ms: head.created_at,
        updated_at_ms: head.updated_at,
        next_fires_ms: next_fires_of(&spec.schedule, head.paused, now, 5),
        source: String::new(),
        recent_runs: Vec::new(),
        task_count: u32::try_from(spec.tasks.len()).unwrap_or(u32::MAX),
        params: Vec::new(),
    }
}

pub fn counts(counts: &InstanceCounts) -> pb::InstanceCounts {
    pb::InstanceCounts {
        waiting: counts.waiting,
        dispatched: counts.dispatched,
        running: counts.running,
        success: counts.success,
        failed: counts.failed,
        timeout: counts.timeout,
        cancelled: counts.cancelled,
        not_created: counts.not_created,
        skipped: counts.skipped,
        upstream_failed: counts.upstream_failed,
    }
}

pub fn run(record: &RunRecord, instance_counts: Option<&InstanceCounts>) -> pb::Run {
    pb::Run {
        id: record.id.0,
        workflow: record.workflow.clone(),
        workflow_version: record.workflow_version,
        state: run_state(record.state) as i32,
        trigger: trigger(record.trigger) as i32,
        logical_time_ms: record.logical_time,
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        params: record.params.clone().into_iter().collect(),
        triggered_by: record.triggered_by.clone(),
        created_at_ms: record.created_at,
        finished_at_ms: record.finished_at.unwrap_or(0),
        counts: instance_counts.map(counts),
        deadline_at_ms: record.deadline_at.unwrap_or(0),
        deadline_missed_at_ms: record.deadline_missed_at.unwrap_or(0),
        parent_run_id: record.parent_run_id.map_or(0, |id| id.0),
        parent_instance_id: record.parent_instance_id.map_or(0, |id| id.0),
        // Filled by `GetRun`, which reads them (`ControlApi::run_message`).
        parent_task: String::new(),
        child_run_ids: Vec::new(),
    }
}

pub fn attempt(record: &AttemptRecord) -> pb::Attempt {
    pb::Attempt {
        attempt: record.attempt.0,
        state: instance_state(record.state) as i32,
        worker_id: record.worker_id.clone().unwrap_or_default(),
        node_id: record.node_id.clone().unwrap_or_default(),
        dispatched_at_ms: record.dispatched_at.unwrap_or(0),
        started_at_ms: record.started_at.unwrap_or(0),
        finished_at_ms: record.finished_at.unwrap_or(0),
        exit_code: record.exit_code,
        signal: record.signal,
        pid: record.pid.unwrap_or(0),
        log_lines: record.log_lines,
        message: record.message.clone(),
        outputs: record
            .outputs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        // Filled by `GetInstance` for a run_workflow task (`ControlApi::instance_message`).
        child_run_id: 0,
    }
}

pub fn instance(record: &InstanceRecord, attempts: &[AttemptRecord]) -> pb::Instance {
    pb::Instance {
        id: record.id.0,
        run_id: record.run_id.0,
        workflow: record.workflow.clone(),
        task: record.task.clone(),
        state: instance_state(record.state) as i32,
        attempt: record.attempt.0,
        worker_id: record.worker_id.clone().unwrap_or_default(),
        created_at_ms: record.created_at,
        started_at_ms: record.started_at.unwrap_or(0),
        finished_at_ms: record.finished_at.unwrap_or(0),
        exit_code: record.exit_code,
        attempts: attempts.iter().map(attempt).collect(),
        priority: record.priority,
        shard_parent_id: record.shard.as_ref().map_or(0, |s| s.parent.0),
        shard_index: record.shard.as_ref().map_or(0, |s| s.index),
        shard_total: record.shard.as_ref().map_or(0, |s| s.total),
        item: record.shard.as_ref().and_then(|s| s.item.clone()),
    }
}

/// A mapped task's items as counts by state and its first failures.
pub fn item_counts(summary: &ItemSummary) -> pb::ItemCounts {
    pb::ItemCounts {
        total: summary.total,
        states: summary
            .states
            .iter()
            .map(|(state, n)| (state.as_str().to_string(), *n))
            .collect(),
        first_failures: summary
            .first_failures
            .iter()
            .map(|i| instance(i, &[]))
            .collect(),
    }
}

/// A message to a worker as its stream's frame; the end of the stream as its status.
pub fn worker_frame(message: ToWorker) -> Result<pb::SchedulerMessage, Status> {
    use pb::scheduler_message::Body;
    let body = match message {
        ToWorker::Dispatch(dispatch) => Body::Dispatch(pb::Dispatch {
            instance_id: dispatch.instance.0,
            attempt: dispatch.attempt.0,
            run_id: dispatch.run.0,
            workflow: dispatch.workflow,
            task: dispatch.task,
            command: dispatch.command,
            argv: dispatch.argv,
            env: dispatch.env,
            working_dir: dispatch.working_dir,
            timeout_ms: dispatch.timeout_ms.map_or(0, std::num::NonZeroU64::get),
            logical_time_ms: dispatch.logical_time,
            shard_index: dispatch.shard.map_or(0, |(index, _)| index),
            shard_total: dispatch.shard.map_or(0, |(_, total)| total),
            keep_when_cut_off: dispatch.keep_when_cut_off,
            survive_worker_restart: dispatch.survive_worker_restart,
        }),
        ToWorker::Cancel {
            instance,
            attempt,
            reason,
        } => Body::Cancel(pb::CancelAttempt {
            instance_id: instance.0,
            attempt: attempt.0,
            reason,
        }),
        ToWorker::FinishedAck { instance, attempt } => Body::FinishedAck(pb::FinishedAck {
            instance_id: instance.0,
            attempt: attempt.0,
        }),
        ToWorker::LogAck {
            instance,
            attempt,
            seq,
        } => Body::LogAck(pb::LogAck {
            instance_id: instance.0,
            attempt: attempt.0,
            seq,
        }),
        ToWorker::HeartbeatAck { sent_at_ms } => {
            Body::HeartbeatAck(pb::HeartbeatAck { sent_at_ms })
        }
        ToWorker::Refused {
            instance,
            attempt,
            reason,
            kill,
            why,
        } => Body::Refused(pb::ReportRefused {
            instance_id: instance.0,
            attempt: attempt.0,
            reason,
            kill,
            code: refusal_code(why) as i32,
        }),
        ToWorker::MoveElsewhere { reason, to_address } => {
            Body::MoveElsewhere(pb::MoveElsewhere { reason, to_address })
        }
        ToWorker::CutOff { node_id } => return Err(ax_proto::cut_off::status(&node_id)),
    };
    Ok(pb::SchedulerMessage { body: Some(body) })
}

/// A refusal's gRPC code, as `ReportRefused.code` carries it.
fn refusal_code(why: Refusal) -> tonic::Code {
    match why {
        Refusal::Stranger => tonic::Code::PermissionDenied,
        Refusal::Unknown => tonic::Code::NotFound,
        Refusal::Stale => tonic::Code::FailedPrecondition,
    }
}
