//! Workflows applied as a set and workflows deleted: a folder of files stored in one
//! transaction (all or nothing), the app's workflows it does not name pruned in the same
//! transaction, a single workflow deleted, and the read-only plan of a dry run.
//!
//! A delete is soft: the row keeps its versions and runs (history, purged by retention like any
//! run's), `deleted_at` is set and `live_name` cleared, which frees the name (its unique key is
//! on `live_name`) and makes every read by name, list, cron fire and dependency treat the
//! workflow as gone. Its schedule plan and its own `after` edges are removed with it. A
//! workflow with unfinished runs (RUNNING or QUEUED) is not deleted: the caller cancels them
//! first, so no run of a deleted workflow is left to end or to fire dependents.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::ids::{RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;
use sqlx::{AnyConnection, Row};

use super::rows::to_u32;
use super::workflows::{apply_workflow_tx, spec_value, stored_spec_value};
use super::{Store, db_errors, write_tx};
use crate::{
    ApplyOutcome, BUSY_RUNS_LISTED, BatchApplied, BatchItem, BusyWorkflow, Deleted, GoneWorkflow,
    PlannedApply, PrunePlan, Result,
};

/// The unfinished runs of a workflow, oldest first, at most [`BUSY_RUNS_LISTED`].
async fn unfinished_runs(c: &mut AnyConnection, id: i64) -> Result<Vec<(RunId, RunState)>> {
    let sql = format!(
        "SELECT id, state FROM run WHERE workflow_id = ? AND state IN ('RUNNING', 'QUEUED') \
         ORDER BY id LIMIT {BUSY_RUNS_LISTED}"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_all(&mut *c)
        .await?
        .iter()
        .map(|row| {
            let state: String = row.try_get("state")?;
            let state = state
                .parse::<RunState>()
                .map_err(|err| super::rows::corrupt(format!("run state: {err}")))?;
            Ok((RunId(row.try_get("id")?), state))
        })
        .collect()
}

fn gone(row: &sqlx::any::AnyRow) -> Result<GoneWorkflow> {
    Ok(GoneWorkflow {
        id: WorkflowId(row.try_get("id")?),
        name: row.try_get("name")?,
        app: row.try_get("app")?,
        version: to_u32(row.try_get("latest_version")?, "workflow version")?,
    })
}

/// The live workflows of `app` whose names are not in `keep`, by name, locked on MySQL, with
/// those that have unfinished runs.
async fn prune_plan_tx(
    store: &Store,
    c: &mut AnyConnection,
    app: &str,
    keep: &BTreeSet<String>,
) -> Result<PrunePlan> {
    let sql = format!(
        "SELECT id, name, app, latest_version FROM workflow WHERE app = ? \
         AND deleted_at IS NULL ORDER BY name{}",
        store.dialect.for_update()
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(app)
        .fetch_all(&mut *c)
        .await?;
    let mut plan = PrunePlan::default();
    for row in &rows {
        let workflow = gone(row)?;
        if keep.contains(&workflow.name) {
            continue;
        }
        let runs = unfinished_runs(c, workflow.id.0).await?;
        if !runs.is_empty() {
            plan.busy.push(BusyWorkflow {
                name: workflow.name.clone(),
                runs,
            });
        }
        plan.gone.push(workflow);
    }
    Ok(plan)
}

/// Marks the workflow deleted and removes what would start its runs: its schedule plan and its
/// `after` edges. Its versions and runs stay.
async fn delete_tx(c: &mut AnyConnection, id: WorkflowId, now: Millis) -> Result<()> {
    sqlx::query(
        "UPDATE workflow SET live_name = NULL, deleted_at = ?, updated_at = ? WHERE id = ?",
    )
    .bind(now)
    .bind(now)
    .bind(id.0)
    .execute(&mut *c)
    .await?;
    sqlx::query("DELETE FROM schedule_plan WHERE workflow_id = ?")
        .bind(id.0)
        .execute(&mut *c)
        .await?;
    super::dependents::store_edges(c, id.0, &[]).await
}

async fn apply_set_tx(
    store: &Store,
    c: &mut AnyConnection,
    items: &[BatchItem<'_>],
    prune: Option<&str>,
    now: Millis,
) -> Result<BatchApplied> {
    let mut plan = PrunePlan::default();
    if let Some(app) = prune {
        let keep: BTreeSet<String> = items.iter().map(|item| item.spec.name.clone()).collect();
        plan = prune_plan_tx(store, c, app, &keep).await?;
        if !plan.busy.is_empty() {
            return Ok(BatchApplied::Busy(plan.busy));
        }
    }
    let mut applied = Vec::with_capacity(items.len());
    for item in items {
        applied.push(
            apply_workflow_tx(store, c, item.spec, item.source, item.next_fire_at, now).await?,
        );
    }
    for workflow in &plan.gone {
        delete_tx(c, workflow.id, now).await?;
    }
    Ok(BatchApplied::Applied {
        applied,
        deleted: plan.gone,
    })
}

impl Store {
    /// Applies every item as [`Store::apply_workflow`] applies one, in one transaction: all are
    /// stored or none. With `prune`, the live workflows of that app that no item names are
    /// deleted in the same transaction, unless one of them has unfinished runs: then nothing is
    /// stored and the answer names them ([`BatchApplied::Busy`]). The items must name distinct
    /// workflows (the caller checks).
    pub async fn apply_workflow_set(
        &self,
        items: &[BatchItem<'_>],
        prune: Option<&str>,
        now: Millis,
    ) -> Result<BatchApplied> {
        let mut tries = 0;
        loop {
            tries += 1;
            let result = write_tx!(self, |c| apply_set_tx(self, c, items, prune, now));
            match result {
                // Another node created one of the new workflows at once: apply again and find
                // its version.
                Err(crate::StoreError::Database(err))
                    if db_errors::is_unique_violation(&err) && tries < 3 =>
                {
                    continue;
                }
                other => return other,
            }
        }
    }

    /// What applying each spec would do now, without writing: the outcome (Unchanged when it
    /// equals the latest version, as an apply compares them) and the latest stored version.
    pub async fn plan_apply(&self, specs: &[&WorkflowSpec]) -> Result<Vec<PlannedApply>> {
        let mut c = self.pool.acquire().await?;
        let mut planned = Vec::with_capacity(specs.len());
        for spec in specs {
            let row = sqlx::query(
                "SELECT w.latest_version, v.spec_json, v.source FROM workflow w \
                 JOIN workflow_version v ON v.workflow_id = w.id \
                 AND v.version = w.latest_version WHERE w.live_name = ?",
            )
            .bind(spec.name.as_str())
            .fetch_optional(&mut *c)
            .await?;
            planned.push(match row {
                None => PlannedApply {
                    outcome: ApplyOutcome::Created,
                    stored: None,
                },
                Some(row) => {
                    let same = stored_spec_value(&row.try_get::<String, _>("spec_json")?)?
                        == spec_value(spec)?;
                    PlannedApply {
                        outcome: if same {
                            ApplyOutcome::Unchanged
                        } else {
                            ApplyOutcome::Updated
                        },
                        stored: Some((
                            to_u32(row.try_get("latest_version")?, "workflow version")?,
                            row.try_get("source")?,
                        )),
                    }
                }
            });
        }
        Ok(planned)
    }

    /// The live workflows of `app` not named in `keep`: what a prune would delete now, and
    /// which of them have unfinished runs. Reads only.
    pub async fn plan_prune(&self, app: &str, keep: &BTreeSet<String>) -> Result<PrunePlan> {
        let mut c = self.pool.acquire().await?;
        prune_plan_tx(self, &mut c, app, keep).await
    }

    /// Deletes the live workflow `id` (soft: see the module's doc), unless it has unfinished
    /// runs.
    pub async fn delete_workflow(&self, id: WorkflowId, now: Millis) -> Result<Deleted> {
        write_tx!(self, |c| async move {
            let sql = format!(
                "SELECT id, name, app, latest_version FROM workflow WHERE id = ? \
                 AND deleted_at IS NULL{}",
                self.dialect.for_update()
            );
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id.0)
                .fetch_optional(&mut *c)
                .await?;
            let Some(row) = row else {
                return Ok(Deleted::NotFound);
            };
            let workflow = gone(&row)?;
            let runs = unfinished_runs(c, id.0).await?;
            if !runs.is_empty() {
                return Ok(Deleted::Busy(BusyWorkflow {
                    name: workflow.name,
                    runs,
                }));
            }
            delete_tx(c, id, now).await?;
            Ok(Deleted::Deleted(workflow))
        })
    }

    /// The app of every live workflow, by name: what the checks of a set across workflows
    /// (`after`, scopes) read, one light row per workflow.
    pub async fn live_workflow_apps(&self) -> Result<BTreeMap<String, String>> {
        sqlx::query("SELECT live_name, app FROM workflow WHERE deleted_at IS NULL")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| Ok((row.try_get("live_name")?, row.try_get("app")?)))
            .collect()
    }

    /// Whether workflow `id` was deleted (false for a live one and for an unknown id).
    pub async fn workflow_deleted(&self, id: WorkflowId) -> Result<bool> {
        let row = sqlx::query("SELECT deleted_at FROM workflow WHERE id = ?")
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => row.try_get::<Option<i64>, _>("deleted_at")?.is_some(),
            None => false,
        })
    }
}
