//! A workflow's recent runs read as a matrix (the web UI's grid): each run's task instances of
//! their own (shard slot 0, never a shard or an item), with, when asked, a mapped task's items
//! counted by state and a `run_workflow` task's child run.
//!
//! Three statements at most whatever the number of runs: the cells by the (run, task, shard
//! slot) index, the items' counts grouped in SQL (only for a workflow with mapped tasks) and the
//! child runs by the waits' parent-run index (only for one with `run_workflow` tasks). 100 runs
//! of 300 tasks are 30,000 narrow rows, not 100 reads.

use std::collections::HashMap;

use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::state::InstanceState;
use sqlx::Row;

use super::rows::{instance_state, to_u32};
use super::{Store, in_list};
use crate::{GridCell, GridParts, Result};

impl Store {
    /// The cells of `runs`, by run then instance id; a task without an instance in a run has no
    /// cell. Items are those of each mapped task's latest fan-out (as `item_summaries` counts
    /// them); a child run is the one the instance's current attempt started.
    pub async fn grid_cells(&self, runs: &[RunId], parts: GridParts) -> Result<Vec<GridCell>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let (list, values) = in_list(runs.iter().map(|id| id.0));
        let sql = format!(
            "SELECT id, run_id, task_name, state, attempt FROM task_instance \
             WHERE run_id IN ({list}) AND shard_slot = 0 ORDER BY run_id, id"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in &values {
            query = query.bind(*id);
        }
        let rows = query.fetch_all(&self.pool).await?;
        let mut cells = Vec::with_capacity(rows.len());
        for row in &rows {
            cells.push(GridCell {
                run: RunId(row.try_get("run_id")?),
                task: row.try_get("task_name")?,
                instance: InstanceId(row.try_get("id")?),
                state: instance_state(&row.try_get::<String, _>("state")?)?,
                attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
                child_run: None,
                items: Vec::new(),
            });
        }
        if parts.items {
            let mut counts = self.grid_item_counts(&list, &values).await?;
            for cell in &mut cells {
                if let Some(items) = counts.remove(&cell.instance.0) {
                    cell.items = items;
                }
            }
        }
        if parts.child_runs {
            let children = self.grid_child_runs(&list, &values).await?;
            for cell in &mut cells {
                cell.child_run = children.get(&(cell.instance.0, cell.attempt.0)).copied();
            }
        }
        Ok(cells)
    }

    /// Each mapped task's items of its latest fan-out by state, by the task's instance id.
    async fn grid_item_counts(
        &self,
        list: &str,
        runs: &[i64],
    ) -> Result<HashMap<i64, Vec<(InstanceState, u32)>>> {
        let sql = format!(
            "SELECT parent_id, parent_attempt, state, COUNT(*) AS n FROM task_instance \
             WHERE run_id IN ({list}) AND item IS NOT NULL \
             GROUP BY parent_id, parent_attempt, state"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in runs {
            query = query.bind(*id);
        }
        let rows = query.fetch_all(&self.pool).await?;
        let latest = super::items::latest_fan_outs(&rows)?;
        // In the states' order, as `item_summaries` gives them.
        Ok(latest
            .into_iter()
            .map(|(parent, (_, counts))| {
                let ordered = InstanceState::ALL
                    .into_iter()
                    .filter_map(|s| counts.get(&s).map(|n| (s, *n)))
                    .collect();
                (parent, ordered)
            })
            .collect())
    }

    /// The child run of each (instance, attempt) of the runs' `run_workflow` tasks.
    async fn grid_child_runs(
        &self,
        list: &str,
        runs: &[i64],
    ) -> Result<HashMap<(i64, u32), RunId>> {
        let sql = format!(
            "SELECT parent_instance_id, parent_attempt, child_run_id FROM sub_workflow_wait \
             WHERE parent_run_id IN ({list})"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in runs {
            query = query.bind(*id);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok((
                    (
                        row.try_get("parent_instance_id")?,
                        to_u32(row.try_get("parent_attempt")?, "attempt")?,
                    ),
                    RunId(row.try_get("child_run_id")?),
                ))
            })
            .collect()
    }
}
