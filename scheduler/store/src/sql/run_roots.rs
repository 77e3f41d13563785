//! The root instances of a new run: what a workflow version's roots are, and their insert.
//!
//! A run that starts at its creation (`run_create.rs`) and a queued run that starts later
//! (`queue.rs`) get their root instances here: attempt 1 of each task without an upstream,
//! WAITING, or DISPATCHED when the transaction's [`Placing`] places it.

use ax_core::Millis;
use ax_core::ids::{InstanceId, RunId, WorkflowId};
use sqlx::Row;

use super::Store;
use super::counted::Counted;
use super::ids::IdKind;
use super::placing::Placing;
use super::{pow2_chunks, values_rows};
use crate::{NewAttempt, NewRun, Result};

/// What creating a run needs of its workflow version.
pub(crate) struct VersionFacts {
    pub(crate) task_count: i64,
    /// The root tasks (no upstream), by name: (name, priority).
    pub(crate) roots: Vec<(String, i64)>,
}

/// The root instances of one run to insert.
pub(crate) struct RootsOf<'a> {
    pub(crate) run_id: i64,
    pub(crate) workflow_id: i64,
    pub(crate) version: i64,
    pub(crate) facts: &'a VersionFacts,
    pub(crate) now: Millis,
}

impl<'a> RootsOf<'a> {
    pub(crate) fn new(run_id: i64, run: &NewRun, facts: &'a VersionFacts) -> RootsOf<'a> {
        RootsOf {
            run_id,
            workflow_id: run.workflow_id.0,
            version: i64::from(run.workflow_version),
            facts,
            now: run.now,
        }
    }
}

/// Inserts an attempt-1 instance for each root task of each run, in multi-row statements:
/// WAITING, or DISPATCHED with its attempt row when `placing` places it. Returns how many.
pub(crate) async fn insert_roots_of(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &[RootsOf<'_>],
    placing: &mut Placing<'_>,
) -> Result<usize> {
    let rows: Vec<(&RootsOf, &(String, i64))> = runs
        .iter()
        .flat_map(|run| run.facts.roots.iter().map(move |root| (run, root)))
        .collect();
    if rows.is_empty() {
        return Ok(0);
    }
    let ids = store
        .take_ids(c.uncounted(), IdKind::Instance, rows.len())
        .await?;
    let rows: Vec<_> = rows
        .into_iter()
        .zip(ids)
        .map(|((run, (task, priority)), id)| {
            let placed = placing.place(NewAttempt {
                instance_id: InstanceId(id),
                run_id: RunId(run.run_id),
                workflow_id: WorkflowId(run.workflow_id),
                workflow_version: run.version as u32,
                task: task.clone(),
                priority: *priority as i32,
                created_at: run.now,
            });
            (run, task, *priority, id, placed)
        })
        .collect();
    for chunk in pow2_chunks(&rows) {
        let sql = format!(
            "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, \
             state, worker_id, attempt, priority, not_before, created_at) VALUES {}",
            values_rows(chunk.len(), 11)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (run, task, priority, id, (state, worker)) in chunk {
            query = query
                .bind(*id)
                .bind(run.run_id)
                .bind(run.workflow_id)
                .bind(run.version)
                .bind(task.as_str())
                .bind(*state)
                .bind(worker.clone())
                .bind(1i64)
                .bind(*priority)
                .bind(run.now)
                .bind(run.now);
        }
        query.execute(&mut *c).await?;
    }
    placing.write_attempts(c.uncounted()).await?;
    Ok(rows.len())
}

/// A workflow version's task count and root tasks, one statement; `None` when it does not
/// exist.
pub(crate) async fn facts_of_version(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
) -> Result<Option<VersionFacts>> {
    let rows = sqlx::query(
        "SELECT v.task_count, d.name, d.priority FROM workflow_version v \
         LEFT JOIN task_definition d ON d.workflow_id = v.workflow_id \
         AND d.version = v.version AND d.start_group = 'run' \
         WHERE v.workflow_id = ? AND v.version = ? ORDER BY d.name",
    )
    .bind(workflow)
    .bind(version)
    .fetch_all(&mut *c)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut facts = VersionFacts {
        task_count: first.try_get("task_count")?,
        roots: Vec::with_capacity(rows.len()),
    };
    for row in &rows {
        if let Some(name) = row.try_get::<Option<String>, _>("name")? {
            facts.roots.push((name, row.try_get("priority")?));
        }
    }
    Ok(Some(facts))
}
