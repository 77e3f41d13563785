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
    let row = sqlx::query("SELECT parent_id FROM task_instance WHERE id = ?")
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    let Some(row) = row else { return Ok(None) };
    if let Some(parent) = row.try_get::<Option<i64>, _>("parent_id")? {
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
