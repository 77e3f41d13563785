//! The decision log: why the scheduler did what it did with a slot, a run or an instance (a
//! slot fired, missed or skipped, a run queued, an instance held back by a limit or with no
//! worker, an attempt lost or timed out). Its rows are recorded in batches, or once per
//! instance, kind and detail (`record_decisions_once`, for the dispatcher, which meets the
//! same waiting instance on every pass), and listed by workflow and slot time.
//!
//! The decisions a store transaction makes itself (a run queued or dequeued, a dependent fired)
//! are written by that transaction, beside the change; this file holds the writes and reads
//! that the `Store` trait offers on their own.

use ax_core::Millis;
use ax_core::ids::WorkflowId;
use sqlx::AnyConnection;

use super::rows;
use super::{Store, values_rows, write_tx};
use crate::{DecisionRecord, Result};

impl Store {
    /// Stores decisions in one multi-row insert.
    pub async fn record_decisions(&self, decisions: &[DecisionRecord]) -> Result<()> {
        if decisions.is_empty() {
            return Ok(());
        }
        write_tx!(self, |c| async {
            for batch in decisions.chunks(500) {
                let sql = format!(
                    "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, \
                     task_name, kind, detail, node_id) VALUES {}",
                    values_rows(batch.len(), 9)
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for d in batch {
                    query = query
                        .bind(d.at)
                        .bind(d.workflow_id.0)
                        .bind(d.slot_at)
                        .bind(d.run_id.map(|id| id.0))
                        .bind(d.instance_id.map(|id| id.0))
                        .bind(d.task.as_deref())
                        .bind(d.kind.as_str())
                        .bind(d.detail.as_str())
                        .bind(d.node_id.as_str());
                }
                query.execute(&mut *c).await?;
            }
            Ok(())
        })
    }

    /// Stores the decisions whose (instance, kind, detail) is not stored yet (each must name an
    /// instance); returns how many it stored. For decisions a dispatcher would otherwise repeat
    /// every pass (throttled, no worker).
    pub async fn record_decisions_once(&self, decisions: &[DecisionRecord]) -> Result<u32> {
        if decisions.is_empty() {
            return Ok(0);
        }
        write_tx!(self, |c| record_decisions_once_tx(c, decisions))
    }

    /// A workflow's decisions with `from <= slot_at <= to`, oldest first, at most `limit`.
    pub async fn list_decisions(
        &self,
        workflow_id: WorkflowId,
        from: Millis,
        to: Millis,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>> {
        let sql = format!(
            "{} WHERE workflow_id = ? AND slot_at >= ? AND slot_at <= ? \
             ORDER BY slot_at, id LIMIT ?",
            rows::DECISION_SELECT
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workflow_id.0)
            .bind(from)
            .bind(to)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::decision).collect()
    }
}

async fn record_decisions_once_tx(
    c: &mut AnyConnection,
    decisions: &[DecisionRecord],
) -> Result<u32> {
    let mut stored = 0;
    for d in decisions {
        let Some(instance) = d.instance_id else {
            continue;
        };
        let seen = sqlx::query(
            "SELECT id FROM decision_log WHERE instance_id = ? AND kind = ? AND detail = ? LIMIT 1",
        )
        .bind(instance.0)
        .bind(d.kind.as_str())
        .bind(d.detail.as_str())
        .fetch_optional(&mut *c)
        .await?;
        if seen.is_some() {
            continue;
        }
        sqlx::query(
            "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, task_name, \
             kind, detail, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(d.at)
        .bind(d.workflow_id.0)
        .bind(d.slot_at)
        .bind(d.run_id.map(|id| id.0))
        .bind(instance.0)
        .bind(d.task.as_deref())
        .bind(d.kind.as_str())
        .bind(d.detail.as_str())
        .bind(d.node_id.as_str())
        .execute(&mut *c)
        .await?;
        stored += 1;
    }
    Ok(stored)
}
