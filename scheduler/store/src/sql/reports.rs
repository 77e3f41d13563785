//! Worker reports, the dependency advance and the end of a run: the transitions of an instance
//! after its dispatch, each a conditional update on (instance, attempt, from-state).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::retry::{retries_left, retry_delay_ms};
use ax_core::state::{Event, InstanceState, transition};
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::dispatch::Ended;
use super::downstream_tasks::VersionTask;
use super::ids::IdKind;
use super::instance_locks::{InstanceKey, load_keys, lock_run_rows};
use super::patch::{Patches, Table, Value};
use super::placing::{Placed, Placing};
use super::rows::{instance_state, map_json, to_u32};
use super::{Dialect, NAMES_PER_STATEMENT, Store, in_list, pow2_chunks, values_rows, write_tx};
use crate::{
    Applied, AttemptEnd, NewAttempt, NoPlacement, PlacedAttempt, Placement, Report, ReportResult,
    Result,
};

/// `lock_run_rows` on MySQL, reading with the lock what the dispatches of placed instances
/// carry from their run (its logical time and params), so placing costs no read of its own.
async fn lock_run_rows_noting(
    c: &mut Counted<'_>,
    runs: &BTreeSet<i64>,
    placing: &mut Placing<'_>,
) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    let (list, padded) = in_list(runs.iter().copied());
    let sql = format!(
        "SELECT id, logical_time, params_json FROM run WHERE id IN ({list}) ORDER BY id FOR UPDATE"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    for row in query.fetch_all(&mut *c).await? {
        let params = map_json(&row.try_get::<String, _>("params_json")?, "run params")?;
        placing.run_facts(row.try_get("id")?, row.try_get("logical_time")?, &params);
    }
    Ok(())
}

impl Store {
    /// Applies worker reports in one transaction, in order; one result per report. A report
    /// that names its worker (`worker_id: Some`) is applied only from the worker its attempt was
    /// dispatched to; from any other it is [`ReportResult::NotYours`], as is one that would be
    /// stale or not found and whose attempt was never dispatched to that worker.
    pub async fn apply_reports(
        &self,
        reports: &[Report],
        now: Millis,
    ) -> Result<Vec<ReportResult>> {
        Ok(self
            .apply_reports_placed(reports, now, &mut NoPlacement)
            .await?
            .0)
    }

    /// `apply_reports`, with each first attempt the advance creates offered to `placement`:
    /// the ones it places are created DISPATCHED and returned (see [`Placement`]).
    pub async fn apply_reports_placed(
        &self,
        reports: &[Report],
        now: Millis,
        placement: &mut dyn Placement,
    ) -> Result<(Vec<ReportResult>, Vec<PlacedAttempt>)> {
        if reports.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        write_tx!(self, |c| async {
            let mut placing = Placing::new(&mut *placement, now);
            let results = apply_reports_tx(self, c, reports, now, &mut placing).await?;
            Ok((results, placing.finish(c).await?))
        })
    }
}

/// Applies a batch of reports in the caller's transaction, counting the statements it sends
/// in [`Store::report_statements`].
async fn apply_reports_tx(
    store: &Store,
    c: &mut AnyConnection,
    reports: &[Report],
    now: Millis,
    placing: &mut Placing<'_>,
) -> Result<Vec<ReportResult>> {
    let mut c = Counted::new(c);
    let result = apply_counted(store, &mut c, reports, now, placing).await;
    store.count_report_statements(c.statements());
    result
}

