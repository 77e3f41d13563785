//! Column lists and row decoding shared by the queries.

use std::collections::BTreeMap;
use std::str::FromStr;

use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::{TriggerKind, WorkflowSpec};
use ax_core::state::InstanceState;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{
    AttemptRecord, AuditRecord, DecisionRecord, InstanceRecord, Result, RunRecord, Shard,
    StoreError, WorkerRecord, WorkflowRecord,
};

pub(crate) const WORKFLOW_SELECT: &str = "SELECT w.id, w.name, w.paused, w.created_at, \
     w.updated_at, v.version, v.spec_json, v.source FROM workflow w JOIN workflow_version v \
     ON v.workflow_id = w.id";

pub(crate) const RUN_SELECT: &str = "SELECT r.id, r.workflow_id, w.name AS workflow_name, \
     r.workflow_version, r.state, r.trigger_type, r.logical_time, r.idempotency_key, \
     r.params_json, r.triggered_by, r.created_at, r.finished_at, r.cancel_requested, \
     r.run_key, r.deadline_at, r.deadline_missed_at, r.parent_run_id, r.parent_instance_id \
     FROM run r \
     JOIN workflow w ON w.id = r.workflow_id";

pub(crate) const INSTANCE_SELECT: &str = "SELECT ti.id, ti.run_id, ti.workflow_id, \
     w.name AS workflow_name, ti.workflow_version, ti.task_name, ti.state, ti.attempt, \
     ti.worker_id, ti.priority, ti.not_before, ti.created_at, ti.started_at, ti.finished_at, \
     ti.exit_code, ti.parent_id, ti.shard_index, ti.shard_total, ti.pinned_worker, ti.item \
     FROM task_instance ti JOIN workflow w ON w.id = ti.workflow_id";

pub(crate) const ATTEMPT_SELECT: &str = "SELECT instance_id, attempt, state, worker_id, \
     node_id, dispatched_at, started_at, finished_at, exit_code, signal_num, pid, log_lines, message, \
     outputs_json \
     FROM task_attempt";

pub(crate) const WORKER_SELECT: &str = "SELECT id, version, hostname, labels_json, capacity, \
     running, started_at, last_heartbeat, node_id, draining, connected, apps_json, incarnation \
     FROM worker";

pub(crate) const AUDIT_SELECT: &str =
    "SELECT at, actor, action, target, detail, remote, token FROM audit_log";

pub(crate) const DECISION_SELECT: &str = "SELECT at, workflow_id, slot_at, run_id, instance_id, \
     task_name, kind, detail, node_id FROM decision_log";

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

pub(crate) fn to_u32(value: i64, what: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| corrupt(format!("{what} {value} is out of range")))
}

pub(crate) fn to_i32(value: i64, what: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| corrupt(format!("{what} {value} is out of range")))
}

fn opt_i32(value: Option<i64>, what: &str) -> Result<Option<i32>> {
    value.map(|v| to_i32(v, what)).transpose()
}

pub(crate) fn instance_state(s: &str) -> Result<InstanceState> {
    InstanceState::from_str(s).map_err(corrupt)
}

pub(crate) fn run_state(s: &str) -> Result<RunState> {
    RunState::from_str(s).map_err(corrupt)
}

fn trigger(s: &str) -> Result<TriggerKind> {
    TriggerKind::parse(s).ok_or_else(|| corrupt(format!("unknown trigger type {s:?}")))
}

pub(crate) fn map_json(text: &str, what: &str) -> Result<BTreeMap<String, String>> {
    serde_json::from_str(text).map_err(|err| corrupt(format!("{what}: {err}")))
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|err| corrupt(format!("cannot encode json: {err}")))
}

