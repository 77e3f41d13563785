//! Worker reports, the dependency advance and the end of a run: the transitions of an instance
//! after its dispatch, each a conditional update on (instance, attempt, from-state).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::for_each::ForEach;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::retry::{retries_left, retry_delay_ms};
use ax_core::state::{Event, InstanceState, transition};
use ax_core::trigger_rule::{TriggerRule, UpstreamEnd, Upstreams, Verdict, judge};
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::dispatch::Ended;
use super::downstream_tasks::VersionTask;
use super::ids::IdKind;
use super::instance_locks::{InstanceKey, load_keys, lock_run_rows, touch_runs};
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
        "SELECT id, logical_time, params_json, handler_env_json, outputs_bytes FROM run \
         WHERE id IN ({list}) ORDER BY id FOR UPDATE"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    for row in query.fetch_all(&mut *c).await? {
        let params = map_json(&row.try_get::<String, _>("params_json")?, "run params")?;
        let run_env = super::rows::run_env(&row)?;
        placing.run_facts(
            row.try_get("id")?,
            row.try_get("logical_time")?,
            &params,
            run_env,
            row.try_get("outputs_bytes")?,
        );
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
pub(crate) async fn apply_reports_tx(
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
            touch_runs(store, c, &runs).await?;
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
    let mut after = AfterBatch {
        output_bytes: output_bytes_of_runs(c, reports, &keys).await?,
        ..AfterBatch::default()
    };
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

/// The bytes of outputs kept by each run with a successful end carrying outputs in `reports`:
/// one read, and none for a batch without outputs (the common case).
async fn output_bytes_of_runs(
    c: &mut Counted<'_>,
    reports: &[Report],
    keys: &HashMap<i64, InstanceKey>,
) -> Result<BTreeMap<i64, u64>> {
    let runs: BTreeSet<i64> = reports
        .iter()
        .filter_map(|report| match report {
            Report::Finished {
                instance_id,
                outputs,
                ..
            } if !outputs.is_empty() => keys.get(&instance_id.0).map(|key| key.run_id.0),
            _ => None,
        })
        .collect();
    let mut bytes = BTreeMap::new();
    if runs.is_empty() {
        return Ok(bytes);
    }
    let (list, padded) = in_list(runs.iter().copied());
    let sql = format!("SELECT id, outputs_bytes FROM run WHERE id IN ({list})");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    for row in query.fetch_all(&mut *c).await? {
        let used: i64 = row.try_get("outputs_bytes")?;
        bytes.insert(row.try_get("id")?, u64::try_from(used).unwrap_or(0));
    }
    Ok(bytes)
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
/// report counts as applied (the worker may forget it). An end the store already holds, the
/// same report again (the attempt's row ended as it says, at its time, on its worker; or applied
/// earlier in this batch), counts as applied too and changes nothing: a worker resends an end
/// until it is acknowledged (on a live stream too, when an answer is late), and a duplicate must
/// be acknowledged, not refused. One read per such report: they are rare, and a batch without
/// them reads nothing more.
async fn record_late_endings(
    c: &mut Counted<'_>,
    reports: &[Report],
    results: &mut [ReportResult],
    writes: &mut Writes,
) -> Result<()> {
    // The worker ends applied so far in this batch, by (instance, attempt, worker, time).
    let mut applied_ends: BTreeSet<(i64, u32, &str, Millis)> = BTreeSet::new();
    for (report, result) in reports.iter().zip(results.iter_mut()) {
        let Report::Finished {
            instance_id,
            attempt,
            worker_id: Some(reporter),
            end,
            exit_code,
            signal,
            at,
            log_lines,
            ..
        } = report
        else {
            continue;
        };
        let this_end = (instance_id.0, attempt.0, reporter.as_str(), *at);
        if matches!(result, ReportResult::Applied(_)) {
            applied_ends.insert(this_end);
            continue;
        }
        if !matches!(result, ReportResult::Stale { .. }) {
            continue;
        }
        if applied_ends.contains(&this_end) {
            *result = ReportResult::Applied(Applied::default());
            continue;
        }
        let row = sqlx::query(
            "SELECT state, worker_id, finished_at, exit_code, signal_num FROM task_attempt \
             WHERE instance_id = ? AND attempt = ?",
        )
        .bind(instance_id.0)
        .bind(i64::from(attempt.0))
        .fetch_optional(&mut *c)
        .await?;
        let Some(row) = row else { continue };
        let state = instance_state(&row.try_get::<String, _>("state")?)?;
        let worker: Option<String> = row.try_get("worker_id")?;
        if worker.as_deref() != Some(reporter.as_str()) {
            continue;
        }
        let finished_at: Option<i64> = row.try_get("finished_at")?;
        let reported_state = match end {
            AttemptEnd::Finished(outcome) => outcome.state(),
            AttemptEnd::SpawnFailed => InstanceState::Failed,
        };
        let stored_exit: Option<i64> = row.try_get("exit_code")?;
        let stored_signal: Option<i64> = row.try_get("signal_num")?;
        if state == reported_state
            && finished_at == Some(*at)
            && stored_exit == exit_code.map(i64::from)
            && stored_signal == signal.map(i64::from)
        {
            // This very end is stored (an end the scheduler gave the attempt itself has no
            // exit code or signal): acknowledged again, nothing written.
            *result = ReportResult::Applied(Applied::default());
            continue;
        }
        let ended_here = matches!(state, InstanceState::Cancelled | InstanceState::Timeout);
        if !ended_here {
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
    /// Task instances that ended (succeeded, or failed with no retry left), with the report
    /// that said so; their downstream tasks' rules are judged.
    finished: Vec<(usize, InstanceKey)>,
    /// Runs with an instance that became terminal, with the last such report.
    touched_runs: Vec<(usize, RunId)>,
    /// Instances whose attempt ended or went back to WAITING: (report, the instance as read
    /// at the start of the batch, its new state).
    ended: Vec<(usize, Ended, InstanceState)>,
    /// The bytes of outputs each run kept, for the runs of the batch's successes with outputs.
    output_bytes: BTreeMap<i64, u64>,
    /// The runs whose outputs grew in this batch.
    outputs_grew: BTreeSet<i64>,
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
            mut finished,
            mut touched_runs,
            ended,
            output_bytes,
            outputs_grew,
        } = self;
        for run in outputs_grew {
            placing.outputs_grew(run);
            sqlx::query("UPDATE run SET outputs_bytes = ? WHERE id = ?")
                .bind(i64::try_from(output_bytes[&run]).unwrap_or(i64::MAX))
                .bind(run)
                .execute(&mut *c)
                .await?;
        }
        super::dispatch::after_attempts_ended(
            c.uncounted(),
            &ended,
            &mut finished,
            &mut touched_runs,
            now,
        )
        .await?;
        let mut frontier: Vec<TaskEnd> = finished
            .iter()
            .map(|(index, key)| TaskEnd {
                index: *index,
                run: key.run_id.0,
                workflow: key.workflow_id.0,
                version: key.version,
                task: key.task.clone(),
            })
            .collect();
        // A task judged SKIPPED or UPSTREAM_FAILED ended too: its downstream is judged in the
        // next round, each round O(the direct downstream of what ended in the last one).
        while !frontier.is_empty() {
            frontier = advance(store, c, &frontier, now, placing, results).await?;
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

/// The advance after tasks ended outside a report: roots SKIPPED or FAILED by their `if:` as
/// their run starts. Judges their downstream in rounds, as a batch of reports does, then ends
/// the runs that have nothing left (a run whose every root was skipped ends SUCCESS at once).
pub(crate) async fn advance_after(
    store: &Store,
    c: &mut Counted<'_>,
    ended: Vec<(i64, i64, i64, String)>,
    now: Millis,
    placing: &mut Placing<'_>,
) -> Result<()> {
    let runs: BTreeSet<i64> = ended.iter().map(|(run, _, _, _)| *run).collect();
    let mut frontier: Vec<TaskEnd> = ended
        .into_iter()
        .map(|(run, workflow, version, task)| TaskEnd {
            index: usize::MAX,
            run,
            workflow,
            version,
            task,
        })
        .collect();
    while !frontier.is_empty() {
        frontier = advance(store, c, &frontier, now, placing, &mut []).await?;
    }
    super::run_end::end_runs_if_done(store, c, &runs, now).await?;
    Ok(())
}

/// [`advance_after`] one task instance that ended outside a report (a person's cancel, a
/// shard failed for a gone worker settling its parent): its downstream is judged, then its run
/// ends if nothing is left.
pub(crate) async fn advance_after_ended(
    store: &Store,
    c: &mut AnyConnection,
    ended: &InstanceKey,
    now: Millis,
) -> Result<()> {
    let task_end = (
        ended.run_id.0,
        ended.workflow_id.0,
        ended.version,
        ended.task.clone(),
    );
    // Boxed: ending a run may promote a queued one, whose roots are advanced in turn.
    Box::pin(advance_after(
        store,
        &mut Counted::new(c),
        vec![task_end],
        now,
        &mut Placing::none(),
    ))
    .await
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
            outputs: Default::default(),
        };
        return decide(&lost, now, index, keys, policies, writes, after);
    }
    if let Report::Finished {
        worker_id: Some(worker),
        end: AttemptEnd::Finished(_),
        at,
        ..
    } = report
        && key.state == InstanceState::Dispatched
    {
        // The end of the attempt dispatched to this worker, with its start not stored: the start
        // report was lost with a stream, or a batch lost it. The attempt number and the worker
        // say it is this attempt's process, and its end proves it ran: the start is recorded
        // first, at the end's time (its own is unknown), rather than the end refused and the
        // worker's success forgotten and run again.
        let started = Report::Started {
            instance_id: id,
            attempt,
            worker_id: worker.clone(),
            pid: 0,
            at: *at,
        };
        if let ReportResult::Applied(_) =
            decide(&started, now, index, keys, policies, writes, after)
        {
            return decide(report, now, index, keys, policies, writes, after);
        }
        return stale_now;
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
            outputs,
            ..
        } => {
            // Outputs past the run's limit fail the attempt whole: a downstream task must not
            // run without a value it was promised.
            let mut end = *end;
            let mut message = message.clone();
            let mut kept = None;
            if end == AttemptEnd::Finished(ax_core::state::Outcome::Success) && !outputs.is_empty()
            {
                let used = after.output_bytes.get(&key.run_id.0).copied().unwrap_or(0);
                let total = used + ax_core::outputs::size(outputs);
                if total > ax_core::outputs::MAX_RUN_BYTES {
                    end = AttemptEnd::Finished(ax_core::state::Outcome::Failed);
                    message = format!(
                        "outputs refused: the run's outputs would reach {total} bytes, more than \
                         the {} a run may keep",
                        ax_core::outputs::MAX_RUN_BYTES
                    );
                } else {
                    kept = Some((total, super::rows::to_json(outputs).unwrap_or_default()));
                }
            }
            let end = &end;
            let message = &message;
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
            if let Some((total, _)) = &kept {
                after.output_bytes.insert(key.run_id.0, *total);
                after.outputs_grew.insert(key.run_id.0);
            }
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
                    ("outputs_json", Value::Text(kept.map(|(_, json)| json))),
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
            after.finished.push((
                index,
                InstanceKey {
                    state: next.to,
                    ..done
                },
            ));
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

/// A task instance that ended in a run, as the advance needs it; `index` is the report it is
/// credited to.
struct TaskEnd {
    index: usize,
    run: i64,
    workflow: i64,
    version: i64,
    task: String,
}

/// One round of the advance: judges the trigger rule of each direct downstream task of `ended`
/// in its run (each (run, task) once, credited to the last report reaching it), creates the
/// instances of those that run (or wakes their PENDING ones) and of those that do not
/// (SKIPPED or UPSTREAM_FAILED), and returns the latter: they ended, and their own downstream
/// is judged next.
async fn advance(
    store: &Store,
    c: &mut Counted<'_>,
    ended: &[TaskEnd],
    now: Millis,
    placing: &mut Placing<'_>,
    results: &mut [ReportResult],
) -> Result<Vec<TaskEnd>> {
    let tasks: BTreeSet<VersionTask> = ended
        .iter()
        .map(|end| (end.workflow, end.version, end.task.clone()))
        .collect();
    let downstream = store.downstream_tasks.of(c, &tasks).await?;
    let mut candidates: Vec<TaskEnd> = Vec::new();
    let mut seen: BTreeSet<(i64, String)> = BTreeSet::new();
    for end in ended.iter().rev() {
        let edges = (end.workflow, end.version, end.task.clone());
        for task in downstream.get(&edges).into_iter().flatten() {
            if seen.insert((end.run, task.clone())) {
                candidates.push(TaskEnd {
                    task: task.clone(),
                    ..*end
                });
            }
        }
    }
    candidates.reverse();
    let judged = judge_candidates(store, c, &candidates, now, placing).await?;
    let mut not_run = Vec::new();
    for (candidate, judged) in candidates.into_iter().zip(judged) {
        match judged {
            Judged::Created(created) if created > 0 => {
                if let Some(ReportResult::Applied(applied)) = results.get_mut(candidate.index) {
                    applied.new_waiting += created;
                }
            }
            Judged::NotRun => not_run.push(candidate),
            Judged::Created(_) | Judged::Undecided => {}
        }
    }
    Ok(not_run)
}

/// What the advance did with one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Its rule waits for an upstream still going.
    Undecided,
    /// It runs: instances created or woken (0 when it had one already).
    Created(u32),
    /// It does not run, and now has an instance that says so.
    NotRun,
}

/// Judges each candidate's trigger rule on its direct upstreams' instances in its run. Per
/// workflow version of the batch: one read of the candidates' definitions, one count of their
/// upstreams' instances by state per run or per task (whichever is fewer: a batch of many runs
/// of a small DAG counts per task, a batch of a wide DAG's one run counts per run), one
/// multi-row insert of the instances that run and one of those that do not, all through
/// indexes: the cost depends neither on the size of the workflow, nor on the history, nor on
/// how many candidates were judged at once.
async fn judge_candidates(
    store: &Store,
    c: &mut Counted<'_>,
    candidates: &[TaskEnd],
    now: Millis,
    placing: &mut Placing<'_>,
) -> Result<Vec<Judged>> {
    let mut judged = vec![Judged::Undecided; candidates.len()];
    let mut versions: BTreeMap<(i64, i64), CandidatesOfVersion<'_>> = BTreeMap::new();
    for (i, candidate) in candidates.iter().enumerate() {
        versions
            .entry((candidate.workflow, candidate.version))
            .or_default()
            .insert((candidate.run, candidate.task.as_str()), i);
    }
    for ((workflow, version), wanted) in versions {
        let pairs: Vec<(i64, &str)> = wanted.keys().copied().collect();
        let verdicts = verdicts(c, workflow, version, &pairs).await?;
        let mut ready: Vec<Ready> = Vec::new();
        let mut not_run: Vec<NotRun> = Vec::new();
        let mut skips: Vec<super::conditions::JudgedSkip> = Vec::new();
        let mut fans: Vec<super::fan_out::FanOut> = Vec::new();
        for Decided {
            run,
            task,
            priority,
            verdict,
            failure,
            skipped,
            items,
        } in verdicts
        {
            match (verdict.state(), failure, skipped, items) {
                (None, None, None, None) => ready.push((run, task, priority)),
                (None, None, None, Some(items)) => fans.push((run, task, priority, items)),
                (None, Some(failure), _, _) => {
                    not_run.push((run, task, priority, InstanceState::Failed, Some(failure)))
                }
                (None, None, Some((kind, because)), _) => {
                    skips.push((run, task.clone(), kind, because));
                    not_run.push((run, task, priority, InstanceState::Skipped, None));
                }
                (Some(state), _, _, _) => not_run.push((run, task, priority, state, None)),
            }
        }
        if !fans.is_empty() {
            let created =
                super::fan_out::insert_fan_outs(store, c, workflow, version, &fans, now).await?;
            for ((run, task), n) in created {
                if let Some(&i) = wanted.get(&(run, task.as_str())) {
                    judged[i] = Judged::Created(n);
                }
            }
        }
        if !ready.is_empty() {
            let woke =
                insert_first_attempts(store, c, workflow, version, &ready, now, placing).await?;
            for ((run, task), n) in woke {
                if let Some(&i) = wanted.get(&(run, task.as_str())) {
                    judged[i] = Judged::Created(n);
                }
            }
        }
        if !not_run.is_empty() {
            for (run, task) in insert_not_run(store, c, workflow, version, &not_run, now).await? {
                if let Some(&i) = wanted.get(&(run, task.as_str())) {
                    judged[i] = Judged::NotRun;
                }
            }
            super::conditions::record_skips(c.uncounted(), workflow, &skips, now).await?;
        }
    }
    Ok(judged)
}

/// A (run, task) pair whose rule is decided.
struct Decided {
    run: i64,
    task: String,
    priority: i64,
    verdict: Verdict,
    /// Why a task its rule runs fails before it starts: an output it names is missing, or its
    /// `if:` cannot be judged.
    failure: Option<String>,
    /// Why a task its rule runs is SKIPPED: its `if:` was false, or its list is empty.
    skipped: Option<(DecisionKind, String)>,
    /// A mapped task that runs: its items.
    items: Option<Vec<String>>,
}

/// The candidates of one workflow version: (run, task) → position in the batch's candidates.
type CandidatesOfVersion<'a> = BTreeMap<(i64, &'a str), usize>;

/// A task ready in a run: (run, task, priority).
pub(crate) type Ready = (i64, String, i64);

/// A task that does not run in a run: (run, task, priority, its state, why it failed). SKIPPED
/// or UPSTREAM_FAILED without an attempt; FAILED as attempt 1, with the message, when an output
/// it names was never passed on.
pub(crate) type NotRun = (i64, String, i64, InstanceState, Option<String>);

/// Of the (run, task) pairs of one workflow version, those whose rule is decided, with the
/// task's priority, the verdict and, for a task that runs, the first output it names that its
/// run does not have (read only for tasks that name outputs), then its `if:` judged (only for
/// tasks that have one).
async fn verdicts(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    pairs: &[(i64, &str)],
) -> Result<Vec<Decided>> {
    let tasks: Vec<&str> = pairs
        .iter()
        .map(|(_, task)| *task)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut defs: HashMap<String, (u32, i64, TriggerRule)> = HashMap::new();
    let mut refs: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut conditions: HashMap<String, String> = HashMap::new();
    let mut fan_outs: HashMap<String, (ForEach, u32)> = HashMap::new();
    for names in tasks.chunks(NAMES_PER_STATEMENT) {
        let columns = "upstream_count, priority, trigger_rule, output_refs, run_if, for_each, \
                       max_items";
        for row in definitions(c, workflow, version, names, columns).await? {
            if let Some(source) = row.try_get::<Option<String>, _>("run_if")? {
                conditions.insert(row.try_get("name")?, source);
            }
            if let Some(json) = row.try_get::<Option<String>, _>("for_each")? {
                let for_each: ForEach = serde_json::from_str(&json)
                    .map_err(|err| super::rows::corrupt(format!("for_each: {err}")))?;
                let max_items = row
                    .try_get::<Option<i64>, _>("max_items")?
                    .map_or(Ok(ax_core::for_each::DEFAULT_MAX_ITEMS), |n| {
                        to_u32(n, "max items")
                    })?;
                fan_outs.insert(row.try_get("name")?, (for_each, max_items));
            }
            let rule: String = row.try_get("trigger_rule")?;
            let rule = TriggerRule::parse(&rule)
                .ok_or_else(|| super::rows::corrupt(format!("unknown trigger rule {rule:?}")))?;
            if let Some(json) = row.try_get::<Option<String>, _>("output_refs")? {
                let named: Vec<(String, String)> = serde_json::from_str(&json)
                    .map_err(|err| super::rows::corrupt(format!("output refs: {err}")))?;
                refs.insert(row.try_get("name")?, named);
            }
            defs.insert(
                row.try_get("name")?,
                (
                    to_u32(row.try_get("upstream_count")?, "upstream count")?,
                    row.try_get("priority")?,
                    rule,
                ),
            );
        }
    }
    let runs: BTreeSet<i64> = pairs.iter().map(|(run, _)| *run).collect();
    let mut ends: HashMap<(i64, String), Upstreams> = HashMap::new();
    if runs.len() <= tasks.len() {
        for &run in &runs {
            let of_run: Vec<&str> = pairs
                .iter()
                .filter(|(r, _)| *r == run)
                .map(|(_, task)| *task)
                .collect();
            for names in of_run.chunks(NAMES_PER_STATEMENT) {
                count_upstream_ends(c, workflow, version, &[run], names, &mut ends).await?;
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
                count_upstream_ends(c, workflow, version, runs, &[task], &mut ends).await?;
            }
        }
    }
    let decided: Vec<(i64, String, i64, Verdict)> = pairs
        .iter()
        .filter_map(|(run, task)| {
            let (total, priority, rule) = defs.get(*task)?;
            let upstreams = Upstreams {
                total: *total,
                ..ends
                    .get(&(*run, task.to_string()))
                    .copied()
                    .unwrap_or_default()
            };
            let verdict = judge(*rule, upstreams)?;
            Some((*run, task.to_string(), *priority, verdict))
        })
        .collect();
    let naming: BTreeSet<i64> = decided
        .iter()
        .filter(|(_, task, _, verdict)| *verdict == Verdict::Run && refs.contains_key(task))
        .map(|(run, _, _, _)| *run)
        .collect();
    let outputs = super::outputs::of_runs(c.uncounted(), &naming).await?;
    let mut decided: Vec<Decided> = decided
        .into_iter()
        .map(|(run, task, priority, verdict)| {
            let missing = (verdict == Verdict::Run)
                .then(|| refs.get(&task))
                .flatten()
                .and_then(|named| {
                    let (from, key) = named.iter().find(|(from, key)| {
                        outputs
                            .get(&run)
                            .and_then(|tasks| tasks.get(from))
                            .is_none_or(|out| !out.contains_key(key))
                    })?;
                    Some(format!(
                        "${{tasks.{from}.outputs.{key}}}: task {from} passed on no output {key} \
                         (it did not succeed, or did not write {key} to $AX_OUTPUT)"
                    ))
                });
            Decided {
                run,
                task,
                priority,
                verdict,
                failure: missing,
                skipped: None,
                items: None,
            }
        })
        .collect();
    let conditioned: Vec<(usize, super::conditions::Conditioned<'_>)> = decided
        .iter()
        .enumerate()
        .filter(|(_, d)| d.verdict == Verdict::Run && d.failure.is_none())
        .filter_map(|(i, d)| {
            let source = conditions.get(&d.task)?;
            Some((i, super::conditions::Conditioned { run: d.run, source }))
        })
        .collect();
    if !conditioned.is_empty() {
        let (at, pending): (Vec<usize>, Vec<_>) = conditioned.into_iter().unzip();
        let outcomes = super::conditions::judge(c.uncounted(), &pending).await?;
        drop(pending);
        for (i, outcome) in at.into_iter().zip(outcomes) {
            match outcome {
                super::conditions::Outcome::Run => {}
                super::conditions::Outcome::Skip(because) => {
                    decided[i].skipped = Some((DecisionKind::ConditionFalse, because))
                }
                super::conditions::Outcome::Fail(message) => decided[i].failure = Some(message),
            }
        }
    }
    let mapped: Vec<(usize, super::fan_out::Mapped<'_>)> = decided
        .iter()
        .enumerate()
        .filter(|(_, d)| d.verdict == Verdict::Run && d.failure.is_none() && d.skipped.is_none())
        .filter_map(|(i, d)| {
            let (for_each, max_items) = fan_outs.get(&d.task)?;
            let mapped = super::fan_out::Mapped {
                run: d.run,
                for_each,
                max_items: *max_items,
            };
            Some((i, mapped))
        })
        .collect();
    if !mapped.is_empty() {
        let (at, pending): (Vec<usize>, Vec<_>) = mapped.into_iter().unzip();
        let listed = super::fan_out::lists(c.uncounted(), &pending).await?;
        drop(pending);
        for (i, listed) in at.into_iter().zip(listed) {
            match listed {
                super::fan_out::Listed::Items(items) => decided[i].items = Some(items),
                super::fan_out::Listed::Empty(because) => {
                    decided[i].skipped = Some((DecisionKind::EmptyList, because))
                }
                super::fan_out::Listed::Refused(message) => decided[i].failure = Some(message),
            }
        }
    }
    Ok(decided)
}

/// Adds to `ends` how the upstream instances of each of `tasks` in each of `runs` ended, by
/// (run, task): one statement through the dependency and instance indexes.
async fn count_upstream_ends(
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    runs: &[i64],
    tasks: &[&str],
    ends: &mut HashMap<(i64, String), Upstreams>,
) -> Result<()> {
    let (run_list, padded_runs) = in_list(runs.iter().copied());
    let (task_list, padded_tasks) = in_list(tasks.iter().copied());
    let sql = format!(
        "SELECT ti.run_id, d.downstream, ti.state, COUNT(*) AS n FROM task_dependency d \
         JOIN task_instance ti \
         ON ti.run_id IN ({run_list}) AND ti.task_name = d.upstream AND ti.shard_slot = 0 \
         WHERE d.workflow_id = ? AND d.version = ? AND d.downstream IN ({task_list}) \
         AND ti.state IN ('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELLED', 'SKIPPED', \
         'UPSTREAM_FAILED') GROUP BY ti.run_id, d.downstream, ti.state"
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
        let n = to_u32(row.try_get("n")?, "upstream count")?;
        let entry = ends
            .entry((row.try_get("run_id")?, row.try_get("downstream")?))
            .or_default();
        match UpstreamEnd::of(Some(instance_state(&row.try_get::<String, _>("state")?)?)) {
            Some(UpstreamEnd::Succeeded) => entry.succeeded += n,
            Some(UpstreamEnd::Failed) => entry.failed += n,
            Some(UpstreamEnd::Skipped) => entry.skipped += n,
            None => {}
        }
    }
    Ok(())
}

/// Gives each task of `not_run` its instance in its run, in the state its rule decided, with no
/// attempt (attempt 0): a new row, or its PENDING one (it ran before a rerun from above) moved.
/// Returns the (run, task) pairs that got it; one that has an instance in another state (it ran
/// already) is left alone.
pub(crate) async fn insert_not_run(
    store: &Store,
    c: &mut Counted<'_>,
    workflow: i64,
    version: i64,
    not_run: &[NotRun],
    now: Millis,
) -> Result<Vec<(i64, String)>> {
    let ids = store
        .take_ids(c.uncounted(), IdKind::Instance, not_run.len())
        .await?;
    let rows: Vec<(i64, &NotRun)> = ids.iter().copied().zip(not_run).collect();
    let mut inserted = 0;
    for rows in pow2_chunks(&rows) {
        let sql = format!(
            "{} task_instance (id, run_id, workflow_id, workflow_version, task_name, state, \
             attempt, priority, not_before, created_at, finished_at) VALUES {}",
            store.dialect.insert_ignore(),
            values_rows(rows.len(), 11)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, (run, task, priority, state, _)) in rows {
            // A task failed for a missing output gets its one attempt; one that did not run has
            // none.
            let attempt = i64::from(*state == InstanceState::Failed);
            query = query
                .bind(*id)
                .bind(*run)
                .bind(workflow)
                .bind(version)
                .bind(task.as_str())
                .bind(state.as_str())
                .bind(attempt)
                .bind(*priority)
                .bind(now)
                .bind(now)
                .bind(now);
        }
        inserted += query.execute(&mut *c).await?.rows_affected();
    }
    for (id, (_, _, _, _, message)) in &rows {
        if let Some(message) = message {
            failed_attempt(c, *id, message, now).await?;
        }
    }
    let all = || {
        not_run
            .iter()
            .map(|(run, task, _, _, _)| (*run, task.clone()))
    };
    if inserted as usize == not_run.len() {
        return Ok(all().collect());
    }
    // Some had an instance: the rows whose id is not one this call took. Rare (a rerun from
    // above), so one read per run.
    let fresh: BTreeSet<i64> = ids.into_iter().collect();
    let mut got = Vec::new();
    let runs: BTreeSet<i64> = not_run.iter().map(|(run, _, _, _, _)| *run).collect();
    for run in runs {
        let of_run: Vec<&NotRun> = not_run.iter().filter(|(r, _, _, _, _)| *r == run).collect();
        let names = of_run.iter().map(|(_, task, _, _, _)| task.as_str());
        for row in task_instances_of_run(c, run, names).await? {
            let id: i64 = row.try_get("id")?;
            let task: String = row.try_get("task_name")?;
            if fresh.contains(&id) {
                got.push((run, task));
                continue;
            }
            let Some((_, _, _, to, _)) = of_run.iter().find(|(_, t, _, _, _)| *t == task) else {
                continue;
            };
            let from = instance_state(&row.try_get::<String, _>("state")?)?;
            let verdict = match to {
                InstanceState::Skipped => Verdict::Skip,
                InstanceState::UpstreamFailed => Verdict::UpstreamFailed,
                // A rerun task (PENDING) that fails before it starts (a missing output, an
                // if: that cannot be judged) ends FAILED as its next attempt, with the reason.
                InstanceState::Failed if from == InstanceState::Pending => {
                    let message = of_run
                        .iter()
                        .find(|(_, t, _, _, _)| *t == task)
                        .and_then(|(_, _, _, _, m)| m.as_deref())
                        .unwrap_or("failed before it started");
                    let moved = sqlx::query(
                        "UPDATE task_instance SET state = 'FAILED', attempt = attempt + 1, \
                         worker_id = NULL, finished_at = ? WHERE id = ? AND state = 'PENDING'",
                    )
                    .bind(now)
                    .bind(id)
                    .execute(&mut *c)
                    .await?;
                    if moved.rows_affected() == 1 {
                        failed_attempt(c, id, message, now).await?;
                        got.push((run, task));
                    }
                    continue;
                }
                _ => continue,
            };
            if transition(from, Event::Judged(verdict)).is_err() {
                continue;
            }
            let moved = sqlx::query(
                "UPDATE task_instance SET state = ?, finished_at = ? \
                 WHERE id = ? AND attempt = ? AND state = ?",
            )
            .bind(to.as_str())
            .bind(now)
            .bind(id)
            .bind(row.try_get::<i64, _>("attempt")?)
            .bind(from.as_str())
            .execute(&mut *c)
            .await?;
            if moved.rows_affected() == 1 {
                got.push((run, task));
            }
        }
    }
    Ok(got)
}

/// The attempt row, as its current attempt, of an instance failed before it ran (an output it
/// names is missing, its if: cannot be judged); none when the insert found the task's instance
/// there already and `id` was not inserted.
async fn failed_attempt(c: &mut Counted<'_>, id: i64, message: &str, now: Millis) -> Result<()> {
    sqlx::query(
        "INSERT INTO task_attempt (instance_id, attempt, state, finished_at, log_lines, message) \
         SELECT id, attempt, 'FAILED', ?, 0, ? FROM task_instance WHERE id = ?",
    )
    .bind(now)
    .bind(message)
    .bind(id)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Inserts the first attempt of each ready (run, task), in multi-row statements: WAITING, or
/// DISPATCHED with its attempt row when `placing` places it. A task whose instance exists
/// already (it ran before a rerun from above and is PENDING) is woken instead. Returns, per
/// (run, task), the instances created or woken.
pub(crate) async fn insert_first_attempts(
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
        let names = ready
            .iter()
            .filter(|(r, _, _)| *r == run)
            .map(|(_, task, _)| task.as_str());
        for row in task_instances_of_run(c, run, names).await? {
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

/// The task instances (not shards) of `tasks` in `run`, as rows of `id, task_name, attempt,
/// state`: where an insert of the advance found an instance already.
pub(crate) async fn task_instances_of_run<'t>(
    c: &mut Counted<'_>,
    run: i64,
    tasks: impl Iterator<Item = &'t str>,
) -> Result<Vec<sqlx::any::AnyRow>> {
    let (list, tasks) = in_list(tasks);
    let sql = format!(
        "SELECT id, task_name, attempt, state FROM task_instance \
         WHERE run_id = ? AND shard_slot = 0 AND task_name IN ({list})"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(run);
    for task in tasks {
        query = query.bind(task);
    }
    Ok(query.fetch_all(&mut *c).await?)
}
