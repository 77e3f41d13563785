//! Sub-workflows in the store: starting a `run_workflow` task's child run, and settling a wait
//! once either side has ended (`ax_core::sub_workflow`).
//!
//! **Start, exactly once.** [`Store::start_sub_workflow`] moves the parent's instance WAITING →
//! RUNNING as its attempt (a conditional move under the run and instance locks, with no worker)
//! and, in the same transaction, creates the child run under the dedup key
//! `parent:<instance>:<attempt>` and the `sub_workflow_wait` row keyed by (instance, attempt).
//! A start repeated (two nodes, a retry after a lost commit) finds the instance RUNNING and does
//! nothing; were it to get past that, the run's unique dedup key would answer with the first
//! child. A start that cannot be made (the workflow is gone or of another app, the params are
//! refused) ends the attempt FAILED with the reason, through the report path, so retries and
//! the run's end follow the usual rules.
//!
//! **Settle.** [`Store::settle_sub_workflow`] reads a wait again under its locks and does what
//! `ax_core::sub_workflow::judge` says: end the parent's attempt as the child ended (a
//! scheduler's report, so a retry makes a new attempt that gets a new child), cancel an orphan
//! child (its parent attempt ended first), or close the wait when both have ended.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::spec::TriggerKind;
use ax_core::state::{InstanceState, Outcome};
use ax_core::sub_workflow::{self, ParentEnd, ParentSide, SweepAction};
use sqlx::{AnyConnection, Row};

use super::cancel::cancel_run_tx;
use super::instance_locks::{load_key, lock_key, lock_runs};
use super::placing::Placing;
use super::reports::apply_reports_tx;
use super::rows::{corrupt, map_json, run_state, to_u32};
use super::run_create::{Created, create_run_tx};
use super::runs::run_by_id;
use super::{Store, write_tx};
use crate::{
    AttemptEnd, CancelledAttempt, NewRun, Report, Result, RunRecord, SubWorkflowStart,
    SubWorkflowStarted, SubWorkflowWait,
};

const WAIT_SELECT: &str = "SELECT w.parent_instance_id, w.parent_attempt, w.parent_run_id, \
     w.child_run_id, w.closed_at, ti.state AS parent_state, ti.attempt AS parent_current, \
     ti.started_at AS parent_started_at, td.timeout_ms AS parent_timeout_ms, \
     r.state AS child_state, wf.name AS child_workflow FROM sub_workflow_wait w \
     LEFT JOIN task_instance ti ON ti.id = w.parent_instance_id \
     LEFT JOIN task_definition td ON td.workflow_id = ti.workflow_id \
       AND td.version = ti.workflow_version AND td.name = ti.task_name \
     JOIN run r ON r.id = w.child_run_id JOIN workflow wf ON wf.id = r.workflow_id";

impl Store {
    /// Starts the child run of a WAITING `run_workflow` task's attempt (see the module doc).
    /// `NotWaiting` when the instance is no longer WAITING as that attempt.
    pub async fn start_sub_workflow(&self, start: &SubWorkflowStart) -> Result<SubWorkflowStarted> {
        write_tx!(self, |c| start_tx(self, c, start))
    }

    /// WAITING attempts of `run_workflow` tasks in running runs, ready at `now`, at most
    /// `limit`: for the dispatcher, which starts them whatever room its workers have. Two
    /// indexed reads: the few task definitions that start a run, then their instances by run.
    pub async fn waiting_sub_workflows(
        &self,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(InstanceId, Attempt)>> {
        let mut c = self.pool.acquire().await?;
        let definitions = sqlx::query(
            "SELECT workflow_id, version, name FROM task_definition \
             WHERE run_workflow IS NOT NULL",
        )
        .fetch_all(&mut *c)
        .await?;
        let mut found = Vec::new();
        for row in definitions {
            if found.len() >= limit as usize {
                break;
            }
            let instances = sqlx::query(
                "SELECT ti.id, ti.attempt FROM run r JOIN task_instance ti \
                 ON ti.run_id = r.id AND ti.task_name = ? \
                 WHERE r.workflow_id = ? AND r.state = 'RUNNING' AND ti.workflow_version = ? \
                 AND ti.state = 'WAITING' AND ti.not_before <= ? ORDER BY ti.id LIMIT ?",
            )
            .bind(row.try_get::<String, _>("name")?)
            .bind(row.try_get::<i64, _>("workflow_id")?)
            .bind(row.try_get::<i64, _>("version")?)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&mut *c)
            .await?;
            for instance in instances {
                found.push((
                    InstanceId(instance.try_get("id")?),
                    Attempt(to_u32(instance.try_get("attempt")?, "attempt")?),
                ));
            }
        }
        found.truncate(limit as usize);
        Ok(found)
    }

