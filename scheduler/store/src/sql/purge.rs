//! Purging history (retention and `axctl purge`): ended runs deleted with their instances,
//! attempts, log chunks and decisions, a bounded step at a time.
//!
//! A step reads its runs without a lock (the next ended runs of one workflow in end order, by
//! `idx_run_finished`, and how many rows each has), then, in one short transaction, locks those
//! run rows by primary key in ascending order (the store's lock order starts with runs,
//! `locks.rs`), checks them again and deletes by primary key or its prefix: log chunks and
//! attempts by instance id, instances and decisions by id, runs by id. Nothing is deleted
//! through a secondary index that active rows share, so on InnoDB (READ COMMITTED, no gap
//! locks) the transaction holds locks on the purged rows only, which the dispatch and report
//! paths never touch: those rows belong to runs that ended long ago. A writer that would
//! reopen one of them (a manual retry) locks the run row first, so it either waits for the
//! step and then finds nothing, or commits first and the step skips the run.
//!
//! On SQLite every write holds the one writer lock: the caller paces the steps (the purger
//! pauses between them at least as long as a step took), so a purge never takes more than
//! about half of the writer's time.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::ids::{RunId, WorkflowId};
use ax_core::retention::purgeable;
use sqlx::{AnyConnection, Row};

use super::rows::run_state;
use super::{Dialect, Store, in_list, write_tx};
use crate::{PurgeCounts, PurgeCursor, PurgeProgress, PurgeStep, Result};

/// The run states a purge may take: ended ones.
const ENDED: &str = "'SUCCESS', 'FAILED', 'CANCELLED'";

/// A run a step may take, with the rows that would go with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    id: i64,
    finished_at: Millis,
    instances: u64,
    /// Instances, attempts and log chunks: the run's rows besides its own.
    rows: u64,
}

/// Which of a step's candidates go in its transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    /// These runs, whole (a prefix of the candidates).
    Whole(Vec<Candidate>),
    /// The first candidate alone is larger than a step: this many of its instances go now, the
    /// run stays for a later step.
    Part { run: Candidate, instances: u64 },
}

/// Cuts a step out of `candidates` (in end order): whole runs while their rows fit in
/// `max_rows`, at least one; a first run larger than that goes in parts when `split` allows.
fn plan(candidates: &[Candidate], max_rows: u64, split: bool) -> Plan {
    let max_rows = max_rows.max(1);
    if let Some(first) = candidates.first()
        && split
        && first.rows > max_rows
    {
        let per_instance = first.rows.div_ceil(first.instances.max(1)).max(1);
        return Plan::Part {
            run: *first,
            instances: (max_rows / per_instance).max(1),
        };
    }
    let mut taken = Vec::new();
    let mut rows = 0u64;
    for candidate in candidates {
        if !taken.is_empty() && rows + candidate.rows > max_rows {
            break;
        }
        rows += candidate.rows;
        taken.push(*candidate);
    }
    Plan::Whole(taken)
}

impl Store {
    /// One step of a purge: the next ended runs of the step's workflow (SUCCESS, FAILED or
    /// CANCELLED, `finished_at` before the cutoff) in end order, at most `max_runs` of them and
    /// as many as fit in `max_rows`, are deleted with their instances, attempts, log chunks and
    /// decisions, in one short transaction. The runs are read first without a lock, then
    /// locked by primary key and checked again: a run reopened meanwhile (a manual retry), or
    /// with an instance still active or holding a concurrency slot, is skipped. Every delete
    /// goes by primary key (or its prefix), so the transaction locks only the purged rows. A
    /// run too large for one step loses a batch of its instances per step and goes with the
    /// last. With `dry_run` the same runs are counted, nothing is locked or deleted.
    pub async fn purge_runs(&self, step: &PurgeStep) -> Result<PurgeProgress> {
        let candidates = {
            let mut c = self.pool.acquire().await?;
            let mut candidates = next_ended_runs(self, &mut c, step).await?;
            sizes(&mut c, &mut candidates).await?;
            candidates
        };
        let Some(last_read) = candidates.last().copied() else {
            return Ok(PurgeProgress::default());
        };
        let plan = plan(&candidates, u64::from(step.max_rows), !step.dry_run);
        let counts = if step.dry_run {
            let mut c = self.pool.acquire().await?;
            count(&mut c, &plan).await?
        } else {
            write_tx!(self, |c| delete(self, c, &plan, step.ended_before))?
        };
        let cursor = |run: &Candidate| PurgeCursor {
            finished_at: run.finished_at,
            run: RunId(run.id),
        };
        let next = match &plan {
            // The run stays; the next step starts at it again.
            Plan::Part { .. } => Some(step.after.unwrap_or(PurgeCursor {
                finished_at: Millis::MIN,
                run: RunId(0),
            })),
            Plan::Whole(taken) => {
                let all_read = taken.len() == candidates.len();
                let more = !all_read || candidates.len() >= step.max_runs as usize;
                match taken.last() {
                    Some(last) if more => Some(cursor(last)),
                    _ if more => Some(cursor(&last_read)),
                    _ => None,
                }
            }
        };
        Ok(PurgeProgress { counts, next })
    }

