//! Reading a mapped task's items (`for_each`) in groups rather than one row each: a run's
//! instances without its items, each mapped task's counts by state with its first failures,
//! and a page of one task's items in index order. A run of 10,000 items is read as a handful
//! of rows by `axctl get run` and the run page; the items themselves are paged.
//!
//! A rerun of a mapped task fans it out again under the parent's next attempt; the items
//! shown are those of the parent's latest fan-out (`parent_attempt`), the earlier ones keep
//! their records.

use std::collections::{BTreeMap, HashMap};

use ax_core::ids::{InstanceId, RunId};
use ax_core::state::InstanceState;
use sqlx::Row;

use super::Store;
use super::rows::{self, instance_state, to_u32};
use crate::{AttemptRecord, FIRST_FAILURES, InstanceRecord, ItemPage, ItemSummary, Result};

const FAILED_STATES: &str = "('FAILED', 'TIMEOUT', 'CANCELLED')";

/// A mapped task's fan-out: its attempt and its items' counts by state.
pub(super) type FanOut = (i64, HashMap<InstanceState, u32>);

/// Item counts grouped by (parent_id, parent_attempt, state) folded to each mapped task's latest
/// fan-out: parent -> (that fan-out's attempt, its counts by state). An earlier fan-out's items
/// (a retried mapped task's) are history, not the task's state.
pub(super) fn latest_fan_outs(rows: &[sqlx::any::AnyRow]) -> Result<BTreeMap<i64, FanOut>> {
    let mut latest: BTreeMap<i64, FanOut> = BTreeMap::new();
    for row in rows {
        let parent: i64 = row.try_get("parent_id")?;
        let attempt: i64 = row.try_get("parent_attempt")?;
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        let n = to_u32(row.try_get("n")?, "item count")?;
        let entry = latest.entry(parent).or_insert((attempt, HashMap::new()));
        if attempt > entry.0 {
            *entry = (attempt, HashMap::new());
        }
        if attempt == entry.0 {
            entry.1.insert(state, n);
        }
    }
    Ok(latest)
}

impl Store {
    /// A run's instances by id, its mapped tasks' items left out (their parents stay).
    pub async fn list_instances_without_items(&self, run: RunId) -> Result<Vec<InstanceRecord>> {
        let sql = format!(
            "{} WHERE ti.run_id = ? AND ti.item IS NULL ORDER BY ti.id",
            rows::INSTANCE_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::instance).collect()
    }

    /// The attempts of a run's instances other than its items, by instance then attempt.
    pub async fn list_run_attempts_without_items(&self, run: RunId) -> Result<Vec<AttemptRecord>> {
        let sql = format!(
            "{} WHERE instance_id IN \
             (SELECT id FROM task_instance WHERE run_id = ? AND item IS NULL) \
             ORDER BY instance_id, attempt",
            rows::ATTEMPT_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::attempt).collect()
    }

    /// One summary per mapped task of the run that has fanned out, by parent id.
    pub async fn item_summaries(&self, run: RunId) -> Result<Vec<ItemSummary>> {
        let rows = sqlx::query(
            "SELECT parent_id, parent_attempt, state, COUNT(*) AS n FROM task_instance \
             WHERE run_id = ? AND item IS NOT NULL GROUP BY parent_id, parent_attempt, state",
        )
        .bind(run.0)
        .fetch_all(&self.pool)
        .await?;
        let latest = latest_fan_outs(&rows)?;
        let mut summaries = Vec::with_capacity(latest.len());
        for (parent, (attempt, counts)) in latest {
            let failed: u32 = counts
                .iter()
                .filter(|(s, _)| is_failure(**s))
                .map(|(_, n)| n)
                .sum();
            let first_failures = if failed == 0 {
                Vec::new()
            } else {
                let sql = format!(
                    "{} WHERE ti.parent_id = ? AND ti.parent_attempt = ? AND ti.item IS NOT NULL \
                     AND ti.state IN {FAILED_STATES} ORDER BY ti.shard_index LIMIT {FIRST_FAILURES}",
                    rows::INSTANCE_SELECT
                );
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(parent)
                    .bind(attempt)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(rows::instance).collect::<Result<_>>()?
            };
            summaries.push(ItemSummary {
                parent: InstanceId(parent),
                total: counts.values().sum(),
                states: InstanceState::ALL
                    .into_iter()
                    .filter_map(|s| counts.get(&s).map(|n| (s, *n)))
                    .collect(),
                first_failures,
            });
        }
        Ok(summaries)
    }

    /// A page of the items of `parent`'s latest fan-out, by index; empty for an instance that
    /// has no items.
    pub async fn list_items(
        &self,
        parent: InstanceId,
        page: ItemPage,
    ) -> Result<Vec<InstanceRecord>> {
        let state = match page.state {
            Some(_) => " AND ti.state = ?",
            None => "",
        };
        let sql = format!(
            "{} WHERE ti.parent_id = ? AND ti.item IS NOT NULL AND ti.parent_attempt = \
             (SELECT MAX(parent_attempt) FROM task_instance WHERE parent_id = ?) \
             AND ti.shard_index >= ?{state} ORDER BY ti.shard_index LIMIT ?",
            rows::INSTANCE_SELECT
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(parent.0)
            .bind(parent.0)
            .bind(i64::from(page.from_index));
        if let Some(state) = page.state {
            query = query.bind(state.as_str());
        }
        let rows = query
            .bind(i64::from(page.limit.max(1)))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::instance).collect()
    }
}

fn is_failure(state: InstanceState) -> bool {
    matches!(
        state,
        InstanceState::Failed | InstanceState::Timeout | InstanceState::Cancelled
    )
}
