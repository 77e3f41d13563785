//! The counts a node's `/metrics` shows as gauges: active instances by state, runs waiting in
//! the run queue, and how long the oldest ready instance has waited; and the WAITING instances
//! its bounds on waiting instances read (`waiting_counts`). Each is one indexed range count
//! (`idx_task_instance_queue` and `idx_run_state` lead with the state), so its cost follows what
//! is active now, never the history.

use sqlx::Row;

use super::Store;
use crate::{ActiveCounts, Result, WaitingCounts};

impl Store {
    /// Instances WAITING, DISPATCHED and RUNNING and runs QUEUED and RUNNING, store-wide: one
    /// indexed count per table, whatever the history's size.
    pub async fn active_counts(&self) -> Result<ActiveCounts> {
        let mut counts = ActiveCounts::default();
        let rows = sqlx::query(
            "SELECT state, COUNT(*) AS n FROM task_instance \
             WHERE state IN ('WAITING', 'DISPATCHED', 'RUNNING') GROUP BY state",
        )
        .fetch_all(&self.pool)
        .await?;
        for row in rows {
            let state: String = row.try_get("state")?;
            let n = row.try_get::<i64, _>("n")?.max(0) as u64;
            match state.as_str() {
                "WAITING" => counts.waiting = n,
                "DISPATCHED" => counts.dispatched = n,
                "RUNNING" => counts.running = n,
                _ => {}
            }
        }
        let rows = sqlx::query(
        "SELECT state, COUNT(*) AS n FROM run WHERE state IN ('QUEUED', 'RUNNING') GROUP BY state",
    )
    .fetch_all(&self.pool)
    .await?;
        for row in rows {
            let state: String = row.try_get("state")?;
            let n = row.try_get::<i64, _>("n")?.max(0) as u64;
            match state.as_str() {
                "QUEUED" => counts.queued_runs = n,
                "RUNNING" => counts.running_runs = n,
                _ => {}
            }
        }
        // Through the queue index's WAITING range: its length is the backlog. A retry whose backoff
        // is not over yet has a later time than any ready instance, so the minimum is a ready one's
        // whenever one is ready.
        let row = sqlx::query(
            "SELECT MIN(not_before) AS since FROM task_instance WHERE state = 'WAITING'",
        )
        .fetch_one(&self.pool)
        .await?;
        counts.oldest_ready_since = row.try_get::<Option<i64>, _>("since")?;
        Ok(counts)
    }

    /// WAITING instances store-wide and, with `by_app`, by the app of their workflow. The
    /// WAITING range of the state index is walked either way; by app, each row is looked up for
    /// its workflow, whose row gives the app. Its cost follows the instances waiting, which the
    /// bounds this reading serves keep near them.
    pub async fn waiting_counts(&self, by_app: bool) -> Result<WaitingCounts> {
        let mut counts = WaitingCounts::default();
        if !by_app {
            let row =
                sqlx::query("SELECT COUNT(*) AS n FROM task_instance WHERE state = 'WAITING'")
                    .fetch_one(&self.pool)
                    .await?;
            counts.total = row.try_get::<i64, _>("n")?.max(0) as u64;
            return Ok(counts);
        }
        let rows = sqlx::query(
            "SELECT w.app, COUNT(*) AS n FROM task_instance i JOIN workflow w \
             ON w.id = i.workflow_id WHERE i.state = 'WAITING' GROUP BY w.app",
        )
        .fetch_all(&self.pool)
        .await?;
        for row in rows {
            let n = row.try_get::<i64, _>("n")?.max(0) as u64;
            counts.total += n;
            counts.by_app.insert(row.try_get("app")?, n);
        }
        Ok(counts)
    }
}
