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

use sqlx::Row;

use super::counted::Counted;
use super::{Dialect, Store, in_list};
use crate::Result;

/// Locks, in ascending id order, the rows of `workflows` (the workflows of ending runs) and of
/// every workflow that depends on one of them (`schedule.after`); returns those of `workflows`
/// that have a dependent. Two statements on MySQL; on SQLite (one writer at a time) nothing is
/// locked and only the dependents are read.
pub(crate) async fn lock_workflows_of_ending_runs(
    store: &Store,
    c: &mut Counted<'_>,
    workflows: &BTreeSet<i64>,
) -> Result<BTreeSet<i64>> {
    if workflows.is_empty() {
        return Ok(BTreeSet::new());
    }
    let (list, padded) = in_list(workflows.iter().copied());
    let sql = format!(
        "SELECT w.id, d.downstream_id FROM workflow w \
         JOIN workflow_dependency d ON d.upstream_name = w.name WHERE w.id IN ({list})"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for workflow in padded {
        query = query.bind(workflow);
    }
    let mut with_dependents = BTreeSet::new();
    let mut locked = workflows.clone();
    for row in query.fetch_all(&mut *c).await? {
        with_dependents.insert(row.try_get::<i64, _>("id")?);
        locked.insert(row.try_get::<i64, _>("downstream_id")?);
    }
    if store.dialect == Dialect::MySql {
        // One statement; InnoDB locks the rows as it walks the primary key, in ascending order.
        let (list, padded) = in_list(locked.iter().copied());
        let sql = format!("SELECT id FROM workflow WHERE id IN ({list}) ORDER BY id FOR UPDATE");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for workflow in padded {
            query = query.bind(workflow);
        }
        query.fetch_all(&mut *c).await?;
    }
    Ok(with_dependents)
}