    /// The waits not closed yet, oldest parent first, at most `limit`, with both sides' states.
    pub async fn open_sub_workflow_waits(&self, limit: u32) -> Result<Vec<SubWorkflowWait>> {
        let sql = format!(
            "{WAIT_SELECT} WHERE w.closed_at IS NULL \
             ORDER BY w.parent_instance_id, w.parent_attempt LIMIT ?"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(wait_row).collect()
    }

    /// The waits of `run`'s instances (the children it started), by parent instance and attempt.
    pub async fn sub_workflow_waits_of_run(&self, run: RunId) -> Result<Vec<SubWorkflowWait>> {
        let sql = format!(
            "{WAIT_SELECT} WHERE w.parent_run_id = ? \
             ORDER BY w.parent_instance_id, w.parent_attempt"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(wait_row).collect()
    }

    /// Does what the wait of (`instance`, `attempt`) calls for now (judged again under its
    /// locks): `None` when there is no such open wait or it has to wait on. Otherwise what was
    /// done, with the attempts a cancelled child had on workers (to be killed).
    pub async fn settle_sub_workflow(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        now: Millis,
    ) -> Result<Option<(SweepAction, Vec<CancelledAttempt>)>> {
        write_tx!(self, |c| settle_tx(self, c, instance, attempt, now))
    }
}

fn wait_row(row: &sqlx::any::AnyRow) -> Result<SubWorkflowWait> {
    let parent_attempt = Attempt(to_u32(row.try_get("parent_attempt")?, "attempt")?);
    let parent_state: Option<String> = row.try_get("parent_state")?;
    let parent_current: Option<i64> = row.try_get("parent_current")?;
    // The parent's attempt still waits when its instance is RUNNING as that attempt; a purged
    // or moved-on instance does not.
    let parent_waiting = parent_state.as_deref() == Some(InstanceState::Running.as_str())
        && parent_current == Some(i64::from(parent_attempt.0));
    Ok(SubWorkflowWait {
        parent_started_at: row.try_get("parent_started_at")?,
        parent_timeout_ms: timeout_of(row.try_get("parent_timeout_ms")?),
        parent_instance_id: InstanceId(row.try_get("parent_instance_id")?),
        parent_attempt,
        parent_run_id: RunId(row.try_get("parent_run_id")?),
        child_run_id: RunId(row.try_get("child_run_id")?),
        child_workflow: row.try_get("child_workflow")?,
        child_state: run_state(&row.try_get::<String, _>("child_state")?)?,
        parent_waiting,
        closed: row.try_get::<Option<i64>, _>("closed_at")?.is_some(),
    })
}

/// A task definition's `timeout_ms` column, which holds 0 for no timeout.
fn timeout_of(column: Option<i64>) -> Option<NonZeroU64> {
    column
        .and_then(|ms| u64::try_from(ms).ok())
        .and_then(NonZeroU64::new)
}

async fn start_tx(
    store: &Store,
    c: &mut AnyConnection,
    start: &SubWorkflowStart,
) -> Result<SubWorkflowStarted> {
    let Some(key) = load_key(c, start.instance_id).await? else {
        return Ok(SubWorkflowStarted::NotWaiting);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    let Some(key) = lock_key(store, c, start.instance_id).await? else {
        return Ok(SubWorkflowStarted::NotWaiting);
    };
    if key.state != InstanceState::Waiting || key.attempt != start.attempt {
        return Ok(SubWorkflowStarted::NotWaiting);
    }
    let Some(parent_run) = run_by_id(c, key.run_id).await? else {
        return Ok(SubWorkflowStarted::NotWaiting);
    };
    let Some(definition) = definition_of(c, &key).await? else {
        // A task that runs a command is the dispatcher's to send, not this.
        return Ok(SubWorkflowStarted::NotWaiting);
    };
    mark_running(c, start).await?;
    let child = child_workflow(c, &definition.workflow, &definition.app).await?;
    let params = child_params(c, &parent_run, &definition.templates).await?;
    let ((workflow_id, version), mut params) = match (child, params) {
        (Ok(found), Ok(params)) => (found, params),
        (Err(reason), _) | (_, Err(reason)) => {
            return fail_start(store, c, start, reason).await;
        }
    };
    // The child's own declarations: its defaults filled in, its required params present.
    let declared = super::dependents::declared_params(c, workflow_id, i64::from(version)).await?;
    if let Err(why) = ax_core::params::apply_declared(&declared, &mut params) {
        let reason = format!("run_workflow: the child's params are refused: {why}");
        return fail_start(store, c, start, reason).await;
    }
    let dedup = sub_workflow::dedup_key(start.instance_id, start.attempt);
    let new_run = NewRun {
        workflow_id,
        workflow_version: version,
        trigger: TriggerKind::Parent,
        logical_time: parent_run.logical_time,
        dedup_key: Some(dedup.clone()),
        idempotency_key: Some(dedup),
        params,
        triggered_by: format!(
            "run {} task {} (attempt {})",
            parent_run.id, key.task, start.attempt
        ),
        now: start.now,
        audit_from: None,
    };
    let child = match create_run_tx(store, c, &new_run).await {
        Ok(Created::New(record) | Created::Existing(record)) => record,
        Err(crate::StoreError::NotFound(what)) => {
            return fail_start(store, c, start, format!("{what} not found")).await;
        }
        Err(err) => return Err(err),
    };
    sqlx::query(
        "UPDATE run SET parent_run_id = ?, parent_instance_id = ?, parent_attempt = ? \
         WHERE id = ?",
    )
    .bind(parent_run.id.0)
    .bind(start.instance_id.0)
    .bind(i64::from(start.attempt.0))
    .bind(child.id.0)
    .execute(&mut *c)
    .await?;
    let sql = format!(
        "{} sub_workflow_wait (parent_instance_id, parent_attempt, parent_run_id, \
         child_run_id, created_at, closed_at) VALUES (?, ?, ?, ?, ?, NULL)",
        store.dialect.insert_ignore()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(start.instance_id.0)
        .bind(i64::from(start.attempt.0))
        .bind(parent_run.id.0)
        .bind(child.id.0)
        .bind(start.now)
        .execute(&mut *c)
        .await?;
    let child = run_by_id(c, child.id)
        .await?
        .ok_or_else(|| corrupt("a child run vanished in its own transaction"))?;
    Ok(SubWorkflowStarted::Started {
        child: Box::new(child),
    })
}

/// What a `run_workflow` task's definition says to start.
struct Definition {
    workflow: String,
    templates: BTreeMap<String, String>,
    /// The task's app: the child must be of it.
    app: String,
}

async fn definition_of(
    c: &mut AnyConnection,
    key: &super::instance_locks::InstanceKey,
) -> Result<Option<Definition>> {
    let row = sqlx::query(
        "SELECT run_workflow, run_params, app FROM task_definition \
         WHERE workflow_id = ? AND version = ? AND name = ?",
    )
    .bind(key.workflow_id.0)
    .bind(key.version)
    .bind(key.task.as_str())
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let Some(workflow) = row.try_get::<Option<String>, _>("run_workflow")? else {
        return Ok(None);
    };
    let templates = match row.try_get::<Option<String>, _>("run_params")? {
        Some(json) => map_json(&json, "run_workflow params")?,
        None => BTreeMap::new(),
    };
    Ok(Some(Definition {
        workflow,
        templates,
        app: row.try_get("app")?,
    }))
}

/// The child's params: the templates rendered over the parent run's params and its tasks'
/// outputs, then held to the limits every run's params are; or why they cannot be.
async fn child_params(
    c: &mut AnyConnection,
    parent: &RunRecord,
    templates: &BTreeMap<String, String>,
) -> Result<std::result::Result<BTreeMap<String, String>, String>> {
    let outputs = if templates.values().any(|t| t.contains("${tasks.")) {
        super::outputs::of_runs(c, &BTreeSet::from([parent.id.0]))
            .await?
            .remove(&parent.id.0)
            .unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    let rendered = match sub_workflow::render_params(templates, &parent.params, &outputs) {
        Ok(rendered) => rendered,
        Err(why) => return Ok(Err(format!("run_workflow: {why}"))),
    };
    if let Err(why) = ax_core::params::check(&rendered) {
        return Ok(Err(format!(
            "run_workflow: the child's params are refused: {why}"
        )));
    }
    Ok(Ok(rendered))
}

/// WAITING → RUNNING as the attempt, on no worker; the attempt's row says which node started
/// it. The caller checked the instance under its lock.
async fn mark_running(c: &mut AnyConnection, start: &SubWorkflowStart) -> Result<()> {
    sqlx::query(
        "UPDATE task_instance SET state = 'RUNNING', worker_id = NULL, started_at = ?, \
         last_heartbeat_at = ? WHERE id = ? AND attempt = ? AND state = 'WAITING'",
    )
    .bind(start.now)
    .bind(start.now)
    .bind(start.instance_id.0)
    .bind(i64::from(start.attempt.0))
    .execute(&mut *c)
    .await?;
    // A row may exist for this attempt number already (a dispatch put back): it is reused.
    sqlx::query("DELETE FROM task_attempt WHERE instance_id = ? AND attempt = ?")
        .bind(start.instance_id.0)
        .bind(i64::from(start.attempt.0))
        .execute(&mut *c)
        .await?;
    sqlx::query(
        "INSERT INTO task_attempt (instance_id, attempt, state, worker_id, node_id, \
         dispatched_at, started_at, finished_at, exit_code, signal_num, pid, log_lines, message) \
         VALUES (?, ?, 'RUNNING', NULL, ?, ?, ?, NULL, NULL, NULL, NULL, 0, '')",
    )
    .bind(start.instance_id.0)
    .bind(i64::from(start.attempt.0))
    .bind(start.node_id.as_str())
    .bind(start.now)
    .bind(start.now)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// The live workflow named `name` (its id and latest version) when it is of `app`; otherwise
/// why not. Apply refuses both cases, but a workflow can be deleted or moved since.
async fn child_workflow(
    c: &mut AnyConnection,
    name: &str,
    app: &str,
) -> Result<std::result::Result<(WorkflowId, u32), String>> {
    let row = sqlx::query(
        "SELECT w.id, w.app, w.latest_version FROM workflow w \
         WHERE w.live_name = ? AND w.deleted_at IS NULL",
    )
    .bind(name)
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else {
        return Ok(Err(format!("run_workflow: workflow {name} not found")));
    };
    let its_app: String = row.try_get("app")?;
    if its_app != app {
        // Said like a missing one: the parent's app must not learn another app's names.
        return Ok(Err(format!("run_workflow: workflow {name} not found")));
    }
    Ok(Ok((
        WorkflowId(row.try_get("id")?),
        to_u32(row.try_get("latest_version")?, "workflow version")?,
    )))
}

/// Ends the just-started attempt FAILED with `reason` (no child was made).
async fn fail_start(
    store: &Store,
    c: &mut AnyConnection,
    start: &SubWorkflowStart,
    reason: String,
) -> Result<SubWorkflowStarted> {
    end_attempt(
        store,
        c,
        start.instance_id,
        start.attempt,
        Outcome::Failed,
        &reason,
        start.now,
    )
    .await?;
    Ok(SubWorkflowStarted::Failed { reason })
}

/// The scheduler's report that ends a RUNNING attempt of a `run_workflow` task.
async fn end_attempt(
    store: &Store,
    c: &mut AnyConnection,
    instance: InstanceId,
    attempt: Attempt,
    outcome: Outcome,
    message: &str,
    now: Millis,
) -> Result<()> {
    let report = Report::Finished {
        instance_id: instance,
        attempt,
        worker_id: None,
        end: AttemptEnd::Finished(outcome),
        exit_code: None,
        signal: None,
        at: now,
        log_lines: 0,
        message: message.to_string(),
        outputs: BTreeMap::new(),
    };
    apply_reports_tx(store, c, &[report], now, &mut Placing::none()).await?;
    Ok(())
}

async fn settle_tx(
    store: &Store,
    c: &mut AnyConnection,
    instance: InstanceId,
    attempt: Attempt,
    now: Millis,
) -> Result<Option<(SweepAction, Vec<CancelledAttempt>)>> {
    let row = sqlx::query(
        "SELECT parent_run_id, child_run_id FROM sub_workflow_wait \
         WHERE parent_instance_id = ? AND parent_attempt = ? AND closed_at IS NULL",
    )
    .bind(instance.0)
    .bind(i64::from(attempt.0))
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let parent_run: i64 = row.try_get("parent_run_id")?;
    let child_run = RunId(row.try_get("child_run_id")?);
    // Runs are locked in id order by every writer; the parent's run is older than its child.
    lock_runs(store, c, &BTreeSet::from([parent_run, child_run.0])).await?;
    let parent = lock_key(store, c, instance).await?;
    let parent_waiting = parent
        .as_ref()
        .is_some_and(|key| key.state == InstanceState::Running && key.attempt == attempt);
    let Some(child) = run_by_id(c, child_run).await? else {
        // The child was purged: nothing is left to wait for.
        close(c, instance, attempt, now).await?;
        return Ok(Some((SweepAction::Close, Vec::new())));
    };
    let (started_at, timeout_ms) = match &parent {
        Some(key) if parent_waiting => started_and_timeout(c, key).await?,
        _ => (None, None),
    };
    let side = ParentSide::of(parent_waiting, started_at, timeout_ms, now);
    let action = sub_workflow::judge(side, child.state);
    let mut killed = Vec::new();
    match action {
        SweepAction::Wait => return Ok(None),
        SweepAction::EndParent(end) => {
            end_parent(store, c, instance, attempt, end, &child, now).await?;
        }
        SweepAction::TimeOut => {
            let timeout = timeout_ms.map_or(0, NonZeroU64::get);
            let message = sub_workflow::timeout_message(child.id.0, &child.workflow, timeout);
            end_attempt(store, c, instance, attempt, Outcome::Timeout, &message, now).await?;
            killed = cancel_run_tx(store, c, child_run, now)
                .await?
                .unwrap_or_default();
        }
        SweepAction::CancelChild => {
            killed = cancel_run_tx(store, c, child_run, now)
                .await?
                .unwrap_or_default();
        }
        SweepAction::Close => {}
    }
    close(c, instance, attempt, now).await?;
    Ok(Some((action, killed)))
}

/// When a waiting parent's attempt started, and its task's timeout.
async fn started_and_timeout(
    c: &mut AnyConnection,
    key: &super::instance_locks::InstanceKey,
) -> Result<(Option<Millis>, Option<NonZeroU64>)> {
    let row = sqlx::query(
        "SELECT ti.started_at, td.timeout_ms FROM task_instance ti \
         JOIN task_definition td ON td.workflow_id = ti.workflow_id \
           AND td.version = ti.workflow_version AND td.name = ti.task_name \
         WHERE ti.id = ?",
    )
    .bind(key.id.0)
    .fetch_optional(&mut *c)
    .await?;
    match row {
        Some(row) => Ok((
            row.try_get("started_at")?,
            timeout_of(row.try_get("timeout_ms")?),
        )),
        None => Ok((None, None)),
    }
}

async fn end_parent(
    store: &Store,
    c: &mut AnyConnection,
    instance: InstanceId,
    attempt: Attempt,
    end: ParentEnd,
    child: &RunRecord,
    now: Millis,
) -> Result<()> {
    let message = sub_workflow::end_message(child.id.0, &child.workflow, child.state);
    let outcome = match end {
        ParentEnd::Success => Outcome::Success,
        ParentEnd::Failed => Outcome::Failed,
        ParentEnd::Cancelled => {
            cancel_parent(store, c, instance, attempt, &message, now).await?;
            return Ok(());
        }
    };
    end_attempt(store, c, instance, attempt, outcome, &message, now).await
}

/// A cancelled child cancels its parent task (not the parent's whole run): the task ends
/// CANCELLED and the run goes on as its rules say, as after `axctl cancel` of one instance.
async fn cancel_parent(
    store: &Store,
    c: &mut AnyConnection,
    instance: InstanceId,
    attempt: Attempt,
    message: &str,
    now: Millis,
) -> Result<()> {
    super::cancel::cancel_instance_tx(store, c, instance, now).await?;
    sqlx::query("UPDATE task_attempt SET message = ? WHERE instance_id = ? AND attempt = ?")
        .bind(message)
        .bind(instance.0)
        .bind(i64::from(attempt.0))
        .execute(&mut *c)
        .await?;
    Ok(())
}

async fn close(
    c: &mut AnyConnection,
    instance: InstanceId,
    attempt: Attempt,
    now: Millis,
) -> Result<()> {
    sqlx::query(
        "UPDATE sub_workflow_wait SET closed_at = ? WHERE parent_instance_id = ? \
         AND parent_attempt = ?",
    )
    .bind(now)
    .bind(instance.0)
    .bind(i64::from(attempt.0))
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// The child runs a run's tasks started, newest first (for the API's `child_run_ids`).
pub(crate) async fn child_run_ids(c: &mut AnyConnection, run: RunId) -> Result<Vec<RunId>> {
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM run WHERE parent_run_id = ? ORDER BY id DESC")
            .bind(run.0)
            .fetch_all(&mut *c)
            .await?;
    Ok(ids.into_iter().map(RunId).collect())
}

impl Store {
    /// Each live workflow's `run_workflow` callees (its latest version's), by workflow name:
    /// what the apply's cycle check walks.
    pub async fn workflow_calls(&self) -> Result<BTreeMap<String, Vec<String>>> {
        let rows = sqlx::query(
            "SELECT w.live_name, td.run_workflow FROM workflow w JOIN task_definition td \
             ON td.workflow_id = w.id AND td.version = w.latest_version \
             WHERE w.deleted_at IS NULL AND td.run_workflow IS NOT NULL \
             ORDER BY w.live_name, td.run_workflow",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut calls: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for row in rows {
            let callee: String = row.try_get("run_workflow")?;
            let entry = calls.entry(row.try_get("live_name")?).or_default();
            if !entry.contains(&callee) {
                entry.push(callee);
            }
        }
        Ok(calls)
    }

    /// The child run each attempt of `instance` started, by attempt.
    pub async fn child_runs_of_instance(
        &self,
        instance: InstanceId,
    ) -> Result<Vec<(Attempt, RunId)>> {
        let rows = sqlx::query(
            "SELECT parent_attempt, child_run_id FROM sub_workflow_wait \
             WHERE parent_instance_id = ? ORDER BY parent_attempt",
        )
        .bind(instance.0)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    Attempt(to_u32(row.try_get("parent_attempt")?, "attempt")?),
                    RunId(row.try_get("child_run_id")?),
                ))
            })
            .collect()
    }

    /// The child run each attempt of `run`'s `run_workflow` tasks started: one read of the
    /// waits' index by parent run, for a run's instance list.
    pub async fn child_runs_of_run_attempts(
        &self,
        run: RunId,
    ) -> Result<Vec<(InstanceId, Attempt, RunId)>> {
        let rows = sqlx::query(
            "SELECT parent_instance_id, parent_attempt, child_run_id FROM sub_workflow_wait \
             WHERE parent_run_id = ?",
        )
        .bind(run.0)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    InstanceId(row.try_get("parent_instance_id")?),
                    Attempt(to_u32(row.try_get("parent_attempt")?, "attempt")?),
                    RunId(row.try_get("child_run_id")?),
                ))
            })
            .collect()
    }

    /// The runs `run`'s `run_workflow` tasks started, newest first.
    pub async fn child_runs(&self, run: RunId) -> Result<Vec<RunId>> {
        let mut c = self.pool.acquire().await?;
        child_run_ids(&mut c, run).await
    }
}
