//! Run creation, a group at a time: the runs the run creator gathered (manual and API triggers,
//! cron fires) are created in one transaction with a few statements for the whole group, not a
//! few per run. What the group needs is read once (the runs that exist already under a dedup
//! key, each workflow's limits, each workflow version's task count and root tasks); the runs
//! of workflows without limits, which always start, are inserted together, then their root
//! instances together; the answers are the rows as inserted, not read back. A run of a
//! workflow with limits is decided and inserted on its own, in order, so that its admission
//! counts the runs before it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::admission::{Origin, past_detail};
use ax_core::audit_text;
use ax_core::decision::DecisionKind;
use ax_core::firing::Admission;
use ax_core::ids::RunId;
use ax_core::run::{RunProgress, RunState, run_outcome};
use sqlx::{AnyConnection, Row};

use super::audit;
use super::counted::Counted;
use super::deadlines::{DeadlineColumns, RunDeadline};
use super::ids::IdKind;
use super::placing::Placing;
use super::queue::{self, Limits};
use super::rows::{self, corrupt, to_json};
use super::run_roots::{RootsOf, VersionFacts, facts_of_version, insert_roots_of};
use super::{Store, db_errors, in_list, pow2_chunks, values_rows, write_tx};
use crate::{
    AuditRecord, NewRun, NoPlacement, PlacedAttempt, Placement, Result, RunRecord, StoreError,
};

impl Store {
    /// Creates the run and a WAITING first attempt for each root task of its version, in one
    /// transaction. Returns the existing run and `false` when the dedup key is taken.
    /// Inside the same transaction (the workflow row locked on MySQL) the store decides, by
    /// `ax_core::firing::start_or_queue` with the latest version's limits, whether the run
    /// starts or is created QUEUED, without instances (a `queued` decision is recorded). When a
    /// run ends by any path, the oldest queued runs of its workflow that now fit are started in
    /// that transaction (`dequeued` decisions).
    pub async fn create_run(&self, run: &NewRun) -> Result<(RunRecord, bool)> {
        let mut created = self.create_runs(std::slice::from_ref(run)).await?;
        created
            .pop()
            .ok_or_else(|| corrupt("a run create returned nothing"))
    }

    /// `create_run` for several runs in one transaction, in order (each sees the ones before
    /// it). On an error nothing is created; the caller may retry the runs one by one.
    pub async fn create_runs(&self, runs: &[NewRun]) -> Result<Vec<(RunRecord, bool)>> {
        Ok(self.create_runs_placed(runs, &mut NoPlacement).await?.0)
    }

    /// `create_runs`, with each new root instance offered to `placement`: the ones it places
    /// are created DISPATCHED and returned (see [`Placement`]).
    pub async fn create_runs_placed(
        &self,
        runs: &[NewRun],
        placement: &mut dyn Placement,
    ) -> Result<(Vec<(RunRecord, bool)>, Vec<PlacedAttempt>)> {
        if runs.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let now = runs.iter().map(|run| run.now).max().unwrap_or_default();
        write_tx!(self, |c| async {
            let mut placing = Placing::new(&mut *placement, now);
            let mut counted = Counted::new(&mut *c);
            let created = create_runs_tx(self, &mut counted, runs, &mut placing).await;
            self.count_create_statements(counted.statements());
            let created = created?.into_iter().map(Into::into).collect();
            Ok((created, placing.finish(c).await?))
        })
    }
}

/// The outcome of creating one run.
pub(crate) enum Created {
    New(RunRecord),
    Existing(RunRecord),
}

impl From<Created> for (RunRecord, bool) {
    fn from(created: Created) -> Self {
        match created {
            Created::New(record) => (record, true),
            Created::Existing(record) => (record, false),
        }
    }
}

/// Creates one run (a dependent workflow's run at an upstream's end, a single trigger).
pub(crate) async fn create_run_tx(
    store: &Store,
    c: &mut AnyConnection,
    run: &NewRun,
) -> Result<Created> {
    let created = create_runs_tx(
        store,
        &mut Counted::new(c),
        std::slice::from_ref(run),
        &mut Placing::none(),
    )
    .await?;
    created
        .into_iter()
        .next()
        .ok_or_else(|| corrupt("a run create returned nothing"))
}

/// How far each run of a group got.
enum Plan {
    /// It existed before the group, under its dedup key.
    Existing(RunRecord),
    /// An earlier run of the group has its dedup key: the answer is that run.
    SameAs(usize),
    /// Inserted as this.
    New(RunRecord),
    /// To insert with the group's runs without limits.
    Batched,
}

