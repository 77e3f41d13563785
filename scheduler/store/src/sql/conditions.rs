//! The `if:` of tasks whose trigger rule says they run, judged in the transaction that would
//! start them (`ax_core::condition`): on the run's params and on the states and outputs of the
//! tasks each expression reads. Only tasks with an `if:` come here, so a workflow without
//! conditions pays nothing.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::condition::{self, Facts, TaskFacts};
use ax_core::decision::DecisionKind;
use sqlx::{AnyConnection, Row};

use super::rows::{instance_state, map_json};
use super::{NAMES_PER_STATEMENT, in_list};
use crate::Result;

/// A ready task with an `if:`: its run and the expression.
#[derive(Clone, Copy)]
pub(crate) struct Conditioned<'a> {
    pub(crate) run: i64,
    pub(crate) source: &'a str,
}

/// What a task's `if:` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Run,
    /// False: SKIPPED, with the line `why` shows.
    Skip(String),
    /// It cannot be judged (a missing param or output, a failed conversion): FAILED, with
    /// the message of its attempt.
    Fail(String),
}

/// Judges each of `pending`, in order.
pub(crate) async fn judge(
    c: &mut AnyConnection,
    pending: &[Conditioned<'_>],
) -> Result<Vec<Outcome>> {
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let runs: BTreeSet<i64> = pending.iter().map(|p| p.run).collect();
    let read: BTreeSet<String> = pending
        .iter()
        .flat_map(|p| condition::tasks_read(p.source))
        .collect();
    let params = params_of(c, &runs).await?;
    let states = states_of(c, &runs, &read).await?;
    let outputs = if read.is_empty() {
        BTreeMap::new()
    } else {
        super::outputs::of_runs(c, &runs).await?
    };
    Ok(pending
        .iter()
        .map(|p| {
            let tasks = condition::tasks_read(p.source)
                .into_iter()
                .map(|task| {
                    let facts = TaskFacts {
                        state: states.get(&(p.run, task.clone())).copied(),
                        outputs: outputs
                            .get(&p.run)
                            .and_then(|of_run| of_run.get(&task))
                            .cloned()
                            .unwrap_or_default(),
                    };
                    (task, facts)
                })
                .collect();
            let facts = Facts {
                params: params.get(&p.run).cloned().unwrap_or_default(),
                tasks,
            };
            match condition::evaluate(p.source, &facts) {
                Ok(judged) if judged.value => Outcome::Run,
                Ok(judged) => Outcome::Skip(judged.skipped_because(p.source)),
                Err(why) => Outcome::Fail(format!("if: {} {why}", p.source)),
            }
        })
        .collect())
}

pub(crate) async fn params_of(
    c: &mut AnyConnection,
    runs: &BTreeSet<i64>,
) -> Result<BTreeMap<i64, BTreeMap<String, String>>> {
    let mut found = BTreeMap::new();
    let ids: Vec<i64> = runs.iter().copied().collect();
    for chunk in ids.chunks(NAMES_PER_STATEMENT) {
        let (list, padded) = in_list(chunk.iter().copied());
        let sql = format!("SELECT id, params_json FROM run WHERE id IN ({list})");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for run in padded {
            query = query.bind(run);
        }
        for row in query.fetch_all(&mut *c).await? {
            let params = map_json(&row.try_get::<String, _>("params_json")?, "run params")?;
            found.insert(row.try_get("id")?, params);
        }
    }
    Ok(found)
}

async fn states_of(
    c: &mut AnyConnection,
    runs: &BTreeSet<i64>,
    tasks: &BTreeSet<String>,
) -> Result<BTreeMap<(i64, String), ax_core::state::InstanceState>> {
    let mut found = BTreeMap::new();
    if tasks.is_empty() {
        return Ok(found);
    }
    let ids: Vec<i64> = runs.iter().copied().collect();
    let names: Vec<&str> = tasks.iter().map(String::as_str).collect();
    for runs in ids.chunks(NAMES_PER_STATEMENT) {
        for names in names.chunks(NAMES_PER_STATEMENT) {
            let (run_list, padded_runs) = in_list(runs.iter().copied());
            let (task_list, padded_tasks) = in_list(names.iter().copied());
            let sql = format!(
                "SELECT run_id, task_name, state FROM task_instance \
                 WHERE run_id IN ({run_list}) AND task_name IN ({task_list}) AND shard_slot = 0"
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for run in padded_runs {
                query = query.bind(run);
            }
            for task in padded_tasks {
                query = query.bind(task);
            }
            for row in query.fetch_all(&mut *c).await? {
                let state = instance_state(&row.try_get::<String, _>("state")?)?;
                found.insert((row.try_get("run_id")?, row.try_get("task_name")?), state);
            }
        }
    }
    Ok(found)
}

/// A task its rule runs but that is SKIPPED: (run, task, why: `condition_false` for its `if:`,
/// `empty_list` for its `for_each`, the line `why` shows).
pub(crate) type JudgedSkip = (i64, String, DecisionKind, String);

/// Records the decision of each task SKIPPED by its `if:` or its empty list, naming its
/// instance, in the advance's transaction.
pub(crate) async fn record_skips(
    c: &mut AnyConnection,
    workflow: i64,
    skipped: &[JudgedSkip],
    now: Millis,
) -> Result<()> {
    for (run, task, kind, because) in skipped {
        sqlx::query(
            "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, \
             task_name, kind, detail, node_id) \
             SELECT ?, ?, r.logical_time, r.id, ti.id, ti.task_name, ?, ?, ? \
             FROM run r JOIN task_instance ti ON ti.run_id = r.id \
             WHERE r.id = ? AND ti.task_name = ? AND ti.shard_slot = 0 \
             AND ti.state = 'SKIPPED'",
        )
        .bind(now)
        .bind(workflow)
        .bind(kind.as_str())
        .bind(because.as_str())
        .bind(super::queue::STORE_NODE)
        .bind(*run)
        .bind(task.as_str())
        .execute(&mut *c)
        .await?;
    }
    Ok(())
}
