//! Audit rows: inserted in multi-row statements, alone (`Store::insert_audits`) or in the
//! transaction of the change they record (a trigger's row with its run), and queried by action,
//! target and actor, newest first.

use super::counted::Counted;
use super::rows;
use super::{Store, pow2_chunks, values_rows, write_tx};
use crate::{AuditFilter, AuditRecord, Result};

impl Store {
    /// Stores audit rows in one transaction: all of them or none.
    pub async fn insert_audits(&self, records: &[AuditRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        write_tx!(self, |c| async {
            insert_rows(&mut Counted::new(c), records).await
        })
    }

    pub async fn insert_audit(&self, record: &AuditRecord) -> Result<()> {
        self.insert_audits(std::slice::from_ref(record)).await
    }

    /// Newest first.
    pub async fn list_audit(&self, limit: u32) -> Result<Vec<AuditRecord>> {
        self.query_audit(&AuditFilter {
            limit,
            ..AuditFilter::default()
        })
        .await
    }

    /// The rows matching every set field of `filter`, newest first, at most `filter.limit`.
    pub async fn query_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        let mut sql = format!("{} WHERE 1 = 1", rows::AUDIT_SELECT);
        let fields = [
            ("action", &filter.action),
            ("target", &filter.target),
            ("actor", &filter.actor),
            ("token", &filter.token),
        ];
        for (column, value) in &fields {
            if value.is_some() {
                sql.push_str(&format!(" AND {column} = ?"));
            }
        }
        sql.push_str(" ORDER BY at DESC, id DESC LIMIT ?");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (_, value) in fields {
            if let Some(value) = value {
                query = query.bind(value.as_str());
            }
        }
        let rows = query
            .bind(i64::from(filter.limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::audit).collect()
    }
}

/// Inserts `records` in the caller's transaction.
pub(crate) async fn insert_rows(c: &mut Counted<'_>, records: &[AuditRecord]) -> Result<()> {
    for chunk in pow2_chunks(records) {
        let sql = format!(
            "INSERT INTO audit_log (at, actor, action, target, detail, remote, token) VALUES {}",
            values_rows(chunk.len(), 7)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for record in chunk {
            query = query
                .bind(record.at)
                .bind(record.actor.as_str())
                .bind(record.action.as_str())
                .bind(record.target.as_str())
                .bind(record.detail.as_str())
                .bind(record.remote.as_str())
                .bind(record.token.as_str());
        }
        query.execute(&mut *c).await?;
    }
    Ok(())
}
