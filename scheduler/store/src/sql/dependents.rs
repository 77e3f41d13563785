//! Cross-workflow dependencies (`schedule.after`): the edges kept at apply, and the check that
//! runs in the transaction that ends an upstream run SUCCESS.
//!
//! Exactly once and crash-safe because it is part of that transaction: the run ends SUCCESS and
//! the dependent's run exists together or not at all, and the dependent's run carries the dedup
//! key `dep:<logical ms>`, so a second upstream completion for the same logical time finds it.
//! On MySQL the dependent's workflow row is locked before its upstreams are read, so two
//! upstreams finishing at once on two nodes cannot both miss the join: the second waits for the
//! first to commit and then sees its SUCCESS. The run end has locked these rows already, with
//! its own workflow's, in ascending id order (`sql/locks.rs`), so that lock is re-entrant.

use std::collections::BTreeMap;

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::dependency::{self, DependencyDecision, UpstreamFact};
use ax_core::ids::{RunId, WorkflowId};
use ax_core::spec::TriggerKind;
use sqlx::{AnyConnection, Row};

use super::run_create::{Created, create_run_tx};
use super::{Store, values_rows};
use crate::{NewRun, Result, StoreError};

/// The decision log's node for decisions taken inside the run-end transaction: whichever node
/// applied the report that ended the upstream run.
const DECIDED_AT_RUN_END: &str = "run-end";

/// Replaces a workflow's upstream edges with `after` (at apply, in its transaction).
pub(crate) async fn store_edges(
    c: &mut AnyConnection,
    workflow_id: i64,
    after: &[String],
) -> Result<()> {
    sqlx::query("DELETE FROM workflow_dependency WHERE downstream_id = ?")
        .bind(workflow_id)
        .execute(&mut *c)
        .await?;
    if after.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO workflow_dependency (upstream_name, downstream_id, position) VALUES {}",
        values_rows(after.len(), 3)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (position, upstream) in after.iter().enumerate() {
        query = query
            .bind(upstream.as_str())
            .bind(workflow_id)
            .bind(position as i64);
    }
    query.execute(&mut *c).await?;
    Ok(())
}

