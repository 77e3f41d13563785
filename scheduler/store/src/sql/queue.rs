//! The run queue: whether a new run starts or waits QUEUED (decided by
//! `ax_core::firing::start_or_queue` inside the run-creation transaction), and the promotion of
//! queued runs when a run ends by any path.
//!
//! Race-free across scheduler nodes: on MySQL the workflow row is locked (`FOR UPDATE`) before
//! the active and same-key runs are counted, so two nodes creating or promoting runs of one
//! workflow take turns; SQLite serializes writers anyway. Every run end locks the workflow row
//! before looking for queued runs: shared, so that run ends on several nodes do not queue
//! behind each other, and exclusively to promote one (`sql/locks.rs`, [`promote`]). Lock order
//! is run rows, then the workflow rows (all those a run end needs, ascending: `sql/locks.rs`),
//! then the queued run's row, which is started by a conditional update (`state = 'QUEUED'`), so
//! a concurrent cancel of that run (which locks the workflow row first too) wins or loses
//! cleanly.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::firing::{Admission, QueueReason, RunLimits, RunLoad, start_or_queue};
use ax_core::ids::{RunId, WorkflowId};
use ax_core::spec::{ConcurrencySpec, OverlapPolicy, ScheduleSpec, TriggerKind};
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::engine::{Locked, touch};
use super::placing::Placing;
use super::rows::{corrupt, to_u32};
use super::run_roots::{RootsOf, facts_of_version, insert_roots_of};
use super::{Store, in_list};
use crate::{NewRun, Result};

/// Queued runs looked at per promotion.
const PROMOTE_SCAN: i64 = 500;
/// `run.run_key` is a VARCHAR(191): longer keys are cut (two keys that share their first 191
/// characters then share a limit: stricter, never looser).
const MAX_KEY_CHARS: usize = 191;
/// The decision log's node column for decisions the store makes inside a transaction.
pub(crate) const STORE_NODE: &str = "store";

/// What the queue needs from a workflow's latest version.
#[derive(serde::Deserialize, Default)]
struct LimitsSpec {
    #[serde(default)]
    schedule: ScheduleSpec,
    #[serde(default)]
    concurrency: ConcurrencySpec,
}

pub(crate) struct Limits {
    limits: RunLimits,
    concurrency: ConcurrencySpec,
}

impl Limits {
    /// The limits of a stored spec (`workflow_version.spec_json`).
    pub(crate) fn from_spec_json(spec_json: &str) -> Result<Limits> {
        let spec: LimitsSpec = serde_json::from_str(spec_json)
            .map_err(|err| corrupt(format!("stored workflow spec: {err}")))?;
        Ok(Limits::from_spec(spec))
    }

    fn from_spec(spec: LimitsSpec) -> Limits {
        let max_runs_per_key = spec
            .concurrency
            .key
            .is_some()
            .then_some(spec.concurrency.max_runs_per_key.max(1));
        Limits {
            limits: RunLimits {
                overlap: spec.schedule.overlap,
                max_active_runs: spec.schedule.max_active_runs,
                max_runs_per_key,
            },
            concurrency: spec.concurrency,
        }
    }

    pub(crate) fn none() -> Limits {
        Limits::from_spec(LimitsSpec::default())
    }

    /// Whether any run of the workflow could ever wait.
    pub(crate) fn limited(&self) -> bool {
        self.limits.max_active_runs > 0
            || self.limits.max_runs_per_key.is_some()
            || self.limits.overlap == OverlapPolicy::Queue
    }

    pub(crate) fn run_key(&self, params: &BTreeMap<String, String>) -> Option<String> {
        self.concurrency
            .run_key(params)
            .map(|key| key.chars().take(MAX_KEY_CHARS).collect())
    }
}

/// Cron and dependency fires obey overlap `queue`; manual, API and backfill runs only the caps.
fn scheduled(trigger: TriggerKind) -> bool {
    matches!(trigger, TriggerKind::Cron | TriggerKind::Dependency)
}

pub(crate) async fn limits(c: &mut AnyConnection, workflow_id: WorkflowId) -> Result<Limits> {
    let row = sqlx::query(
        "SELECT v.spec_json FROM workflow w JOIN workflow_version v \
         ON v.workflow_id = w.id AND v.version = w.latest_version WHERE w.id = ?",
    )
    .bind(workflow_id.0)
    .fetch_optional(&mut *c)
    .await?;
    match row {
        Some(row) => Limits::from_spec_json(&row.try_get::<String, _>("spec_json")?),
        None => Ok(Limits::none()),
    }
}