async fn apply_counted(
    store: &Store,
    c: &mut Counted<'_>,
    reports: &[Report],
    now: Millis,
    placing: &mut Placing<'_>,
) -> Result<Vec<ReportResult>> {
    let ids: BTreeSet<i64> = reports.iter().map(|r| r.key().0.0).collect();
    // Only an attempt's end moves a run: it may create downstream instances or end the run,
    // which two nodes must not do at once. Started and heartbeat reports need no run lock.
    let ends_attempts = reports
        .iter()
        .any(|r| matches!(r, Report::Finished { .. } | Report::Rejected { .. }));
    if store.dialect == Dialect::MySql && ends_attempts && !ids.is_empty() {
        let (list, padded) = in_list(ids.iter().copied());
        let sql =
            format!("SELECT run_id FROM task_instance FORCE INDEX (PRIMARY) WHERE id IN ({list})");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in padded {
            query = query.bind(id);
        }
        let mut runs = BTreeSet::new();
        for row in query.fetch_all(&mut *c).await? {
            runs.insert(row.try_get::<i64, _>("run_id")?);
        }
        if placing.is_active() {
            lock_run_rows_noting(c, &runs, placing).await?;
        } else {
            lock_run_rows(store, c, &runs).await?;
        }
    }
    // Read under lock after the run locks: the transitions are decided on these rows in
    // memory, and nothing else can change them before this transaction ends.
    let mut keys = load_keys(c, &ids, store.dialect.for_update()).await?;
    let policies = load_retry_policies(c, reports, &keys).await?;
    let superseded = superseded_dispatches(c, reports).await?;
    let mut writes = Writes::default();
    let mut results = Vec::with_capacity(reports.len());
    let mut after = AfterBatch::default();
    for (index, report) in reports.iter().enumerate() {
        if superseded.contains(&index) {
            results.push(match keys.get(&report.key().0.0) {
                Some(key) => ReportResult::Stale {
                    current_attempt: key.attempt,
                    state: key.state,
                },
                None => ReportResult::NotFound,
            });
            continue;
        }
        results.push(decide(
            report,
            now,
            index,
            &mut keys,
            &policies,
            &mut writes,
            &mut after,
        ));
    }
    record_late_endings(c, reports, &mut results, &mut writes).await?;
    refuse_strangers(c, reports, &mut results).await?;
    let sent =
        writes.instances.write(c.uncounted()).await? + writes.attempts.write(c.uncounted()).await?;
    c.add(sent);
    after
        .carry_out(store, c, now, &mut results, placing)
        .await?;
    Ok(results)
}

/// The reports (by index) about a dispatch that is no longer the attempt's: a scheduler's
/// `Rejected` verdict naming the `dispatched_at` it read, while the attempt row (locked with its
/// instance) holds another, i.e. the attempt was refused and dispatched again meanwhile. One
/// read per such report: they are rare, and a batch without them reads nothing more.
async fn superseded_dispatches(c: &mut Counted<'_>, reports: &[Report]) -> Result<BTreeSet<usize>> {
    let mut superseded = BTreeSet::new();
    for (index, report) in reports.iter().enumerate() {
        let Report::Rejected {
            instance_id,
            attempt,
            dispatched_at: Some(read),
            ..
        } = report
        else {
            continue;
        };
        let row = sqlx::query(
            "SELECT dispatched_at FROM task_attempt WHERE instance_id = ? AND attempt = ?",
        )
        .bind(instance_id.0)
        .bind(i64::from(attempt.0))
        .fetch_optional(&mut *c)
        .await?;
        let stored = match row {
            Some(row) => row.try_get::<Option<i64>, _>("dispatched_at")?,
            None => None,
        };
        if stored != Some(*read) {
            superseded.insert(index);
        }
    }
    Ok(superseded)
}

/// A worker's report that would be stale or not found is [`ReportResult::NotYours`] when its
/// attempt was never dispatched to that worker (another worker's, or one that does not exist
/// yet): one read of the attempts of their instances, for the batches that have such reports
/// (rare: a worker speaks of its own attempts, and most of those are current). A node's own
/// verdict (a withdrawal, or a `Rejected` naming the dispatch it read) is left as it is.
async fn refuse_strangers(
    c: &mut Counted<'_>,
    reports: &[Report],
    results: &mut [ReportResult],
) -> Result<()> {
    let reporter = |report: &Report| match report {
        Report::Rejected {
            dispatched_at: Some(_),
            ..
        }
        | Report::Rejected {
            withdrawn: true, ..
        } => None,
        Report::Started { worker_id, .. } => Some(worker_id.clone()),
        Report::Rejected { worker_id, .. }
        | Report::TaskHeartbeat { worker_id, .. }
        | Report::Finished { worker_id, .. } => worker_id.clone(),
    };
    let doubtful: Vec<usize> = (0..reports.len())
        .filter(|&i| {
            matches!(
                results[i],
                ReportResult::Stale { .. } | ReportResult::NotFound
            ) && reporter(&reports[i]).is_some()
        })
        .collect();
    if doubtful.is_empty() {
        return Ok(());
    }
    let instances: BTreeSet<i64> = doubtful.iter().map(|&i| reports[i].key().0.0).collect();
    let dispatched = dispatched_attempts(c, instances).await?;
    for index in doubtful {
        let (instance, attempt) = reports[index].key();
        let Some(worker) = reporter(&reports[index]) else {
            continue;
        };
        if !dispatched.contains(&(instance.0, i64::from(attempt.0), worker)) {
            results[index] = ReportResult::NotYours;
        }
    }
    Ok(())
}

