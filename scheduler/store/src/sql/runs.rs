//! Reading runs and their task instances: one run or instance by id, lists of runs, of a run's
//! instances and of an instance's attempts, a run's instance counts, and the runs near a time
//! or still unfinished for a workflow.
//!
//! Only reads are here: runs are created in `run_create.rs` and ended in `run_end.rs`, a set at
//! a time inside a writer's transaction. [`run_by_id`] and [`instance_by_id`] take the caller's
//! connection, so that a writer elsewhere (a cancel, a retry) reads inside its own transaction.

use ax_core::Millis;
use ax_core::ids::{InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::SqlStore;
use super::rows::{self, instance_state, to_u32};
use crate::{AttemptRecord, InstanceCounts, InstanceRecord, Result, RunRecord};

pub(crate) async fn run_by_id(c: &mut AnyConnection, id: RunId) -> Result<Option<RunRecord>> {
    let sql = format!("{} WHERE r.id = ?", rows::RUN_SELECT);
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(rows::run).transpose()
}

pub(crate) async fn instance_by_id(
    c: &mut AnyConnection,
    id: InstanceId,
) -> Result<Option<InstanceRecord>> {
    let sql = format!("{} WHERE ti.id = ?", rows::INSTANCE_SELECT);
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(rows::instance).transpose()
}

pub(crate) async fn get_run(store: &SqlStore, id: RunId) -> Result<Option<RunRecord>> {
    let mut c = store.pool.acquire().await?;
    run_by_id(&mut c, id).await
}

pub(crate) async fn list_runs(
    store: &SqlStore,
    workflow: Option<&str>,
    state: Option<RunState>,
    before: Option<RunId>,
    limit: u32,
) -> Result<Vec<RunRecord>> {
    let mut sql = format!("{} WHERE 1 = 1", rows::RUN_SELECT);
    if workflow.is_some() {
        sql.push_str(" AND w.name = ?");
    }
    if state.is_some() {
        sql.push_str(" AND r.state = ?");
    }
    // Paging by id, never by offset: a page deep in a million runs reads only its own rows.
    if before.is_some() {
        sql.push_str(" AND r.id < ?");
    }
    sql.push_str(" ORDER BY r.id DESC LIMIT ?");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    if let Some(workflow) = workflow {
        query = query.bind(workflow);
    }
    if let Some(state) = state {
        query = query.bind(state.as_str());
    }
    if let Some(before) = before {
        query = query.bind(before.0);
    }
    let rows = query.bind(i64::from(limit)).fetch_all(&store.pool).await?;
    rows.iter().map(rows::run).collect()
}

pub(crate) async fn run_counts(store: &SqlStore, id: RunId) -> Result<InstanceCounts> {
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
    .fetch_all(&store.pool)
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

pub(crate) async fn get_instance(
    store: &SqlStore,
    id: InstanceId,
) -> Result<Option<InstanceRecord>> {
    let mut c = store.pool.acquire().await?;
    instance_by_id(&mut c, id).await
}

pub(crate) async fn list_instances(store: &SqlStore, run: RunId) -> Result<Vec<InstanceRecord>> {
    let sql = format!(
        "{} WHERE ti.run_id = ? ORDER BY ti.id",
        rows::INSTANCE_SELECT
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(run.0)
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::instance).collect()
}

pub(crate) async fn list_attempts(store: &SqlStore, id: InstanceId) -> Result<Vec<AttemptRecord>> {
    let sql = format!(
        "{} WHERE instance_id = ? ORDER BY attempt",
        rows::ATTEMPT_SELECT
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::attempt).collect()
}

pub(crate) async fn list_run_attempts(store: &SqlStore, run: RunId) -> Result<Vec<AttemptRecord>> {
    // The instances' (run_id, …) index finds the run's instances; each one's attempts are a
    // range of the attempt table's primary key.
    let sql = format!(
        "{} WHERE instance_id IN (SELECT id FROM task_instance WHERE run_id = ?) \
         ORDER BY instance_id, attempt",
        rows::ATTEMPT_SELECT
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(run.0)
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::attempt).collect()
}

pub(crate) async fn runs_near(
    store: &SqlStore,
    workflow_id: WorkflowId,
    at: Millis,
) -> Result<Vec<RunRecord>> {
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
            .fetch_optional(&store.pool)
            .await?;
        if let Some(row) = row {
            runs.push(rows::run(&row)?);
        }
    }
    Ok(runs)
}

pub(crate) async fn unfinished_runs(
    store: &SqlStore,
    workflow_id: WorkflowId,
    limit: u32,
) -> Result<Vec<RunRecord>> {
    let sql = format!(
        "{} WHERE r.workflow_id = ? AND r.state IN ('RUNNING', 'QUEUED') ORDER BY r.id LIMIT ?",
        rows::RUN_SELECT
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(workflow_id.0)
        .bind(i64::from(limit))
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::run).collect()
}
