//! Workflows and their schedules: applying a spec, reading workflows and their versions,
//! pausing and resuming, and the schedule plan's due fires and conditional advances.
//!
//! Schedules share the file with workflows because a workflow's `schedule_plan` row is written
//! by the same statements that write the workflow: an apply stores the spec's plan beside the
//! new version, and a pause or resume sets the flag on both rows in one transaction. An apply
//! stores a new version only when the spec differs from the latest; two nodes creating the same
//! workflow at once race on its unique name, and the loser applies again and finds the winner's
//! version.

use std::collections::BTreeSet;

use ax_core::Millis;
use ax_core::ids::WorkflowId;
use ax_core::spec::{Handler, TaskSpec, WorkflowSpec};
use sqlx::{AnyConnection, Row};

use super::ids::IdKind;
use super::queue;
use super::rows::{self, corrupt, to_json, to_u32};
use super::{INSERT_CHUNK, Store, db_errors, values_rows, write_tx};
use crate::{ApplyOutcome, DueSchedule, Result, WorkflowHead, WorkflowRecord};

async fn workflow_by_name(c: &mut AnyConnection, name: &str) -> Result<Option<WorkflowRecord>> {
    let sql = format!(
        "{} AND v.version = w.latest_version WHERE w.live_name = ?",
        rows::WORKFLOW_SELECT
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(name)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(rows::workflow).transpose()
}

pub(super) fn spec_value(spec: &WorkflowSpec) -> Result<serde_json::Value> {
    serde_json::to_value(spec).map_err(|err| corrupt(format!("cannot encode spec: {err}")))
}

/// A stored version's spec as JSON: what an apply compares the new spec with (equal: nothing
/// to store).
pub(super) fn stored_spec_value(spec_json: &str) -> Result<serde_json::Value> {
    serde_json::from_str(spec_json).map_err(|err| corrupt(format!("stored workflow spec: {err}")))
}

/// Stores `spec` as its workflow's next version in the caller's transaction, unless it equals
/// the latest (see [`Store::apply_workflow`]).
pub(super) async fn apply_workflow_tx(
    store: &Store,
    c: &mut AnyConnection,
    spec: &WorkflowSpec,
    source: &str,
    next_fire_at: Option<Millis>,
    now: Millis,
) -> Result<(WorkflowRecord, ApplyOutcome)> {
    let sql = format!(
        "SELECT id, latest_version FROM workflow WHERE live_name = ?{}",
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
            if stored_spec_value(&stored)? == spec_value(spec)? {
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
                "INSERT INTO workflow (id, app, name, live_name, owner, latest_version, paused, \
                 created_at, updated_at) VALUES (?, ?, ?, ?, ?, 1, 0, ?, ?)",
            )
            .bind(id)
            .bind(spec.app.as_str())
            .bind(spec.name.as_str())
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
         on_failure_tasks, on_success_tasks, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(workflow_id)
    .bind(version)
    .bind(spec_json)
    .bind(source)
    .bind(spec.graph_tasks().count() as i64)
    .bind(handler_count(spec, Handler::OnFailure))
    .bind(handler_count(spec, Handler::OnSuccess))
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
             retries, retry_backoff_ms, priority, labels_json, upstream_count, app, owner, \
             trigger_rule, handler, start_group, output_refs, run_if, for_each, max_items, \
             run_workflow, run_params) VALUES {}",
            values_rows(chunk.len(), 21)
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
                // The column holds 0 for no timeout.
                .bind(
                    task.timeout_ms
                        .map_or(0, |ms| i64::try_from(ms.get()).unwrap_or(i64::MAX)),
                )
                .bind(i64::from(task.retries))
                .bind(i64::try_from(task.retry_backoff_ms).unwrap_or(i64::MAX))
                .bind(i64::from(task.priority))
                .bind(to_json(&task.labels)?)
                .bind(*upstreams)
                .bind(spec.app.as_str())
                .bind(spec.owner.as_str())
                .bind(task.trigger_rule.as_str())
                .bind(task.handler.map(Handler::field))
                .bind(start_group(task))
                .bind(output_refs_json(task)?)
                .bind(task.condition.as_deref())
                .bind(task.for_each.as_ref().map(to_json).transpose()?)
                .bind(task.max_items.map(i64::from))
                .bind(task.run_workflow.as_deref())
                .bind(
                    (!task.params.is_empty())
                        .then(|| to_json(&task.params))
                        .transpose()?,
                );
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

impl Store {
    /// Stores `spec` as the workflow's next version unless it equals the latest one.
    /// `next_fire_at` is the schedule's next cron fire (None when not cron-triggered); it is
    /// stored only when the version changes or the workflow is new.
    /// Writes the version, its task definitions and dependency edges, and the schedule plan in
    /// one transaction.
    pub async fn apply_workflow(
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
                Err(crate::StoreError::Database(err))
                    if db_errors::is_unique_violation(&err) && tries < 3 =>
                {
                    continue;
                }
                other => return other,
            }
        }
    }

    /// The latest version.
    pub async fn get_workflow(&self, name: &str) -> Result<Option<WorkflowRecord>> {
        let mut c = self.pool.acquire().await?;
        workflow_by_name(&mut c, name).await
    }

    /// The id and latest version number of the workflow called `name`, without its spec: one
    /// light read for callers that cache versions (a version never changes once stored).
    pub async fn latest_version(&self, name: &str) -> Result<Option<(WorkflowId, u32)>> {
        let row = sqlx::query("SELECT id, latest_version FROM workflow WHERE live_name = ?")
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

    pub async fn get_workflow_version(
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

    /// The live workflows (a deleted one is gone), by name.
    pub async fn list_workflows(&self, app: Option<&str>) -> Result<Vec<WorkflowRecord>> {
        let mut sql = format!(
            "{} AND v.version = w.latest_version WHERE w.deleted_at IS NULL",
            rows::WORKFLOW_SELECT
        );
        if app.is_some() {
            sql.push_str(" AND w.app = ?");
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

    /// [`Store::list_workflows`] without the specs and sources, by name: one row per workflow,
    /// however large its definition.
    pub async fn list_workflow_heads(&self, app: Option<&str>) -> Result<Vec<WorkflowHead>> {
        self.heads(app, false).await
    }

    /// [`Store::list_workflow_heads`] with the deleted workflows too: every workflow that may
    /// have runs, for what reads or purges history (a deleted workflow's runs are kept until
    /// its retention purges them).
    pub async fn history_heads(&self, app: Option<&str>) -> Result<Vec<WorkflowHead>> {
        self.heads(app, true).await
    }

    async fn heads(&self, app: Option<&str>, deleted_too: bool) -> Result<Vec<WorkflowHead>> {
        let mut sql = String::from(
            "SELECT id, name, latest_version, paused, created_at, updated_at FROM workflow \
             WHERE 1 = 1",
        );
        if !deleted_too {
            sql.push_str(" AND deleted_at IS NULL");
        }
        if app.is_some() {
            sql.push_str(" AND app = ?");
        }
        sql.push_str(" ORDER BY name, id");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(app) = app {
            query = query.bind(app);
        }
        query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| {
                Ok(WorkflowHead {
                    id: WorkflowId(row.try_get("id")?),
                    name: row.try_get("name")?,
                    version: to_u32(row.try_get("latest_version")?, "workflow version")?,
                    paused: row.try_get::<i64, _>("paused")? != 0,
                    created_at: row.try_get("created_at")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// Pauses or resumes a workflow's schedule. On resume `next_fire_at` replaces the stored one.
    pub async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<WorkflowRecord>> {
        write_tx!(self, |c| async move {
            let row = sqlx::query("SELECT id FROM workflow WHERE live_name = ?")
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

    pub async fn due_schedules(&self, now: Millis, limit: u32) -> Result<Vec<DueSchedule>> {
        let rows = sqlx::query(
            "SELECT sp.workflow_id, w.name, w.latest_version, sp.cron, sp.timezone, \
             sp.next_fire_at FROM schedule_plan sp JOIN workflow w ON w.id = sp.workflow_id \
             WHERE sp.paused = 0 AND sp.next_fire_at <= ? AND sp.trigger_type = 'cron' \
             AND w.deleted_at IS NULL \
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

    /// Moves a schedule's next fire time from `from` to `to`; false if someone else did.
    pub async fn advance_schedule(
        &self,
        workflow_id: WorkflowId,
        from: Millis,
        to: Millis,
    ) -> Result<bool> {
        let won = self.advance_schedules(&[(workflow_id, from, to)]).await?;
        Ok(won.first().copied().unwrap_or(false))
    }

    /// `advance_schedule` for several schedules (workflow, from, to) in one transaction; says for
    /// each whether this call moved it.
    pub async fn advance_schedules(
        &self,
        moves: &[(WorkflowId, Millis, Millis)],
    ) -> Result<Vec<bool>> {
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

    /// The schedule's stored next fire time (kept while paused); `None` without a schedule.
    pub async fn schedule_next_fire(&self, workflow_id: WorkflowId) -> Result<Option<Millis>> {
        let row = sqlx::query("SELECT next_fire_at FROM schedule_plan WHERE workflow_id = ?")
            .bind(workflow_id.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => row.try_get("next_fire_at")?,
            None => None,
        })
    }
}

/// The output references of a task as stored (`[[task, key], …]`), `None` for none: the
/// advance checks them when the task is ready.
fn output_refs_json(task: &TaskSpec) -> Result<Option<String>> {
    let refs: Vec<(String, String)> = task
        .output_refs()
        .into_iter()
        .map(|r| (r.task, r.key))
        .collect();
    if refs.is_empty() {
        return Ok(None);
    }
    Ok(Some(to_json(&refs)?))
}

/// The tasks of one handler list of `spec`.
fn handler_count(spec: &WorkflowSpec, handler: Handler) -> i64 {
    spec.tasks
        .iter()
        .filter(|task| task.handler == Some(handler))
        .count() as i64
}

/// The group a task starts with (`start_group`): `run` for a task a new run starts with,
/// `on_failure`/`on_success` for the first tasks of a handler list, none for the others.
fn start_group(task: &TaskSpec) -> Option<&'static str> {
    let first = task.upstream.is_empty() || task.trigger_rule.starts_with_run();
    match task.handler {
        _ if !first => None,
        None => Some("run"),
        Some(handler) => Some(handler.field()),
    }
}