    /// Deletes (or with `dry_run` counts) at most `limit` of the workflow's decisions that
    /// belong to no run or instance (dropped slots: misfired, skipped) with a slot before
    /// `before`; returns how many. A dry run counts them all.
    pub async fn purge_slot_decisions(
        &self,
        workflow_id: WorkflowId,
        before: Millis,
        limit: u32,
        dry_run: bool,
    ) -> Result<u64> {
        const RUN_FREE: &str = "workflow_id = ? AND slot_at < ? AND run_id IS NULL \
             AND instance_id IS NULL";
        if dry_run {
            let sql = format!("SELECT COUNT(*) FROM decision_log WHERE {RUN_FREE}");
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(workflow_id.0)
                .bind(before)
                .fetch_one(&self.pool)
                .await?;
            return Ok(n.max(0) as u64);
        }
        let sql = format!(
            "SELECT id FROM decision_log WHERE {RUN_FREE} ORDER BY slot_at LIMIT {}",
            limit.max(1)
        );
        let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(workflow_id.0)
            .bind(before)
            .fetch_all(&self.pool)
            .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        write_tx!(self, |c| delete_by(c, "decision_log", "id", &ids))
    }

    /// Deletes (or with `dry_run` counts) at most `limit` of the oldest audit rows written
    /// before `before`, by id (`idx_audit_log_at` finds them); returns how many. A dry run counts
    /// them all.
    pub async fn purge_audit(&self, before: Millis, limit: u32, dry_run: bool) -> Result<u64> {
        if dry_run {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_log WHERE at < ?")
                .bind(before)
                .fetch_one(&self.pool)
                .await?;
            return Ok(n.max(0) as u64);
        }
        let sql = format!(
            "SELECT id FROM audit_log WHERE at < ? ORDER BY at LIMIT {}",
            limit.max(1)
        );
        let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(before)
            .fetch_all(&self.pool)
            .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        write_tx!(self, |c| delete_by(c, "audit_log", "id", &ids))
    }
}

/// The next ended runs of the step's workflow past the cursor, in end order, without a lock.
/// The statement goes as text with its numbers in it (every value spliced in is a number), as
/// `runs.rs` pages runs, and names its index on both backends: without statistics either may
/// prefer `idx_run_state`, a scan of every ended run.
async fn next_ended_runs(
    store: &Store,
    c: &mut AnyConnection,
    step: &PurgeStep,
) -> Result<Vec<Candidate>> {
    let mut sql = format!(
        "SELECT id, finished_at FROM run{} WHERE workflow_id = {} AND finished_at < {}",
        match store.dialect {
            Dialect::MySql => " FORCE INDEX (idx_run_finished)",
            Dialect::Sqlite => " INDEXED BY idx_run_finished",
        },
        step.workflow_id.0,
        step.ended_before
    );
    if let Some(after) = step.after {
        sql.push_str(&format!(
            " AND (finished_at > {f} OR (finished_at = {f} AND id > {id}))",
            f = after.finished_at,
            id = after.run.0
        ));
    }
    sql.push_str(&format!(
        " AND state IN ({ENDED}) ORDER BY finished_at, id LIMIT {}",
        step.max_runs.max(1)
    ));
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_all(c).await?;
    rows.iter()
        .map(|row| {
            Ok(Candidate {
                id: row.try_get("id")?,
                finished_at: row.try_get("finished_at")?,
                instances: 0,
                rows: 0,
            })
        })
        .collect()
}

