//! Retries and reruns of sharded tasks.
//!
//! A sharded task's instance (the parent) fails as soon as one shard failed with no retry
//! left, while its other shards may still run. A manual retry of it, or `rerun --failed`, moves
//! it to its next attempt, which fans out a new set of shards: beside the old ones, two sets
//! would run at once. So (chosen over cancelling the other shards when the parent fails, which
//! would throw away their work and still let them run until their next refused report):
//!
//! - a shard is never retried on its own: the retry names its parent instead (its result
//!   counts only through the parent's attempt it belongs to);
//! - a parent is retried only once none of its shards is WAITING, DISPATCHED or RUNNING;
//!   `rerun --failed` leaves such a parent alone and says so.
//!
//! A mapped task's items (`for_each`) are each their own piece of work, so retries act on them
//! one by one: an item of the parent's current attempt is retried on its own (its parent, if
//! it ended, is RUNNING again until the items settle it), and a retry of the parent (or
//! `rerun --failed`) retries its unsuccessful items rather than fanning out anew.

use ax_core::Millis;
use ax_core::ids::InstanceId;
use sqlx::{AnyConnection, Row};

use super::placeholders;
use super::rows::to_u32;
use crate::{ManualRetry, Result};

/// Why the instance may not be retried now, if it may not.
pub(crate) async fn refuse_retry(
    c: &mut AnyConnection,
    id: InstanceId,
) -> Result<Option<ManualRetry>> {
    let row = sqlx::query(
        "SELECT i.parent_id, i.item, i.parent_attempt, p.attempt AS current FROM task_instance i \
         LEFT JOIN task_instance p ON p.id = i.parent_id WHERE i.id = ?",
    )
    .bind(id.0)
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else { return Ok(None) };
    if let Some(parent) = row.try_get::<Option<i64>, _>("parent_id")? {
        let item = row.try_get::<Option<String>, _>("item")?.is_some();
        let current = row.try_get::<Option<i64>, _>("parent_attempt")?
            == row.try_get::<Option<i64>, _>("current")?;
        if item && current {
            return Ok(None);
        }
        return Ok(Some(ManualRetry::Shard {
            parent: InstanceId(parent),
        }));
    }
    Ok(shards_going(c, &[id])
        .await?
        .first()
        .map(|(_, unfinished)| ManualRetry::ShardsActive {
            unfinished: *unfinished,
        }))
}

/// The instances of `parents` with shards still WAITING, DISPATCHED or RUNNING, and how many,
/// in id order (one statement, by `idx_task_instance_parent`).
pub(crate) async fn shards_going(
    c: &mut AnyConnection,
    parents: &[InstanceId],
) -> Result<Vec<(InstanceId, u32)>> {
    if parents.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT parent_id, COUNT(*) AS n FROM task_instance WHERE parent_id IN ({}) \
         AND state IN ('WAITING', 'DISPATCHED', 'RUNNING') GROUP BY parent_id ORDER BY parent_id",
        placeholders(parents.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in parents {
        query = query.bind(id.0);
    }
    query
        .fetch_all(&mut *c)
        .await?
        .iter()
        .map(|row| {
            Ok((
                InstanceId(row.try_get("parent_id")?),
                to_u32(row.try_get("n")?, "shard count")?,
            ))
        })
        .collect()
}

/// The parent of `id` when `id` is an item of a mapped task.
pub(crate) async fn parent_of_item(c: &mut AnyConnection, id: InstanceId) -> Result<Option<i64>> {
    let row = sqlx::query("SELECT parent_id FROM task_instance WHERE id = ? AND item IS NOT NULL")
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    Ok(match row {
        Some(row) => row.try_get("parent_id")?,
        None => None,
    })
}

/// Whether `id` is a mapped task's parent (its children carry items).
pub(crate) async fn is_mapped_parent(c: &mut AnyConnection, id: InstanceId) -> Result<bool> {
    let row = sqlx::query(
        "SELECT id FROM task_instance WHERE parent_id = ? AND item IS NOT NULL LIMIT 1",
    )
    .bind(id.0)
    .fetch_optional(&mut *c)
    .await?;
    Ok(row.is_some())
}

/// A mapped parent that ended is RUNNING again, as its items run again: its end is theirs to
/// settle. Its attempt stays, which its items belong to.
pub(crate) async fn reopen_parent(c: &mut AnyConnection, parent: i64) -> Result<()> {
    sqlx::query(
        "UPDATE task_instance SET state = 'RUNNING', finished_at = NULL \
         WHERE id = ? AND state IN ('FAILED', 'TIMEOUT', 'CANCELLED')",
    )
    .bind(parent)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Retries every FAILED, TIMEOUT and CANCELLED item of a mapped parent's current attempt (each
/// WAITING as its next attempt) and reopens the parent; false when no item was retried.
pub(crate) async fn retry_items(
    c: &mut AnyConnection,
    parent: InstanceId,
    now: Millis,
) -> Result<bool> {
    if !items_again(c, parent, "('FAILED', 'TIMEOUT', 'CANCELLED')", now).await? {
        return Ok(false);
    }
    reopen_parent(c, parent.0).await?;
    Ok(true)
}

/// Moves the items of `parent`'s current attempt that are in one of `states` (an SQL list) to
/// WAITING as their next attempt; false when there was none.
async fn items_again(
    c: &mut AnyConnection,
    parent: InstanceId,
    states: &str,
    now: Millis,
) -> Result<bool> {
    let row = sqlx::query("SELECT attempt FROM task_instance WHERE id = ?")
        .bind(parent.0)
        .fetch_optional(&mut *c)
        .await?;
    let Some(row) = row else { return Ok(false) };
    let attempt: i64 = row.try_get("attempt")?;
    let sql = format!(
        "UPDATE task_instance SET state = 'WAITING', attempt = attempt + 1, not_before = ?, \
         worker_id = NULL, started_at = NULL, finished_at = NULL, exit_code = NULL \
         WHERE parent_id = ? AND parent_attempt = ? AND item IS NOT NULL AND state IN {states}"
    );
    let again = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(now)
        .bind(parent.0)
        .bind(attempt)
        .execute(&mut *c)
        .await?;
    Ok(again.rows_affected() > 0)
}

/// Runs every ended item of a mapped parent's current attempt again (each WAITING as its next
/// attempt) and the parent RUNNING until they settle it: a rerun from the mapped task. False
/// when the parent has no items (it ended before it fanned out).
pub(crate) async fn rerun_items(
    c: &mut AnyConnection,
    parent: InstanceId,
    now: Millis,
) -> Result<bool> {
    let ended = "('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELLED')";
    if !items_again(c, parent, ended, now).await? {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE task_instance SET state = 'RUNNING', finished_at = NULL \
         WHERE id = ? AND state IN ('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELLED')",
    )
    .bind(parent.0)
    .execute(&mut *c)
    .await?;
    Ok(true)
}
