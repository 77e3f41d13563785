//! The end of runs: once instances became terminal, every run of the set with nothing left to
//! run ends, and what follows a run end happens in the same transaction (the dependent
//! workflows' decisions, the promotion of queued runs).
//!
//! A run whose workflow has handlers (`on_failure`, `on_success`) takes one more step first
//! (`ax_core::run::run_step`): when its graph's outcome is known, the handler list for it starts
//! (its first tasks WAITING, the outcome kept in `run.handlers_for` and told to them through
//! `run.handler_env_json`), and the run ends with that outcome once they ended.
//!
//! Set-based, so a report batch that ends a hundred runs costs about what one run end costs:
//! one statement finds the runs that may end (RUNNING, no unfinished instance), one counts
//! their instances, one reads (and on MySQL one locks) the workflow rows they need, one update
//! per end state ends them, and one probe finds the workflows with queued runs. Only the rare
//! parts, a workflow with dependents or with queued runs, cost statements per workflow.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::ids::RunId;
use ax_core::run::{Handlers, RunProgress, RunState, RunStep, run_step};
use ax_core::spec::Handler;
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::rows::{instance_state, run_state, to_u32};
use super::{Store, in_list};
use crate::Result;

/// Ends the run when nothing of it can run any more (after an instance became terminal).
pub(crate) async fn finish_run_if_done(
    store: &Store,
    c: &mut AnyConnection,
    run_id: RunId,
    now: Millis,
) -> Result<Option<(RunId, RunState)>> {
    let runs = BTreeSet::from([run_id.0]);
    let ended = end_runs_if_done(store, &mut Counted::new(c), &runs, now).await?;
    Ok(ended.get(&run_id.0).map(|end| (run_id, *end)))
}

/// Ends each of `runs` that has nothing left to run, then carries out what follows; returns the
/// runs that ended and how. The caller holds the run rows' locks (MySQL) or the writer lock.
pub(crate) async fn end_runs_if_done(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &BTreeSet<i64>,
    now: Millis,
) -> Result<BTreeMap<i64, RunState>> {
    let (ending, handlers) = ends_due(c, runs).await?;
    if !handlers.is_empty() {
        start_handlers(store, c, &handlers, now).await?;
    }
    if ending.is_empty() {
        return Ok(BTreeMap::new());
    }
    // Which runs end is decided first, then the workflow rows all of them need are locked at
    // once in id order (`sql/locks.rs`), then they end.
    let workflows: BTreeSet<i64> = ending.values().map(|(workflow, _)| *workflow).collect();
    let with_dependents = super::locks::lock_workflows_of_ending_runs(store, c, &workflows).await?;
    let ended = mark_ended(c, &ending, now).await?;
    for (run, end) in &ended {
        let workflow = ending[run].0;
        if *end == RunState::Success && with_dependents.contains(&workflow) {
            super::dependents::after_run_success(store, c.uncounted(), RunId(*run), now).await?;
        }
    }
    let workflows: BTreeSet<i64> = ended.keys().map(|run| ending[run].0).collect();
    super::queue::promote_queued_of(store, c, &workflows, now).await?;
    Ok(ended)
}

/// A run whose graph ended and whose handler list for that outcome starts: (workflow,
/// version, outcome, list).
type HandlersDue = BTreeMap<i64, (i64, i64, RunState, Handler)>;

