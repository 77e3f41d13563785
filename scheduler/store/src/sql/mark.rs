//! A person marks a task instance SUCCESS or FAILED (`MarkInstance`): the state is set without
//! running anything, and the run goes on as after a real end. What a mark may do from which
//! state is `ax_core::mark`'s decision; this is its transaction.
//!
//! The transaction takes the locks every writer takes (`locks.rs`): the run row, then the
//! instance row (`lock_key`), then, for an instance that held concurrency slots, the counter rows
//! (`dispatch::release`). The instance moves by a conditional update on (instance, attempt, from
//! state), so a report or a claim racing the mark either came first (the mark then sees its
//! result) or finds the state moved and is refused.
//!
//! A mark keeps the attempt number. A DISPATCHED or RUNNING attempt's own record ends CANCELLED
//! (its process is killed, as for a cancel), so the worker's late end of it is a late ending
//! that only adds the exit code (`reports::record_late_endings`); the instance keeps the marked
//! state. The attempt's message says who marked it and why.

use std::collections::BTreeSet;

use ax_core::Millis;
use ax_core::ids::InstanceId;
use ax_core::mark::{MarkAs, plan};
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::instance_locks::{InstanceKey, load_key, lock_key, lock_runs};
use super::rerun::{reopen, spec_of_run};
use super::rows::corrupt;
use super::run_end::finish_run_if_done;
use super::runs::instance_by_id;
use super::{Store, write_tx};
use crate::{CancelledAttempt, MarkAnswer, Result};

impl Store {
    /// Marks instance `id` `to` (a person's verdict; `note` goes into its current attempt's
    /// message): an active instance stops (a started attempt's record ends CANCELLED and comes
    /// back to be killed), its task's downstream is judged by the trigger rules, tasks below it
    /// that did not run wait to be judged again, and its run reopens if it had ended, ending
    /// anew once nothing is left. Changes nothing unless the answer is `Marked`.
    pub async fn mark_instance(
        &self,
        id: InstanceId,
        to: MarkAs,
        note: &str,
        now: Millis,
    ) -> Result<MarkAnswer> {
        write_tx!(self, |c| mark_tx(self, c, id, to, note, now))
    }
}