/// What creating a run needs of its workflow: its name (for the answer) and its limits (from
/// its latest version).
pub(crate) struct WorkflowFacts {
    name: String,
    /// Its app, for the bounds on waiting instances.
    app: String,
    limits: Limits,
    deadline: RunDeadline,
}

/// Creates `runs` in the caller's transaction, in order; a run whose (workflow, dedup key)
/// exists already, before or earlier in the group, is answered with that run. Any error (a
/// workflow version that does not exist, say) fails the whole group.
pub(crate) async fn create_runs_tx(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &[NewRun],
    placing: &mut Placing<'_>,
) -> Result<Vec<Created>> {
    let mut known = runs_by_dedup(c, runs).await?;
    let versions = version_facts(c, runs).await?;
    let workflows = workflow_facts(c, runs).await?;

    let mut plans = Vec::with_capacity(runs.len());
    let mut claimed: HashMap<(i64, &str), usize> = HashMap::new();
    let mut batched = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let dedup = run.dedup_key.as_deref().map(|key| (run.workflow_id.0, key));
        if let Some(key) = dedup {
            if let Some(record) = known.remove(&(key.0, key.1.to_string())) {
                plans.push(Plan::Existing(record));
                claimed.insert(key, i);
                continue;
            }
            if let Some(first) = claimed.get(&key) {
                plans.push(Plan::SameAs(*first));
                continue;
            }
            claimed.insert(key, i);
        }
        let workflow = workflow_of(&workflows, run)?;
        let facts = facts_of(&versions, run)?;
        if workflow.limits.limited() {
            plans.push(insert_one(store, c, run, workflow, facts).await?);
        } else {
            plans.push(Plan::Batched);
            batched.push(i);
        }
    }
    if !batched.is_empty() {
        let inserted =
            insert_started(store, c, runs, &batched, &workflows, &versions, placing).await?;
        for (i, plan) in batched.into_iter().zip(inserted) {
            plans[i] = plan;
        }
    }

    let mut created: Vec<Created> = Vec::with_capacity(plans.len());
    for plan in plans {
        let outcome = match plan {
            Plan::Existing(record) => Created::Existing(record),
            Plan::SameAs(first) => match created.get(first) {
                Some(Created::New(record) | Created::Existing(record)) => {
                    Created::Existing(record.clone())
                }
                None => return Err(corrupt("a run's dedup twin comes after it")),
            },
            Plan::New(record) => Created::New(record),
            Plan::Batched => return Err(corrupt("a batched run was not inserted")),
        };
        created.push(outcome);
    }
    insert_trigger_audits(c, runs, &created).await?;
    insert_past_bound_decisions(store, c, runs, &created, &workflows).await?;
    Ok(created)
}

/// The `admitted_over_bound` decisions of the new runs that are never refused (cron and
/// dependency fires, child runs, backfill slots) and were created past a bound on waiting
/// instances, as the node's bounds say (`Store::set_waiting_bounds`), in the runs' transaction.
/// Requests (API triggers) were judged before they came here. Rare, so sent outside the
/// statement count.
async fn insert_past_bound_decisions(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &[NewRun],
    created: &[Created],
    workflows: &HashMap<i64, WorkflowFacts>,
) -> Result<()> {
    let Some(bounds) = store.waiting_bounds.get() else {
        return Ok(());
    };
    let mut decisions = Vec::new();
    for (run, created) in runs.iter().zip(created) {
        let Created::New(record) = created else {
            continue;
        };
        if Origin::of(run.trigger) != Origin::Fact {
            continue;
        }
        let app = workflow_of(workflows, run)?.app.as_str();
        if let Some(past) = bounds.past_bound(app, run.trigger, run.now) {
            decisions.push((record.id, run, past_detail(run.trigger, app, &past)));
        }
    }
    let node = bounds.node_id().to_string();
    for chunk in pow2_chunks(&decisions) {
        let sql = format!(
            "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, task_name, \
             kind, detail, node_id) VALUES {}",
            values_rows(chunk.len(), 9)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, run, detail) in chunk {
            query = query
                .bind(run.now)
                .bind(run.workflow_id.0)
                .bind(run.logical_time)
                .bind(id.0)
                .bind(None::<i64>)
                .bind(None::<String>)
                .bind(DecisionKind::AdmittedOverBound.as_str())
                .bind(detail.clone())
                .bind(node.clone());
        }
        query.execute(c.uncounted()).await?;
    }
    Ok(())
}