pub(crate) async fn lock_workflow(
    store: &Store,
    c: &mut AnyConnection,
    id: WorkflowId,
) -> Result<()> {
    let sql = format!(
        "SELECT id FROM workflow WHERE id = ?{}",
        store.dialect.for_update()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    touch(store, &mut Counted::new(c), Locked::Workflow, &[id.0]).await
}

/// Runs of the workflow in `state` (with `key` when given; only unscheduled ones when
/// `unscheduled_only`).
async fn count(
    c: &mut AnyConnection,
    workflow_id: WorkflowId,
    state: &str,
    key: Option<&str>,
    unscheduled_only: bool,
) -> Result<u32> {
    let mut sql = String::from("SELECT COUNT(*) AS n FROM run WHERE workflow_id = ? AND state = ?");
    if key.is_some() {
        sql.push_str(" AND run_key = ?");
    }
    if unscheduled_only {
        sql.push_str(" AND trigger_type NOT IN ('cron', 'dependency')");
    }
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(workflow_id.0)
        .bind(state);
    if let Some(key) = key {
        query = query.bind(key);
    }
    let n: i64 = query.fetch_one(&mut *c).await?.try_get("n")?;
    to_u32(n, "run count")
}

/// The decision for a run about to be created under `limits`: `(start?, run key)`. Locks the
/// workflow row first when the workflow has limits.
pub(crate) async fn admit(
    store: &Store,
    c: &mut AnyConnection,
    limits: &Limits,
    run: &NewRun,
) -> Result<(Admission, Option<String>)> {
    let key = limits.run_key(&run.params);
    if !limits.limited() {
        return Ok((Admission::Start, key));
    }
    let workflow_id = run.workflow_id;
    lock_workflow(store, c, workflow_id).await?;
    let active = count(c, workflow_id, "RUNNING", None, false).await?;
    // A manual, API or backfill run does not wait behind scheduled fires that are queued only
    // by overlap `queue` (with room under the caps, that is the only reason they can wait).
    let unscheduled_only = !scheduled(run.trigger);
    let (active_same_key, queued_ahead) = match &key {
        Some(key) => (
            count(c, workflow_id, "RUNNING", Some(key), false).await?,
            count(c, workflow_id, "QUEUED", Some(key), unscheduled_only).await?,
        ),
        None => (
            active,
            count(c, workflow_id, "QUEUED", None, unscheduled_only).await?,
        ),
    };
    let load = RunLoad {
        active,
        active_same_key,
        queued_ahead,
    };
    Ok((
        start_or_queue(limits.limits, scheduled(run.trigger), load),
        key,
    ))
}

/// Inserts a WAITING attempt-1 instance for each root task of the version (a promoted run).
async fn insert_roots(
    store: &Store,
    c: &mut AnyConnection,
    workflow_id: WorkflowId,
    version: i64,
    run_id: i64,
    now: Millis,
) -> Result<()> {
    let mut c = Counted::new(c);
    let facts = facts_of_version(&mut c, workflow_id.0, version)
        .await?
        .ok_or_else(|| corrupt(format!("workflow {workflow_id} version {version} vanished")))?;
    let roots = RootsOf {
        run_id,
        workflow_id: workflow_id.0,
        version,
        facts: &facts,
        now,
    };
    insert_roots_of(store, &mut c, &[roots], &mut Placing::none()).await?;
    Ok(())
}

pub(crate) async fn record(
    c: &mut AnyConnection,
    workflow_id: WorkflowId,
    run_id: RunId,
    slot_at: Millis,
    kind: DecisionKind,
    detail: &str,
    now: Millis,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, task_name, \
         kind, detail, node_id) VALUES (?, ?, ?, ?, NULL, NULL, ?, ?, ?)",
    )
    .bind(now)
    .bind(workflow_id.0)
    .bind(slot_at)
    .bind(run_id.0)
    .bind(kind.as_str())
    .bind(detail)
    .bind(STORE_NODE)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Starts the oldest queued runs of the run's workflow that now fit, in creation order, and
/// returns them. Called in the transaction that ended a run (or cancelled a queued one).
pub(crate) async fn promote_after(
    store: &Store,
    c: &mut AnyConnection,
    ended_run: RunId,
    now: Millis,
) -> Result<Vec<RunId>> {
    let row = sqlx::query("SELECT workflow_id FROM run WHERE id = ?")
        .bind(ended_run.0)
        .fetch_optional(&mut *c)
        .await?;
    let Some(row) = row else {
        return Ok(Vec::new());
    };
    let workflow_id = WorkflowId(row.try_get("workflow_id")?);
    promote(store, c, workflow_id, now).await
}