/// The (instance, attempt, worker) of every attempt of `instances` that went to a worker: what
/// a worker's report or log batch is checked against, in one read per group of instances.
pub(crate) async fn dispatched_attempts<C>(
    c: &mut C,
    instances: BTreeSet<i64>,
) -> Result<std::collections::HashSet<(i64, i64, String)>>
where
    for<'c> &'c mut C: sqlx::Executor<'c, Database = sqlx::Any>,
{
    let mut dispatched = std::collections::HashSet::new();
    for group in instances
        .into_iter()
        .collect::<Vec<_>>()
        .chunks(NAMES_PER_STATEMENT)
    {
        let (list, padded) = in_list(group.iter().copied());
        let sql = format!(
            "SELECT instance_id, attempt, worker_id FROM task_attempt WHERE instance_id IN ({list})"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in padded {
            query = query.bind(id);
        }
        for row in query.fetch_all(&mut *c).await? {
            if let Some(worker) = row.try_get::<Option<String>, _>("worker_id")? {
                dispatched.insert((row.try_get("instance_id")?, row.try_get("attempt")?, worker));
            }
        }
    }
    Ok(dispatched)
}

/// A worker's report of how an attempt ended that the scheduler had already ended itself (a
/// cancel, or the backstop's timeout), from the worker the attempt was dispatched to: the
/// attempt keeps its state and gets the process's exit code, signal and line count, and the
/// report counts as applied (the worker may forget it). One read per such report: they are
/// rare, and a batch without them reads nothing more.
async fn record_late_endings(
    c: &mut Counted<'_>,
    reports: &[Report],
    results: &mut [ReportResult],
    writes: &mut Writes,
) -> Result<()> {
    for (report, result) in reports.iter().zip(results.iter_mut()) {
        let Report::Finished {
            instance_id,
            attempt,
            worker_id: Some(reporter),
            exit_code,
            signal,
            log_lines,
            ..
        } = report
        else {
            continue;
        };
        if !matches!(result, ReportResult::Stale { .. }) {
            continue;
        }
        let row = sqlx::query(
            "SELECT state, worker_id FROM task_attempt WHERE instance_id = ? AND attempt = ?",
        )
        .bind(instance_id.0)
        .bind(i64::from(attempt.0))
        .fetch_optional(&mut *c)
        .await?;
        let Some(row) = row else { continue };
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        let worker: Option<String> = row.try_get("worker_id")?;
        let ended_here = matches!(state, InstanceState::Cancelled | InstanceState::Timeout);
        if !ended_here || worker.as_deref() != Some(reporter.as_str()) {
            continue;
        }
        writes.attempts.set(
            instance_id.0,
            i64::from(attempt.0),
            [
                ("exit_code", exit_code.map(i64::from).into()),
                ("signal_num", signal.map(i64::from).into()),
                (
                    "log_lines",
                    i64::try_from(*log_lines).unwrap_or(i64::MAX).into(),
                ),
            ],
        );
        *result = ReportResult::Applied(Applied::default());
    }
    Ok(())
}

/// The row changes a batch decided, sent after every report of it is decided.
struct Writes {
    instances: Patches,
    attempts: Patches,
}

impl Default for Writes {
    fn default() -> Writes {
        Writes {
            instances: Patches::new(Table::Instance),
            attempts: Patches::new(Table::Attempt),
        }
    }
}

/// A task's retry policy: (retries, backoff in ms), by (workflow, version, task).
type RetryPolicies = HashMap<(i64, i64, String), (u32, u64)>;

/// The retry policies of the tasks of the batch's Finished reports that may retry (an attempt
/// that failed, timed out or could not start), one statement per workflow version; a batch of
/// successes reads none.
async fn load_retry_policies(
    c: &mut Counted<'_>,
    reports: &[Report],
    keys: &HashMap<i64, InstanceKey>,
) -> Result<RetryPolicies> {
    let mut wanted: BTreeMap<(i64, i64), BTreeSet<&str>> = BTreeMap::new();
    for report in reports {
        // A withdrawal that finds its attempt running ends it as a failure (see `decide`).
        let failing = match report {
            Report::Finished {
                instance_id, end, ..
            } => may_retry(end).then_some(instance_id),
            Report::Rejected {
                instance_id,
                withdrawn: true,
                ..
            } => Some(instance_id),
            _ => None,
        };
        if let Some(instance_id) = failing
            && let Some(key) = keys.get(&instance_id.0)
        {
            wanted
                .entry((key.workflow_id.0, key.version))
                .or_default()
                .insert(key.task.as_str());
        }
    }
    let mut policies = RetryPolicies::new();
    for ((workflow, version), tasks) in wanted {
        let tasks: Vec<&str> = tasks.into_iter().collect();
        let rows = definitions(c, workflow, version, &tasks, "retries, retry_backoff_ms").await?;
        for row in rows {
            policies.insert(
                (workflow, version, row.try_get("name")?),
                (
                    to_u32(row.try_get("retries")?, "retries")?,
                    row.try_get::<i64, _>("retry_backoff_ms")?.max(0) as u64,
                ),
            );
        }
    }
    Ok(policies)
}

/// Whether an attempt that ended so may be retried: all but a success.
fn may_retry(end: &AttemptEnd) -> bool {
    match end {
        AttemptEnd::Finished(outcome) => outcome.state() != InstanceState::Success,
        AttemptEnd::SpawnFailed => true,
    }
}

/// What the reports of one batch set in motion, done once for the whole batch after every
/// transition of it is applied: a fan-in reached by many upstreams in one batch is counted
/// once, not once per upstream, and a run ends only after its new instances exist.
#[derive(Default)]
struct AfterBatch {
    /// Instances that succeeded, with the report that said so.
    succeeded: Vec<(usize, InstanceKey)>,
    /// Runs with an instance that became terminal, with the last such report.
    touched_runs: Vec<(usize, RunId)>,
    /// Instances whose attempt ended or went back to WAITING: (report, the instance as read
    /// at the start of the batch, its new state).
    ended: Vec<(usize, Ended, InstanceState)>,
}

impl AfterBatch {
    async fn carry_out(
        self,
        store: &Store,
        c: &mut Counted<'_>,
        now: Millis,
        results: &mut [ReportResult],
        placing: &mut Placing<'_>,
    ) -> Result<()> {
        let AfterBatch {
            mut succeeded,
            mut touched_runs,
            ended,
        } = self;
        super::dispatch::after_attempts_ended(
            c.uncounted(),
            &ended,
            &mut succeeded,
            &mut touched_runs,
            now,
        )
        .await?;
        // Each (run, downstream task) is examined once, credited to the last report reaching it.
        let finished_tasks: BTreeSet<VersionTask> = succeeded
            .iter()
            .map(|(_, done)| (done.workflow_id.0, done.version, done.task.clone()))
            .collect();
        let downstream = store.downstream_tasks.of(c, &finished_tasks).await?;
        let mut candidates: Vec<(usize, InstanceKey, String)> = Vec::new();
        let mut seen: BTreeSet<(i64, String)> = BTreeSet::new();
        for (index, done) in succeeded.iter().rev() {
            let edges = (done.workflow_id.0, done.version, done.task.clone());
            for task in downstream.get(&edges).into_iter().flatten() {
                if seen.insert((done.run_id.0, task.clone())) {
                    candidates.push((*index, done.clone(), task.clone()));
                }
            }
        }
        candidates.reverse();
        let created = create_ready(store, c, &candidates, now, placing).await?;
        for ((index, _, _), created) in candidates.iter().zip(created) {
            if created > 0
                && let Some(ReportResult::Applied(applied)) = results.get_mut(*index)
            {
                applied.new_waiting += created;
            }
        }
        // Each run is credited to the last report that touched it.
        let mut last_report: BTreeMap<i64, usize> = BTreeMap::new();
        for (index, run) in &touched_runs {
            last_report.insert(run.0, *index);
        }
        let runs: BTreeSet<i64> = last_report.keys().copied().collect();
        let ended = super::run_end::end_runs_if_done(store, c, &runs, now).await?;
        for (run, end) in ended {
            if let Some(ReportResult::Applied(applied)) = results.get_mut(last_report[&run]) {
                applied.run_finished = Some((RunId(run), end));
            }
        }
        Ok(())
    }
}

/// Decides one report on the in-memory row of its instance (read under lock): the row changes
/// go to `writes`, the row in `keys` moves on (a later report on the same instance in the batch
/// sees it), and what the batch must do afterwards goes to `after`.
fn decide(
    report: &Report,
    now: Millis,
    index: usize,
    keys: &mut HashMap<i64, InstanceKey>,
    policies: &RetryPolicies,
    writes: &mut Writes,
    after: &mut AfterBatch,
) -> ReportResult {
    let (id, attempt) = report.key();
    let Some(key) = keys.get_mut(&id.0) else {
        return ReportResult::NotFound;
    };
    let stale_now = ReportResult::Stale {
        current_attempt: key.attempt,
        state: key.state,
    };
    if key.attempt != attempt {
        return stale_now;
    }
    // Fencing by identity too: only the worker the attempt was dispatched to may report on it.
    let reporter = match report {
        Report::Started { worker_id, .. } => Some(worker_id),
        Report::Rejected { worker_id, .. }
        | Report::TaskHeartbeat { worker_id, .. }
        | Report::Finished { worker_id, .. } => worker_id.as_ref(),
    };
    if let (Some(reporter), Some(assigned)) = (reporter, key.worker_id.as_ref())
        && reporter != assigned
    {
        // A withdrawal is a node's verdict about the worker it read, not a worker speaking:
        // the attempt went to another worker since, and the verdict is merely stale.
        if matches!(
            report,
            Report::Rejected {
                withdrawn: true,
                ..
            }
        ) {
            return stale_now;
        }
        return ReportResult::NotYours;
    }
    let attempt_no = i64::from(attempt.0);
    if let Report::Rejected {
        reason,
        withdrawn: true,
        ..
    } = report
        && key.state == InstanceState::Running
    {
        // Its Started report was applied after the withdrawal was decided on an older read: the
        // worker ran the attempt and no longer has it, so it is lost, not withdrawn.
        let lost = Report::Finished {
            instance_id: id,
            attempt,
            worker_id: None,
            end: AttemptEnd::Finished(ax_core::state::Outcome::Failed),
            exit_code: None,
            signal: None,
            at: now,
            log_lines: 0,
            message: format!("lost: {reason}"),
        };
        return decide(&lost, now, index, keys, policies, writes, after);
    }
    match report {
        Report::Rejected {
            reason, withdrawn, ..
        } => {
            let event = if *withdrawn {
                Event::Withdraw
            } else {
                Event::Reject
            };
            let Ok(next) = transition(key.state, event) else {
                return stale_now;
            };
            if next.next_attempt {
                // The withdrawn attempt keeps its record, ended; the next one starts afresh.
                key.withdrawn += 1;
                writes.instances.set(
                    id.0,
                    0,
                    [
                        ("state", next.to.as_str().into()),
                        ("attempt", (attempt_no + 1).into()),
                        ("withdrawn_attempts", i64::from(key.withdrawn).into()),
                        ("worker_id", Value::Text(None)),
                        ("not_before", now.into()),
                    ],
                );
                writes.attempts.set(
                    id.0,
                    attempt_no,
                    [
                        ("state", InstanceState::Failed.as_str().into()),
                        ("finished_at", now.into()),
                        ("message", format!("withdrawn: {reason}").into()),
                    ],
                );
            } else {
                writes.instances.set(
                    id.0,
                    0,
                    [
                        ("state", next.to.as_str().into()),
                        ("worker_id", Value::Text(None)),
                    ],
                );
                writes.attempts.set(
                    id.0,
                    attempt_no,
                    [
                        ("state", next.to.as_str().into()),
                        ("message", reason.as_str().into()),
                    ],
                );
            }
            after.ended.push((index, Ended::of(key), next.to));
            key.state = next.to;
            key.worker_id = None;
            if next.next_attempt {
                key.attempt = Attempt(attempt.0 + 1);
            }
            ReportResult::Applied(Applied {
                new_waiting: 1,
                attempt_ended: next.next_attempt,
                ..Applied::default()
            })
        }
        Report::Started {
            worker_id, pid, at, ..
        } => {
            // A worker replays Started for the attempts it re-attaches after a reconnect; the
            // current attempt already RUNNING is the same fact again, not a stale report.
            if key.state == InstanceState::Running {
                return ReportResult::Applied(Applied::default());
            }
            let Ok(next) = transition(key.state, Event::Start) else {
                return stale_now;
            };
            writes.instances.set(
                id.0,
                0,
                [
                    ("state", next.to.as_str().into()),
                    ("started_at", (*at).into()),
                    ("worker_id", worker_id.as_str().into()),
                    ("last_heartbeat_at", (*at).into()),
                ],
            );
            writes.attempts.set(
                id.0,
                attempt_no,
                [
                    ("state", next.to.as_str().into()),
                    ("started_at", (*at).into()),
                    ("pid", i64::from(*pid).into()),
                    ("worker_id", worker_id.as_str().into()),
                ],
            );
            key.state = next.to;
            key.worker_id = Some(worker_id.clone());
            ReportResult::Applied(Applied::default())
        }
        Report::TaskHeartbeat { at, .. } => {
            if key.state != InstanceState::Running {
                return stale_now;
            }
            writes
                .instances
                .set(id.0, 0, [("last_heartbeat_at", (*at).into())]);
            ReportResult::Applied(Applied::default())
        }
        Report::Finished {
            end,
            exit_code,
            signal,
            at,
            log_lines,
            message,
            ..
        } => {
            let (retries, backoff) = policies
                .get(&(key.workflow_id.0, key.version, key.task.clone()))
                .copied()
                .unwrap_or((0, 0));
            let left = retries_left(attempt.0, key.withdrawn, retries);
            let (event, attempt_state) = match end {
                AttemptEnd::Finished(outcome) => (
                    Event::Finish {
                        outcome: *outcome,
                        retries_left: left,
                    },
                    outcome.state(),
                ),
                AttemptEnd::SpawnFailed => (
                    Event::SpawnFailed { retries_left: left },
                    InstanceState::Failed,
                ),
            };
            let Ok(next) = transition(key.state, event) else {
                return stale_now;
            };
            let exit = exit_code.map(i64::from);
            if next.next_attempt {
                let failures = attempt.0.saturating_sub(key.withdrawn);
                let delay = retry_delay_ms(backoff, failures, rand::random::<f64>());
                let not_before = now.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
                writes.instances.set(
                    id.0,
                    0,
                    [
                        ("state", next.to.as_str().into()),
                        ("attempt", (attempt_no + 1).into()),
                        ("worker_id", Value::Text(None)),
                        ("not_before", not_before.into()),
                        ("started_at", Value::Int(None)),
                        ("finished_at", Value::Int(None)),
                        ("exit_code", Value::Int(None)),
                        ("last_heartbeat_at", Value::Int(None)),
                    ],
                );
            } else {
                writes.instances.set(
                    id.0,
                    0,
                    [
                        ("state", next.to.as_str().into()),
                        ("finished_at", (*at).into()),
                        ("exit_code", exit.into()),
                    ],
                );
            }
            writes.attempts.set(
                id.0,
                attempt_no,
                [
                    ("state", attempt_state.as_str().into()),
                    ("finished_at", (*at).into()),
                    ("exit_code", exit.into()),
                    ("signal_num", signal.map(i64::from).into()),
                    (
                        "log_lines",
                        i64::try_from(*log_lines).unwrap_or(i64::MAX).into(),
                    ),
                    ("message", message.as_str().into()),
                ],
            );
            after.ended.push((index, Ended::of(key), next.to));
            let done = key.clone();
            key.state = next.to;
            if next.next_attempt {
                key.attempt = Attempt(attempt.0 + 1);
                key.worker_id = None;
            }
            let mut applied = Applied {
                attempt_ended: true,
                attempt_state: Some(attempt_state),
                retry_scheduled: next.next_attempt,
                ..Applied::default()
            };
            if next.next_attempt {
                applied.new_waiting = 1;
                return ReportResult::Applied(applied);
            }
            after.touched_runs.push((index, done.run_id));
            if next.to == InstanceState::Success {
                after.succeeded.push((
                    index,
                    InstanceKey {
                        state: next.to,
                        ..done
                    },
                ));
            }
            ReportResult::Applied(applied)
        }
    }
}

/// `name` and `columns` of the definitions of `tasks` in one workflow version, one statement.
async fn definitions(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    tasks: &[&str],
    columns: &str,
) -> Result<Vec<sqlx::any::AnyRow>> {
    let (list, padded) = in_list(tasks.iter().copied());
    let sql = format!(
        "SELECT name, {columns} FROM task_definition \
         WHERE workflow_id = ? AND version = ? AND name IN ({list})"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(workflow)
        .bind(version);
    for task in padded {
        query = query.bind(task);
    }
    Ok(query.fetch_all(&mut *c).await?)
}

/// Creates the WAITING first attempt of each candidate (a downstream task of an instance that
/// succeeded, in that instance's run) whose upstreams have all succeeded in the run; returns
/// how many instances each candidate created or woke (0 or 1). Per workflow version of the
/// batch: one read of the candidates' definitions, one count of their succeeded upstreams'
/// instances per run or per task (whichever is fewer: a batch of many runs of a small DAG counts
/// per task, a batch of a wide DAG's one run counts per run), one multi-row insert of the ready
/// ones, all through indexes: the cost depends neither on the size of the workflow, nor on the
/// history, nor on how many candidates became ready at once.
async fn create_ready(
    store: &Store,
    c: &mut Counted<'_>,
    candidates: &[(usize, InstanceKey, String)],
    now: Millis,
    placing: &mut Placing<'_>,
) -> Result<Vec<u32>> {
    let mut created = vec![0u32; candidates.len()];
    let mut versions: BTreeMap<(i64, i64), CandidatesOfVersion<'_>> = BTreeMap::new();
    for (i, (_, done, task)) in candidates.iter().enumerate() {
        versions
            .entry((done.workflow_id.0, done.version))
            .or_default()
            .insert((done.run_id.0, task.as_str()), i);
    }
    for ((workflow, version), wanted) in versions {
        let pairs: Vec<(i64, &str)> = wanted.keys().copied().collect();
        let ready = ready_pairs(c, workflow, version, &pairs).await?;
        if ready.is_empty() {
            continue;
        }
        let woke = insert_first_attempts(store, c, workflow, version, &ready, now, placing).await?;
        for ((run, task), n) in woke {
            if let Some(&i) = wanted.get(&(run, task.as_str())) {
                created[i] = n;
            }
        }
    }
    Ok(created)
}

/// The candidates of one workflow version: (run, task) → position in the batch's candidates.
type CandidatesOfVersion<'a> = BTreeMap<(i64, &'a str), usize>;

/// A task ready in a run: (run, task, priority).
type Ready = (i64, String, i64);

/// Of the (run, task) pairs of one workflow version, the ones whose upstreams have all
/// succeeded in their run, with the task's priority.
async fn ready_pairs(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    pairs: &[(i64, &str)],
) -> Result<Vec<Ready>> {
    let tasks: Vec<&str> = pairs
        .iter()
        .map(|(_, task)| *task)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut needs: HashMap<String, (i64, i64)> = HashMap::new();
    for names in tasks.chunks(NAMES_PER_STATEMENT) {
        for row in definitions(c, workflow, version, names, "upstream_count, priority").await? {
            needs.insert(
                row.try_get("name")?,
                (row.try_get("upstream_count")?, row.try_get("priority")?),
            );
        }
    }
    let runs: BTreeSet<i64> = pairs.iter().map(|(run, _)| *run).collect();
    let mut succeeded: HashMap<(i64, String), i64> = HashMap::new();
    if runs.len() <= tasks.len() {
        for &run in &runs {
            let of_run: Vec<&str> = pairs
                .iter()
                .filter(|(r, _)| *r == run)
                .map(|(_, task)| *task)
                .collect();
            for names in of_run.chunks(NAMES_PER_STATEMENT) {
                count_succeeded(c, workflow, version, &[run], names, &mut succeeded).await?;
            }
        }
    } else {
        for &task in &tasks {
            let of_task: Vec<i64> = pairs
                .iter()
                .filter(|(_, t)| *t == task)
                .map(|(run, _)| *run)
                .collect();
            for runs in of_task.chunks(NAMES_PER_STATEMENT) {
                count_succeeded(c, workflow, version, runs, &[task], &mut succeeded).await?;
            }
        }
    }
    Ok(pairs
        .iter()
        .filter_map(|(run, task)| {
            let (upstreams, priority) = needs.get(*task)?;
            let done = succeeded
                .get(&(*run, task.to_string()))
                .copied()
                .unwrap_or(0);
            (done >= *upstreams).then(|| (*run, task.to_string(), *priority))
        })
        .collect())
}

/// Adds to `succeeded` the succeeded upstream instances of each of `tasks` in each of `runs`,
/// by (run, task): one statement through the dependency and instance indexes.
async fn count_succeeded(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    runs: &[i64],
    tasks: &[&str],
    succeeded: &mut HashMap<(i64, String), i64>,
) -> Result<()> {
    let (run_list, padded_runs) = in_list(runs.iter().copied());
    let (task_list, padded_tasks) = in_list(tasks.iter().copied());
    let sql = format!(
        "SELECT ti.run_id, d.downstream, COUNT(*) AS n FROM task_dependency d JOIN task_instance ti \
         ON ti.run_id IN ({run_list}) AND ti.task_name = d.upstream AND ti.shard_slot = 0 \
         WHERE d.workflow_id = ? AND d.version = ? AND d.downstream IN ({task_list}) \
         AND ti.state = 'SUCCESS' GROUP BY ti.run_id, d.downstream"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded_runs {
        query = query.bind(run);
    }
    query = query.bind(workflow).bind(version);
    for task in padded_tasks {
        query = query.bind(task);
    }
    for row in query.fetch_all(&mut *c).await? {
        succeeded.insert(
            (row.try_get("run_id")?, row.try_get("downstream")?),
            row.try_get("n")?,
        );
    }
    Ok(())
}

/// Inserts the first attempt of each ready (run, task), in multi-row statements: WAITING, or
/// DISPATCHED with its attempt row when `placing` places it. A task whose instance exists
/// already (it ran before a rerun from above and is PENDING) is woken instead. Returns, per
/// (run, task), the instances created or woken.
async fn insert_first_attempts(
    store: &Store,
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    ready: &[Ready],
    now: Millis,
    placing: &mut Placing<'_>,
) -> Result<HashMap<(i64, String), u32>> {
    let ids = store
        .take_ids(c.uncounted(), IdKind::Instance, ready.len())
        .await?;
    let rows: Vec<(i64, &Ready, Placed)> = ids
        .iter()
        .copied()
        .zip(ready)
        .map(|(id, ready)| {
            let (run, task, priority) = ready;
            let placed = placing.place(NewAttempt {
                instance_id: InstanceId(id),
                run_id: RunId(*run),
                workflow_id: WorkflowId(workflow),
                workflow_version: version as u32,
                task: task.clone(),
                priority: *priority as i32,
                created_at: now,
            });
            (id, ready, placed)
        })
        .collect();
    let mut inserted = 0;
    for rows in pow2_chunks(&rows) {
        let sql = format!(
            "{} task_instance (id, run_id, workflow_id, workflow_version, task_name, state, \
             worker_id, attempt, priority, not_before, created_at) VALUES {}",
            store.dialect.insert_ignore(),
            values_rows(rows.len(), 11)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, (run, task, priority), (state, worker)) in rows {
            query = query
                .bind(*id)
                .bind(*run)
                .bind(workflow)
                .bind(version)
                .bind(task.as_str())
                .bind(*state)
                .bind(worker.clone())
                .bind(1i64)
                .bind(*priority)
                .bind(now)
                .bind(now);
        }
        inserted += query.execute(&mut *c).await?.rows_affected();
    }
    let mut woke: HashMap<(i64, String), u32> = ready
        .iter()
        .map(|(run, task, _)| ((*run, task.clone()), 1))
        .collect();
    if inserted as usize == ready.len() {
        placing.write_attempts(c.uncounted()).await?;
        return Ok(woke);
    }
    // The fresh id each (run, task) was offered: where the task had an instance already, that
    // id was not inserted, and what was placed under it is not dispatched.
    let offered: HashMap<(i64, &str), i64> = rows
        .iter()
        .map(|(id, (run, task, _), _)| ((*run, task.as_str()), *id))
        .collect();
    let mut ignored = BTreeSet::new();
    // Some instances existed: the ones whose id is not one this call took. Rare (a rerun from
    // above), so one read per run.
    let fresh: BTreeSet<i64> = ids.into_iter().collect();
    let runs: BTreeSet<i64> = ready.iter().map(|(run, _, _)| *run).collect();
    for run in runs {
        let (list, tasks) = in_list(
            ready
                .iter()
                .filter(|(r, _, _)| *r == run)
                .map(|(_, task, _)| task.as_str()),
        );
        let sql = format!(
            "SELECT id, task_name FROM task_instance \
             WHERE run_id = ? AND shard_slot = 0 AND task_name IN ({list})"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(run);
        for task in tasks {
            query = query.bind(task);
        }
        for row in query.fetch_all(&mut *c).await? {
            let id: i64 = row.try_get("id")?;
            if !fresh.contains(&id) {
                let task: String = row.try_get("task_name")?;
                if let Some(offered) = offered.get(&(run, task.as_str())) {
                    ignored.insert(*offered);
                }
                let n = super::rerun::wake_pending(c.uncounted(), RunId(run), &task, now).await?;
                woke.insert((run, task), n);
            }
        }
    }
    placing.not_inserted(&ignored);
    placing.write_attempts(c.uncounted()).await?;
    Ok(woke)
}
