//! Mapped tasks (`for_each`, `ax_core::for_each`): their list read when the advance (or a run's
//! start, for a root) says they run, and their fan-out: the task's instance becomes the
//! RUNNING parent of one WAITING item instance per element, all in the transaction that judged
//! it, so a node killed at any point leaves either no items or every item, never some twice.
//! Items are children as a sharded task's shards are (`parent_id`, `shard_index`,
//! `shard_total`), unpinned, with their `item`; their ends settle the parent
//! (`dispatch.rs::settle_parent`), which alone counts for the tasks below and the run's end.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::for_each::{self, ForEach};
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::ids::IdKind;
use super::{Store, pow2_chunks, values_rows};
use crate::Result;

/// A task judged to run whose `for_each` is to be read: its run, the list's source, its cap.
pub(crate) struct Mapped<'a> {
    pub(crate) run: i64,
    pub(crate) for_each: &'a ForEach,
    pub(crate) max_items: u32,
}

/// What a mapped task's list decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listed {
    Items(Vec<String>),
    /// The list is empty: SKIPPED, with the line `why` shows.
    Empty(String),
    /// The list cannot be read: FAILED before any item starts, with the reason.
    Refused(String),
}

/// Reads the list of each of `mapped`, in order: one read of the runs' params and one of their
/// outputs, each only when some list needs it.
pub(crate) async fn lists(c: &mut AnyConnection, mapped: &[Mapped<'_>]) -> Result<Vec<Listed>> {
    let runs_of = |wanted: fn(&ForEach) -> bool| -> BTreeSet<i64> {
        mapped
            .iter()
            .filter(|m| wanted(m.for_each))
            .map(|m| m.run)
            .collect()
    };
    let params =
        super::conditions::params_of(c, &runs_of(|f| matches!(f, ForEach::Param(_)))).await?;
    let outputs =
        super::outputs::of_runs(c, &runs_of(|f| matches!(f, ForEach::Output { .. }))).await?;
    Ok(mapped
        .iter()
        .map(|m| {
            let source = m.for_each.source();
            let read = match m.for_each {
                ForEach::Items(items) => for_each::written(items, m.max_items),
                ForEach::Param(name) => match params.get(&m.run).and_then(|p| p.get(name)) {
                    Some(json) => for_each::items(json, m.max_items),
                    None => Err(format!("is missing: the run has no param {name}")),
                },
                ForEach::Output { task, key } => {
                    match outputs
                        .get(&m.run)
                        .and_then(|of_run| of_run.get(task))
                        .and_then(|o| o.get(key))
                    {
                        Some(json) => for_each::items(json, m.max_items),
                        None => Err(format!(
                            "is missing: task {task} passed on no output {key} (it did not \
                             succeed, or did not write {key} to $AX_OUTPUT)"
                        )),
                    }
                }
            };
            match read {
                Ok(items) if items.is_empty() => {
                    Listed::Empty(format!("for_each: {source} is an empty list"))
                }
                Ok(items) => Listed::Items(items),
                Err(why) => Listed::Refused(format!("for_each: {source} {why}")),
            }
        })
        .collect())
}

/// A mapped task to fan out in its run: (run, task, priority, items).
pub(crate) type FanOut = (i64, String, i64, Vec<String>);

/// Fans each of `fans` out: its instance RUNNING as the parent (a new one, or its PENDING one
/// after a rerun from above, as its next attempt) and one WAITING item per element. A task
/// whose instance is in another state fanned out already and is left alone. Returns, per
/// (run, task), the items created.
pub(crate) async fn insert_fan_outs(
    store: &Store,
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    fans: &[FanOut],
    now: Millis,
) -> Result<HashMap<(i64, String), u32>> {
    let mut created = HashMap::new();
    let mut existing: BTreeMap<(i64, String), (i64, i64, InstanceState)> = BTreeMap::new();
    let runs: BTreeSet<i64> = fans.iter().map(|(run, _, _, _)| *run).collect();
    for run in runs {
        let names = fans
            .iter()
            .filter(|(r, _, _, _)| *r == run)
            .map(|(_, task, _, _)| task.as_str());
        for row in super::reports::task_instances_of_run(c, run, names).await? {
            let state = super::rows::instance_state(&row.try_get::<String, _>("state")?)?;
            existing.insert(
                (run, row.try_get("task_name")?),
                (row.try_get("id")?, row.try_get("attempt")?, state),
            );
        }
    }
    let mut parents: Vec<(i64, i64, &FanOut)> = Vec::new();
    let fresh: Vec<&FanOut> = fans
        .iter()
        .filter(|(run, task, _, _)| !existing.contains_key(&(*run, task.clone())))
        .collect();
    let ids = store
        .take_ids(c.uncounted(), IdKind::Instance, fresh.len())
        .await?;
    let rows: Vec<(i64, &&FanOut)> = ids.iter().copied().zip(&fresh).collect();
    for chunk in pow2_chunks(&rows) {
        let sql = format!(
            "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, \
             state, attempt, priority, not_before, created_at, started_at, shard_total) \
             VALUES {}",
            values_rows(chunk.len(), 12)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, (run, task, priority, items)) in chunk {
            query = query
                .bind(*id)
                .bind(*run)
                .bind(workflow)
                .bind(version)
                .bind(task.as_str())
                .bind(InstanceState::Running.as_str())
                .bind(1i64)
                .bind(*priority)
                .bind(now)
                .bind(now)
                .bind(now)
                .bind(items.len() as i64);
        }
        query.execute(&mut *c).await?;
    }
    parents.extend(rows.iter().map(|(id, fan)| (*id, 1, **fan)));
    for fan in fans {
        let (run, task, _, items) = fan;
        let Some((id, attempt, InstanceState::Pending)) = existing.get(&(*run, task.clone()))
        else {
            continue;
        };
        let next = attempt + 1;
        let moved = sqlx::query(
            "UPDATE task_instance SET state = 'RUNNING', attempt = ?, worker_id = NULL, \
             started_at = ?, finished_at = NULL, shard_total = ? WHERE id = ? AND attempt = ? \
             AND state = 'PENDING'",
        )
        .bind(next)
        .bind(now)
        .bind(items.len() as i64)
        .bind(*id)
        .bind(*attempt)
        .execute(&mut *c)
        .await?;
        if moved.rows_affected() == 1 {
            parents.push((*id, next, fan));
        }
    }
    let total: usize = parents.iter().map(|(_, _, fan)| fan.3.len()).sum();
    let item_ids = store
        .take_ids(c.uncounted(), IdKind::Instance, total)
        .await?;
    let mut item_ids = item_ids.into_iter();
    let mut items: Vec<(i64, i64, i64, &FanOut, usize, &str)> = Vec::with_capacity(total);
    for (parent, attempt, fan) in &parents {
        for (index, item) in fan.3.iter().enumerate() {
            let Some(id) = item_ids.next() else { break };
            items.push((id, *parent, *attempt, fan, index, item.as_str()));
        }
        created.insert((fan.0, fan.1.clone()), fan.3.len() as u32);
    }
    for chunk in pow2_chunks(&items) {
        let sql = format!(
            "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, \
             state, attempt, priority, not_before, created_at, parent_id, parent_attempt, \
             shard_index, shard_total, shard_slot, item) VALUES {}",
            values_rows(chunk.len(), 16)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, parent, attempt, (run, task, priority, all), index, item) in chunk {
            query = query
                .bind(*id)
                .bind(*run)
                .bind(workflow)
                .bind(version)
                .bind(task.as_str())
                .bind(InstanceState::Waiting.as_str())
                .bind(1i64)
                .bind(*priority)
                .bind(now)
                .bind(now)
                .bind(*parent)
                .bind(*attempt)
                .bind(*index as i64)
                .bind(all.len() as i64)
                .bind(*id)
                .bind(*item);
        }
        query.execute(&mut *c).await?;
    }
    Ok(created)
}