/// Starts what now fits of the queued runs of each of `workflows` (the workflows of runs that
/// just ended, their rows locked already: `sql/locks.rs`). One probe for the whole set; most
/// workflows never queue.
pub(crate) async fn promote_queued_of(
    store: &Store,
    c: &mut Counted<'_>,
    workflows: &BTreeSet<i64>,
    now: Millis,
) -> Result<()> {
    if workflows.is_empty() {
        return Ok(());
    }
    let (list, padded) = in_list(workflows.iter().copied());
    let sql = format!(
        "SELECT DISTINCT workflow_id FROM run WHERE workflow_id IN ({list}) AND state = 'QUEUED'"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for workflow in padded {
        query = query.bind(workflow);
    }
    let mut waiting = BTreeSet::new();
    for row in query.fetch_all(&mut *c).await? {
        waiting.insert(row.try_get::<i64, _>("workflow_id")?);
    }
    for workflow in waiting {
        promote(store, c.uncounted(), WorkflowId(workflow), now).await?;
    }
    Ok(())
}

pub(crate) async fn promote(
    store: &Store,
    c: &mut AnyConnection,
    workflow_id: WorkflowId,
    now: Millis,
) -> Result<Vec<RunId>> {
    let queued_sql = "SELECT id, run_key, trigger_type, workflow_version, logical_time FROM run \
                      WHERE workflow_id = ? AND state = 'QUEUED' ORDER BY id LIMIT ?";
    // The workflow row is locked before the check, always (one primary-key lock): a run being
    // created concurrently holds it from its count to its commit, so either this check waits
    // and then sees that run QUEUED, or the creator waits and then counts this run ended.
    // Checked without the lock (READ COMMITTED), a run queued behind the ending run would stay
    // QUEUED with nothing running. Not only when the latest version has limits: queued runs of
    // an earlier, limited version must still start after an apply removed the limits.
    lock_workflow(store, c, workflow_id).await?;
    // Most workflows never queue: one indexed read (migration 0007) and out.
    let any = sqlx::query(queued_sql)
        .bind(workflow_id.0)
        .bind(1i64)
        .fetch_optional(&mut *c)
        .await?;
    if any.is_none() {
        return Ok(Vec::new());
    }
    let queued = sqlx::query(queued_sql)
        .bind(workflow_id.0)
        .bind(PROMOTE_SCAN)
        .fetch_all(&mut *c)
        .await?;
    let limits = limits(c, workflow_id).await?;
    let mut active = count(c, workflow_id, "RUNNING", None, false).await?;
    let mut per_key: BTreeMap<String, u32> = BTreeMap::new();
    if limits.limits.max_runs_per_key.is_some() {
        let rows = sqlx::query(
            "SELECT run_key, COUNT(*) AS n FROM run WHERE workflow_id = ? AND state = 'RUNNING' \
             AND run_key IS NOT NULL GROUP BY run_key",
        )
        .bind(workflow_id.0)
        .fetch_all(&mut *c)
        .await?;
        for row in rows {
            per_key.insert(
                row.try_get("run_key")?,
                to_u32(row.try_get("n")?, "run count")?,
            );
        }
    }
    // Keys (None = the whole workflow, unkeyed) with an older queued run still waiting: for
    // every run, or (overlap `queue`) for scheduled fires only.
    let mut blocked: BTreeSet<Option<String>> = BTreeSet::new();
    let mut blocked_scheduled: BTreeSet<Option<String>> = BTreeSet::new();
    let mut promoted = Vec::new();
    for row in queued {
        let id = RunId(row.try_get("id")?);
        let key: Option<String> = row.try_get("run_key")?;
        let trigger: String = row.try_get("trigger_type")?;
        let trigger = TriggerKind::parse(&trigger)
            .ok_or_else(|| corrupt(format!("unknown trigger type {trigger:?}")))?;
        let keyed = limits.limits.max_runs_per_key.is_some();
        let slot = if keyed { key.clone() } else { None };
        let active_same_key = if keyed {
            key.as_ref()
                .map_or(0, |k| per_key.get(k).copied().unwrap_or(0))
        } else {
            active
        };
        let ahead =
            blocked.contains(&slot) || (scheduled(trigger) && blocked_scheduled.contains(&slot));
        let load = RunLoad {
            active,
            active_same_key,
            queued_ahead: u32::from(ahead),
        };
        if let Admission::Queue(reason) = start_or_queue(limits.limits, scheduled(trigger), load) {
            if reason == QueueReason::Overlap {
                blocked_scheduled.insert(slot);
            } else {
                blocked.insert(slot);
            }
            if limits.limits.max_active_runs > 0 && active >= limits.limits.max_active_runs {
                break;
            }
            continue;
        }
        // A deadline that is a duration counts from now, the run's start.
        let done = sqlx::query(
            "UPDATE run SET state = 'RUNNING', \
             deadline_at = COALESCE(? + deadline_after_ms, deadline_at) \
             WHERE id = ? AND state = 'QUEUED'",
        )
        .bind(now)
        .bind(id.0)
        .execute(&mut *c)
        .await?;
        if done.rows_affected() != 1 {
            continue;
        }
        let version: i64 = row.try_get("workflow_version")?;
        insert_roots(store, c, workflow_id, version, id.0, now).await?;
        active += 1;
        if let Some(k) = &key {
            *per_key.entry(k.clone()).or_default() += 1;
        }
        let logical_time: Millis = row.try_get("logical_time")?;
        record(
            c,
            workflow_id,
            id,
            logical_time,
            DecisionKind::Dequeued,
            &format!("run {id} started: {active} active runs now"),
            now,
        )
        .await?;
        promoted.push(id);
    }
    Ok(promoted)
}
