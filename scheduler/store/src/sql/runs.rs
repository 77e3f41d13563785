//! Reading runs and their task instances: one run or instance by id, lists of runs, of a run's
//! instances and of an instance's attempts, a run's instance counts, and the runs near a time
//! or still unfinished for a workflow.
//!
//! Only reads are here: runs are created in `run_create.rs` and ended in `run_end.rs`, a set at
//! a time inside a writer's transaction. [`run_by_id`] and [`instance_by_id`] take the caller's
//! connection, so that a writer elsewhere (a cancel, a retry) reads inside its own transaction.

use std::collections::HashMap;

use ax_core::Millis;
use ax_core::ids::{InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::rows::{self, instance_state, to_u32};
use super::{Store, in_list};
use crate::{AttemptRecord, InstanceCounts, InstanceRecord, Result, RunFilter, RunRecord};

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

impl Store {
    pub async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>> {
        let mut c = self.pool.acquire().await?;
        run_by_id(&mut c, id).await
    }

    /// The run of `workflow` under `dedup_key` (unique per workflow), if any.
    pub async fn run_by_dedup_key(
        &self,
        workflow: WorkflowId,
        dedup_key: &str,
    ) -> Result<Option<RunRecord>> {
        let sql = format!(
            "{} WHERE r.workflow_id = ? AND r.dedup_key = ?",
            rows::RUN_SELECT
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workflow.0)
            .bind(dedup_key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(rows::run).transpose()
    }

    /// Newest first; with `before`, only runs with a smaller id (the next page).
    pub async fn list_runs(
        &self,
        workflow: Option<&str>,
        state: Option<RunState>,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        self.find_runs(workflow, &RunFilter::state(state), before, limit)
            .await
    }

    /// [`Store::list_runs`] narrowed by `filter`.
    pub async fn find_runs(
        &self,
        workflow: Option<&str>,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        let workflow_ids = match workflow {
            None => None,
            Some(name) => {
                let id: Option<i64> =
                    sqlx::query_scalar("SELECT id FROM workflow WHERE live_name = ?")
                        .bind(name)
                        .fetch_optional(&self.pool)
                        .await?;
                match id {
                    Some(id) => Some(vec![WorkflowId(id)]),
                    None => return Ok(Vec::new()),
                }
            }
        };
        runs_page(self, workflow_ids.as_deref(), filter, before, limit).await
    }

    /// [`Store::list_runs`] over the runs of `workflows` only (none when it is empty): an app's
    /// page of runs, whatever other apps' runs lie between them.
    pub async fn list_runs_of(
        &self,
        workflows: &[WorkflowId],
        state: Option<RunState>,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        self.find_runs_of(workflows, &RunFilter::state(state), before, limit)
            .await
    }

    /// [`Store::list_runs_of`] narrowed by `filter`.
    pub async fn find_runs_of(
        &self,
        workflows: &[WorkflowId],
        filter: &RunFilter,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        if workflows.is_empty() {
            return Ok(Vec::new());
        }
        runs_page(self, Some(workflows), filter, before, limit).await
    }

    pub async fn run_counts(&self, id: RunId) -> Result<InstanceCounts> {
        self.runs_counts(&[id])
            .await?
            .remove(&id)
            .ok_or_else(|| crate::StoreError::NotFound(format!("run {id}")))
    }

    /// The counts of several runs in one read; a run that does not exist is left out.
    pub async fn runs_counts(&self, ids: &[RunId]) -> Result<HashMap<RunId, InstanceCounts>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        // One statement for the lot: each run's task count beside its instances' counts by state
        // (one row with a NULL state for a run without instances). Shards count through their
        // parent. A page of runs costs one round trip, not one per run.
        let (list, values) = in_list(ids.iter().map(|id| id.0));
        let sql = format!(
            "SELECT r.id, v.task_count, ti.state, COUNT(ti.id) AS n FROM run r \
             JOIN workflow_version v ON v.workflow_id = r.workflow_id \
             AND v.version = r.workflow_version \
             LEFT JOIN task_instance ti ON ti.run_id = r.id AND ti.shard_slot = 0 \
             WHERE r.id IN ({list}) GROUP BY r.id, v.task_count, ti.state"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in values {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&self.pool).await?;
        // Per run: its task count, the instances counted, and the counts by state.
        let mut found: HashMap<RunId, (i64, i64, InstanceCounts)> = HashMap::new();
        for row in &rows {
            let id = RunId(row.try_get("id")?);
            let tasks: i64 = row.try_get("task_count")?;
            let (_, total, counts) = found
                .entry(id)
                .or_insert_with(|| (tasks, 0, InstanceCounts::default()));
            let Some(state) = row.try_get::<Option<String>, _>("state")? else {
                continue;
            };
            let n: i64 = row.try_get("n")?;
            *total += n;
            let n = to_u32(n, "instance count")?;
            match instance_state(&state)? {
                InstanceState::Waiting => counts.waiting = n,
                InstanceState::Dispatched => counts.dispatched = n,
                InstanceState::Running => counts.running = n,
                InstanceState::Success => counts.success = n,
                InstanceState::Failed => counts.failed = n,
                InstanceState::Timeout => counts.timeout = n,
                InstanceState::Cancelled => counts.cancelled = n,
                InstanceState::Skipped => counts.skipped = n,
                InstanceState::UpstreamFailed => counts.upstream_failed = n,
                // Waits for its upstreams again after a rerun: shown like a task not created.
                InstanceState::Pending => *total -= i64::from(n),
            }
        }
        found
            .into_iter()
            .map(|(id, (tasks, total, mut counts))| {
                counts.not_created = to_u32((tasks - total).max(0), "task count")?;
                Ok((id, counts))
            })
            .collect()
    }

    pub async fn get_instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>> {
        let mut c = self.pool.acquire().await?;
        instance_by_id(&mut c, id).await
    }

    pub async fn list_instances(&self, run: RunId) -> Result<Vec<InstanceRecord>> {
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

    pub async fn list_attempts(&self, id: InstanceId) -> Result<Vec<AttemptRecord>> {
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

    /// Every attempt of every instance of a run, by instance id then attempt number.
    pub async fn list_run_attempts(&self, run: RunId) -> Result<Vec<AttemptRecord>> {
        // The instances' (run_id, …) index finds the run's instances; each one's attempts are a
        // range of the attempt table's primary key.
        let sql = format!(
            "{} WHERE instance_id IN (SELECT id FROM task_instance WHERE run_id = ?) \
             ORDER BY instance_id, attempt",
            rows::ATTEMPT_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::attempt).collect()
    }

    /// The runs of a workflow nearest to `at` by logical time: the latest with
    /// `logical_time <= at` and the earliest after it (either may be missing), in that order.
    pub async fn runs_near(&self, workflow_id: WorkflowId, at: Millis) -> Result<Vec<RunRecord>> {
        let mut runs = Vec::with_capacity(2);
        // The nearest logical time on each side first (an index's edge), then the run at it. In
        // one statement, MariaDB sorts every run of the workflow for `ORDER BY logical_time, id`
        // over the (workflow_id, logical_time, state) index, and SQLite walks all of them when
        // no run lies on that side.
        for (nearest, order) in [("MAX", "DESC"), ("MIN", "ASC")] {
            let side = if nearest == "MAX" { "<=" } else { ">" };
            let edge: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {nearest}(logical_time) FROM run WHERE workflow_id = ? AND logical_time {side} ?"
        )))
        .bind(workflow_id.0)
        .bind(at)
        .fetch_one(&self.pool)
        .await?;
            let Some(edge) = edge else { continue };
            let sql = format!(
                "{} WHERE r.workflow_id = ? AND r.logical_time = ? ORDER BY r.id {order} LIMIT 1",
                rows::RUN_SELECT
            );
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(workflow_id.0)
                .bind(edge)
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                runs.push(rows::run(&row)?);
            }
        }
        Ok(runs)
    }

    /// The workflow's runs that have not ended (RUNNING or QUEUED), oldest first, at most `limit`.
    pub async fn unfinished_runs(
        &self,
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
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::run).collect()
    }
}