/// Fills in each candidate's instances and rows (instances, attempts, log chunks): index-only
/// counts, grouped by run.
async fn sizes(c: &mut AnyConnection, candidates: &mut [Candidate]) -> Result<()> {
    if candidates.is_empty() {
        return Ok(());
    }
    let (list, values) = in_list(candidates.iter().map(|run| run.id));
    let mut counted: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    let statements = [
        "SELECT run_id, COUNT(*) AS n FROM task_instance WHERE run_id IN ({list}) GROUP BY run_id",
        "SELECT ti.run_id, COUNT(*) AS n FROM task_attempt a \
         JOIN task_instance ti ON ti.id = a.instance_id \
         WHERE ti.run_id IN ({list}) GROUP BY ti.run_id",
        "SELECT ti.run_id, COUNT(*) AS n FROM execution_log l \
         JOIN task_instance ti ON ti.id = l.instance_id \
         WHERE ti.run_id IN ({list}) GROUP BY ti.run_id",
    ];
    for (i, sql) in statements.into_iter().enumerate() {
        let sql = sql.replace("{list}", &list);
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in &values {
            query = query.bind(*id);
        }
        for row in query.fetch_all(&mut *c).await? {
            let run: i64 = row.try_get("run_id")?;
            let n = row.try_get::<i64, _>("n")?.max(0) as u64;
            let entry = counted.entry(run).or_default();
            if i == 0 {
                entry.0 = n;
            }
            entry.1 += n;
        }
    }
    for candidate in candidates {
        let (instances, rows) = counted.get(&candidate.id).copied().unwrap_or_default();
        candidate.instances = instances;
        candidate.rows = rows;
    }
    Ok(())
}

/// A dry run's counts of the planned runs' rows.
async fn count(c: &mut AnyConnection, plan: &Plan) -> Result<PurgeCounts> {
    let Plan::Whole(runs) = plan else {
        return Ok(PurgeCounts::default());
    };
    let runs: Vec<i64> = runs.iter().map(|run| run.id).collect();
    let instances = instance_ids(c, &runs, None).await?;
    Ok(PurgeCounts {
        runs: runs.len() as u64,
        instances: instances.len() as u64,
        attempts: count_by_instance(c, "task_attempt", &instances).await?,
        log_chunks: count_by_instance(c, "execution_log", &instances).await?,
        decisions: decision_ids(c, &runs, &instances).await?.len() as u64,
    })
}

async fn count_by_instance(c: &mut AnyConnection, table: &str, instances: &[i64]) -> Result<u64> {
    let mut total = 0;
    for chunk in instances.chunks(LIST_CHUNK) {
        let (list, values) = in_list(chunk.iter().copied());
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE instance_id IN ({list})");
        let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
        for id in values {
            query = query.bind(id);
        }
        total += query.fetch_one(&mut *c).await?.max(0) as u64;
    }
    Ok(total)
}

/// Ids per `IN (…)` list: a step's instances can be a few thousand.
const LIST_CHUNK: usize = 1_024;

/// The instances of `runs` in id order, at most `limit`.
async fn instance_ids(c: &mut AnyConnection, runs: &[i64], limit: Option<u64>) -> Result<Vec<i64>> {
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let (list, values) = in_list(runs.iter().copied());
    let mut sql = format!("SELECT id FROM task_instance WHERE run_id IN ({list}) ORDER BY id");
    if let Some(limit) = limit {
        sql.push_str(&format!(" LIMIT {limit}"));
    }
    let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
    for id in values {
        query = query.bind(id);
    }
    Ok(query.fetch_all(c).await?)
}

/// The decisions about `runs` or `instances` (by `idx_decision_log_run` and
/// `idx_decision_log_instance`), by id.
async fn decision_ids(c: &mut AnyConnection, runs: &[i64], instances: &[i64]) -> Result<Vec<i64>> {
    let mut ids = BTreeSet::new();
    for (column, keys) in [("run_id", runs), ("instance_id", instances)] {
        for chunk in keys.chunks(LIST_CHUNK) {
            let (list, values) = in_list(chunk.iter().copied());
            let sql = format!("SELECT id FROM decision_log WHERE {column} IN ({list})");
            let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
            for id in values {
                query = query.bind(id);
            }
            ids.extend(query.fetch_all(&mut *c).await?);
        }
    }
    Ok(ids.into_iter().collect())
}

/// `DELETE FROM {table} WHERE {column} IN (…)` over `keys`; the rows deleted.
async fn delete_by(c: &mut AnyConnection, table: &str, column: &str, keys: &[i64]) -> Result<u64> {
    let mut deleted = 0;
    for chunk in keys.chunks(LIST_CHUNK) {
        let (list, values) = in_list(chunk.iter().copied());
        let sql = format!("DELETE FROM {table} WHERE {column} IN ({list})");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in values {
            query = query.bind(id);
        }
        deleted += query.execute(&mut *c).await?.rows_affected();
    }
    Ok(deleted)
}

