//! The end of runs: once instances became terminal, every run of the set with nothing left to
//! run ends, and what follows a run end happens in the same transaction (the dependent
//! workflows' decisions, the promotion of queued runs).
//!
//! Set-based, so a report batch that ends a hundred runs costs about what one run end costs:
//! one statement finds the runs that may end (RUNNING, no unfinished instance), one counts
//! their instances, one reads (and on MySQL one locks) the workflow rows they need, one update
//! per end state ends them, and one probe finds the workflows with queued runs. Only the rare
//! parts, a workflow with dependents or with queued runs, cost statements per workflow.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::ids::RunId;
use ax_core::run::{RunProgress, RunState, run_outcome};
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
    let ending = ends_due(c, runs).await?;
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

/// The runs of `runs` that are RUNNING with no unfinished instance, with their workflow and how
/// they end: two statements for the whole set. The common case, a run with an instance still
/// to run, is one index probe inside the first.
async fn ends_due(
    c: &mut Counted<'_>,
    runs: &BTreeSet<i64>,
) -> Result<BTreeMap<i64, (i64, RunState)>> {
    if runs.is_empty() {
        return Ok(BTreeMap::new());
    }
    let (list, padded) = in_list(runs.iter().copied());
    // The run's state is checked here, not in SQL: a condition on `r.state` would let SQLite
    // walk the run state index (every RUNNING run) instead of the listed ids.
    let sql = format!(
        "SELECT r.id, r.state, r.workflow_id, r.cancel_requested, v.task_count FROM run r \
         JOIN workflow_version v ON v.workflow_id = r.workflow_id AND v.version = r.workflow_version \
         WHERE r.id IN ({list}) AND NOT EXISTS (SELECT 1 FROM task_instance ti \
         WHERE ti.run_id = r.id AND ti.state IN ('WAITING', 'DISPATCHED', 'RUNNING'))"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    let mut idle: BTreeMap<i64, (i64, RunProgress)> = BTreeMap::new();
    for row in query.fetch_all(&mut *c).await? {
        if run_state(&row.try_get::<String, _>("state")?)? != RunState::Running {
            continue;
        }
        let progress = RunProgress {
            tasks: to_u32(row.try_get("task_count")?, "task count")?,
            cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
            ..RunProgress::default()
        };
        idle.insert(row.try_get("id")?, (row.try_get("workflow_id")?, progress));
    }
    if idle.is_empty() {
        return Ok(BTreeMap::new());
    }
    // Shards count through their parent.
    let (list, padded) = in_list(idle.keys().copied());
    let sql = format!(
        "SELECT run_id, state, COUNT(*) AS n FROM task_instance \
         WHERE run_id IN ({list}) AND shard_slot = 0 GROUP BY run_id, state"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    for row in query.fetch_all(&mut *c).await? {
        let Some((_, progress)) = idle.get_mut(&row.try_get::<i64, _>("run_id")?) else {
            continue;
        };
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
    Ok(idle
        .into_iter()
        .filter_map(|(run, (workflow, progress))| {
            run_outcome(progress).map(|end| (run, (workflow, end)))
        })
        .collect())
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