/// A page of runs, newest first, of the given workflows (of every workflow with `None`).
async fn runs_page(
    store: &Store,
    workflows: Option<&[WorkflowId]>,
    filter: &RunFilter,
    before: Option<RunId>,
    limit: u32,
) -> Result<Vec<RunRecord>> {
    // The page's ids first, from an index alone, then their rows. Paging by id, never by
    // offset: a page deep in a million runs reads only its own index entries. The ids' query
    // goes as text with its numbers in it: MariaDB plans a re-executed prepared statement of
    // it as a walk down the (workflow_id, id) index from the newest run, filtering `id < ?`
    // entry by entry (hundreds of milliseconds half way down a million runs), and asked for
    // whole rows at once it sorts every run when no workflow is given. Every value spliced in
    // is a number or a state's own name.
    let mut page = String::from("SELECT r.id FROM run r WHERE 1 = 1");
    match workflows {
        None => {}
        Some([id]) => page.push_str(&format!(" AND r.workflow_id = {}", id.0)),
        Some(ids) => {
            let ids: Vec<String> = ids.iter().map(|id| id.0.to_string()).collect();
            page.push_str(&format!(" AND r.workflow_id IN ({})", ids.join(", ")));
        }
    }
    if let Some(state) = filter.state {
        page.push_str(&format!(" AND r.state = '{}'", state.as_str()));
    }
    if let Some(trigger) = filter.trigger {
        page.push_str(&format!(" AND r.trigger_type = '{}'", trigger.as_str()));
    }
    if let Some(from) = filter.logical_from {
        page.push_str(&format!(" AND r.logical_time >= {from}"));
    }
    if let Some(to) = filter.logical_to {
        page.push_str(&format!(" AND r.logical_time <= {to}"));
    }
    if let Some(before) = before {
        page.push_str(&format!(" AND r.id < {}", before.0));
    }
    page.push_str(&format!(" ORDER BY r.id DESC LIMIT {limit}"));
    let ids: Vec<i64> = sqlx::raw_sql(sqlx::AssertSqlSafe(page))
        .fetch_all(&store.pool)
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<std::result::Result<_, _>>()?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let (list, values) = in_list(ids);
    let sql = format!(
        "{} WHERE r.id IN ({list}) ORDER BY r.id DESC",
        rows::RUN_SELECT
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in values {
        query = query.bind(id);
    }
    let rows = query.fetch_all(&store.pool).await?;
    rows.iter().map(rows::run).collect()
}
