//! Cancelling a run or one task instance, and the shards of a cancelled sharded task.
//!
//! A cancel is a conditional update of each unfinished instance and its attempt row, like every
//! other transition. It takes its locks in the order every writer takes them (`locks.rs`): the
//! workflow row before a queued run's row, the run row, then instance rows in id order through
//! the (run, task) key a claim never changes, and the limits' counter rows last, once, after
//! every instance row (`dispatch::release`). A cancelled attempt that had reached a worker comes
//! back as a [`CancelledAttempt`] so that the caller tells that worker to kill it.

use std::collections::BTreeSet;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::instance_locks::{InstanceKey, load_key, lock_key, lock_runs};
use super::queue;
use super::rows::{corrupt, instance_state, to_u32};
use super::run_end::finish_run_if_done;
use super::runs::{instance_by_id, run_by_id};
use super::{Store, write_tx};
use crate::{CancelledAttempt, InstanceRecord, Result};

const UNFINISHED: &str = "('WAITING', 'DISPATCHED', 'RUNNING')";
/// The unique (run, task, shard slot) index of `task_instance` (MySQL).
const RUN_TASK_INDEX: &str = "uq_task_instance_run_task_shard";

/// Cancels one unfinished instance and its current attempt row; returns whether it did. The
/// caller gives back its concurrency scopes (`dispatch::release`) once, after all its cancels:
/// instance rows first, counter rows after, as in the claim.
async fn cancel_one(
    c: &mut AnyConnection,
    id: InstanceId,
    attempt: Attempt,
    from: InstanceState,
    now: Millis,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE task_instance SET state = 'CANCELLED', finished_at = ? \
         WHERE id = ? AND attempt = ? AND state = ?",
    )
    .bind(now)
    .bind(id.0)
    .bind(i64::from(attempt.0))
    .bind(from.as_str())
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE task_attempt SET state = 'CANCELLED', finished_at = ? \
         WHERE instance_id = ? AND attempt = ?",
    )
    .bind(now)
    .bind(id.0)
    .bind(i64::from(attempt.0))
    .execute(&mut *c)
    .await?;
    Ok(true)
}

