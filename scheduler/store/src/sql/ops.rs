//! The [`Store`] trait for [`SqlStore`]: workflows, schedules, runs, dispatch, cancellation,
//! logs, workers and audit. Worker reports live in `reports.rs`.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;
use ax_core::state::{Event, InstanceState, transition};
use sqlx::{AnyConnection, Row};

use super::audit;
use super::counted::Counted;
use super::ids::IdKind;
use super::patch::{Patches, Table};
use super::queue;
use super::reports::{self, load_key, lock_runs};
use super::rows::{self, corrupt, instance_state, map_json, to_json, to_u32};
use super::run_create::create_runs_tx;
use super::run_end::finish_run_if_done;
use super::{Dialect, SqlStore, in_list, is_unique_violation, pow2_chunks, values_rows, write_tx};
use crate::{
    ActiveAttempt, ApplyOutcome, AttemptRecord, AuditFilter, AuditRecord, Backend,
    CancelledAttempt, DecisionRecord, DispatchClaim, DueSchedule, InstanceCounts, InstanceRecord,
    LogChunk, LogStream, ManualRetry, NewRun, Report, ReportResult, RerunFailed, Result, RunRecord,
    Store, StoredLine, WaitingInstance, WorkerRecord, WorkflowRecord,
};

/// Rows per multi-row insert: far below both backends' limits on bound parameters.
const INSERT_CHUNK: usize = 500;

/// Text bytes of log lines per insert statement.
const LOG_STATEMENT_BYTES: usize = 4 << 20;
const UNFINISHED: &str = "('WAITING', 'DISPATCHED', 'RUNNING')";
/// The unique (run, task, shard slot) index of `task_instance` (MySQL).
const RUN_TASK_INDEX: &str = "uq_task_instance_run_task_shard";