impl Store {
    /// Every stored workflow's `schedule.after` list, by workflow name: what the cycle check at
    /// apply reads.
    pub async fn workflow_dependencies(&self) -> Result<BTreeMap<String, Vec<String>>> {
        let rows = sqlx::query(
            "SELECT w.name, d.upstream_name FROM workflow_dependency d \
             JOIN workflow w ON w.id = d.downstream_id AND w.deleted_at IS NULL \
             ORDER BY w.name, d.position",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for row in rows {
            edges
                .entry(row.try_get("name")?)
                .or_default()
                .push(row.try_get("upstream_name")?);
        }
        Ok(edges)
    }
}

/// Called once a run has ended SUCCESS, in the same transaction: every workflow that lists the
/// run's workflow in `after` gets its decision for the run's logical time, and a run when all its
/// upstreams succeeded for it. Reads only the dependents' edges and one index probe per
/// upstream.
pub(crate) async fn after_run_success(
    store: &Store,
    c: &mut AnyConnection,
    run_id: RunId,
    now: Millis,
) -> Result<()> {
    let run = sqlx::query(
        "SELECT r.logical_time, w.live_name FROM run r JOIN workflow w ON w.id = r.workflow_id \
         WHERE r.id = ?",
    )
    .bind(run_id.0)
    .fetch_optional(&mut *c)
    .await?;
    let Some(run) = run else { return Ok(()) };
    let logical_time: i64 = run.try_get("logical_time")?;
    // A deleted workflow's run fires nothing: its name may be a new workflow's by now.
    let Some(upstream_name) = run.try_get::<Option<String>, _>("live_name")? else {
        return Ok(());
    };
    let dependents: Vec<i64> = sqlx::query(
        "SELECT downstream_id FROM workflow_dependency WHERE upstream_name = ? \
         ORDER BY downstream_id",
    )
    .bind(upstream_name.as_str())
    .fetch_all(&mut *c)
    .await?
    .iter()
    .map(|row| row.try_get("downstream_id"))
    .collect::<std::result::Result<_, _>>()?;
    // Ascending id order: two transactions locking several dependents never cross.
    for dependent in dependents {
        on_upstream_success(store, c, WorkflowId(dependent), logical_time, now).await?;
    }
    Ok(())
}

async fn on_upstream_success(
    store: &Store,
    c: &mut AnyConnection,
    dependent: WorkflowId,
    logical_time: Millis,
    now: Millis,
) -> Result<()> {
    let sql = format!(
        "SELECT paused, latest_version FROM workflow WHERE id = ? AND deleted_at IS NULL{}",
        store.dialect.for_update()
    );
    let workflow = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(dependent.0)
        .fetch_optional(&mut *c)
        .await?;
    let Some(workflow) = workflow else {
        return Ok(());
    };
    let paused = workflow.try_get::<i64, _>("paused")? != 0;
    let version: i64 = workflow.try_get("latest_version")?;
    let upstreams: Vec<String> = sqlx::query(
        "SELECT upstream_name FROM workflow_dependency WHERE downstream_id = ? ORDER BY position",
    )
    .bind(dependent.0)
    .fetch_all(&mut *c)
    .await?
    .iter()
    .map(|row| row.try_get("upstream_name"))
    .collect::<std::result::Result<_, _>>()?;
    let mut facts = Vec::with_capacity(upstreams.len());
    for workflow in upstreams {
        let success = sqlx::query(
            "SELECT r.id FROM workflow w JOIN run r ON r.workflow_id = w.id \
             AND r.logical_time = ? AND r.state = 'SUCCESS' WHERE w.live_name = ? \
             ORDER BY r.id LIMIT 1",
        )
        .bind(logical_time)
        .bind(workflow.as_str())
        .fetch_optional(&mut *c)
        .await?;
        let success_run = match success {
            Some(row) => Some(RunId(row.try_get("id")?)),
            None => None,
        };
        facts.push(UpstreamFact {
            workflow,
            success_run,
        });
    }
    let decision = dependency::decide(paused, &facts);
    let mut created_run = None;
    if let DependencyDecision::Fire { upstream_runs } = &decision {
        let new_run = NewRun {
            workflow_id: dependent,
            workflow_version: u32::try_from(version).unwrap_or(u32::MAX),
            trigger: TriggerKind::Dependency,
            logical_time,
            dedup_key: Some(dependency::dedup_key(logical_time)),
            idempotency_key: None,
            params: ax_core::params::defaults(&declared_params(c, dependent, version).await?),
            triggered_by: dependency::upstream_runs_text(upstream_runs),
            now,
            audit_from: None,
        };
        match create_run_tx(store, c, &new_run).await? {
            Created::New(run) => created_run = Some(run.id),
            // Fired for this logical time already (a duplicate or a rerun upstream): nothing new,
            // and nothing new to explain.
            Created::Existing(_) => return Ok(()),
        }
    }
    record(
        c,
        dependent,
        logical_time,
        created_run,
        decision.kind(),
        &decision.detail(logical_time),
        now,
    )
    .await
}

async fn record(
    c: &mut AnyConnection,
    workflow: WorkflowId,
    slot_at: Millis,
    run: Option<RunId>,
    kind: DecisionKind,
    detail: &str,
    now: Millis,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, task_name, \
         kind, detail, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(now)
    .bind(workflow.0)
    .bind(slot_at)
    .bind(run.map(|id| id.0))
    .bind(None::<i64>)
    .bind(None::<String>)
    .bind(kind.as_str())
    .bind(detail)
    .bind(DECIDED_AT_RUN_END)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// The params a workflow version declares (`params:` in its file): a run its upstreams start
/// is given none, so it gets their defaults; a child run's are held to them.
pub(super) async fn declared_params(
    c: &mut AnyConnection,
    workflow: WorkflowId,
    version: i64,
) -> Result<Vec<ax_core::spec::ParamSpec>> {
    #[derive(serde::Deserialize)]
    struct Declared {
        #[serde(default)]
        params: Vec<ax_core::spec::ParamSpec>,
    }
    let row =
        sqlx::query("SELECT spec_json FROM workflow_version WHERE workflow_id = ? AND version = ?")
            .bind(workflow.0)
            .bind(version)
            .fetch_optional(&mut *c)
            .await?;
    let Some(row) = row else {
        return Ok(Vec::new());
    };
    let spec_json: String = row.try_get("spec_json")?;
    let declared: Declared = serde_json::from_str(&spec_json)
        .map_err(|err| StoreError::Corrupt(format!("stored workflow spec: {err}")))?;
    Ok(declared.params)
}
