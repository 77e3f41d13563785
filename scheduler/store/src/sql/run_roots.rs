//! The root instances of a new run: what a workflow version's roots are, and their insert.
//!
//! A run that starts at its creation (`run_create.rs`) and a queued run that starts later
//! (`queue.rs`) get their root instances here: attempt 1 of each task without an upstream,
//! WAITING, or DISPATCHED when the transaction's [`Placing`] places it.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::for_each::{DEFAULT_MAX_ITEMS, ForEach};
use ax_core::ids::{InstanceId, RunId, WorkflowId};
use ax_core::state::InstanceState;
use sqlx::Row;

use super::Store;
use super::conditions::{Conditioned, JudgedSkip, Outcome};
use super::counted::Counted;
use super::fan_out::{FanOut, Listed, Mapped};
use super::ids::IdKind;
use super::placing::Placing;
use super::reports::NotRun;
use super::{pow2_chunks, values_rows};
use crate::{NewAttempt, NewRun, Result};

/// What creating a run needs of its workflow version.
pub(crate) struct VersionFacts {
    pub(crate) task_count: i64,
    /// The root tasks (no upstream), by name.
    pub(crate) roots: Vec<Root>,
}

/// A task a run starts with.
pub(crate) struct Root {
    pub(crate) name: String,
    pub(crate) priority: i64,
    /// Its `if:`, judged on the run's params before it starts.
    pub(crate) condition: Option<String>,
    /// Its `for_each` (a list written in the file or a param) and `max_items`.
    pub(crate) for_each: Option<ForEach>,
    pub(crate) max_items: u32,
}

/// The root instances of one run to insert.
pub(crate) struct RootsOf<'a> {
    pub(crate) run_id: i64,
    pub(crate) workflow_id: i64,
    pub(crate) version: i64,
    pub(crate) facts: &'a VersionFacts,
    pub(crate) now: Millis,
}