async fn workflow_by_name(c: &mut AnyConnection, name: &str) -> Result<Option<WorkflowRecord>> {
    let sql = format!(
        "{} AND v.version = w.latest_version WHERE w.name = ?",
        rows::WORKFLOW_SELECT
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(name)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(rows::workflow).transpose()
}

async fn run_by_id(c: &mut AnyConnection, id: RunId) -> Result<Option<RunRecord>> {
    let sql = format!("{} WHERE r.id = ?", rows::RUN_SELECT);
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(rows::run).transpose()
}

async fn instance_by_id(c: &mut AnyConnection, id: InstanceId) -> Result<Option<InstanceRecord>> {
    let sql = format!("{} WHERE ti.id = ?", rows::INSTANCE_SELECT);
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(rows::instance).transpose()
}

fn spec_value(spec: &WorkflowSpec) -> Result<serde_json::Value> {
    serde_json::to_value(spec).map_err(|err| corrupt(format!("cannot encode spec: {err}")))
}

async fn apply_workflow_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    spec: &WorkflowSpec,
    source: &str,
    next_fire_at: Option<Millis>,
    now: Millis,
) -> Result<(WorkflowRecord, ApplyOutcome)> {
    let sql = format!(
        "SELECT id, latest_version FROM workflow WHERE name = ?{}",
        store.dialect.for_update()
    );
    let existing = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(spec.name.as_str())
        .fetch_optional(&mut *c)
        .await?;
    let spec_json = to_json(spec)?;
    let (workflow_id, version, outcome) = match existing {
        Some(row) => {
            let id: i64 = row.try_get("id")?;
            let latest: i64 = row.try_get("latest_version")?;
            let stored: String = sqlx::query(
                "SELECT spec_json FROM workflow_version WHERE workflow_id = ? AND version = ?",
            )
            .bind(id)
            .bind(latest)
            .fetch_one(&mut *c)
            .await?
            .try_get("spec_json")?;
            let stored: serde_json::Value = serde_json::from_str(&stored)
                .map_err(|err| corrupt(format!("stored workflow spec: {err}")))?;
            if stored == spec_value(spec)? {
                let record = workflow_by_name(c, &spec.name).await?;
                let record = record.ok_or_else(|| corrupt("workflow vanished during apply"))?;
                return Ok((record, ApplyOutcome::Unchanged));
            }
            sqlx::query(
                "UPDATE workflow SET latest_version = ?, app = ?, owner = ?, updated_at = ? \
                 WHERE id = ?",
            )
            .bind(latest + 1)
            .bind(spec.app.as_str())
            .bind(spec.owner.as_str())
            .bind(now)
            .bind(id)
            .execute(&mut *c)
            .await?;
            (id, latest + 1, ApplyOutcome::Updated)
        }
        None => {
            let id = store.take_ids(c, IdKind::Workflow, 1).await?[0];
            sqlx::query(
                "INSERT INTO workflow (id, app, name, owner, latest_version, paused, created_at, \
                 updated_at) VALUES (?, ?, ?, ?, 1, 0, ?, ?)",
            )
            .bind(id)
            .bind(spec.app.as_str())
            .bind(spec.name.as_str())
            .bind(spec.owner.as_str())
            .bind(now)
            .bind(now)
            .execute(&mut *c)
            .await?;
            (id, 1, ApplyOutcome::Created)
        }
    };

    sqlx::query(
        "INSERT INTO workflow_version (workflow_id, version, spec_json, source, task_count, \
         created_at) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(workflow_id)
    .bind(version)
    .bind(spec_json)
    .bind(source)
    .bind(spec.tasks.len() as i64)
    .bind(now)
    .execute(&mut *c)
    .await?;

    let mut edges: Vec<(&str, &str)> = Vec::new();
    let mut upstream_counts = Vec::with_capacity(spec.tasks.len());
    for task in &spec.tasks {
        let upstreams: BTreeSet<&str> = task.upstream.iter().map(String::as_str).collect();
        upstream_counts.push(upstreams.len() as i64);
        edges.extend(upstreams.into_iter().map(|up| (up, task.name.as_str())));
    }
    let tasks: Vec<_> = spec.tasks.iter().zip(upstream_counts).collect();
    for chunk in tasks.chunks(INSERT_CHUNK) {
        let sql = format!(
            "INSERT INTO task_definition (workflow_id, version, name, command, timeout_ms, \
             retries, retry_backoff_ms, priority, labels_json, upstream_count, app, owner) \
             VALUES {}",
            values_rows(chunk.len(), 12)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (task, upstreams) in chunk {
            let command = if task.argv.is_empty() {
                task.command.clone()
            } else {
                task.argv.join(" ")
            };
            query = query
                .bind(workflow_id)
                .bind(version)
                .bind(task.name.as_str())
                .bind(command)
                .bind(i64::try_from(task.timeout_ms).unwrap_or(i64::MAX))
                .bind(i64::from(task.retries))
                .bind(i64::try_from(task.retry_backoff_ms).unwrap_or(i64::MAX))
                .bind(i64::from(task.priority))
                .bind(to_json(&task.labels)?)
                .bind(*upstreams)
                .bind(spec.app.as_str())
                .bind(spec.owner.as_str());
        }
        query.execute(&mut *c).await?;
    }
    for chunk in edges.chunks(INSERT_CHUNK) {
        let sql = format!(
            "INSERT INTO task_dependency (workflow_id, version, upstream, downstream) VALUES {}",
            values_rows(chunk.len(), 4)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (up, down) in chunk {
            query = query.bind(workflow_id).bind(version).bind(*up).bind(*down);
        }
        query.execute(&mut *c).await?;
    }

    // The plan follows the new version; `paused` belongs to the workflow and is kept.
    let paused: i64 = sqlx::query("SELECT paused FROM workflow WHERE id = ?")
        .bind(workflow_id)
        .fetch_one(&mut *c)
        .await?
        .try_get("paused")?;
    let sql = format!(
        "INSERT INTO schedule_plan (workflow_id, trigger_type, cron, timezone, paused, \
         next_fire_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?){}",
        store.dialect.upsert_tail(
            &["workflow_id"],
            &[
                "trigger_type",
                "cron",
                "timezone",
                "paused",
                "next_fire_at",
                "updated_at"
            ]
        )
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(workflow_id)
        .bind(spec.schedule.trigger.as_str())
        .bind(spec.schedule.cron.clone())
        .bind(spec.schedule.timezone.as_str())
        .bind(paused)
        .bind(next_fire_at)
        .bind(now)
        .execute(&mut *c)
        .await?;
    super::dependents::store_edges(c, workflow_id, &spec.schedule.after).await?;

    // New limits may let queued runs start (a raised or removed max_active_runs).
    queue::promote(store, c, WorkflowId(workflow_id), now).await?;
    let record = workflow_by_name(c, &spec.name).await?;
    let record = record.ok_or_else(|| corrupt("workflow vanished during apply"))?;
    Ok((record, outcome))
}

/// Cancels one unfinished instance and its current attempt row; returns whether it did. The
/// caller gives back its concurrency scopes (`dispatch::release`) once, after all its cancels:
/// instance rows first, counter rows after, as in the claim.
async fn cancel_one(
    c: &mut AnyConnection,
    id: InstanceId,
    attempt: Attempt,
    from: InstanceState,
    now: Millis,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE task_instance SET state = 'CANCELLED', finished_at = ? \
         WHERE id = ? AND attempt = ? AND state = ?",
    )
    .bind(now)
    .bind(id.0)
    .bind(i64::from(attempt.0))
    .bind(from.as_str())
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE task_attempt SET state = 'CANCELLED', finished_at = ? \
         WHERE instance_id = ? AND attempt = ?",
    )
    .bind(now)
    .bind(id.0)
    .bind(i64::from(attempt.0))
    .execute(&mut *c)
    .await?;
    Ok(true)
}

/// Cancelling a sharded task's instance cancels its unfinished shards too. Their workers are not
/// told at once: a shard's next report (a task heartbeat, its end) is refused, and a refused
/// report makes the worker kill it.
/// Returns the cancelled shards, whose scopes the caller releases.
pub(crate) async fn cancel_shards_of(
    store: &SqlStore,
    c: &mut AnyConnection,
    parent: &reports::InstanceKey,
    now: Millis,
) -> Result<Vec<i64>> {
    // The shards share the parent's run and task: read through the key that never changes.
    let sql = format!(
        "SELECT id, attempt, state FROM task_instance{} WHERE run_id = ? AND task_name = ? \
         AND parent_id = ? AND state IN {UNFINISHED} ORDER BY id{}",
        store.dialect.force_index(RUN_TASK_INDEX),
        store.dialect.for_update()
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(parent.run_id.0)
        .bind(parent.task.as_str())
        .bind(parent.id.0)
        .fetch_all(&mut *c)
        .await?;
    let mut cancelled = Vec::new();
    for row in rows {
        let id = InstanceId(row.try_get("id")?);
        let attempt = Attempt(to_u32(row.try_get("attempt")?, "attempt")?);
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        if cancel_one(c, id, attempt, state, now).await? {
            cancelled.push(id.0);
        }
    }
    Ok(cancelled)
}

fn was_started(state: InstanceState) -> bool {
    matches!(state, InstanceState::Dispatched | InstanceState::Running)
}

async fn cancel_run_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    id: RunId,
    now: Millis,
) -> Result<Option<Vec<CancelledAttempt>>> {
    // A promotion locks the workflow row, then the queued run's row: cancelling a queued run
    // takes them in that order too (`sql/locks.rs`).
    if let Some(run) = run_by_id(c, id).await?
        && run.state == RunState::Queued
    {
        queue::lock_workflow(store, c, run.workflow_id).await?;
    }
    lock_runs(store, c, &BTreeSet::from([id.0])).await?;
    let Some(run) = run_by_id(c, id).await? else {
        return Ok(None);
    };
    if run.state.is_terminal() {
        return Ok(Some(Vec::new()));
    }
    sqlx::query("UPDATE run SET cancel_requested = 1 WHERE id = ?")
        .bind(id.0)
        .execute(&mut *c)
        .await?;
    // A locking read in id order (the claim's order: instance rows, then counter rows): a claim
    // WAITING → DISPATCHED committing meanwhile is waited for and then read as DISPATCHED, so
    // its instance is cancelled and its worker told, instead of the conditional cancel missing
    // it (a plain READ COMMITTED read would still say WAITING). Through the (run, task) key,
    // which a claim does not change (`Dialect::force_index`).
    let sql = format!(
        "SELECT id, attempt, state, worker_id FROM task_instance{} \
         WHERE run_id = ? AND state IN {UNFINISHED} ORDER BY id{}",
        store.dialect.force_index(RUN_TASK_INDEX),
        store.dialect.for_update()
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_all(&mut *c)
        .await?;
    let mut killed = Vec::new();
    let mut cancelled = Vec::new();
    for row in rows {
        let instance = InstanceId(row.try_get("id")?);
        let attempt = Attempt(to_u32(row.try_get("attempt")?, "attempt")?);
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        if !cancel_one(c, instance, attempt, state, now).await? {
            return Err(corrupt("a locked instance moved during cancel"));
        }
        cancelled.push(instance.0);
        if was_started(state) {
            killed.push(CancelledAttempt {
                instance_id: instance,
                attempt,
                worker_id: row.try_get("worker_id")?,
            });
        }
    }
    super::dispatch::release(c, &cancelled).await?;
    // A QUEUED run has no instances: it simply ends CANCELLED.
    sqlx::query(
        "UPDATE run SET state = 'CANCELLED', finished_at = ? WHERE id = ? \
         AND state IN ('RUNNING', 'QUEUED')",
    )
    .bind(now)
    .bind(id.0)
    .execute(&mut *c)
    .await?;
    queue::promote_after(store, c, id, now).await?;
    Ok(Some(killed))
}

async fn cancel_instance_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    id: InstanceId,
    now: Millis,
) -> Result<Option<(InstanceRecord, Option<CancelledAttempt>)>> {
    let Some(key) = load_key(c, id).await? else {
        return Ok(None);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    // Read again under the run lock, and lock the row: a report may have moved it meanwhile,
    // and a batch of Started reports (which takes no run lock) must not move it between this
    // read and the cancel.
    let Some(key) = reports::lock_key(store, c, id).await? else {
        return Ok(None);
    };
    let mut killed = None;
    if key.state.is_active() && cancel_one(c, id, key.attempt, key.state, now).await? {
        if was_started(key.state) {
            killed = Some(CancelledAttempt {
                instance_id: id,
                attempt: key.attempt,
                worker_id: key.worker_id.clone(),
            });
        }
        super::dispatch::settle_parent_of(c, id, now).await?;
        let mut cancelled = cancel_shards_of(store, c, &key, now).await?;
        cancelled.push(id.0);
        // Counter rows after every instance row, once.
        super::dispatch::release(c, &cancelled).await?;
        finish_run_if_done(store, c, key.run_id, now).await?;
    }
    let record = instance_by_id(c, id).await?;
    Ok(record.map(|r| (r, killed)))
}

/// Moves one finished, unsuccessful instance to its next attempt (a person asked for it), and
/// reopens its run. False when the instance is not in `key.state` any more.
async fn retry_one(c: &mut AnyConnection, key: &reports::InstanceKey, now: Millis) -> Result<bool> {
    if transition(key.state, Event::ManualRetry).is_err() {
        return Ok(false);
    }
    let done = sqlx::query(
        "UPDATE task_instance SET state = 'WAITING', attempt = attempt + 1, not_before = ?, \
         worker_id = NULL, started_at = NULL, finished_at = NULL, exit_code = NULL \
         WHERE id = ? AND attempt = ? AND state = ?",
    )
    .bind(now)
    .bind(key.id.0)
    .bind(i64::from(key.attempt.0))
    .bind(key.state.as_str())
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE run SET state = 'RUNNING', finished_at = NULL, cancel_requested = 0 \
         WHERE id = ? AND state <> 'RUNNING'",
    )
    .bind(key.run_id.0)
    .execute(&mut *c)
    .await?;
    Ok(true)
}

async fn retry_instance_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    id: InstanceId,
    now: Millis,
) -> Result<ManualRetry> {
    let Some(key) = load_key(c, id).await? else {
        return Ok(ManualRetry::NotFound);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    let Some(key) = load_key(c, id).await? else {
        return Ok(ManualRetry::NotFound);
    };
    if let Some(refused) = super::shard_retry::refuse_retry(c, id).await? {
        return Ok(refused);
    }
    if !retry_one(c, &key, now).await? {
        return Ok(ManualRetry::NotRetryable(key.state));
    }
    let record = instance_by_id(c, id)
        .await?
        .ok_or_else(|| corrupt("retried instance vanished"))?;
    Ok(ManualRetry::Retried(record))
}

async fn rerun_failed_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    run: RunId,
    now: Millis,
) -> Result<Option<RerunFailed>> {
    lock_runs(store, c, &BTreeSet::from([run.0])).await?;
    if run_by_id(c, run).await?.is_none() {
        return Ok(None);
    }
    let ids = sqlx::query(
        "SELECT id FROM task_instance WHERE run_id = ? AND shard_slot = 0 \
         AND state IN ('FAILED', 'TIMEOUT', 'CANCELLED') ORDER BY id",
    )
    .bind(run.0)
    .fetch_all(&mut *c)
    .await?;
    let ids: Vec<InstanceId> = ids
        .iter()
        .map(|row| Ok(InstanceId(row.try_get("id")?)))
        .collect::<Result<_>>()?;
    let shards_active = super::shard_retry::shards_going(c, &ids).await?;
    let mut retried = Vec::new();
    for id in ids {
        if shards_active.iter().any(|(parent, _)| *parent == id) {
            continue;
        }
        if let Some(key) = load_key(c, id).await?
            && retry_one(c, &key, now).await?
        {
            retried.push(id);
        }
    }
    Ok(Some(RerunFailed {
        retried,
        shards_active,
    }))
}

/// The conditional claims; with `allowed`, only the claims it allows are tried (the limits said
/// no to the others, see `dispatch.rs`). A claim wins when its instance is still WAITING as that
/// attempt; the batch costs a fixed number of statements whatever its size: one locking read
/// of the instances, one update of the winners, one read of their attempt rows, one multi-row
/// insert of the new attempt rows (and one update for attempts dispatched again).
pub(crate) async fn mark_dispatched_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    claims: &[DispatchClaim],
    allowed: Option<&[bool]>,
) -> Result<Vec<bool>> {
    let mut won = vec![false; claims.len()];
    let ids: BTreeSet<i64> = claims
        .iter()
        .enumerate()
        .filter(|(i, _)| allowed.is_none_or(|allowed| allowed[*i]))
        .map(|(_, claim)| claim.instance_id.0)
        .collect();
    if ids.is_empty() {
        return Ok(won);
    }
    // Lock the instance rows in id order whatever the claim order, so two batches cannot
    // deadlock; the claims are decided on what the lock shows.
    let (list, ids) = in_list(ids);
    let sql = format!(
        "SELECT id, attempt, state FROM task_instance WHERE id IN ({list}) ORDER BY id{}",
        store.dialect.for_update()
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(id);
    }
    let mut waiting: BTreeMap<i64, i64> = BTreeMap::new();
    for row in query.fetch_all(&mut *c).await? {
        if row.try_get::<String, _>("state")? == InstanceState::Waiting.as_str() {
            waiting.insert(row.try_get("id")?, row.try_get("attempt")?);
        }
    }
    let mut instances = Patches::new(Table::Instance);
    let mut winners: Vec<&DispatchClaim> = Vec::new();
    for (i, claim) in claims.iter().enumerate() {
        if allowed.is_some_and(|allowed| !allowed[i]) {
            continue;
        }
        let attempt = i64::from(claim.attempt.0);
        // A claim wins once: the instance leaves WAITING with it.
        if waiting.get(&claim.instance_id.0) == Some(&attempt) {
            waiting.remove(&claim.instance_id.0);
            won[i] = true;
            instances.set(
                claim.instance_id.0,
                0,
                [
                    ("state", InstanceState::Dispatched.as_str().into()),
                    ("worker_id", claim.worker_id.as_str().into()),
                    ("held_slots", super::dispatch::held_slots(claim).into()),
                ],
            );
            winners.push(claim);
        }
    }
    if winners.is_empty() {
        return Ok(won);
    }
    instances.write(c).await?;
    // One attempt row per claim; a rejected attempt dispatched again reuses its row, whose
    // earlier start and end are cleared.
    const COLUMNS: [&str; 13] = [
        "instance_id",
        "attempt",
        "state",
        "worker_id",
        "node_id",
        "dispatched_at",
        "started_at",
        "finished_at",
        "exit_code",
        "signal_num",
        "pid",
        "log_lines",
        "message",
    ];
    let tail = store.dialect.upsert_tail(&COLUMNS[..2], &COLUMNS[2..]);
    for winners in pow2_chunks(&winners) {
        let sql = format!(
            "INSERT INTO task_attempt ({}) VALUES {}{tail}",
            COLUMNS.join(", "),
            values_rows(winners.len(), COLUMNS.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for claim in winners {
            query = query
                .bind(claim.instance_id.0)
                .bind(i64::from(claim.attempt.0))
                .bind(InstanceState::Dispatched.as_str())
                .bind(claim.worker_id.as_str())
                .bind(claim.node_id.as_str())
                .bind(claim.at)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(0i64)
                .bind("");
        }
        query.execute(&mut *c).await?;
    }
    Ok(won)
}

async fn append_logs_tx(
    store: &SqlStore,
    c: &mut AnyConnection,
    chunks: &[LogChunk],
) -> Result<()> {
    let chunks: Vec<&LogChunk> = chunks
        .iter()
        .filter(|chunk| chunk.line_count() > 0)
        .collect();
    // Statements stay far below MySQL's max_allowed_packet (16 MiB by default on MariaDB)
    // whatever the lines' length: a group closes at INSERT_CHUNK rows or LOG_STATEMENT_BYTES.
    let mut groups: Vec<&[&LogChunk]> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, chunk) in chunks.iter().enumerate() {
        let size = chunk.body().len() + chunk.line_count();
        if i > start && (i - start == INSERT_CHUNK || bytes + size > LOG_STATEMENT_BYTES) {
            groups.push(&chunks[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < chunks.len() {
        groups.push(&chunks[start..]);
    }
    for batch in groups {
        let sql = format!(
            "{} execution_log (instance_id, attempt, first_seq, line_count, streams, body, \
             created_at) VALUES {}",
            store.dialect.insert_ignore(),
            values_rows(batch.len(), 7)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for chunk in batch {
            let streams: String = chunk
                .streams()
                .iter()
                .map(|stream| match stream {
                    LogStream::Stdout => 'o',
                    LogStream::Stderr => 'e',
                })
                .collect();
            query = query
                .bind(chunk.instance_id.0)
                .bind(i64::from(chunk.attempt.0))
                .bind(i64::try_from(chunk.first_seq).unwrap_or(i64::MAX))
                .bind(chunk.line_count() as i64)
                .bind(streams)
                .bind(chunk.body())
                .bind(chunk.at);
        }
        query.execute(&mut *c).await?;
    }
    Ok(())
}

/// Chunks fetched per read while filling a page of log lines.
const READ_CHUNKS: i64 = 32;

/// Appends the lines of one stored chunk after `last` to `lines`, up to `limit` lines.
fn split_chunk(
    row: &sqlx::any::AnyRow,
    last: &mut u64,
    limit: u32,
    lines: &mut Vec<StoredLine>,
) -> Result<()> {
    let first: i64 = row.try_get("first_seq")?;
    let first = u64::try_from(first).map_err(|_| corrupt("negative log seq"))?;
    let streams: String = row.try_get("streams")?;
    let body: String = row.try_get("body")?;
    let at: Millis = row.try_get("created_at")?;
    for (offset, (stream, text)) in streams.chars().zip(body.split('\n')).enumerate() {
        let seq = first + offset as u64;
        // Overlapping chunks (a resend cut differently) never repeat a line.
        if seq <= *last {
            continue;
        }
        if lines.len() as u64 >= u64::from(limit) {
            return Ok(());
        }
        let stream = if stream == 'e' {
            LogStream::Stderr
        } else {
            LogStream::Stdout
        };
        lines.push(StoredLine {
            seq,
            stream,
            text: text.to_string(),
            at,
        });
        *last = seq;
    }
    Ok(())
}

#[async_trait::async_trait]
impl Store for SqlStore {
    fn backend(&self) -> Backend {
        self.backend_kind()
    }

    async fn apply_workflow(
        &self,
        spec: &WorkflowSpec,
        source: &str,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<(WorkflowRecord, ApplyOutcome)> {
        let mut tries = 0;
        loop {
            tries += 1;
            let result = write_tx!(self, |c| apply_workflow_tx(
                self,
                c,
                spec,
                source,
                next_fire_at,
                now
            ));
            match result {
                // Two nodes created the same new workflow at once: the loser applies again and
                // finds the winner's version.
                Err(crate::StoreError::Database(err)) if is_unique_violation(&err) && tries < 3 => {
                    continue;
                }
                other => return other,
            }
        }
    }

    async fn get_workflow(&self, name: &str) -> Result<Option<WorkflowRecord>> {
        let mut c = self.pool.acquire().await?;
        workflow_by_name(&mut c, name).await
    }

    async fn latest_version(&self, name: &str) -> Result<Option<(WorkflowId, u32)>> {
        let row = sqlx::query("SELECT id, latest_version FROM workflow WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok((
                WorkflowId(row.try_get("id")?),
                to_u32(row.try_get("latest_version")?, "workflow version")?,
            ))
        })
        .transpose()
    }

    async fn get_workflow_version(
        &self,
        id: WorkflowId,
        version: u32,
    ) -> Result<Option<WorkflowRecord>> {
        let sql = format!("{} WHERE w.id = ? AND v.version = ?", rows::WORKFLOW_SELECT);
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.0)
            .bind(i64::from(version))
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(rows::workflow).transpose()
    }

    async fn list_workflows(&self, app: Option<&str>) -> Result<Vec<WorkflowRecord>> {
        let mut sql = format!("{} AND v.version = w.latest_version", rows::WORKFLOW_SELECT);
        if app.is_some() {
            sql.push_str(" WHERE w.app = ?");
        }
        sql.push_str(" ORDER BY w.name");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(app) = app {
            query = query.bind(app);
        }
        query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(rows::workflow)
            .collect()
    }

    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<WorkflowRecord>> {
        write_tx!(self, |c| async move {
            let row = sqlx::query("SELECT id FROM workflow WHERE name = ?")
                .bind(name)
                .fetch_optional(&mut *c)
                .await?;
            let Some(row) = row else { return Ok(None) };
            let id: i64 = row.try_get("id")?;
            sqlx::query("UPDATE workflow SET paused = ?, updated_at = ? WHERE id = ?")
                .bind(i64::from(paused))
                .bind(now)
                .bind(id)
                .execute(&mut *c)
                .await?;
            if paused {
                sqlx::query(
                    "UPDATE schedule_plan SET paused = 1, updated_at = ? WHERE workflow_id = ?",
                )
                .bind(now)
                .bind(id)
                .execute(&mut *c)
                .await?;
            } else {
                sqlx::query(
                    "UPDATE schedule_plan SET paused = 0, next_fire_at = ?, updated_at = ? \
                     WHERE workflow_id = ?",
                )
                .bind(next_fire_at)
                .bind(now)
                .bind(id)
                .execute(&mut *c)
                .await?;
            }
            workflow_by_name(c, name).await
        })
    }

    async fn due_schedules(&self, now: Millis, limit: u32) -> Result<Vec<DueSchedule>> {
        let rows = sqlx::query(
            "SELECT sp.workflow_id, w.name, w.latest_version, sp.cron, sp.timezone, \
             sp.next_fire_at FROM schedule_plan sp JOIN workflow w ON w.id = sp.workflow_id \
             WHERE sp.paused = 0 AND sp.next_fire_at <= ? AND sp.trigger_type = 'cron' \
             AND sp.cron IS NOT NULL ORDER BY sp.next_fire_at, sp.workflow_id LIMIT ?",
        )
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(DueSchedule {
                    workflow_id: WorkflowId(row.try_get("workflow_id")?),
                    workflow: row.try_get("name")?,
                    workflow_version: to_u32(row.try_get("latest_version")?, "version")?,
                    cron: row
                        .try_get::<Option<String>, _>("cron")?
                        .unwrap_or_default(),
                    timezone: row.try_get("timezone")?,
                    next_fire_at: row.try_get("next_fire_at")?,
                })
            })
            .collect()
    }

    async fn advance_schedules(&self, moves: &[(WorkflowId, Millis, Millis)]) -> Result<Vec<bool>> {
        if moves.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |c| async move {
            let mut won = Vec::with_capacity(moves.len());
            for (workflow_id, from, to) in moves {
                let done = sqlx::query(
                    "UPDATE schedule_plan SET next_fire_at = ? \
                     WHERE workflow_id = ? AND next_fire_at = ?",
                )
                .bind(*to)
                .bind(workflow_id.0)
                .bind(*from)
                .execute(&mut *c)
                .await?;
                won.push(done.rows_affected() == 1);
            }
            Ok(won)
        })
    }

    async fn create_run(&self, run: &NewRun) -> Result<(RunRecord, bool)> {
        let mut created = self.create_runs(std::slice::from_ref(run)).await?;
        created
            .pop()
            .ok_or_else(|| corrupt("a run create returned nothing"))
    }

    async fn create_runs(&self, runs: &[NewRun]) -> Result<Vec<(RunRecord, bool)>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |c| async move {
            let mut c = Counted::new(c);
            let created = create_runs_tx(self, &mut c, runs).await;
            self.count_create_statements(c.statements());
            Ok(created?.into_iter().map(Into::into).collect())
        })
    }

    async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>> {
        let mut c = self.pool.acquire().await?;
        run_by_id(&mut c, id).await
    }

    async fn list_runs(
        &self,
        workflow: Option<&str>,
        state: Option<RunState>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        let mut sql = format!("{} WHERE 1 = 1", rows::RUN_SELECT);
        if workflow.is_some() {
            sql.push_str(" AND w.name = ?");
        }
        if state.is_some() {
            sql.push_str(" AND r.state = ?");
        }
        sql.push_str(" ORDER BY r.id DESC LIMIT ?");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(workflow) = workflow {
            query = query.bind(workflow);
        }
        if let Some(state) = state {
            query = query.bind(state.as_str());
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(rows::run).collect()
    }

    async fn run_counts(&self, id: RunId) -> Result<InstanceCounts> {
        // One statement: the run's task count beside its instances' counts by state (one row
        // with a NULL state for a run without instances). Shards count through their parent.
        let rows = sqlx::query(
            "SELECT v.task_count, ti.state, COUNT(ti.id) AS n FROM run r \
             JOIN workflow_version v ON v.workflow_id = r.workflow_id \
             AND v.version = r.workflow_version \
             LEFT JOIN task_instance ti ON ti.run_id = r.id AND ti.shard_slot = 0 \
             WHERE r.id = ? GROUP BY v.task_count, ti.state",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await?;
        let first = rows
            .first()
            .ok_or_else(|| crate::StoreError::NotFound(format!("run {id}")))?;
        let tasks: i64 = first.try_get("task_count")?;
        let mut counts = InstanceCounts::default();
        let mut total = 0i64;
        for row in &rows {
            let Some(state) = row.try_get::<Option<String>, _>("state")? else {
                continue;
            };
            let n: i64 = row.try_get("n")?;
            total += n;
            let n = to_u32(n, "instance count")?;
            match instance_state(&state)? {
                InstanceState::Waiting => counts.waiting = n,
                InstanceState::Dispatched => counts.dispatched = n,
                InstanceState::Running => counts.running = n,
                InstanceState::Success => counts.success = n,
                InstanceState::Failed => counts.failed = n,
                InstanceState::Timeout => counts.timeout = n,
                InstanceState::Cancelled => counts.cancelled = n,
                // Waits for its upstreams again after a rerun: shown like a task not created.
                InstanceState::Pending => total -= n as i64,
            }
        }
        counts.not_created = to_u32((tasks - total).max(0), "task count")?;
        Ok(counts)
    }

    async fn cancel_run(&self, id: RunId, now: Millis) -> Result<Option<Vec<CancelledAttempt>>> {
        write_tx!(self, |c| cancel_run_tx(self, c, id, now))
    }

    async fn get_instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>> {
        let mut c = self.pool.acquire().await?;
        instance_by_id(&mut c, id).await
    }

    async fn list_instances(&self, run: RunId) -> Result<Vec<InstanceRecord>> {
        let sql = format!(
            "{} WHERE ti.run_id = ? ORDER BY ti.id",
            rows::INSTANCE_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::instance).collect()
    }

    async fn list_attempts(&self, id: InstanceId) -> Result<Vec<AttemptRecord>> {
        let sql = format!(
            "{} WHERE instance_id = ? ORDER BY attempt",
            rows::ATTEMPT_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::attempt).collect()
    }

    async fn cancel_instance(
        &self,
        id: InstanceId,
        now: Millis,
    ) -> Result<Option<(InstanceRecord, Option<CancelledAttempt>)>> {
        write_tx!(self, |c| cancel_instance_tx(self, c, id, now))
    }

    async fn waiting(&self, now: Millis, limit: u32) -> Result<Vec<WaitingInstance>> {
        // Walk the queue index from its head and stop after `limit` rows, looking up each
        // row's workflow and run by primary key. Left to itself, MariaDB starts from the small
        // workflow and run tables, or joins the workflow through a join buffer, and either way
        // sorts every WAITING row (20–35 ms a read with 10,000 waiting).
        let (join_order, queue_index, by_key) = match self.dialect {
            Dialect::MySql => (
                "SELECT STRAIGHT_JOIN",
                "task_instance ti FORCE INDEX (idx_task_instance_queue)",
                " FORCE INDEX (PRIMARY) ON",
            ),
            Dialect::Sqlite => (
                "SELECT",
                "task_instance ti INDEXED BY idx_task_instance_queue",
                " ON",
            ),
        };
        let sql = format!(
            "{} JOIN run r{by_key} r.id = ti.run_id \
             WHERE ti.state = 'WAITING' AND ti.not_before <= ? AND r.state = 'RUNNING' \
             ORDER BY ti.priority DESC, ti.id LIMIT ?",
            rows::INSTANCE_SELECT
                .replace(
                    "ti.exit_code,",
                    "ti.exit_code, r.logical_time, r.params_json,"
                )
                .replacen("SELECT", join_order, 1)
                .replacen("task_instance ti", queue_index, 1)
                .replacen("JOIN workflow w ON", &format!("JOIN workflow w{by_key}"), 1)
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let params: String = row.try_get("params_json")?;
                let instance = rows::instance(row)?;
                let shard = instance.shard.clone();
                Ok(WaitingInstance {
                    instance,
                    logical_time: row.try_get("logical_time")?,
                    params: map_json(&params, "run params")?,
                    shard,
                })
            })
            .collect()
    }

    async fn retry_instance(&self, id: InstanceId, now: Millis) -> Result<ManualRetry> {
        write_tx!(self, |c| retry_instance_tx(self, c, id, now))
    }

    async fn rerun_failed(&self, run: RunId, now: Millis) -> Result<Option<RerunFailed>> {
        write_tx!(self, |c| rerun_failed_tx(self, c, run, now))
    }

    async fn active_attempts(
        &self,
        worker: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ActiveAttempt>> {
        let on_worker = if worker.is_some() {
            " AND ti.worker_id = ?"
        } else {
            ""
        };
        let sql = format!(
            "SELECT ti.id, ti.run_id, ti.attempt, ti.state, ti.worker_id, ti.started_at, \
             ti.last_heartbeat_at, ta.dispatched_at, td.timeout_ms \
             FROM task_instance ti \
             JOIN task_definition td ON td.workflow_id = ti.workflow_id \
               AND td.version = ti.workflow_version AND td.name = ti.task_name \
             LEFT JOIN task_attempt ta ON ta.instance_id = ti.id AND ta.attempt = ti.attempt \
             WHERE ti.state IN ('DISPATCHED', 'RUNNING'){on_worker} \
             AND NOT (ti.shard_slot = 0 AND ti.shard_total IS NOT NULL) ORDER BY ti.id LIMIT ?"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(worker) = worker {
            query = query.bind(worker);
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let timeout: i64 = row.try_get("timeout_ms")?;
                Ok(ActiveAttempt {
                    instance_id: InstanceId(row.try_get("id")?),
                    run_id: RunId(row.try_get("run_id")?),
                    attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
                    state: instance_state(&row.try_get::<String, _>("state")?)?,
                    worker_id: row.try_get("worker_id")?,
                    dispatched_at: row.try_get("dispatched_at")?,
                    started_at: row.try_get("started_at")?,
                    last_heartbeat_at: row.try_get("last_heartbeat_at")?,
                    timeout_ms: u64::try_from(timeout).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn mark_dispatched(&self, claims: &[DispatchClaim]) -> Result<Vec<bool>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |c| super::dispatch::mark_dispatched(self, c, claims))
    }

    async fn limit_usage(
        &self,
        scopes: &[String],
    ) -> Result<std::collections::BTreeMap<String, u32>> {
        super::dispatch::limit_usage(self, scopes).await
    }

    async fn fan_out(
        &self,
        parent: InstanceId,
        attempt: Attempt,
        workers: &[String],
        now: Millis,
    ) -> Result<bool> {
        write_tx!(self, |c| super::dispatch::fan_out_tx(
            self, c, parent, attempt, workers, now
        ))
    }

    async fn fail_shard(
        &self,
        id: InstanceId,
        attempt: Attempt,
        reason: &str,
        now: Millis,
    ) -> Result<bool> {
        write_tx!(self, |c| super::dispatch::fail_shard_tx(
            self, c, id, attempt, reason, now
        ))
    }

    async fn apply_reports(&self, reports: &[Report], now: Millis) -> Result<Vec<ReportResult>> {
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |c| reports::apply_reports(self, c, reports, now))
    }

    async fn append_logs(&self, chunks: &[LogChunk]) -> Result<()> {
        if chunks.iter().all(|chunk| chunk.line_count() == 0) {
            return Ok(());
        }
        write_tx!(self, |c| append_logs_tx(self, c, chunks))
    }

    async fn read_logs(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredLine>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let next = i64::try_from(after_seq)
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let attempt_no = i64::from(attempt.0);
        let mut lines = Vec::new();
        let mut last = after_seq;
        // Both reads are ranges of the (instance, attempt, first_seq) key, so a page costs the
        // same at line 1 and at line 1,000,000: the chunk holding line `next`, then the chunks
        // after it, a few at a time, until the page is full.
        let head = sqlx::query(
            "SELECT first_seq, line_count, streams, body, created_at FROM execution_log \
             WHERE instance_id = ? AND attempt = ? AND first_seq <= ? \
             ORDER BY first_seq DESC LIMIT 1",
        )
        .bind(instance.0)
        .bind(attempt_no)
        .bind(next)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = head {
            split_chunk(&row, &mut last, limit, &mut lines)?;
        }
        let mut from = next;
        while (lines.len() as u64) < u64::from(limit) {
            let rows = sqlx::query(
                "SELECT first_seq, line_count, streams, body, created_at FROM execution_log \
                 WHERE instance_id = ? AND attempt = ? AND first_seq > ? \
                 ORDER BY first_seq LIMIT ?",
            )
            .bind(instance.0)
            .bind(attempt_no)
            .bind(from)
            .bind(READ_CHUNKS)
            .fetch_all(&self.pool)
            .await?;
            let Some(tail) = rows.last() else { break };
            from = tail.try_get("first_seq")?;
            for row in &rows {
                split_chunk(row, &mut last, limit, &mut lines)?;
            }
            if (rows.len() as i64) < READ_CHUNKS {
                break;
            }
        }
        Ok(lines)
    }

    async fn upsert_workers(&self, workers: &[WorkerRecord]) -> Result<()> {
        const COLUMNS: [&str; 10] = [
            "version",
            "hostname",
            "labels_json",
            "capacity",
            "running",
            "started_at",
            "last_heartbeat",
            "node_id",
            "draining",
            "connected",
        ];
        if workers.is_empty() {
            return Ok(());
        }
        // In id order, so two nodes saving overlapping sets lock their rows in the same order.
        let mut sorted: Vec<&WorkerRecord> = workers.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        let labels = sorted
            .iter()
            .map(|worker| to_json(&worker.labels))
            .collect::<Result<Vec<String>>>()?;
        let rows: Vec<(&WorkerRecord, &str)> = sorted
            .into_iter()
            .zip(labels.iter().map(String::as_str))
            .collect();
        write_tx!(self, |c| async {
            for chunk in pow2_chunks(&rows) {
                let sql = format!(
                    "INSERT INTO worker (id, {}) VALUES {}{}",
                    COLUMNS.join(", "),
                    values_rows(chunk.len(), COLUMNS.len() + 1),
                    self.dialect.upsert_tail(&["id"], &COLUMNS)
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (worker, labels) in chunk {
                    query = query
                        .bind(worker.id.as_str())
                        .bind(worker.version.as_str())
                        .bind(worker.hostname.as_str())
                        .bind(*labels)
                        .bind(i64::from(worker.capacity))
                        .bind(i64::from(worker.running))
                        .bind(worker.started_at)
                        .bind(worker.last_heartbeat)
                        .bind(worker.node_id.as_str())
                        .bind(i64::from(worker.draining))
                        .bind(i64::from(worker.connected));
                }
                query.execute(&mut *c).await?;
            }
            Ok(())
        })
    }

    async fn list_workers(&self) -> Result<Vec<WorkerRecord>> {
        let sql = format!("{} ORDER BY id", rows::WORKER_SELECT);
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::worker).collect()
    }

    async fn insert_audits(&self, records: &[AuditRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        write_tx!(self, |c| async {
            audit::insert_rows(&mut Counted::new(c), records).await
        })
    }

    async fn query_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        let mut sql = format!("{} WHERE 1 = 1", rows::AUDIT_SELECT);
        let fields = [
            ("action", &filter.action),
            ("target", &filter.target),
            ("actor", &filter.actor),
        ];
        for (column, value) in &fields {
            if value.is_some() {
                sql.push_str(&format!(" AND {column} = ?"));
            }
        }
        sql.push_str(" ORDER BY at DESC, id DESC LIMIT ?");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (_, value) in fields {
            if let Some(value) = value {
                query = query.bind(value.as_str());
            }
        }
        let rows = query
            .bind(i64::from(filter.limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::audit).collect()
    }

    async fn runs_near(&self, workflow_id: WorkflowId, at: Millis) -> Result<Vec<RunRecord>> {
        let mut runs = Vec::with_capacity(2);
        for (condition, order) in [
            ("r.logical_time <= ?", "r.logical_time DESC, r.id DESC"),
            ("r.logical_time > ?", "r.logical_time, r.id"),
        ] {
            let sql = format!(
                "{} WHERE r.workflow_id = ? AND {condition} ORDER BY {order} LIMIT 1",
                rows::RUN_SELECT
            );
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(workflow_id.0)
                .bind(at)
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                runs.push(rows::run(&row)?);
            }
        }
        Ok(runs)
    }

    async fn unfinished_runs(&self, workflow_id: WorkflowId, limit: u32) -> Result<Vec<RunRecord>> {
        let sql = format!(
            "{} WHERE r.workflow_id = ? AND r.state IN ('RUNNING', 'QUEUED') ORDER BY r.id LIMIT ?",
            rows::RUN_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workflow_id.0)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::run).collect()
    }

    async fn schedule_next_fire(&self, workflow_id: WorkflowId) -> Result<Option<Millis>> {
        let row = sqlx::query("SELECT next_fire_at FROM schedule_plan WHERE workflow_id = ?")
            .bind(workflow_id.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => row.try_get("next_fire_at")?,
            None => None,
        })
    }

    async fn record_decisions(&self, decisions: &[DecisionRecord]) -> Result<()> {
        if decisions.is_empty() {
            return Ok(());
        }
        write_tx!(self, |c| async {
            for batch in decisions.chunks(500) {
                let sql = format!(
                    "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, \
                     task_name, kind, detail, node_id) VALUES {}",
                    values_rows(batch.len(), 9)
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for d in batch {
                    query = query
                        .bind(d.at)
                        .bind(d.workflow_id.0)
                        .bind(d.slot_at)
                        .bind(d.run_id.map(|id| id.0))
                        .bind(d.instance_id.map(|id| id.0))
                        .bind(d.task.as_deref())
                        .bind(d.kind.as_str())
                        .bind(d.detail.as_str())
                        .bind(d.node_id.as_str());
                }
                query.execute(&mut *c).await?;
            }
            Ok(())
        })
    }

    async fn record_decisions_once(&self, decisions: &[DecisionRecord]) -> Result<u32> {
        if decisions.is_empty() {
            return Ok(0);
        }
        write_tx!(self, |c| super::dispatch::record_decisions_once_tx(
            c, decisions
        ))
    }

    async fn list_decisions(
        &self,
        workflow_id: WorkflowId,
        from: Millis,
        to: Millis,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>> {
        let sql = format!(
            "{} WHERE workflow_id = ? AND slot_at >= ? AND slot_at <= ? \
             ORDER BY slot_at, id LIMIT ?",
            rows::DECISION_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workflow_id.0)
            .bind(from)
            .bind(to)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::decision).collect()
    }

    async fn rerun_from(&self, run: RunId, task: &str, now: Millis) -> Result<crate::RerunFrom> {
        write_tx!(self, |c| super::rerun::rerun_from_tx(
            self, c, run, task, now
        ))
    }

    async fn workflow_dependencies(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Vec<String>>> {
        super::dependents::all_edges(self).await
    }
}
