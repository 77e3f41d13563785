//! Runs' deadlines: set when a run is created (a wall-clock deadline, or a duration for a run
//! that starts at once) or leaves the queue (`queue::promote`), and judged missed once.
//!
//! A run's deadline comes from its workflow's latest version, as its limits do, and is computed
//! by `ax_core::deadline`. Judging is a conditional update of `deadline_missed_at` (still NULL,
//! the run still active, its deadline passed): two nodes judging at once cannot both win, and
//! the winner's decision (and with `on_deadline: cancel` the run's cancel) is written in the
//! same transaction, so a run missed is never left without its decision or its cancel.

use std::collections::BTreeSet;

use ax_core::Millis;
use ax_core::deadline::Deadline;
use ax_core::decision::DecisionKind;
use ax_core::ids::WorkflowId;
use ax_core::run::RunState;
use ax_core::spec::ScheduleSpec;
use sqlx::AnyConnection;

use super::cancel::cancel_run_tx;
use super::instance_locks::lock_runs;
use super::queue::lock_workflow;
use super::rows::{self, corrupt};
use super::runs::run_by_id;
use super::{Store, write_tx};
use crate::{DeadlineMiss, MissedDeadline, NewRun, Result, RunRecord};

/// What a run's deadline needs of its workflow's stored spec.
#[derive(serde::Deserialize, Default)]
struct DeadlineSpec {
    #[serde(default)]
    schedule: ScheduleSpec,
    #[serde(default)]
    deadline: Option<Deadline>,
}

/// A workflow's deadline rule, read from its latest version's spec.
#[derive(Default)]
pub(crate) struct RunDeadline {
    deadline: Option<Deadline>,
    timezone: String,
}

/// The deadline columns of a new run: `deadline_at`, `deadline_after_ms`.
pub(crate) type DeadlineColumns = (Option<Millis>, Option<i64>);

impl RunDeadline {
    /// The rule of a stored spec (`workflow_version.spec_json`).
    pub(crate) fn from_spec_json(spec_json: &str) -> Result<RunDeadline> {
        let spec: DeadlineSpec = serde_json::from_str(spec_json)
            .map_err(|err| corrupt(format!("stored workflow spec: {err}")))?;
        Ok(RunDeadline {
            deadline: spec.deadline,
            timezone: spec.schedule.timezone,
        })
    }

    /// The columns of `run` created in `state`: a duration counts from now when the run starts
    /// at once, from its start when it is queued; a backfill slot has no wall-clock deadline.
    pub(crate) fn columns(&self, run: &NewRun, state: RunState) -> DeadlineColumns {
        let Some(deadline) = self.deadline.filter(|d| d.applies_to(run.trigger)) else {
            return (None, None);
        };
        let (logical_time, now) = (run.logical_time, run.now);
        let started = (state != RunState::Queued).then_some(now);
        let after_ms = deadline
            .after_start_ms()
            .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
        (
            deadline.instant_in_zone(logical_time, &self.timezone, started),
            after_ms,
        )
    }
}

impl Store {
    /// Active runs (RUNNING or QUEUED) whose deadline is at or before `now` and not judged yet,
    /// earliest deadline first, at most `limit`.
    pub async fn runs_past_deadline(&self, now: Millis, limit: u32) -> Result<Vec<RunRecord>> {
        let sql = format!(
            "{} WHERE r.state IN ('RUNNING', 'QUEUED') AND r.deadline_at <= ? \
             AND r.deadline_missed_at IS NULL ORDER BY r.deadline_at, r.id LIMIT ?",
            rows::RUN_SELECT
        );
        let found = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        found.iter().map(rows::run).collect()
    }

    /// Judges a run's deadline missed, once: `None` when the run is gone, has ended, is not
    /// past its deadline at `miss.now`, or was judged already (by this node or another). The
    /// winner's `deadline_missed` decision and, with `miss.cancel`, the run's cancel are in the
    /// same transaction.
    pub async fn miss_deadline(&self, miss: &DeadlineMiss) -> Result<Option<MissedDeadline>> {
        write_tx!(self, |c| miss_deadline_tx(self, c, miss))
    }
}

async fn miss_deadline_tx(
    store: &Store,
    c: &mut AnyConnection,
    miss: &DeadlineMiss,
) -> Result<Option<MissedDeadline>> {
    let id = miss.run_id;
    let Some(before) = run_by_id(c, id).await? else {
        return Ok(None);
    };
    // A cancel takes the workflow row before a queued run's row (`sql/locks.rs`): so does this.
    if miss.cancel && before.state == RunState::Queued {
        lock_workflow(store, c, before.workflow_id).await?;
    }
    lock_runs(store, c, &BTreeSet::from([id.0])).await?;
    let judged = sqlx::query(
        "UPDATE run SET deadline_missed_at = ? WHERE id = ? AND deadline_missed_at IS NULL \
         AND deadline_at IS NOT NULL AND deadline_at <= ? AND state IN ('RUNNING', 'QUEUED')",
    )
    .bind(miss.now)
    .bind(id.0)
    .bind(miss.now)
    .execute(&mut *c)
    .await?;
    if judged.rows_affected() != 1 {
        return Ok(None);
    }
    record_missed(c, before.workflow_id, &before, miss).await?;
    let cancelled = if miss.cancel {
        Some(
            cancel_run_tx(store, c, id, miss.now)
                .await?
                .unwrap_or_default(),
        )
    } else {
        None
    };
    let run = run_by_id(c, id)
        .await?
        .ok_or_else(|| corrupt("a locked run vanished"))?;
    Ok(Some(MissedDeadline { run, cancelled }))
}

async fn record_missed(
    c: &mut AnyConnection,
    workflow_id: WorkflowId,
    run: &RunRecord,
    miss: &DeadlineMiss,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO decision_log (at, workflow_id, slot_at, run_id, instance_id, task_name, \
         kind, detail, node_id) VALUES (?, ?, ?, ?, NULL, NULL, ?, ?, ?)",
    )
    .bind(miss.now)
    .bind(workflow_id.0)
    .bind(run.logical_time)
    .bind(run.id.0)
    .bind(DecisionKind::DeadlineMissed.as_str())
    .bind(miss.detail.as_str())
    .bind(miss.node_id.as_str())
    .execute(&mut *c)
    .await?;
    Ok(())
}