async fn mark_tx(
    store: &Store,
    c: &mut AnyConnection,
    id: InstanceId,
    to: MarkAs,
    note: &str,
    now: Millis,
) -> Result<MarkAnswer> {
    let Some(key) = load_key(c, id).await? else {
        return Ok(MarkAnswer::NotFound);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    // Read again under the run lock, and lock the row: a report may have moved it meanwhile.
    let Some(key) = lock_key(store, c, id).await? else {
        return Ok(MarkAnswer::NotFound);
    };
    let plan = match plan(key.state, to) {
        Ok(plan) => plan,
        Err(refused) => return Ok(MarkAnswer::Refused(refused)),
    };
    if let Some(parent) = key.parent_id
        && !of_current_parent_attempt(c, id, parent).await?
    {
        return Ok(MarkAnswer::OldChild {
            parent: InstanceId(parent),
        });
    }
    if key.parent_id.is_none()
        && let Some((_, unfinished)) = super::shard_retry::shards_going(c, &[id]).await?.first()
    {
        return Ok(MarkAnswer::ChildrenGoing {
            unfinished: *unfinished,
        });
    }
    let finished_at = if plan.was_active {
        "?"
    } else {
        "COALESCE(finished_at, ?)"
    };
    let sql = format!(
        "UPDATE task_instance SET state = ?, finished_at = {finished_at} \
         WHERE id = ? AND attempt = ? AND state = ?"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(plan.to.as_str())
        .bind(now)
        .bind(id.0)
        .bind(i64::from(key.attempt.0))
        .bind(key.state.as_str())
        .execute(&mut *c)
        .await?;
    if done.rows_affected() != 1 {
        return Err(corrupt("a locked instance moved during a mark"));
    }
    note_on_attempt(c, &key, plan.kill, note, now).await?;
    let killed = plan.kill.then(|| CancelledAttempt {
        instance_id: id,
        attempt: key.attempt,
        worker_id: key.worker_id.clone(),
    });
    if plan.was_active {
        super::dispatch::release(c, &[id.0]).await?;
    }
    // The task that ended: this one, or the mapped or sharded task it belongs to once its
    // children settle it (a parent whose other children still run has not ended).
    let (ended, reopened_task) = match key.parent_id {
        None => (
            Some(InstanceKey {
                state: plan.to,
                ..key.clone()
            }),
            plan.reopens.then(|| key.task.clone()),
        ),
        Some(parent) => {
            let parent_was_ended = reopen_parent(c, parent).await?;
            let ended = super::dispatch::settle_parent(c, parent, now)
                .await?
                .filter(|(_, state)| state.is_terminal())
                .map(|(parent, _)| parent);
            (ended, parent_was_ended.then(|| key.task.clone()))
        }
    };
    if let Some(task) = reopened_task {
        let spec = spec_of_run(c, key.run_id)
            .await?
            .ok_or_else(|| corrupt("marked instance's run vanished"))?;
        reopen(c, key.run_id, &spec, &[task.as_str()], now).await?;
    }
    match ended {
        Some(ended) => super::reports::advance_after_ended(store, c, &ended, now).await?,
        None => {
            finish_run_if_done(store, c, key.run_id, now).await?;
        }
    }
    let record = instance_by_id(c, id)
        .await?
        .ok_or_else(|| corrupt("marked instance vanished"))?;
    Ok(MarkAnswer::Marked {
        record,
        from: key.state,
        killed,
    })
}

/// Whether child `id` (an item or shard) belongs to its parent's current attempt: a child of an
/// earlier attempt is history, and marking it would change nothing that decides.
async fn of_current_parent_attempt(
    c: &mut AnyConnection,
    id: InstanceId,
    parent: i64,
) -> Result<bool> {
    let row = sqlx::query(
        "SELECT i.parent_attempt, p.attempt AS current FROM task_instance i \
         JOIN task_instance p ON p.id = ? WHERE i.id = ?",
    )
    .bind(parent)
    .bind(id.0)
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else { return Ok(false) };
    Ok(row.try_get::<Option<i64>, _>("parent_attempt")?
        == row.try_get::<Option<i64>, _>("current")?)
}

/// A parent that had ended is RUNNING again, for its children to settle its end anew (a marked
/// child may change it). Its attempt stays, which its children belong to. Returns whether it
/// had ended.
async fn reopen_parent(c: &mut AnyConnection, parent: i64) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE task_instance SET state = 'RUNNING', finished_at = NULL \
         WHERE id = ? AND state IN ('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELLED')",
    )
    .bind(parent)
    .execute(&mut *c)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The mark in the current attempt's record: its message says it, and an attempt that reached
/// a worker ends CANCELLED (its process is killed; its late end adds only the exit code). An
/// instance without a record of its current attempt (never dispatched) has nothing to note.
async fn note_on_attempt(
    c: &mut AnyConnection,
    key: &InstanceKey,
    kill: bool,
    note: &str,
    now: Millis,
) -> Result<()> {
    let row = sqlx::query("SELECT message FROM task_attempt WHERE instance_id = ? AND attempt = ?")
        .bind(key.id.0)
        .bind(i64::from(key.attempt.0))
        .fetch_optional(&mut *c)
        .await?;
    let Some(row) = row else { return Ok(()) };
    let before: String = row.try_get("message")?;
    let message = if before.is_empty() {
        note.to_string()
    } else {
        format!("{before}; {note}")
    };
    if kill {
        sqlx::query(
            "UPDATE task_attempt SET state = ?, finished_at = ?, message = ? \
             WHERE instance_id = ? AND attempt = ?",
        )
        .bind(InstanceState::Cancelled.as_str())
        .bind(now)
        .bind(message)
        .bind(key.id.0)
        .bind(i64::from(key.attempt.0))
        .execute(&mut *c)
        .await?;
    } else {
        sqlx::query("UPDATE task_attempt SET message = ? WHERE instance_id = ? AND attempt = ?")
            .bind(message)
            .bind(key.id.0)
            .bind(i64::from(key.attempt.0))
            .execute(&mut *c)
            .await?;
    }
    Ok(())
}
