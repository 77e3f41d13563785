//! The workflow rows a run end locks, all at once and in ascending id order.
//!
//! Ending a run locks its workflow's row (the promotion of queued runs, `queue.rs`) and, for a
//! SUCCESS, each dependent workflow's row (`dependents.rs`). A report batch can end runs of
//! several workflows, and a dependent may have a lower or higher id than its upstream: taken as
//! they come, two transactions could take two workflow rows in opposite orders and deadlock
//! (MySQL would abort one, and `write_tx!` retry it). So every path that ends runs first locks
//! the union of the rows it may need here, ascending; the later locks are then re-entrant.
//!
//! The order across tables is: run rows (ascending), instance rows (ascending), counter rows
//! (by scope), workflow rows (ascending), then rows of the workflow's queued or new runs.

use std::collections::BTreeSet;

use sqlx::{AnyConnection, Row};

use super::{Dialect, SqlStore, in_list};
use crate::Result;

/// Locks, in ascending id order, the workflow rows of `runs` and of every workflow that
/// depends on one of them (`schedule.after`). Nothing on SQLite (one writer at a time).
pub(crate) async fn lock_workflows_of_ending_runs(
    store: &SqlStore,
    c: &mut AnyConnection,
    runs: &BTreeSet<i64>,
) -> Result<()> {
    if store.dialect != Dialect::MySql || runs.is_empty() {
        return Ok(());
    }
    let (list, padded) = in_list(runs.iter().copied());
    let sql = format!(
        "SELECT DISTINCT r.workflow_id, d.downstream_id FROM run r \
         JOIN workflow w ON w.id = r.workflow_id \
         LEFT JOIN workflow_dependency d ON d.upstream_name = w.name \
         WHERE r.id IN ({list})"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    let mut workflows = BTreeSet::new();
    for row in query.fetch_all(&mut *c).await? {
        workflows.insert(row.try_get::<i64, _>("workflow_id")?);
        if let Some(dependent) = row.try_get::<Option<i64>, _>("downstream_id")? {
            workflows.insert(dependent);
        }
    }
    for id in workflows {
        sqlx::query("SELECT id FROM workflow WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *c)
            .await?;
    }
    Ok(())
}
