//! Running finished tasks again: `axctl rerun RUN --from TASK`, rerunning a run's failed part,
//! and a manual retry of one instance.
//!
//! **Rerun from a task.** The task and everything below it run again as new attempts,
//! and the advance wakes the PENDING instances a rerun leaves behind.
//!
//! The chosen task's instance goes to WAITING as attempt + 1; every instance below it that ran
//! goes to PENDING with its attempt (and that attempt's record) untouched; tasks below it that
//! never got an instance stay without one. The advance then treats a PENDING instance like a
//! missing one: once all its upstreams succeeded again it becomes WAITING as attempt + 1
//! ([`wake_pending`]), so the advance stays O(direct downstream).
//!
//! **Manual retries.** A retry moves a finished, unsuccessful instance to its next attempt
//! and reopens its run; rerunning a run's failed part retries each of its failed, timed-out or
//! cancelled tasks that has no shards still going. A sharded task is retried as a whole, once
//! its shards ended (`shard_retry.rs`).

use std::collections::{BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::spec::WorkflowSpec;
use ax_core::state::{Event, InstanceState, transition};
use sqlx::{AnyConnection, Row};

use super::instance_locks::{InstanceKey, load_key, lock_runs};
use super::rows::{corrupt, instance_state, to_u32};
use super::runs::{instance_by_id, run_by_id};
use super::{Store, placeholders, write_tx};
use crate::{ManualRetry, RerunFailed, RerunFrom, RerunSelection, Result};

/// The new attempt's columns when an instance goes back to WAITING.
const FRESH_ATTEMPT: &str = "attempt = attempt + 1, worker_id = NULL, not_before = ?, \
     started_at = NULL, finished_at = NULL, exit_code = NULL, last_heartbeat_at = NULL";

impl Store {
    /// A person asks for another attempt of a finished, unsuccessful instance: it becomes
    /// WAITING as attempt + 1 (the earlier attempts keep their records), and its run, if it had
    /// ended, is running again.
    pub async fn retry_instance(&self, id: InstanceId, now: Millis) -> Result<ManualRetry> {
        write_tx!(self, |c| retry_instance_tx(self, c, id, now))
    }

    /// Retries every FAILED, TIMEOUT and CANCELLED task instance of a run (their downstream
    /// follows when they succeed), except sharded tasks' instances with shards still going.
    /// `None` when the run does not exist.
    pub async fn rerun_failed(&self, run: RunId, now: Millis) -> Result<Option<RerunFailed>> {
        write_tx!(self, |c| rerun_failed_tx(self, c, run, now))
    }

    /// Reruns `task` of a run and everything below it (transitively), in one transaction: the
    /// task's instance becomes WAITING as its next attempt, each instance below it that ran
    /// becomes PENDING (it runs again as its next attempt once its upstreams succeeded again),
    /// earlier attempts keep their records, and the run is running again. Changes nothing unless
    /// the answer is `Rerun`.
    pub async fn rerun_from(&self, run: RunId, task: &str, now: Millis) -> Result<RerunFrom> {
        let answer = write_tx!(self, |c| rerun_tasks_tx(self, c, run, &[task], now))?;
        Ok(match answer {
            RerunSelection::Rerun { again, pending } => RerunFrom::Rerun {
                again: again
                    .first()
                    .copied()
                    .ok_or_else(|| corrupt("a rerun from one task reran nothing"))?,
                pending,
            },
            RerunSelection::Refused { why, .. } => why,
        })
    }

    /// Reruns a selection of a run's tasks and everything below each (Airflow's "clear with
    /// downstream"), in one transaction: each chosen task no other chosen task is above goes
    /// WAITING as its next attempt, every instance below them that ran (a chosen one too)
    /// becomes PENDING, earlier attempts keep their records, and the run is running again.
    /// Changes nothing unless the answer is `Rerun`.
    pub async fn rerun_tasks(
        &self,
        run: RunId,
        tasks: &[&str],
        now: Millis,
    ) -> Result<RerunSelection> {
        write_tx!(self, |c| rerun_tasks_tx(self, c, run, tasks, now))
    }
}

/// Whether `task` of `spec` maps over a list (`for_each`).
fn is_mapped(spec: &ax_core::spec::WorkflowSpec, task: &str) -> bool {
    spec.tasks
        .iter()
        .any(|t| t.name == task && t.for_each.is_some())
}

async fn rerun_tasks_tx(
    store: &Store,
    c: &mut AnyConnection,
    run: RunId,
    chosen: &[&str],
    now: Millis,
) -> Result<RerunSelection> {
    let first = chosen.first().copied().unwrap_or_default().to_string();
    let refused = |task: &str, why| RerunSelection::Refused {
        task: task.to_string(),
        why,
    };
    lock_runs(store, c, &BTreeSet::from([run.0])).await?;
    let Some(spec) = spec_of_run(c, run).await? else {
        return Ok(refused(&first, RerunFrom::RunNotFound));
    };
    let dag = spec
        .dag()
        .map_err(|err| corrupt(format!("stored workflow DAG: {err}")))?;
    if let Some(unknown) = chosen.iter().find(|task| !dag.contains(task)) {
        return Ok(refused(
            unknown,
            RerunFrom::UnknownTask {
                tasks: dag.tasks().to_vec(),
            },
        ));
    }
    // What runs again: each chosen task's downstream closure. The tops (chosen tasks no other
    // chosen task is above) go again at once; everything else below waits for them.
    let mut below: BTreeSet<&str> = BTreeSet::new();
    let mut affected: Vec<&str> = Vec::new();
    for task in chosen {
        for (n, name) in dag.downstream_closure(task).into_iter().enumerate() {
            if n > 0 {
                below.insert(name);
            }
            if !affected.contains(&name) {
                affected.push(name);
            }
        }
    }
    let mut tops: Vec<&str> = Vec::new();
    for task in chosen {
        if !below.contains(task) && !tops.contains(task) {
            tops.push(task);
        }
    }
    // Task instances only (shard_slot 0): a sharded task's shards carry its name too, and its
    // instance (the parent) is what goes back to WAITING or PENDING, to fan out again.
    let sql = format!(
        "SELECT id, task_name, state, attempt FROM task_instance \
         WHERE run_id = ? AND shard_slot = 0 AND task_name IN ({}) ORDER BY id",
        placeholders(affected.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(run.0);
    for name in &affected {
        query = query.bind(*name);
    }
    let mut instances: HashMap<String, (InstanceId, InstanceState, Attempt)> = HashMap::new();
    for row in query.fetch_all(&mut *c).await? {
        instances.insert(
            row.try_get("task_name")?,
            (
                InstanceId(row.try_get("id")?),
                instance_state(&row.try_get::<String, _>("state")?)?,
                Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
            ),
        );
    }
    let busy: Vec<(String, InstanceState)> = affected
        .iter()
        .filter_map(|name| {
            let (_, state, _) = instances.get(*name)?;
            state.is_active().then(|| (name.to_string(), *state))
        })
        .collect();
    if !busy.is_empty() {
        return Ok(refused(&first, RerunFrom::Active { busy }));
    }
    // A sharded task that failed on its first failed shard may still have shards going: its
    // next attempt would fan out beside them.
    let parents: Vec<(String, InstanceId)> = affected
        .iter()
        .filter_map(|name| {
            instances
                .get(*name)
                .map(|(id, _, _)| (name.to_string(), *id))
        })
        .collect();
    let shards = unfinished_shards(c, &parents).await?;
    if !shards.is_empty() {
        return Ok(refused(&first, RerunFrom::ShardsActive { shards }));
    }
    // Every top must be able to go again before anything moves.
    for task in &tops {
        let Some(&(_, state, _)) = instances.get(*task) else {
            return Ok(refused(task, RerunFrom::NotRun { state: None }));
        };
        if transition(state, Event::RerunFrom).is_err() {
            return Ok(refused(task, RerunFrom::NotRun { state: Some(state) }));
        }
    }
    let mut again = Vec::new();
    for task in &tops {
        let &(id, state, attempt) = &instances[*task];
        if is_mapped(&spec, task) {
            // A mapped task runs again as its items, every one of them, on the list it read; a
            // rerun from the task above it reads the list anew.
            if !super::shard_retry::rerun_items(c, id, now).await? {
                if again.is_empty() {
                    return Ok(refused(task, RerunFrom::NotFannedOut));
                }
                return Err(corrupt("a mapped task lost its items under the run lock"));
            }
        } else if !move_to(c, id, attempt, state, InstanceState::Waiting, now).await? {
            return Err(corrupt("instance moved under the run lock"));
        }
        again.push(id);
    }
    let mut pending = Vec::new();
    for name in affected.iter().filter(|name| below.contains(*name)) {
        let Some(&(id, state, attempt)) = instances.get(*name) else {
            continue;
        };
        if transition(state, Event::UpstreamRerun).is_err() {
            // Already PENDING from an earlier rerun.
            continue;
        }
        if move_to(c, id, attempt, state, InstanceState::Pending, now).await? {
            pending.push(id);
        }
    }
    reopen(c, run, &spec, &[], now).await?;
    Ok(RerunSelection::Rerun { again, pending })
}

/// For each of `parents` (task, instance) with shards still WAITING, DISPATCHED or RUNNING:
/// the task and how many (one statement, by `idx_task_instance_parent`).
pub(crate) async fn unfinished_shards(
    c: &mut AnyConnection,
    parents: &[(String, InstanceId)],
) -> Result<Vec<(String, u32)>> {
    let ids: Vec<InstanceId> = parents.iter().map(|(_, id)| *id).collect();
    let going = super::shard_retry::shards_going(c, &ids).await?;
    Ok(going
        .into_iter()
        .filter_map(|(parent, n)| {
            let (task, _) = parents.iter().find(|(_, id)| *id == parent)?;
            Some((task.clone(), n))
        })
        .collect())
}

/// One conditional move of an instance for a rerun: to WAITING as its next attempt, or to
/// PENDING keeping its attempt.
async fn move_to(
    c: &mut AnyConnection,
    id: InstanceId,
    attempt: Attempt,
    from: InstanceState,
    to: InstanceState,
    now: Millis,
) -> Result<bool> {
    let sets = if to == InstanceState::Waiting {
        format!(", {FRESH_ATTEMPT}")
    } else {
        String::new()
    };
    let sql = format!(
        "UPDATE task_instance SET state = ?{sets} WHERE id = ? AND attempt = ? AND state = ?"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(to.as_str());
    if to == InstanceState::Waiting {
        query = query.bind(now);
    }
    let done = query
        .bind(id.0)
        .bind(i64::from(attempt.0))
        .bind(from.as_str())
        .execute(&mut *c)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The advance found every upstream of `task` succeeded in `run`, but its instance exists: if it
/// is PENDING (it ran before a rerun from above), it becomes WAITING as its next attempt.
/// Returns how many instances it woke (0 or 1).
pub(crate) async fn wake_pending(
    c: &mut AnyConnection,
    run: RunId,
    task: &str,
    now: Millis,
) -> Result<u32> {
    debug_assert!(
        transition(
            InstanceState::Pending,
            Event::Judged(ax_core::trigger_rule::Verdict::Run)
        )
        .is_ok()
    );
    let sql = format!(
        "UPDATE task_instance SET state = 'WAITING', {FRESH_ATTEMPT} \
         WHERE run_id = ? AND task_name = ? AND shard_slot = 0 AND state = 'PENDING'"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(now)
        .bind(run.0)
        .bind(task)
        .execute(&mut *c)
        .await?;
    Ok(u32::try_from(done.rows_affected()).unwrap_or(u32::MAX))
}

/// Moves one finished, unsuccessful instance to its next attempt (a person asked for it), and
/// reopens its run. False when the instance is not in `key.state` any more.
async fn retry_one(c: &mut AnyConnection, key: &InstanceKey, now: Millis) -> Result<bool> {
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
    Ok(done.rows_affected() == 1)
}

/// The spec of a run's workflow version.
pub(crate) async fn spec_of_run(c: &mut AnyConnection, run: RunId) -> Result<Option<WorkflowSpec>> {
    let row = sqlx::query(
        "SELECT v.spec_json FROM run r JOIN workflow_version v \
         ON v.workflow_id = r.workflow_id AND v.version = r.workflow_version WHERE r.id = ?",
    )
    .bind(run.0)
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let spec = serde_json::from_str(&row.try_get::<String, _>("spec_json")?)
        .map_err(|err| corrupt(format!("stored workflow spec: {err}")))?;
    Ok(Some(spec))
}

/// Reopens a run after tasks of it go again (`retried`: tasks retried as a new attempt): the
/// tasks below them that did not run (SKIPPED, UPSTREAM_FAILED) wait for their upstreams again
/// (PENDING), to be judged anew, and the run is RUNNING. Unless a handler itself is retried,
/// the run's handlers that ran wait for its next outcome (PENDING) and the run has no handler
/// outcome yet.
pub(crate) async fn reopen(
    c: &mut AnyConnection,
    run: RunId,
    spec: &WorkflowSpec,
    retried: &[&str],
    now: Millis,
) -> Result<()> {
    let dag = spec
        .dag()
        .map_err(|err| corrupt(format!("stored workflow DAG: {err}")))?;
    let mut below: BTreeSet<&str> = BTreeSet::new();
    for task in retried {
        below.extend(dag.downstream_closure(task).into_iter().skip(1));
    }
    let handlers: BTreeSet<&str> = spec
        .tasks
        .iter()
        .filter(|task| task.handler.is_some())
        .map(|task| task.name.as_str())
        .collect();
    let handlers_again = !retried.iter().any(|task| handlers.contains(task));
    let names: Vec<&str> = if handlers_again {
        below.union(&handlers).copied().collect()
    } else {
        below.iter().copied().collect()
    };
    for names in names.chunks(super::NAMES_PER_STATEMENT) {
        let sql = format!(
            "SELECT id, task_name, state, attempt FROM task_instance \
             WHERE run_id = ? AND shard_slot = 0 AND task_name IN ({}) ORDER BY id",
            placeholders(names.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(run.0);
        for name in names {
            query = query.bind(*name);
        }
        for row in query.fetch_all(&mut *c).await? {
            let task: String = row.try_get("task_name")?;
            let state = instance_state(&row.try_get::<String, _>("state")?)?;
            let again = if handlers.contains(task.as_str()) {
                state.is_terminal()
            } else {
                matches!(
                    state,
                    InstanceState::Skipped | InstanceState::UpstreamFailed
                )
            };
            if again && transition(state, Event::UpstreamRerun).is_ok() {
                let id = InstanceId(row.try_get("id")?);
                let attempt = Attempt(to_u32(row.try_get("attempt")?, "attempt")?);
                move_to(c, id, attempt, state, InstanceState::Pending, now).await?;
            }
        }
    }
    let handlers_reset = if handlers_again {
        ", handlers_for = NULL, handler_env_json = NULL"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE run SET state = 'RUNNING', finished_at = NULL, cancel_requested = 0{handlers_reset} \
         WHERE id = ?"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(run.0)
        .execute(&mut *c)
        .await?;
    Ok(())
}

async fn retry_instance_tx(
    store: &Store,
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
    if transition(key.state, Event::ManualRetry).is_err() {
        return Ok(ManualRetry::NotRetryable(key.state));
    }
    let spec = spec_of_run(c, key.run_id)
        .await?
        .ok_or_else(|| corrupt("retried instance's run vanished"))?;
    if super::shard_retry::is_mapped_parent(c, id).await? {
        if !super::shard_retry::retry_items(c, id, now).await? {
            return Ok(ManualRetry::NotRetryable(key.state));
        }
    } else if is_mapped(&spec, &key.task) && key.parent_id.is_none() {
        // Run as a plain task it would run its command once, without an item.
        return Ok(ManualRetry::NotFannedOut);
    } else if !retry_one(c, &key, now).await? {
        return Ok(ManualRetry::NotRetryable(key.state));
    } else if let Some(parent) = super::shard_retry::parent_of_item(c, id).await? {
        super::shard_retry::reopen_parent(c, parent).await?;
    }
    reopen(c, key.run_id, &spec, &[key.task.as_str()], now).await?;
    let record = instance_by_id(c, id)
        .await?
        .ok_or_else(|| corrupt("retried instance vanished"))?;
    Ok(ManualRetry::Retried(record))
}

async fn rerun_failed_tx(
    store: &Store,
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
    let mut tasks = Vec::new();
    let spec = spec_of_run(c, run)
        .await?
        .ok_or_else(|| corrupt("rerun run vanished"))?;
    for id in ids {
        if shards_active.iter().any(|(parent, _)| *parent == id) {
            continue;
        }
        let Some(key) = load_key(c, id).await? else {
            continue;
        };
        let again = if super::shard_retry::is_mapped_parent(c, id).await? {
            transition(key.state, Event::ManualRetry).is_ok()
                && super::shard_retry::retry_items(c, id, now).await?
        } else if is_mapped(&spec, &key.task) && key.parent_id.is_none() {
            // Ended before it fanned out: no item to retry, and run plain it would run its
            // command once without one. A rerun from the task above it reads the list again.
            false
        } else {
            retry_one(c, &key, now).await?
        };
        if again {
            retried.push(id);
            tasks.push(key.task);
        }
    }
    if !retried.is_empty() {
        let tasks: Vec<&str> = tasks.iter().map(String::as_str).collect();
        reopen(c, run, &spec, &tasks, now).await?;
    }
    Ok(Some(RerunFailed {
        retried,
        shards_active,
    }))
}
