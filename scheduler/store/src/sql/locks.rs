//! The workflow rows a run end locks, all at once and in ascending id order.
//!
//! Ending a run locks its workflow's row (against the creation of a queued run, `queue.rs`)
//! and, for a SUCCESS, each dependent workflow's row (`dependents.rs`). A report batch can end
//! runs of several workflows, and a dependent may have a lower or higher id than its upstream:
//! taken as they come, two transactions could take two workflow rows in opposite orders and
//! deadlock (MySQL would abort one, and `write_tx!` retry it). So every path that ends runs
//! first locks the union of the rows it may need here, ascending; the later locks are then
//! re-entrant.
//!
//! A run end's own workflow row is locked *shared* unless the workflow has queued runs. The
//! lock only has to keep a run's creation (which takes the row exclusively when the workflow
//! has limits, `queue::admit`) and the end's look for queued runs from missing each other: the
//! creator then counts the ended run as ended, or the end sees the queued run. Shared, the run
//! ends of one workflow on several nodes hold it together instead of queueing behind each
//! other's commits, which is what a busy workflow's report batches from three nodes did. A
//! workflow with queued runs, whose end promotes one, and a dependent workflow, whose run the
//! end may create, are locked exclusively. A run queued between the look and the lock is found
//! after it and promoted under an upgraded lock; two ends upgrading at once deadlock, and one
//! of them is retried.
//!
//! The order across tables is: run rows (ascending), instance rows (ascending), counter rows
//! (by scope), workflow rows (ascending), then rows of the workflow's queued or new runs.

use std::collections::BTreeSet;

use sqlx::Row;

use super::counted::Counted;
use super::engine::{Locked, touch};
use super::{Dialect, Store, in_list};
use crate::Result;

/// How a run end holds a workflow row on MySQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// `LOCK IN SHARE MODE`: other run ends may hold it too; a creator under limits waits.
    Shared,
    /// `FOR UPDATE`: a promotion of queued runs or the creation of a dependent's run.
    Exclusive,
}

/// Locks, in ascending id order, the rows of `workflows` (the workflows of ending runs) and of
/// every workflow that depends on one of them (`schedule.after`); returns those of `workflows`
/// that have a dependent. Two statements on MySQL in the common case; on SQLite (one writer at
/// a time) nothing is locked and only the dependents are read.
pub(crate) async fn lock_workflows_of_ending_runs(
    store: &Store,
    c: &mut Counted<'_>,
    workflows: &BTreeSet<i64>,
) -> Result<BTreeSet<i64>> {
    if workflows.is_empty() {
        return Ok(BTreeSet::new());
    }
    let (list, padded) = in_list(workflows.iter().copied());
    // Only MySQL chooses between a shared and an exclusive hold; SQLite locks nothing and skips
    // the look for queued runs.
    let first_queued = match store.dialect {
        Dialect::MySql => {
            "(SELECT MIN(q.id) FROM run q WHERE q.workflow_id = w.id AND q.state = 'QUEUED')"
        }
        Dialect::Sqlite => "NULL",
    };
    let sql = format!(
        "SELECT w.id, d.downstream_id, {first_queued} AS first_queued \
         FROM workflow w LEFT JOIN workflow_dependency d ON d.upstream_name = w.name \
         WHERE w.id IN ({list})"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for workflow in padded {
        query = query.bind(workflow);
    }
    let mut with_dependents = BTreeSet::new();
    let mut exclusive = BTreeSet::new();
    for row in query.fetch_all(&mut *c).await? {
        let workflow: i64 = row.try_get("id")?;
        if let Some(downstream) = row.try_get::<Option<i64>, _>("downstream_id")? {
            with_dependents.insert(workflow);
            exclusive.insert(downstream);
        }
        if row.try_get::<Option<i64>, _>("first_queued")?.is_some() {
            exclusive.insert(workflow);
        }
    }
    if store.dialect == Dialect::MySql {
        let locked: BTreeSet<i64> = workflows.union(&exclusive).copied().collect();
        for (hold, ids) in ascending_runs(&locked, &exclusive) {
            lock_rows(c, hold, &ids).await?;
        }
        // On a cluster member a shared hold is written too: a creator under limits on another
        // server then conflicts with this end, as it waits for it on one server.
        let locked: Vec<i64> = locked.into_iter().collect();
        touch(store, c, Locked::Workflow, &locked).await?;
    }
    Ok(with_dependents)
}

/// `locked` in ascending order, cut where the hold changes: one statement per stretch keeps
/// the order across shared and exclusive rows (usually one stretch).
fn ascending_runs(locked: &BTreeSet<i64>, exclusive: &BTreeSet<i64>) -> Vec<(Hold, Vec<i64>)> {
    let mut runs: Vec<(Hold, Vec<i64>)> = Vec::new();
    for &id in locked {
        let hold = if exclusive.contains(&id) {
            Hold::Exclusive
        } else {
            Hold::Shared
        };
        match runs.last_mut() {
            Some((last, ids)) if *last == hold => ids.push(id),
            _ => runs.push((hold, vec![id])),
        }
    }
    runs
}

async fn lock_rows(c: &mut Counted<'_>, hold: Hold, ids: &[i64]) -> Result<()> {
    let mode = match hold {
        Hold::Shared => "LOCK IN SHARE MODE",
        Hold::Exclusive => "FOR UPDATE",
    };
    // One statement; InnoDB locks the rows as it walks the primary key, in ascending order.
    let (list, padded) = in_list(ids.iter().copied());
    let sql = format!("SELECT id FROM workflow WHERE id IN ({list}) ORDER BY id {mode}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in padded {
        query = query.bind(id);
    }
    query.fetch_all(&mut *c).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_locked_in_ascending_order_one_statement_per_stretch_of_a_hold() {
        let locked = BTreeSet::from([3, 5, 8, 9, 12]);
        let exclusive = BTreeSet::from([8, 9]);
        assert_eq!(
            ascending_runs(&locked, &exclusive),
            vec![
                (Hold::Shared, vec![3, 5]),
                (Hold::Exclusive, vec![8, 9]),
                (Hold::Shared, vec![12]),
            ]
        );
        assert_eq!(
            ascending_runs(&BTreeSet::from([4, 7]), &BTreeSet::new()),
            vec![(Hold::Shared, vec![4, 7])]
        );
    }
}
