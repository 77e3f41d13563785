//! Audit rows: inserted in multi-row statements, alone (`Store::insert_audits`) or in the
//! transaction of the change they record (a trigger's row with its run).

use super::counted::Counted;
use super::{pow2_chunks, values_rows};
use crate::{AuditRecord, Result};

/// Inserts `records` in the caller's transaction.
pub(crate) async fn insert_rows(c: &mut Counted<'_>, records: &[AuditRecord]) -> Result<()> {
    for chunk in pow2_chunks(records) {
        let sql = format!(
            "INSERT INTO audit_log (at, actor, action, target, detail, remote) VALUES {}",
            values_rows(chunk.len(), 6)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for record in chunk {
            query = query
                .bind(record.at)
                .bind(record.actor.as_str())
                .bind(record.action.as_str())
                .bind(record.target.as_str())
                .bind(record.detail.as_str())
                .bind(record.remote.as_str());
        }
        query.execute(&mut *c).await?;
    }
    Ok(())
}