/// The runs of `runs` that are RUNNING with no unfinished instance, with their workflow and how
/// they end, and those whose handlers start instead: two statements for the whole set (three
/// when a run's workflow has handlers). The common case, a run with an instance still to run,
/// is one index probe inside the first.
async fn ends_due(
    c: &mut Counted<'_>,
    runs: &BTreeSet<i64>,
) -> Result<(BTreeMap<i64, (i64, RunState)>, HandlersDue)> {
    let mut handlers_due = BTreeMap::new();
    if runs.is_empty() {
        return Ok((BTreeMap::new(), handlers_due));
    }
    let (list, padded) = in_list(runs.iter().copied());
    // The run's state is checked here, not in SQL: a condition on `r.state` would let SQLite
    // walk the run state index (every RUNNING run) instead of the listed ids.
    let sql = format!(
        "SELECT r.id, r.state, r.workflow_id, r.workflow_version, r.cancel_requested, \
         r.handlers_for, v.task_count, v.on_failure_tasks, v.on_success_tasks FROM run r \
         JOIN workflow_version v ON v.workflow_id = r.workflow_id AND v.version = r.workflow_version \
         WHERE r.id IN ({list}) AND NOT EXISTS (SELECT 1 FROM task_instance ti \
         WHERE ti.run_id = r.id AND ti.state IN ('WAITING', 'DISPATCHED', 'RUNNING'))"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    let mut idle: BTreeMap<i64, IdleRun> = BTreeMap::new();
    for row in query.fetch_all(&mut *c).await? {
        if run_state(&row.try_get::<String, _>("state")?)? != RunState::Running {
            continue;
        }
        let graph = RunProgress {
            tasks: to_u32(row.try_get("task_count")?, "task count")?,
            cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
            ..RunProgress::default()
        };
        let handlers = Handlers {
            on_failure: row.try_get::<i64, _>("on_failure_tasks")? > 0,
            on_success: row.try_get::<i64, _>("on_success_tasks")? > 0,
            started_for: row
                .try_get::<Option<String>, _>("handlers_for")?
                .map(|state| run_state(&state))
                .transpose()?,
            unfinished: 0,
        };
        idle.insert(
            row.try_get("id")?,
            IdleRun {
                workflow: row.try_get("workflow_id")?,
                version: row.try_get("workflow_version")?,
                graph,
                handlers,
            },
        );
    }
    if idle.is_empty() {
        return Ok((BTreeMap::new(), handlers_due));
    }
    // Shards count through their parent; a handler's instance does not count for the graph.
    let (with_handlers, plain): (Vec<i64>, Vec<i64>) = idle
        .keys()
        .partition(|run| idle[*run].handlers.on_failure || idle[*run].handlers.on_success);
    for (runs, join) in [(plain, false), (with_handlers, true)] {
        if runs.is_empty() {
            continue;
        }
        let (list, padded) = in_list(runs.iter().copied());
        let sql = if join {
            format!(
                "SELECT ti.run_id, ti.state, COUNT(*) AS n FROM task_instance ti \
                 JOIN task_definition td ON td.workflow_id = ti.workflow_id \
                 AND td.version = ti.workflow_version AND td.name = ti.task_name \
                 WHERE ti.run_id IN ({list}) AND ti.shard_slot = 0 AND td.handler IS NULL \
                 GROUP BY ti.run_id, ti.state"
            )
        } else {
            format!(
                "SELECT run_id, state, COUNT(*) AS n FROM task_instance \
                 WHERE run_id IN ({list}) AND shard_slot = 0 GROUP BY run_id, state"
            )
        };
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for run in padded {
            query = query.bind(run);
        }
        for row in query.fetch_all(&mut *c).await? {
            let Some(facts) = idle.get_mut(&row.try_get::<i64, _>("run_id")?) else {
                continue;
            };
            let progress = &mut facts.graph;
            let n = to_u32(row.try_get("n")?, "instance count")?;
            match instance_state(&row.try_get::<String, _>("state")?)? {
                InstanceState::Success => progress.succeeded += n,
                InstanceState::Skipped => progress.skipped += n,
                InstanceState::Cancelled => progress.cancelled += n,
                InstanceState::Failed | InstanceState::Timeout | InstanceState::UpstreamFailed => {
                    progress.failed += n
                }
                // PENDING (after a rerun from above) counts like a task without an instance.
                InstanceState::Pending => {}
                InstanceState::Waiting | InstanceState::Dispatched | InstanceState::Running => {
                    progress.unfinished += n
                }
            }
        }
    }
    let mut ending = BTreeMap::new();
    for (run, facts) in idle {
        match run_step(facts.graph, facts.handlers) {
            RunStep::Continue => {}
            RunStep::End(state) => {
                ending.insert(run, (facts.workflow, state));
            }
            RunStep::StartHandlers { outcome, handler } => {
                handlers_due.insert(run, (facts.workflow, facts.version, outcome, handler));
            }
        }
    }
    Ok((ending, handlers_due))
}

/// What the end of a run reads of a RUNNING run with nothing unfinished.
struct IdleRun {
    workflow: i64,
    version: i64,
    graph: RunProgress,
    handlers: Handlers,
}

/// The most failed tasks `AX_FAILED_TASKS` names.
const FAILED_TASKS_NAMED: usize = 100;

/// Starts the handler list of each run of `due`: its first tasks WAITING (or woken, when they
/// ran before the run was reopened), the outcome and what the handlers are told kept on the run.
async fn start_handlers(
    store: &Store,
    c: &mut Counted<'_>,
    due: &HandlersDue,
    now: Millis,
) -> Result<()> {
    for (run, (workflow, version, outcome, handler)) in due {
        let failed: Vec<String> = sqlx::query(
            "SELECT task_name FROM task_instance WHERE run_id = ? AND shard_slot = 0 \
             AND state IN ('FAILED', 'TIMEOUT', 'CANCELLED') ORDER BY task_name",
        )
        .bind(*run)
        .fetch_all(&mut *c)
        .await?
        .iter()
        .map(|row| row.try_get("task_name"))
        .collect::<std::result::Result<_, _>>()?;
        let env = BTreeMap::from([
            ("AX_RUN_STATE", outcome.as_str().to_string()),
            (
                "AX_FAILED_TASKS",
                failed
                    .iter()
                    .take(FAILED_TASKS_NAMED)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]);
        sqlx::query(
            "UPDATE run SET handlers_for = ?, handler_env_json = ? \
             WHERE id = ? AND state = 'RUNNING'",
        )
        .bind(outcome.as_str())
        .bind(super::rows::to_json(&env)?)
        .bind(*run)
        .execute(&mut *c)
        .await?;
        let first: Vec<(i64, String, i64)> = sqlx::query(
            "SELECT name, priority FROM task_definition \
             WHERE workflow_id = ? AND version = ? AND start_group = ? ORDER BY name",
        )
        .bind(*workflow)
        .bind(*version)
        .bind(handler.field())
        .fetch_all(&mut *c)
        .await?
        .iter()
        .map(|row| Ok((*run, row.try_get("name")?, row.try_get("priority")?)))
        .collect::<Result<_>>()?;
        super::reports::insert_first_attempts(
            store,
            c,
            *workflow,
            *version,
            &first,
            now,
            &mut super::placing::Placing::none(),
        )
        .await?;
    }
    Ok(())
}

/// Moves the runs from RUNNING to their end, one conditional update per end state; returns the
/// runs it moved.
async fn mark_ended(
    c: &mut Counted<'_>,
    ending: &BTreeMap<i64, (i64, RunState)>,
    now: Millis,
) -> Result<BTreeMap<i64, RunState>> {
    let mut by_end: BTreeMap<&'static str, (RunState, Vec<i64>)> = BTreeMap::new();
    for (run, (_, end)) in ending {
        by_end
            .entry(end.as_str())
            .or_insert_with(|| (*end, Vec::new()))
            .1
            .push(*run);
    }
    let mut ended = BTreeMap::new();
    for (state, (end, runs)) in by_end {
        let (list, padded) = in_list(runs.iter().copied());
        let sql = format!(
            "UPDATE run SET state = ?, finished_at = ? WHERE id IN ({list}) AND state = 'RUNNING'"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(state).bind(now);
        for run in padded {
            query = query.bind(run);
        }
        let moved = query.execute(&mut *c).await?.rows_affected();
        if moved as usize == runs.len() {
            ended.extend(runs.into_iter().map(|run| (run, end)));
            continue;
        }
        // Some run left RUNNING between the read and the update (the read is under the
        // run's lock, so this is not expected): ask which ones this update moved.
        let (list, padded) = in_list(runs.iter().copied());
        let sql =
            format!("SELECT id FROM run WHERE id IN ({list}) AND state = ? AND finished_at = ?");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for run in padded {
            query = query.bind(run);
        }
        for row in query.bind(state).bind(now).fetch_all(&mut *c).await? {
            ended.insert(row.try_get("id")?, end);
        }
    }
    Ok(ended)
}