/// The `trigger` audit rows of the new runs that asked for one, in the runs' transaction: a
/// burst of API triggers costs no commits of its own for its audit trail.
async fn insert_trigger_audits(
    c: &mut Counted<'_>,
    runs: &[NewRun],
    created: &[Created],
) -> Result<()> {
    let records: Vec<AuditRecord> = runs
        .iter()
        .zip(created)
        .filter_map(|(run, created)| match (created, &run.audit_from) {
            (Created::New(record), Some(caller)) => Some(AuditRecord {
                at: run.now,
                actor: run.triggered_by.clone(),
                action: "trigger".into(),
                target: format!("workflow/{}", record.workflow),
                detail: audit_text::trigger(record.id, &run.params),
                remote: caller.remote.clone(),
                token: caller.token.clone(),
            }),
            _ => None,
        })
        .collect();
    audit::insert_rows(c, &records).await
}

fn workflow_of<'a>(
    workflows: &'a HashMap<i64, WorkflowFacts>,
    run: &NewRun,
) -> Result<&'a WorkflowFacts> {
    workflows
        .get(&run.workflow_id.0)
        .ok_or_else(|| StoreError::NotFound(format!("workflow {}", run.workflow_id)))
}

fn facts_of<'a>(
    versions: &'a HashMap<(i64, i64), VersionFacts>,
    run: &NewRun,
) -> Result<&'a VersionFacts> {
    versions
        .get(&(run.workflow_id.0, i64::from(run.workflow_version)))
        .ok_or_else(|| {
            StoreError::NotFound(format!(
                "workflow {} version {}",
                run.workflow_id, run.workflow_version
            ))
        })
}

/// The state a new run starts in, and its end time when it ends at once (no tasks at all).
fn initial_state(
    admission: &Admission,
    facts: &VersionFacts,
    now: Millis,
) -> (RunState, Option<Millis>) {
    match admission {
        Admission::Queue(_) => (RunState::Queued, None),
        Admission::Start if facts.task_count == 0 => match run_outcome(RunProgress::default()) {
            Some(end) => (end, Some(now)),
            None => (RunState::Running, None),
        },
        Admission::Start => (RunState::Running, None),
    }
}

const RUN_COLUMNS: &str = "INSERT INTO run (id, workflow_id, workflow_version, state, trigger_type, \
     logical_time, dedup_key, idempotency_key, params_json, triggered_by, cancel_requested, \
     created_at, run_key, finished_at, deadline_at, deadline_after_ms) VALUES ";
const RUN_VALUES: usize = 16;

/// One row of a run insert, bound in `RUN_COLUMNS` order.
struct RunRow<'a> {
    id: i64,
    run: &'a NewRun,
    state: RunState,
    params_json: String,
    run_key: Option<String>,
    finished_at: Option<Millis>,
    deadline: DeadlineColumns,
}

impl RunRow<'_> {
    /// The run as this row stores it.
    fn record(&self, workflow: &WorkflowFacts) -> RunRecord {
        let run = self.run;
        RunRecord {
            id: RunId(self.id),
            workflow_id: run.workflow_id,
            workflow: workflow.name.clone(),
            workflow_version: run.workflow_version,
            state: self.state,
            trigger: run.trigger,
            logical_time: run.logical_time,
            idempotency_key: run.idempotency_key.clone(),
            params: run.params.clone(),
            triggered_by: run.triggered_by.clone(),
            created_at: run.now,
            finished_at: self.finished_at,
            cancel_requested: false,
            run_key: self.run_key.clone(),
            deadline_at: self.deadline.0,
            deadline_missed_at: None,
            // A child run gets its parent in the transaction that starts it (`sub_workflows`).
            parent_run_id: None,
            parent_instance_id: None,
        }
    }
}

fn bind_run<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    row: &RunRow<'_>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    let run = row.run;
    query
        .bind(row.id)
        .bind(run.workflow_id.0)
        .bind(i64::from(run.workflow_version))
        .bind(row.state.as_str())
        .bind(run.trigger.as_str())
        .bind(run.logical_time)
        .bind(run.dedup_key.clone())
        .bind(run.idempotency_key.clone())
        .bind(row.params_json.clone())
        .bind(run.triggered_by.clone())
        .bind(0i64)
        .bind(run.now)
        .bind(row.run_key.clone())
        .bind(row.finished_at)
        .bind(row.deadline.0)
        .bind(row.deadline.1)
}