/// The step's transaction: lock the planned runs, keep those still purgeable, delete them and
/// everything of theirs.
async fn delete(
    store: &Store,
    c: &mut AnyConnection,
    plan: &Plan,
    ended_before: Millis,
) -> Result<PurgeCounts> {
    let (planned, part): (Vec<i64>, Option<u64>) = match plan {
        Plan::Whole(runs) => (runs.iter().map(|run| run.id).collect(), None),
        Plan::Part { run, instances } => (vec![run.id], Some(*instances)),
    };
    if planned.is_empty() {
        return Ok(PurgeCounts::default());
    }
    // Ascending, by primary key: the lock order's first table. A run reopened since it was
    // read (a manual retry leaves `finished_at` NULL) is no longer purgeable and is left alone.
    // The rows are read by id alone and judged here: given the state and end time too, SQLite
    // plans a list of a few hundred ids as a scan of every ended run (`idx_run_state`).
    let (list, values) = in_list(planned.iter().copied());
    let sql = format!(
        "SELECT id, state, finished_at FROM run WHERE id IN ({list}) ORDER BY id{}",
        store.dialect.for_update()
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in values {
        query = query.bind(id);
    }
    let mut runs = BTreeSet::new();
    for row in query.fetch_all(&mut *c).await? {
        let state = run_state(&row.try_get::<String, _>("state")?)?;
        let finished_at: Option<Millis> = row.try_get("finished_at")?;
        if purgeable(state, finished_at, ended_before) {
            runs.insert(row.try_get::<i64, _>("id")?);
        }
    }
    if runs.is_empty() {
        return Ok(PurgeCounts::default());
    }
    // An ended run's instances have ended and hold no concurrency slot; one that does not is
    // left for a later pass rather than deleted under a counter that counts it.
    let (list, values) = in_list(runs.iter().copied());
    let sql = format!(
        "SELECT DISTINCT run_id FROM task_instance WHERE run_id IN ({list}) \
         AND (held_slots <> '' OR state IN ('WAITING', 'DISPATCHED', 'RUNNING'))"
    );
    let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
    for id in values {
        query = query.bind(id);
    }
    for busy in query.fetch_all(&mut *c).await? {
        runs.remove(&busy);
    }
    if runs.is_empty() {
        return Ok(PurgeCounts::default());
    }
    let runs: Vec<i64> = runs.into_iter().collect();
    let instances = instance_ids(c, &runs, part).await?;
    let decisions = match part {
        // The run's own decisions go with the run, in its last step.
        Some(_) => decision_ids(c, &[], &instances).await?,
        None => decision_ids(c, &runs, &instances).await?,
    };
    let mut counts = PurgeCounts {
        log_chunks: delete_by(c, "execution_log", "instance_id", &instances).await?,
        attempts: delete_by(c, "task_attempt", "instance_id", &instances).await?,
        decisions: delete_by(c, "decision_log", "id", &decisions).await?,
        instances: delete_by(c, "task_instance", "id", &instances).await?,
        runs: 0,
    };
    if part.is_none() {
        delete_by(c, "sub_workflow_wait", "parent_run_id", &runs).await?;
        counts.runs = delete_by(c, "run", "id", &runs).await?;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: i64, instances: u64, rows: u64) -> Candidate {
        Candidate {
            id,
            finished_at: id * 10,
            instances,
            rows,
        }
    }

    #[test]
    fn a_step_takes_whole_runs_while_their_rows_fit() {
        let candidates = [run(1, 1, 3), run(2, 1, 3), run(3, 1, 3)];
        assert_eq!(
            plan(&candidates, 7, true),
            Plan::Whole(vec![candidates[0], candidates[1]])
        );
        assert_eq!(
            plan(&candidates, 100, true),
            Plan::Whole(candidates.to_vec())
        );
        assert_eq!(plan(&[], 100, true), Plan::Whole(Vec::new()));
    }

    #[test]
    fn a_run_larger_than_a_step_goes_in_parts_unless_only_counted() {
        let big = run(1, 1_000, 3_000);
        let candidates = [big, run(2, 1, 3)];
        assert_eq!(
            plan(&candidates, 300, true),
            Plan::Part {
                run: big,
                instances: 100
            }
        );
        // A dry run counts it whole, alone.
        assert_eq!(plan(&candidates, 300, false), Plan::Whole(vec![big]));
        // One huge instance still goes, alone.
        let huge = run(1, 1, 50_000);
        assert_eq!(
            plan(&[huge], 300, true),
            Plan::Part {
                run: huge,
                instances: 1
            }
        );
    }
}
