//! Worker reports, the dependency advance and the end of a run: the transitions of an instance
//! after its dispatch, each a conditional update on (instance, attempt, from-state).

use std::collections::{BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::retry::{retries_left, retry_delay_ms};
use ax_core::run::{RunProgress, RunState, run_outcome};
use ax_core::state::{Event, InstanceState, transition};
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::ids::IdKind;
use super::rows::{instance_state, run_state, to_u32};
use super::{Dialect, SqlStore, placeholders, values_rows};
use crate::{Applied, AttemptEnd, Report, ReportResult, Result};

/// The facts about an instance a transition needs.
#[derive(Debug, Clone)]
pub(crate) struct InstanceKey {
    pub(crate) id: InstanceId,
    pub(crate) run_id: RunId,
    pub(crate) workflow_id: WorkflowId,
    pub(crate) version: i64,
    pub(crate) task: String,
    pub(crate) state: InstanceState,
    pub(crate) attempt: Attempt,
    pub(crate) worker_id: Option<String>,
}

pub(crate) async fn load_key(c: &mut AnyConnection, id: InstanceId) -> Result<Option<InstanceKey>> {
    read_key(&mut Counted::new(c), id).await
}

async fn read_key(c: &mut Counted<'_>, id: InstanceId) -> Result<Option<InstanceKey>> {
    let row = sqlx::query(
        "SELECT id, run_id, workflow_id, workflow_version, task_name, state, attempt, worker_id \
         FROM task_instance WHERE id = ?",
    )
    .bind(id.0)
    .fetch_optional(&mut *c)
    .await?;
    row.as_ref().map(key_of).transpose()
}

/// The keys of many instances in one statement (a batch's first read of each instance).
async fn load_keys(c: &mut Counted<'_>, ids: &BTreeSet<i64>) -> Result<HashMap<i64, InstanceKey>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = format!(
        "SELECT id, run_id, workflow_id, workflow_version, task_name, state, attempt, worker_id \
         FROM task_instance WHERE id IN ({})",
        placeholders(ids.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(*id);
    }
    let mut keys = HashMap::with_capacity(ids.len());
    for row in query.fetch_all(&mut *c).await? {
        let key = key_of(&row)?;
        keys.insert(key.id.0, key);
    }
    Ok(keys)
}

fn key_of(row: &sqlx::any::AnyRow) -> Result<InstanceKey> {
    Ok(InstanceKey {
        id: InstanceId(row.try_get("id")?),
        run_id: RunId(row.try_get("run_id")?),
        workflow_id: WorkflowId(row.try_get("workflow_id")?),
        version: row.try_get("workflow_version")?,
        task: row.try_get("task_name")?,
        state: instance_state(&row.try_get::<String, _>("state")?)?,
        attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
        worker_id: row.try_get("worker_id")?,
    })
}

/// Locks the rows of `runs` in ascending id order, so that two transactions finishing upstreams
/// of one fan-in cannot both miss it, and two batches never lock runs in opposite orders.
pub(crate) async fn lock_runs(
    store: &SqlStore,
    c: &mut AnyConnection,
    runs: &BTreeSet<i64>,
) -> Result<()> {
    lock_run_rows(store, &mut Counted::new(c), runs).await
}

async fn lock_run_rows(store: &SqlStore, c: &mut Counted<'_>, runs: &BTreeSet<i64>) -> Result<()> {
    if store.dialect != Dialect::MySql {
        return Ok(());
    }
    for run in runs {
        sqlx::query("SELECT id FROM run WHERE id = ? FOR UPDATE")
            .bind(*run)
            .fetch_optional(&mut *c)
            .await?;
    }
    Ok(())
}

fn report_key(report: &Report) -> (InstanceId, Attempt) {
    match report {
        Report::Rejected {
            instance_id,
            attempt,
            ..
        }
        | Report::Started {
            instance_id,
            attempt,
            ..
        }
        | Report::TaskHeartbeat {
            instance_id,
            attempt,
            ..
        }
        | Report::Finished {
            instance_id,
            attempt,
            ..
        } => (*instance_id, *attempt),
    }
}

/// Applies a batch of reports in the caller's transaction, counting the statements it sends
/// in [`SqlStore::report_statements`].
pub(crate) async fn apply_reports(
    store: &SqlStore,
    c: &mut AnyConnection,
    reports: &[Report],
    now: Millis,
) -> Result<Vec<ReportResult>> {
    let mut c = Counted::new(c);
    let result = apply_counted(store, &mut c, reports, now).await;
    store.count_report_statements(c.statements());
    result
}

async fn apply_counted(
    store: &SqlStore,
    c: &mut Counted<'_>,
    reports: &[Report],
    now: Millis,
) -> Result<Vec<ReportResult>> {
    let ids: BTreeSet<i64> = reports.iter().map(|r| report_key(r).0.0).collect();
    if store.dialect == Dialect::MySql && !ids.is_empty() {
        let sql = format!(
            "SELECT DISTINCT run_id FROM task_instance WHERE id IN ({})",
            placeholders(ids.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in &ids {
            query = query.bind(*id);
        }
        let mut runs = BTreeSet::new();
        for row in query.fetch_all(&mut *c).await? {
            runs.insert(row.try_get::<i64, _>("run_id")?);
        }
        lock_run_rows(store, c, &runs).await?;
    }
    // Read after the run locks, so the keys are what this transaction may change. A key is
    // used once: a second report on the same instance in the batch reads it again.
    let mut keys = load_keys(c, &ids).await?;
    let mut results = Vec::with_capacity(reports.len());
    let mut after = AfterBatch::default();
    for (index, report) in reports.iter().enumerate() {
        results.push(apply_one(c, report, now, index, &mut after, &mut keys).await?);
    }
    after.carry_out(store, c, now, &mut results).await?;
    Ok(results)
}

/// What the reports of one batch set in motion, done once for the whole batch after every
/// transition of it is applied: a fan-in reached by many upstreams in one batch is counted
/// once, not once per upstream, and a run ends only after its new instances exist.
#[derive(Default)]
struct AfterBatch {
    /// Instances that succeeded, with the report that said so.
    succeeded: Vec<(usize, InstanceKey)>,
    /// Runs with an instance that became terminal, with the last such report.
    touched_runs: Vec<(usize, RunId)>,
    /// Instances whose attempt ended or went back to WAITING: (report, id, new state).
    ended: Vec<(usize, i64, InstanceState)>,
}

impl AfterBatch {
    async fn carry_out(
        self,
        store: &SqlStore,
        c: &mut Counted<'_>,
        now: Millis,
        results: &mut [ReportResult],
    ) -> Result<()> {
        let AfterBatch {
            mut succeeded,
            mut touched_runs,
            ended,
        } = self;
        super::dispatch::after_attempts_ended(
            c.uncounted(),
            &ended,
            &mut succeeded,
            &mut touched_runs,
            now,
        )
        .await?;
        // Each (run, downstream task) is examined once, credited to the last report reaching it.
        let mut candidates: Vec<(usize, InstanceKey, String)> = Vec::new();
        let mut seen: BTreeSet<(i64, String)> = BTreeSet::new();
        for (index, done) in succeeded.iter().rev() {
            for task in downstream_of(c, done).await? {
                if seen.insert((done.run_id.0, task.clone())) {
                    candidates.push((*index, done.clone(), task));
                }
            }
        }
        for (index, done, task) in candidates.into_iter().rev() {
            let created = create_if_ready(store, c, &done, &task, now).await?;
            if created > 0
                && let Some(ReportResult::Applied(applied)) = results.get_mut(index)
            {
                applied.new_waiting += created;
            }
        }
        // Which runs end is decided first, then the workflow rows all of them need are locked
        // at once in id order (`sql/locks.rs`), then they end.
        let mut seen: BTreeSet<i64> = BTreeSet::new();
        let mut ending: Vec<(usize, RunId, RunState)> = Vec::new();
        for (index, run) in touched_runs.iter().rev() {
            if seen.insert(run.0)
                && let Some(end) = run_end(c, *run).await?
            {
                ending.push((*index, *run, end));
            }
        }
        let runs: BTreeSet<i64> = ending.iter().map(|(_, run, _)| run.0).collect();
        super::locks::lock_workflows_of_ending_runs(store, c.uncounted(), &runs).await?;
        for (index, run, end) in ending {
            let finished = end_run(store, c, run, end, now).await?;
            if let Some(ReportResult::Applied(applied)) = results.get_mut(index) {
                applied.run_finished = finished;
            }
        }
        Ok(())
    }
}

/// The report's result when the instance is not where the report expects it.
async fn stale(c: &mut Counted<'_>, id: InstanceId) -> Result<ReportResult> {
    Ok(match read_key(c, id).await? {
        Some(key) => ReportResult::Stale {
            current_attempt: key.attempt,
            state: key.state,
        },
        None => ReportResult::NotFound,
    })
}

/// Moves the instance from `from` to `to` with extra assignments; true when this call did it.
async fn move_instance(
    c: &mut Counted<'_>,
    key: &InstanceKey,
    to: InstanceState,
    sets: &str,
    binds: Vec<Option<i64>>,
) -> Result<bool> {
    let sql = format!(
        "UPDATE task_instance SET state = ?{sets} WHERE id = ? AND attempt = ? AND state = ?"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(to.as_str());
    for value in binds {
        query = query.bind(value);
    }
    let done = query
        .bind(key.id.0)
        .bind(i64::from(key.attempt.0))
        .bind(key.state.as_str())
        .execute(&mut *c)
        .await?;
    Ok(done.rows_affected() == 1)
}

async fn apply_one(
    c: &mut Counted<'_>,
    report: &Report,
    now: Millis,
    index: usize,
    after: &mut AfterBatch,
    keys: &mut HashMap<i64, InstanceKey>,
) -> Result<ReportResult> {
    let (id, attempt) = report_key(report);
    let key = match keys.remove(&id.0) {
        Some(key) => key,
        None => match read_key(c, id).await? {
            Some(key) => key,
            None => return Ok(ReportResult::NotFound),
        },
    };
    let stale_now = ReportResult::Stale {
        current_attempt: key.attempt,
        state: key.state,
    };
    if key.attempt != attempt {
        return Ok(stale_now);
    }
    // Fencing by identity too: only the worker the attempt was dispatched to may report on it.
    let reporter = match report {
        Report::Started { worker_id, .. } => Some(worker_id),
        Report::Rejected { worker_id, .. }
        | Report::TaskHeartbeat { worker_id, .. }
        | Report::Finished { worker_id, .. } => worker_id.as_ref(),
    };
    if let (Some(reporter), Some(assigned)) = (reporter, key.worker_id.as_ref())
        && reporter != assigned
    {
        return Ok(stale_now);
    }
    let attempt_no = i64::from(attempt.0);
    match report {
        Report::Rejected { reason, .. } => {
            let Ok(next) = transition(key.state, Event::Reject) else {
                return Ok(stale_now);
            };
            if !move_instance(c, &key, next.to, ", worker_id = NULL", vec![]).await? {
                return stale(c, id).await;
            }
            sqlx::query(
                "UPDATE task_attempt SET state = ?, message = ? WHERE instance_id = ? AND attempt = ?",
            )
            .bind(next.to.as_str())
            .bind(reason.as_str())
            .bind(id.0)
            .bind(attempt_no)
            .execute(&mut *c)
            .await?;
            after.ended.push((index, id.0, next.to));
            Ok(ReportResult::Applied(Applied {
                new_waiting: 1,
                ..Applied::default()
            }))
        }
        Report::Started {
            worker_id, pid, at, ..
        } => {
            // A worker replays Started for the attempts it re-attaches after a reconnect; the
            // current attempt already RUNNING is the same fact again, not a stale report.
            if key.state == InstanceState::Running {
                return Ok(ReportResult::Applied(Applied::default()));
            }
            let Ok(next) = transition(key.state, Event::Start) else {
                return Ok(stale_now);
            };
            let sql = "UPDATE task_instance SET state = ?, started_at = ?, worker_id = ?, \
                       last_heartbeat_at = ? WHERE id = ? AND attempt = ? AND state = ?";
            let done = sqlx::query(sql)
                .bind(next.to.as_str())
                .bind(*at)
                .bind(worker_id.as_str())
                .bind(*at)
                .bind(id.0)
                .bind(attempt_no)
                .bind(key.state.as_str())
                .execute(&mut *c)
                .await?;
            if done.rows_affected() != 1 {
                return stale(c, id).await;
            }
            sqlx::query(
                "UPDATE task_attempt SET state = ?, started_at = ?, pid = ?, worker_id = ? \
                 WHERE instance_id = ? AND attempt = ?",
            )
            .bind(next.to.as_str())
            .bind(*at)
            .bind(i64::from(*pid))
            .bind(worker_id.as_str())
            .bind(id.0)
            .bind(attempt_no)
            .execute(&mut *c)
            .await?;
            Ok(ReportResult::Applied(Applied::default()))
        }
        Report::TaskHeartbeat { at, .. } => {
            if key.state != InstanceState::Running {
                return Ok(stale_now);
            }
            let done = sqlx::query(
                "UPDATE task_instance SET last_heartbeat_at = ? \
                 WHERE id = ? AND attempt = ? AND state = 'RUNNING'",
            )
            .bind(*at)
            .bind(id.0)
            .bind(attempt_no)
            .execute(&mut *c)
            .await?;
            if done.rows_affected() != 1 {
                return stale(c, id).await;
            }
            Ok(ReportResult::Applied(Applied::default()))
        }
        Report::Finished {
            end,
            exit_code,
            signal,
            at,
            log_lines,
            message,
            ..
        } => {
            let policy = sqlx::query(
                "SELECT retries, retry_backoff_ms FROM task_definition \
                 WHERE workflow_id = ? AND version = ? AND name = ?",
            )
            .bind(key.workflow_id.0)
            .bind(key.version)
            .bind(key.task.as_str())
            .fetch_optional(&mut *c)
            .await?;
            let (retries, backoff) = match policy {
                Some(row) => (
                    to_u32(row.try_get("retries")?, "retries")?,
                    row.try_get::<i64, _>("retry_backoff_ms")?.max(0) as u64,
                ),
                None => (0, 0),
            };
            let left = retries_left(attempt.0, retries);
            let (event, attempt_state) = match end {
                AttemptEnd::Finished(outcome) => (
                    Event::Finish {
                        outcome: *outcome,
                        retries_left: left,
                    },
                    outcome.state(),
                ),
                AttemptEnd::SpawnFailed => (
                    Event::SpawnFailed { retries_left: left },
                    InstanceState::Failed,
                ),
            };
            let Ok(next) = transition(key.state, event) else {
                return Ok(stale_now);
            };
            let exit = exit_code.map(i64::from);
            let moved = if next.next_attempt {
                let delay = retry_delay_ms(backoff, attempt.0, rand::random::<f64>());
                let not_before = now.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
                move_instance(
                    c,
                    &key,
                    next.to,
                    ", attempt = attempt + 1, worker_id = NULL, not_before = ?, \
                     started_at = NULL, finished_at = NULL, exit_code = NULL, \
                     last_heartbeat_at = NULL",
                    vec![Some(not_before)],
                )
                .await?
            } else {
                move_instance(
                    c,
                    &key,
                    next.to,
                    ", finished_at = ?, exit_code = ?",
                    vec![Some(*at), exit],
                )
                .await?
            };
            if !moved {
                return stale(c, id).await;
            }
            sqlx::query(
                "UPDATE task_attempt SET state = ?, finished_at = ?, exit_code = ?, \
                 signal_num = ?, log_lines = ?, message = ? WHERE instance_id = ? AND attempt = ?",
            )
            .bind(attempt_state.as_str())
            .bind(*at)
            .bind(exit)
            .bind(signal.map(i64::from))
            .bind(i64::try_from(*log_lines).unwrap_or(i64::MAX))
            .bind(message.as_str())
            .bind(id.0)
            .bind(attempt_no)
            .execute(&mut *c)
            .await?;
            after.ended.push((index, id.0, next.to));
            let mut applied = Applied {
                attempt_ended: true,
                attempt_state: Some(attempt_state),
                retry_scheduled: next.next_attempt,
                ..Applied::default()
            };
            if next.next_attempt {
                applied.new_waiting = 1;
                return Ok(ReportResult::Applied(applied));
            }
            after.touched_runs.push((index, key.run_id));
            if next.to == InstanceState::Success {
                after.succeeded.push((index, key));
            }
            Ok(ReportResult::Applied(applied))
        }
    }
}

/// Creates the WAITING first attempt of each direct downstream task of `done` whose upstreams
/// have all succeeded in this run. Reads only the finished task's edges and, per downstream, its
/// upstreams' instances, through indexes: the cost does not depend on the size of the workflow,
/// the number of runs or the history.
/// The direct downstream tasks of the task `done` finished, by index.
async fn downstream_of(c: &mut Counted<'_>, done: &InstanceKey) -> Result<Vec<String>> {
    let rows = sqlx::query(
        "SELECT downstream FROM task_dependency \
         WHERE workflow_id = ? AND version = ? AND upstream = ? ORDER BY downstream",
    )
    .bind(done.workflow_id.0)
    .bind(done.version)
    .bind(done.task.as_str())
    .fetch_all(&mut *c)
    .await?;
    rows.iter()
        .map(|row| Ok(row.try_get("downstream")?))
        .collect()
}

/// Creates the WAITING first attempt of `task` in `done`'s run if every upstream of it has
/// succeeded there; returns how many instances it created (0 or 1). Reads the task's
/// definition and its upstreams' instances in this run through indexes: the cost does not
/// depend on the size of the workflow, the number of runs or the history.
async fn create_if_ready(
    store: &SqlStore,
    c: &mut Counted<'_>,
    done: &InstanceKey,
    task: &str,
    now: Millis,
) -> Result<u32> {
    let def = sqlx::query(
        "SELECT upstream_count, priority FROM task_definition \
         WHERE workflow_id = ? AND version = ? AND name = ?",
    )
    .bind(done.workflow_id.0)
    .bind(done.version)
    .bind(task)
    .fetch_optional(&mut *c)
    .await?;
    let Some(def) = def else { return Ok(0) };
    let upstreams: i64 = def.try_get("upstream_count")?;
    let succeeded: i64 = sqlx::query(
        "SELECT COUNT(*) AS n FROM task_dependency d JOIN task_instance ti \
         ON ti.run_id = ? AND ti.task_name = d.upstream AND ti.shard_slot = 0 \
         WHERE d.workflow_id = ? AND d.version = ? AND d.downstream = ? \
         AND ti.state = 'SUCCESS'",
    )
    .bind(done.run_id.0)
    .bind(done.workflow_id.0)
    .bind(done.version)
    .bind(task)
    .fetch_one(&mut *c)
    .await?
    .try_get("n")?;
    if succeeded < upstreams {
        return Ok(0);
    }
    let priority: i64 = def.try_get("priority")?;
    let ids = store.take_ids(c.uncounted(), IdKind::Instance, 1).await?;
    let sql = format!(
        "{} task_instance (id, run_id, workflow_id, workflow_version, task_name, state, \
         attempt, priority, not_before, created_at) VALUES {}",
        store.dialect.insert_ignore(),
        values_rows(1, 10)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query
            .bind(id)
            .bind(done.run_id.0)
            .bind(done.workflow_id.0)
            .bind(done.version)
            .bind(task)
            .bind(InstanceState::Waiting.as_str())
            .bind(1i64)
            .bind(priority)
            .bind(now)
            .bind(now);
    }
    let inserted = query.execute(&mut *c).await?.rows_affected();
    if inserted == 0 {
        return super::rerun::wake_pending(c.uncounted(), done.run_id, task, now).await;
    }
    Ok(u32::try_from(inserted).unwrap_or(u32::MAX))
}

/// Ends the run when nothing of it can run any more (after an instance became terminal).
/// The common case, an unfinished instance left, is one index probe.
pub(crate) async fn finish_run_if_done(
    store: &SqlStore,
    c: &mut AnyConnection,
    run_id: RunId,
    now: Millis,
) -> Result<Option<(RunId, RunState)>> {
    end_run_if_done(store, &mut Counted::new(c), run_id, now).await
}

async fn end_run_if_done(
    store: &SqlStore,
    c: &mut Counted<'_>,
    run_id: RunId,
    now: Millis,
) -> Result<Option<(RunId, RunState)>> {
    let Some(end) = run_end(c, run_id).await? else {
        return Ok(None);
    };
    let runs = BTreeSet::from([run_id.0]);
    super::locks::lock_workflows_of_ending_runs(store, c.uncounted(), &runs).await?;
    end_run(store, c, run_id, end, now).await
}

/// How the run ends now, if nothing of it can run any more.
async fn run_end(c: &mut Counted<'_>, run_id: RunId) -> Result<Option<RunState>> {
    let busy = sqlx::query(
        "SELECT id FROM task_instance WHERE run_id = ? \
         AND state IN ('WAITING', 'DISPATCHED', 'RUNNING') LIMIT 1",
    )
    .bind(run_id.0)
    .fetch_optional(&mut *c)
    .await?;
    if busy.is_some() {
        return Ok(None);
    }
    let run = sqlx::query(
        "SELECT r.state, r.cancel_requested, v.task_count FROM run r JOIN workflow_version v \
         ON v.workflow_id = r.workflow_id AND v.version = r.workflow_version WHERE r.id = ?",
    )
    .bind(run_id.0)
    .fetch_optional(&mut *c)
    .await?;
    let Some(run) = run else { return Ok(None) };
    if run_state(&run.try_get::<String, _>("state")?)? != RunState::Running {
        return Ok(None);
    }
    let mut progress = RunProgress {
        tasks: to_u32(run.try_get("task_count")?, "task count")?,
        cancel_requested: run.try_get::<i64, _>("cancel_requested")? != 0,
        ..RunProgress::default()
    };
    // Shards count through their parent.
    let counts = sqlx::query(
        "SELECT state, COUNT(*) AS n FROM task_instance WHERE run_id = ? AND shard_slot = 0 \
         GROUP BY state",
    )
    .bind(run_id.0)
    .fetch_all(&mut *c)
    .await?;
    for row in counts {
        let n = to_u32(row.try_get("n")?, "instance count")?;
        match instance_state(&row.try_get::<String, _>("state")?)? {
            InstanceState::Success => progress.succeeded += n,
            InstanceState::Cancelled => progress.cancelled += n,
            // PENDING (after a rerun from above) counts like a task without an instance.
            InstanceState::Failed | InstanceState::Timeout | InstanceState::Pending => {}
            InstanceState::Waiting | InstanceState::Dispatched | InstanceState::Running => {
                progress.unfinished += n
            }
        }
    }
    Ok(run_outcome(progress))
}

/// Ends the run as `end` (if still RUNNING), then its dependents and queued runs, with the
/// workflow rows they need already locked.
async fn end_run(
    store: &SqlStore,
    c: &mut Counted<'_>,
    run_id: RunId,
    end: RunState,
    now: Millis,
) -> Result<Option<(RunId, RunState)>> {
    let done =
        sqlx::query("UPDATE run SET state = ?, finished_at = ? WHERE id = ? AND state = 'RUNNING'")
            .bind(end.as_str())
            .bind(now)
            .bind(run_id.0)
            .execute(&mut *c)
            .await?;
    if done.rows_affected() != 1 {
        return Ok(None);
    }
    if end == RunState::Success {
        super::dependents::after_run_success(store, c.uncounted(), run_id, now).await?;
    }
    super::queue::promote_after(store, c.uncounted(), run_id, now).await?;
    Ok(Some((run_id, end)))
}