pub(crate) fn workflow(row: &AnyRow) -> Result<WorkflowRecord> {
    let spec_json: String = row.try_get("spec_json")?;
    let spec: WorkflowSpec = serde_json::from_str(&spec_json)
        .map_err(|err| corrupt(format!("stored workflow spec: {err}")))?;
    Ok(WorkflowRecord {
        id: WorkflowId(row.try_get("id")?),
        name: row.try_get("name")?,
        version: to_u32(row.try_get("version")?, "workflow version")?,
        spec,
        source: row.try_get("source")?,
        paused: row.try_get::<i64, _>("paused")? != 0,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

pub(crate) fn run(row: &AnyRow) -> Result<RunRecord> {
    let params: String = row.try_get("params_json")?;
    Ok(RunRecord {
        id: RunId(row.try_get("id")?),
        workflow_id: WorkflowId(row.try_get("workflow_id")?),
        workflow: row.try_get("workflow_name")?,
        workflow_version: to_u32(row.try_get("workflow_version")?, "workflow version")?,
        state: run_state(&row.try_get::<String, _>("state")?)?,
        trigger: trigger(&row.try_get::<String, _>("trigger_type")?)?,
        logical_time: row.try_get("logical_time")?,
        idempotency_key: row.try_get("idempotency_key")?,
        params: map_json(&params, "run params")?,
        triggered_by: row.try_get("triggered_by")?,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
        run_key: row.try_get("run_key")?,
        deadline_at: row.try_get("deadline_at")?,
        deadline_missed_at: row.try_get("deadline_missed_at")?,
        parent_run_id: row.try_get::<Option<i64>, _>("parent_run_id")?.map(RunId),
        parent_instance_id: row
            .try_get::<Option<i64>, _>("parent_instance_id")?
            .map(InstanceId),
    })
}

pub(crate) fn instance(row: &AnyRow) -> Result<InstanceRecord> {
    Ok(InstanceRecord {
        id: InstanceId(row.try_get("id")?),
        run_id: RunId(row.try_get("run_id")?),
        workflow_id: WorkflowId(row.try_get("workflow_id")?),
        workflow: row.try_get("workflow_name")?,
        workflow_version: to_u32(row.try_get("workflow_version")?, "workflow version")?,
        task: row.try_get("task_name")?,
        state: instance_state(&row.try_get::<String, _>("state")?)?,
        attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
        worker_id: row.try_get("worker_id")?,
        priority: to_i32(row.try_get("priority")?, "priority")?,
        not_before: row.try_get("not_before")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        exit_code: opt_i32(row.try_get("exit_code")?, "exit code")?,
        shard: shard(row)?,
    })
}

/// The fan-out facts of a shard or an item instance; `None` for any other.
fn shard(row: &AnyRow) -> Result<Option<Shard>> {
    let Some(parent) = row.try_get::<Option<i64>, _>("parent_id")? else {
        return Ok(None);
    };
    let number = |column: &str| -> Result<u32> {
        to_u32(row.try_get::<Option<i64>, _>(column)?.unwrap_or(0), column)
    };
    Ok(Some(Shard {
        parent: InstanceId(parent),
        index: number("shard_index")?,
        total: number("shard_total")?,
        worker: row.try_get("pinned_worker")?,
        item: row.try_get("item")?,
    }))
}

pub(crate) fn attempt(row: &AnyRow) -> Result<AttemptRecord> {
    let pid: Option<i64> = row.try_get("pid")?;
    Ok(AttemptRecord {
        instance_id: InstanceId(row.try_get("instance_id")?),
        attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
        state: instance_state(&row.try_get::<String, _>("state")?)?,
        worker_id: row.try_get("worker_id")?,
        node_id: row.try_get("node_id")?,
        dispatched_at: row.try_get("dispatched_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        exit_code: opt_i32(row.try_get("exit_code")?, "exit code")?,
        signal: opt_i32(row.try_get("signal_num")?, "signal")?,
        pid: pid.map(|p| to_u32(p, "pid")).transpose()?,
        log_lines: u64::try_from(row.try_get::<i64, _>("log_lines")?)
            .map_err(|_| corrupt("negative log line count"))?,
        message: row.try_get("message")?,
        outputs: match row.try_get::<Option<String>, _>("outputs_json")? {
            Some(json) => map_json(&json, "attempt outputs")?,
            None => Default::default(),
        },
    })
}

pub(crate) fn worker(row: &AnyRow) -> Result<WorkerRecord> {
    let labels: String = row.try_get("labels_json")?;
    Ok(WorkerRecord {
        id: row.try_get("id")?,
        version: row.try_get("version")?,
        hostname: row.try_get("hostname")?,
        labels: map_json(&labels, "worker labels")?,
        capacity: to_u32(row.try_get("capacity")?, "capacity")?,
        running: to_u32(row.try_get("running")?, "running")?,
        started_at: row.try_get("started_at")?,
        last_heartbeat: row.try_get("last_heartbeat")?,
        node_id: row.try_get("node_id")?,
        draining: row.try_get::<i64, _>("draining")? != 0,
        connected: row.try_get::<i64, _>("connected")? != 0,
        apps: match row.try_get::<String, _>("apps_json")?.as_str() {
            "" => None,
            apps => Some(
                serde_json::from_str(apps).map_err(|err| corrupt(format!("worker apps: {err}")))?,
            ),
        },
        incarnation: row.try_get("incarnation")?,
    })
}

pub(crate) fn audit(row: &AnyRow) -> Result<AuditRecord> {
    Ok(AuditRecord {
        at: row.try_get("at")?,
        actor: row.try_get("actor")?,
        action: row.try_get("action")?,
        target: row.try_get("target")?,
        detail: row.try_get("detail")?,
        remote: row.try_get("remote")?,
        token: row.try_get("token")?,
    })
}

pub(crate) fn decision(row: &AnyRow) -> Result<DecisionRecord> {
    let kind: String = row.try_get("kind")?;
    Ok(DecisionRecord {
        at: row.try_get("at")?,
        workflow_id: WorkflowId(row.try_get("workflow_id")?),
        slot_at: row.try_get("slot_at")?,
        run_id: row.try_get::<Option<i64>, _>("run_id")?.map(RunId),
        instance_id: row
            .try_get::<Option<i64>, _>("instance_id")?
            .map(InstanceId),
        task: row.try_get("task_name")?,
        kind: DecisionKind::parse(&kind)
            .ok_or_else(|| corrupt(format!("unknown decision kind {kind:?}")))?,
        detail: row.try_get("detail")?,
        node_id: row.try_get("node_id")?,
    })
}

/// What a run tells its handlers (`run.handler_env_json`; empty before they started).
pub(crate) fn run_env(row: &AnyRow) -> Result<BTreeMap<String, String>> {
    match row.try_get::<Option<String>, _>("handler_env_json")? {
        Some(json) => map_json(&json, "run handler env"),
        None => Ok(BTreeMap::new()),
    }
}