impl<'a> RootsOf<'a> {
    pub(crate) fn new(run_id: i64, run: &NewRun, facts: &'a VersionFacts) -> RootsOf<'a> {
        RootsOf {
            run_id,
            workflow_id: run.workflow_id.0,
            version: i64::from(run.workflow_version),
            facts,
            now: run.now,
        }
    }
}

/// Inserts an attempt-1 instance for each root task of each run, in multi-row statements:
/// WAITING, or DISPATCHED with its attempt row when `placing` places it. Returns how many.
pub(crate) async fn insert_roots_of(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &[RootsOf<'_>],
    placing: &mut Placing<'_>,
) -> Result<usize> {
    let held = judge_roots(store, c, runs).await?;
    let rows: Vec<(&RootsOf, (&String, &i64))> = runs
        .iter()
        .flat_map(|run| {
            run.facts
                .roots
                .iter()
                .filter(|root| !held.contains(&(run.run_id, root.name.as_str())))
                .map(move |root| (run, (&root.name, &root.priority)))
        })
        .collect();
    if rows.is_empty() {
        return Ok(0);
    }
    let ids = store
        .take_ids(c.uncounted(), IdKind::Instance, rows.len())
        .await?;
    let rows: Vec<_> = rows
        .into_iter()
        .zip(ids)
        .map(|((run, (task, priority)), id)| {
            let placed = placing.place(NewAttempt {
                instance_id: InstanceId(id),
                run_id: RunId(run.run_id),
                workflow_id: WorkflowId(run.workflow_id),
                workflow_version: run.version as u32,
                task: task.clone(),
                priority: *priority as i32,
                created_at: run.now,
            });
            (run, task, *priority, id, placed)
        })
        .collect();
    for chunk in pow2_chunks(&rows) {
        let sql = format!(
            "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, \
             state, worker_id, attempt, priority, not_before, created_at) VALUES {}",
            values_rows(chunk.len(), 11)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (run, task, priority, id, (state, worker)) in chunk {
            query = query
                .bind(*id)
                .bind(run.run_id)
                .bind(run.workflow_id)
                .bind(run.version)
                .bind(task.as_str())
                .bind(*state)
                .bind(worker.clone())
                .bind(1i64)
                .bind(*priority)
                .bind(run.now)
                .bind(run.now);
        }
        query.execute(&mut *c).await?;
    }
    placing.write_attempts(c.uncounted()).await?;
    Ok(rows.len())
}

/// Judges the `if:` of the roots of `runs` that have one, then reads the list of those mapped
/// (`for_each`): a false `if:` or an empty list is SKIPPED, one that cannot be judged or read
/// FAILED, each with its instance, and what is below them is judged at once; a mapped root
/// fans out. Returns the (run, root) pairs not to insert as plain roots.
async fn judge_roots<'r>(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &'r [RootsOf<'_>],
) -> Result<BTreeSet<(i64, &'r str)>> {
    let special: Vec<(&RootsOf, &Root)> = runs
        .iter()
        .flat_map(|run| {
            run.facts
                .roots
                .iter()
                .filter(|root| root.condition.is_some() || root.for_each.is_some())
                .map(move |root| (run, root))
        })
        .collect();
    let mut held = BTreeSet::new();
    if special.is_empty() {
        return Ok(held);
    }
    let conditioned: Vec<(usize, Conditioned)> = special
        .iter()
        .enumerate()
        .filter_map(|(i, (run, root))| {
            let source = root.condition.as_deref()?;
            Some((
                i,
                Conditioned {
                    run: run.run_id,
                    source,
                },
            ))
        })
        .collect();
    let (at, pending): (Vec<usize>, Vec<Conditioned>) = conditioned.into_iter().unzip();
    let mut outcomes = vec![Outcome::Run; special.len()];
    for (i, outcome) in at
        .into_iter()
        .zip(super::conditions::judge(c.uncounted(), &pending).await?)
    {
        outcomes[i] = outcome;
    }
    let mut kinds = vec![DecisionKind::ConditionFalse; special.len()];
    let mapped: Vec<(usize, Mapped)> = special
        .iter()
        .enumerate()
        .filter(|(i, _)| outcomes[*i] == Outcome::Run)
        .filter_map(|(i, (run, root))| {
            let for_each = root.for_each.as_ref()?;
            Some((
                i,
                Mapped {
                    run: run.run_id,
                    for_each,
                    max_items: root.max_items,
                },
            ))
        })
        .collect();
    let (at, pending): (Vec<usize>, Vec<Mapped>) = mapped.into_iter().unzip();
    let mut items: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (i, listed) in at
        .into_iter()
        .zip(super::fan_out::lists(c.uncounted(), &pending).await?)
    {
        match listed {
            Listed::Items(list) => {
                items.insert(i, list);
            }
            Listed::Empty(because) => {
                outcomes[i] = Outcome::Skip(because);
                kinds[i] = DecisionKind::EmptyList;
            }
            Listed::Refused(message) => outcomes[i] = Outcome::Fail(message),
        }
    }
    // By workflow version, as the advance inserts them.
    let mut not_run: BTreeMap<(i64, i64), (Vec<NotRun>, Vec<JudgedSkip>)> = BTreeMap::new();
    let mut fans: BTreeMap<(i64, i64), Vec<FanOut>> = BTreeMap::new();
    let now = runs.first().map_or(0, |run| run.now);
    for (i, ((run, root), outcome)) in special.iter().zip(outcomes).enumerate() {
        let version = (run.workflow_id, run.version);
        let (state, message, because) = match outcome {
            Outcome::Run => {
                if let Some(list) = items.remove(&i) {
                    held.insert((run.run_id, root.name.as_str()));
                    fans.entry(version).or_default().push((
                        run.run_id,
                        root.name.clone(),
                        root.priority,
                        list,
                    ));
                }
                continue;
            }
            Outcome::Skip(because) => (InstanceState::Skipped, None, Some(because)),
            Outcome::Fail(message) => (InstanceState::Failed, Some(message), None),
        };
        held.insert((run.run_id, root.name.as_str()));
        let entry = not_run.entry(version).or_default();
        entry
            .0
            .push((run.run_id, root.name.clone(), root.priority, state, message));
        if let Some(because) = because {
            entry
                .1
                .push((run.run_id, root.name.clone(), kinds[i], because));
        }
    }
    for ((workflow, version), fans) in fans {
        super::fan_out::insert_fan_outs(store, c, workflow, version, &fans, now).await?;
    }
    let mut ended = Vec::new();
    for ((workflow, version), (rows, skips)) in not_run {
        for (run, task) in
            super::reports::insert_not_run(store, c, workflow, version, &rows, now).await?
        {
            ended.push((run, workflow, version, task));
        }
        super::conditions::record_skips(c.uncounted(), workflow, &skips, now).await?;
    }
    if !ended.is_empty() {
        // Boxed: ending a run may promote a queued one, whose roots come back here.
        Box::pin(super::reports::advance_after(
            store,
            c,
            ended,
            now,
            &mut Placing::none(),
        ))
        .await?;
    }
    Ok(held)
}

/// A workflow version's task count and root tasks, one statement; `None` when it does not
/// exist.
pub(crate) async fn facts_of_version(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
) -> Result<Option<VersionFacts>> {
    let rows = sqlx::query(
        "SELECT v.task_count, d.name, d.priority, d.run_if, d.for_each, d.max_items \
         FROM workflow_version v \
         LEFT JOIN task_definition d ON d.workflow_id = v.workflow_id \
         AND d.version = v.version AND d.start_group = 'run' \
         WHERE v.workflow_id = ? AND v.version = ? ORDER BY d.name",
    )
    .bind(workflow)
    .bind(version)
    .fetch_all(&mut *c)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut facts = VersionFacts {
        task_count: first.try_get("task_count")?,
        roots: Vec::with_capacity(rows.len()),
    };
    for row in &rows {
        if let Some(name) = row.try_get::<Option<String>, _>("name")? {
            facts.roots.push(Root {
                name,
                priority: row.try_get("priority")?,
                condition: row.try_get("run_if")?,
                for_each: row
                    .try_get::<Option<String>, _>("for_each")?
                    .map(|json| serde_json::from_str(&json))
                    .transpose()
                    .map_err(|err| super::rows::corrupt(format!("for_each: {err}")))?,
                max_items: row
                    .try_get::<Option<i64>, _>("max_items")?
                    .map_or(Ok(DEFAULT_MAX_ITEMS), |n| {
                        super::rows::to_u32(n, "max items")
                    })?,
            });
        }
    }
    Ok(Some(facts))
}
