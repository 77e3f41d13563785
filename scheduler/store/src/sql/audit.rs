//! Audit rows: inserted in multi-row statements, alone (`Store::insert_audits`) or in the
//! transaction of the change they record (a trigger's row with its run), and queried by action,
//! target and actor, newest first.

use super::counted::Counted;
use super::rows;
use super::{SqlStore, pow2_chunks, values_rows};
use crate::{AuditFilter, AuditRecord, Result};

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

pub(crate) async fn query_audit(
    store: &SqlStore,
    filter: &AuditFilter,
) -> Result<Vec<AuditRecord>> {
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
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::audit).collect()
}