/// Cancelling a sharded task's instance cancels its unfinished shards too. Their workers are not
/// told at once: a shard's next report of its running process (a task heartbeat) is answered with
/// a cancel, and the backstop of the node its worker is connected to tells it within a second.
/// Returns the cancelled shards, whose scopes the caller releases.
pub(crate) async fn cancel_shards_of(
    store: &Store,
    c: &mut AnyConnection,
    parent: &InstanceKey,
    now: Millis,
) -> Result<Vec<i64>> {
    // The shards share the parent's run and task: read through the key that never changes.
    let sql = format!(
        "SELECT id, attempt, state FROM task_instance{} WHERE run_id = ? AND task_name = ? \
         AND parent_id = ? AND state IN {UNFINISHED} ORDER BY id{}",
        store.dialect.force_index(RUN_TASK_INDEX),
        store.dialect.for_update()
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(parent.run_id.0)
        .bind(parent.task.as_str())
        .bind(parent.id.0)
        .fetch_all(&mut *c)
        .await?;
    let mut cancelled = Vec::new();
    for row in rows {
        let id = InstanceId(row.try_get("id")?);
        let attempt = Attempt(to_u32(row.try_get("attempt")?, "attempt")?);
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        if cancel_one(c, id, attempt, state, now).await? {
            cancelled.push(id.0);
        }
    }
    Ok(cancelled)
}

fn was_started(state: InstanceState) -> bool {
    matches!(state, InstanceState::Dispatched | InstanceState::Running)
}

impl Store {
    /// Marks the run cancel-requested, cancels its unfinished instances, ends it CANCELLED and
    /// returns the attempts that were dispatched or running (their workers must kill them).
    /// A QUEUED run (no instances) simply ends CANCELLED. Queued runs of the workflow that now
    /// fit are started in the same transaction.
    pub async fn cancel_run(
        &self,
        id: RunId,
        now: Millis,
    ) -> Result<Option<Vec<CancelledAttempt>>> {
        write_tx!(self, |c| cancel_run_tx(self, c, id, now))
    }

    /// Cancels one unfinished instance (ending its run if nothing is left). `Ok(None)` when it
    /// does not exist; the returned attempt is set when it was dispatched or running.
    pub async fn cancel_instance(
        &self,
        id: InstanceId,
        now: Millis,
    ) -> Result<Option<(InstanceRecord, Option<CancelledAttempt>)>> {
        write_tx!(self, |c| cancel_instance_tx(self, c, id, now))
    }
}

pub(crate) async fn cancel_run_tx(
    store: &Store,
    c: &mut AnyConnection,
    id: RunId,
    now: Millis,
) -> Result<Option<Vec<CancelledAttempt>>> {
    // A promotion locks the workflow row, then the queued run's row: cancelling a queued run
    // takes them in that order too (`sql/locks.rs`).
    if let Some(run) = run_by_id(c, id).await?
        && run.state == RunState::Queued
    {
        queue::lock_workflow(store, c, run.workflow_id).await?;
    }
    lock_runs(store, c, &BTreeSet::from([id.0])).await?;
    let Some(run) = run_by_id(c, id).await? else {
        return Ok(None);
    };
    if run.state.is_terminal() {
        return Ok(Some(Vec::new()));
    }
    sqlx::query("UPDATE run SET cancel_requested = 1 WHERE id = ?")
        .bind(id.0)
        .execute(&mut *c)
        .await?;
    // A locking read in id order (the claim's order: instance rows, then counter rows): a claim
    // WAITING → DISPATCHED committing meanwhile is waited for and then read as DISPATCHED, so
    // its instance is cancelled and its worker told, instead of the conditional cancel missing
    // it (a plain READ COMMITTED read would still say WAITING). Through the (run, task) key,
    // which a claim does not change (`Dialect::force_index`).
    let sql = format!(
        "SELECT id, attempt, state, worker_id FROM task_instance{} \
         WHERE run_id = ? AND state IN {UNFINISHED} ORDER BY id{}",
        store.dialect.force_index(RUN_TASK_INDEX),
        store.dialect.for_update()
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_all(&mut *c)
        .await?;
    let mut killed = Vec::new();
    let mut cancelled = Vec::new();
    for row in rows {
        let instance = InstanceId(row.try_get("id")?);
        let attempt = Attempt(to_u32(row.try_get("attempt")?, "attempt")?);
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        if !cancel_one(c, instance, attempt, state, now).await? {
            return Err(corrupt("a locked instance moved during cancel"));
        }
        cancelled.push(instance.0);
        if was_started(state) {
            killed.push(CancelledAttempt {
                instance_id: instance,
                attempt,
                worker_id: row.try_get("worker_id")?,
            });
        }
    }
    super::dispatch::release(c, &cancelled).await?;
    // A QUEUED run has no instances: it simply ends CANCELLED.
    sqlx::query(
        "UPDATE run SET state = 'CANCELLED', finished_at = ? WHERE id = ? \
         AND state IN ('RUNNING', 'QUEUED')",
    )
    .bind(now)
    .bind(id.0)
    .execute(&mut *c)
    .await?;
    queue::promote_after(store, c, id, now).await?;
    Ok(Some(killed))
}

pub(crate) async fn cancel_instance_tx(
    store: &Store,
    c: &mut AnyConnection,
    id: InstanceId,
    now: Millis,
) -> Result<Option<(InstanceRecord, Option<CancelledAttempt>)>> {
    let Some(key) = load_key(c, id).await? else {
        return Ok(None);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    // Read again under the run lock, and lock the row: a report may have moved it meanwhile,
    // and a batch of Started reports (which takes no run lock) must not move it between this
    // read and the cancel.
    let Some(key) = lock_key(store, c, id).await? else {
        return Ok(None);
    };
    let mut killed = None;
    if key.state.is_active() && cancel_one(c, id, key.attempt, key.state, now).await? {
        if was_started(key.state) {
            killed = Some(CancelledAttempt {
                instance_id: id,
                attempt: key.attempt,
                worker_id: key.worker_id.clone(),
            });
        }
        // The task that ended: this one, or the sharded or mapped task it belongs to once its
        // cancel settles that (a parent whose other children still run has not ended).
        let ended = match key.parent_id {
            None => Some(key.clone()),
            Some(parent) => super::dispatch::settle_parent(c, parent, now)
                .await?
                .filter(|(_, state)| state.is_terminal())
                .map(|(parent, _)| parent),
        };
        let mut cancelled = cancel_shards_of(store, c, &key, now).await?;
        cancelled.push(id.0);
        // Counter rows after every instance row, once.
        super::dispatch::release(c, &cancelled).await?;
        // Its downstream is judged as after any failure (a person's cancel counts as one in
        // the trigger rules).
        match ended {
            Some(ended) => super::reports::advance_after_ended(store, c, &ended, now).await?,
            None => {
                finish_run_if_done(store, c, key.run_id, now).await?;
            }
        }
    }
    let record = instance_by_id(c, id).await?;
    Ok(record.map(|r| (r, killed)))
}