/// Decides and inserts one run with its root instances: its admission (for a workflow with
/// limits, counted under the workflow row's lock), the run, and either its root instances or,
/// when it waits, the decision that says why.
async fn insert_one(
    store: &Store,
    c: &mut Counted<'_>,
    run: &NewRun,
    workflow: &WorkflowFacts,
    facts: &VersionFacts,
) -> Result<Plan> {
    let (admission, run_key) = queue::admit(store, c.uncounted(), &workflow.limits, run).await?;
    let (state, finished_at) = initial_state(&admission, facts, run.now);
    let id = store.take_ids(c.uncounted(), IdKind::Run, 1).await?[0];
    let row = RunRow {
        id,
        run,
        state,
        params_json: to_json(&run.params)?,
        run_key,
        finished_at,
        deadline: workflow.deadline.columns(run, state),
    };
    let sql = format!("{RUN_COLUMNS}{}", values_rows(1, RUN_VALUES));
    let inserted = bind_run(sqlx::query(sqlx::AssertSqlSafe(sql)), &row)
        .execute(&mut *c)
        .await;
    match inserted {
        Ok(_) => {}
        // Another node created the run with this key between our read and our insert: the
        // unique key decides, and the first run is the answer.
        Err(err) if db_errors::is_unique_violation(&err) => {
            let mut existing = runs_by_dedup(c, std::slice::from_ref(run)).await?;
            return match existing.drain().next() {
                Some((_, record)) => Ok(Plan::Existing(record)),
                None => Err(StoreError::Database(err)),
            };
        }
        Err(err) => return Err(err.into()),
    }
    match admission {
        // A queued run has no instances until it is promoted (`queue::promote`). The decision
        // names the run already; the detail says why.
        Admission::Queue(reason) => {
            queue::record(
                c.uncounted(),
                run.workflow_id,
                RunId(id),
                run.logical_time,
                DecisionKind::Queued,
                &reason.describe(),
                run.now,
            )
            .await?;
        }
        Admission::Start => {
            insert_roots_of(
                store,
                c,
                &[RootsOf::new(id, run, facts)],
                &mut Placing::none(),
            )
            .await?;
        }
    }
    Ok(Plan::New(row.record(workflow)))
}

/// Inserts the runs of `positions` (all of workflows without limits: they start) in multi-row
/// statements, then all their root instances. When another node inserted one of their dedup
/// keys since the group's read, the statement fails whole and each run is inserted on its own
/// instead, the unique key deciding which run is the answer.
async fn insert_started(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &[NewRun],
    positions: &[usize],
    workflows: &HashMap<i64, WorkflowFacts>,
    versions: &HashMap<(i64, i64), VersionFacts>,
    placing: &mut Placing<'_>,
) -> Result<Vec<Plan>> {
    let ids = store
        .take_ids(c.uncounted(), IdKind::Run, positions.len())
        .await?;
    let mut rows = Vec::with_capacity(positions.len());
    for (&i, id) in positions.iter().zip(&ids) {
        let run = &runs[i];
        let facts = facts_of(versions, run)?;
        let workflow = workflow_of(workflows, run)?;
        let run_key = workflow.limits.run_key(&run.params);
        let (state, finished_at) = initial_state(&Admission::Start, facts, run.now);
        rows.push(RunRow {
            id: *id,
            run,
            state,
            params_json: to_json(&run.params)?,
            run_key,
            finished_at,
            deadline: workflow.deadline.columns(run, state),
        });
    }
    for chunk in pow2_chunks(&rows) {
        let sql = format!("{RUN_COLUMNS}{}", values_rows(chunk.len(), RUN_VALUES));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for row in chunk {
            query = bind_run(query, row);
        }
        match query.execute(&mut *c).await {
            Ok(_) => {}
            Err(err) if db_errors::is_unique_violation(&err) => {
                // The failed statement inserted nothing, earlier chunks are in (without
                // instances yet): take them out, then go one by one. Rare (a race on a dedup
                // key between two nodes), so simple.
                let (list, padded) = in_list(ids.iter().copied());
                let sql = format!("DELETE FROM run WHERE id IN ({list})");
                let mut delete = sqlx::query(sqlx::AssertSqlSafe(sql));
                for id in padded {
                    delete = delete.bind(id);
                }
                delete.execute(&mut *c).await?;
                let mut plans = Vec::with_capacity(positions.len());
                for &i in positions {
                    let run = &runs[i];
                    let (workflow, facts) =
                        (workflow_of(workflows, run)?, facts_of(versions, run)?);
                    plans.push(insert_one(store, c, run, workflow, facts).await?);
                }
                return Ok(plans);
            }
            Err(err) => return Err(err.into()),
        }
    }
    let roots: Vec<RootsOf> = rows
        .iter()
        .map(|row| Ok(RootsOf::new(row.id, row.run, facts_of(versions, row.run)?)))
        .collect::<Result<_>>()?;
    for row in &rows {
        placing.run_facts(
            row.id,
            row.run.logical_time,
            &row.run.params,
            BTreeMap::new(),
            0,
        );
    }
    insert_roots_of(store, c, &roots, placing).await?;
    rows.iter()
        .map(|row| Ok(Plan::New(row.record(workflow_of(workflows, row.run)?))))
        .collect()
}

