//! The worker registry: each scheduler node saves the workers it sees (their version, labels,
//! capacity, load and connection), and any node lists them.
//!
//! A save is an upsert of many rows in multi-row statements, in worker id order, so two nodes
//! saving overlapping sets lock the rows in the same order and cannot deadlock.

use super::rows::{self, to_json};
use super::{Store, pow2_chunks, values_rows, write_tx};
use crate::{Result, WorkerRecord};

impl Store {
    /// Saves workers' rows (inserted or replaced, by id) in one transaction; a worker listed
    /// twice keeps its last record.
    pub async fn upsert_workers(&self, workers: &[WorkerRecord]) -> Result<()> {
        const COLUMNS: [&str; 12] = [
            "version",
            "hostname",
            "labels_json",
            "capacity",
            "running",
            "started_at",
            "last_heartbeat",
            "node_id",
            "draining",
            "connected",
            "apps_json",
            "incarnation",
        ];
        if workers.is_empty() {
            return Ok(());
        }
        // In id order, so two nodes saving overlapping sets lock their rows in the same order.
        let mut sorted: Vec<&WorkerRecord> = workers.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        let encoded = sorted
            .iter()
            .map(|worker| {
                let apps = match &worker.apps {
                    Some(apps) => to_json(apps)?,
                    None => String::new(),
                };
                Ok((to_json(&worker.labels)?, apps))
            })
            .collect::<Result<Vec<(String, String)>>>()?;
        let rows: Vec<(&WorkerRecord, &(String, String))> =
            sorted.into_iter().zip(encoded.iter()).collect();
        write_tx!(self, |c| async {
            for chunk in pow2_chunks(&rows) {
                let sql = format!(
                    "INSERT INTO worker (id, {}) VALUES {}{}",
                    COLUMNS.join(", "),
                    values_rows(chunk.len(), COLUMNS.len() + 1),
                    // A row saved late by another node (one cut off from the self, say) must not
                    // overwrite the worker's newer row from the node it is connected to now.
                    self.dialect
                        .upsert_newer_tail(&["id"], &COLUMNS, "last_heartbeat")
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (worker, (labels, apps)) in chunk {
                    query = query
                        .bind(worker.id.as_str())
                        .bind(worker.version.as_str())
                        .bind(worker.hostname.as_str())
                        .bind(labels.as_str())
                        .bind(i64::from(worker.capacity))
                        .bind(i64::from(worker.running))
                        .bind(worker.started_at)
                        .bind(worker.last_heartbeat)
                        .bind(worker.node_id.as_str())
                        .bind(i64::from(worker.draining))
                        .bind(i64::from(worker.connected))
                        .bind(apps.as_str())
                        .bind(worker.incarnation.as_str());
                }
                query.execute(&mut *c).await?;
            }
            Ok(())
        })
    }

    pub async fn list_workers(&self) -> Result<Vec<WorkerRecord>> {
        let sql = format!("{} ORDER BY id", rows::WORKER_SELECT);
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::worker).collect()
    }

    /// The row of the worker `id`, if any.
    pub async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>> {
        let sql = format!("{} WHERE id = ?", rows::WORKER_SELECT);
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(rows::worker).transpose()
    }
}