/// The runs that exist under the dedup keys of `runs`, by (workflow, key): one statement.
async fn runs_by_dedup(
    c: &mut Counted<'_>,
    runs: &[NewRun],
) -> Result<HashMap<(i64, String), RunRecord>> {
    let keys: BTreeSet<(i64, &str)> = runs
        .iter()
        .filter_map(|run| Some((run.workflow_id.0, run.dedup_key.as_deref()?)))
        .collect();
    let mut found = HashMap::new();
    if keys.is_empty() {
        return Ok(found);
    }
    let workflows: BTreeSet<i64> = keys.iter().map(|(workflow, _)| *workflow).collect();
    let names: BTreeSet<&str> = keys.iter().map(|(_, key)| *key).collect();
    let (workflow_list, workflows) = in_list(workflows);
    let (name_list, names) = in_list(names);
    let sql = format!(
        "{} WHERE r.workflow_id IN ({workflow_list}) AND r.dedup_key IN ({name_list})",
        rows::RUN_SELECT.replacen("SELECT ", "SELECT r.dedup_key, ", 1)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for workflow in workflows {
        query = query.bind(workflow);
    }
    for name in names {
        query = query.bind(name);
    }
    for row in query.fetch_all(&mut *c).await? {
        let record = rows::run(&row)?;
        let key: String = row.try_get("dedup_key")?;
        if keys.contains(&(record.workflow_id.0, key.as_str())) {
            found.insert((record.workflow_id.0, key), record);
        }
    }
    Ok(found)
}

/// The facts of each (workflow, version) of `runs`: one statement per version (a group is
/// almost always of one or a few workflows). A version that does not exist is left out.
async fn version_facts(
    c: &mut Counted<'_>,
    runs: &[NewRun],
) -> Result<HashMap<(i64, i64), VersionFacts>> {
    let wanted: BTreeSet<(i64, i64)> = runs
        .iter()
        .map(|run| (run.workflow_id.0, i64::from(run.workflow_version)))
        .collect();
    let mut facts = HashMap::with_capacity(wanted.len());
    for (workflow, version) in wanted {
        if let Some(found) = facts_of_version(c, workflow, version).await? {
            facts.insert((workflow, version), found);
        }
    }
    Ok(facts)
}

/// The name and limits of each workflow of `runs`, one statement; a workflow that does not
/// exist or was deleted is left out (its run is refused: a deleted workflow runs no more).
async fn workflow_facts(
    c: &mut Counted<'_>,
    runs: &[NewRun],
) -> Result<HashMap<i64, WorkflowFacts>> {
    let workflows: BTreeSet<i64> = runs.iter().map(|run| run.workflow_id.0).collect();
    let mut facts = HashMap::with_capacity(workflows.len());
    if workflows.is_empty() {
        return Ok(facts);
    }
    let (list, padded) = in_list(workflows);
    let sql = format!(
        "SELECT w.id, w.name, w.app, v.spec_json FROM workflow w JOIN workflow_version v \
         ON v.workflow_id = w.id AND v.version = w.latest_version WHERE w.id IN ({list}) \
         AND w.deleted_at IS NULL"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for workflow in padded {
        query = query.bind(workflow);
    }
    for row in query.fetch_all(&mut *c).await? {
        let spec_json = row.try_get::<String, _>("spec_json")?;
        let limits = Limits::from_spec_json(&spec_json)?;
        facts.insert(
            row.try_get("id")?,
            WorkflowFacts {
                name: row.try_get("name")?,
                app: row.try_get("app")?,
                limits,
                deadline: RunDeadline::from_spec_json(&spec_json)?,
            },
        );
    }
    Ok(facts)
}
