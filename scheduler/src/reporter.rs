//! Applies worker reports to the store in batches.
//!
//! Every report is a conditional transition; applying many in one transaction is what lets a
//! durable store keep up with thousands of transitions a second (one commit per transition,
//! serially, caps a scheduler at a few hundred). Reports of one stream stay in order because
//! they pass through this one queue.

use std::sync::Arc;
use std::time::Duration;

use ax_core::ids::{Attempt, InstanceId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use ax_store::{Applied, AttemptEnd, PlacedAttempt, Report, ReportResult, Store};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::dispatch_send::Undone;
use crate::failure_alerts::{Failure, FailureAlerts};
use crate::guards::Guards;
use crate::metrics::Metrics;
use crate::place_now::{PlaceNow, Placing};
use crate::progress::Progress;
use crate::registry::Registry;
use crate::telemetry::{Event, Traces};
use crate::to_worker::{self, ToWorker};
use crate::wake::Wake;
use crate::watching::Watching;
use crate::worker_refusals::{FRAME_REFUSED, Refusal, WorkerRefusals};

/// The most reports applied in one transaction.
const MAX_BATCH: usize = 512;
/// Reports queued at most; past it their senders wait.
const QUEUE: usize = 8192;

pub struct Envelope {
    /// The worker the attempt is on (the sender, when `from_worker`).
    pub worker: String,
    pub report: Report,
    /// Sent by the worker itself (a stale one is answered), rather than decided by this node
    /// (the liveness backstop, an undeliverable dispatch).
    pub from_worker: bool,
}

impl Envelope {
    /// A report this node decided about an attempt on `worker`.
    pub fn decided(worker: &str, report: Report) -> Envelope {
        Envelope {
            worker: worker.to_string(),
            report,
            from_worker: false,
        }
    }
}

/// The reporter stopped: the node is shutting down.
#[derive(Debug)]
pub struct Stopped;

/// Queues reports for the reporter; clones share its queue.
#[derive(Clone)]
pub struct Reports {
    sender: mpsc::Sender<Envelope>,
}

impl Reports {
    /// Queues a report; waits while the queue is full.
    pub async fn send(&self, envelope: Envelope) -> Result<(), Stopped> {
        self.sender.send(envelope).await.map_err(|_| Stopped)
    }

    /// Puts an attempt that was claimed and not sent back to WAITING.
    pub async fn put_back(&self, undone: Undone) {
        let _ = self
            .send(Envelope::decided(&undone.worker, *undone.report))
            .await;
    }
}

/// How the message of a lost attempt begins (the metrics count lost attempts by it).
pub const LOST: &str = "lost: ";

/// The reporter: its queue, and the path a batch takes.
pub struct Reporter {
    inbox: mpsc::Receiver<Envelope>,
    /// The queue's sender, for [`Reporter::handle`]; dropped when it runs.
    sender: mpsc::Sender<Envelope>,
    path: BatchPath,
}

/// The path a batch takes: the node's parts its results reach.
pub struct BatchPath {
    pub store: Arc<Store>,
    pub placing: Placing,
    pub registry: Arc<Registry>,
    pub guards: Arc<dyn Guards>,
    pub metrics: Arc<Metrics>,
    pub traces: Traces,
    pub refusals: Arc<WorkerRefusals>,
    pub alerts: FailureAlerts,
    pub watching: Arc<Watching>,
    pub progress: Progress,
    /// The dispatcher's wake-up: a batch made instances WAITING, or freed slots.
    pub dispatch: Wake,
    /// Masks secrets' values in outputs before they are stored, as in log lines.
    pub secrets: Arc<crate::secrets::Secrets>,
}

/// What a batch's results leave to do once its workers are answered.
#[derive(Default)]
struct Effects {
    /// Instances became WAITING, or slots were freed.
    wake_dispatch: bool,
    failures: Vec<Failure>,
}

impl Reporter {
    pub fn new(path: BatchPath) -> Reporter {
        let (sender, inbox) = mpsc::channel(QUEUE);
        Reporter {
            inbox,
            sender,
            path,
        }
    }

    pub fn handle(&self) -> Reports {
        Reports {
            sender: self.sender.clone(),
        }
    }

    /// Runs until every handle is dropped, or `cancel` fires with the queue drained.
    pub async fn run(self, cancel: CancellationToken) {
        let Reporter {
            mut inbox,
            sender,
            path,
        } = self;
        // Undone placements go back through the queue, which still closes with the last handle.
        let requeue = sender.downgrade();
        drop(sender);
        let mut batch: Vec<Envelope> = Vec::with_capacity(MAX_BATCH);
        loop {
            let received = tokio::select! {
                biased;
                n = inbox.recv_many(&mut batch, MAX_BATCH) => n,
                _ = cancel.cancelled() => {
                    inbox.close();
                    inbox.recv_many(&mut batch, MAX_BATCH).await
                }
            };
            if received == 0 {
                return;
            }
            if batch.iter().all(|envelope| !ends_attempt(&envelope.report)) {
                linger(&mut inbox, &mut batch).await;
            }
            let undone = path.apply(&batch).await;
            if let Some(reports) = requeue.upgrade().map(|sender| Reports { sender }) {
                for undone in undone {
                    reports.put_back(undone).await;
                }
            }
            batch.clear();
        }
    }
}

/// How long a batch of starts and heartbeats waits for more reports before it is applied.
const LINGER: Duration = Duration::from_millis(2);

fn ends_attempt(report: &Report) -> bool {
    matches!(report, Report::Finished { .. } | Report::Rejected { .. })
}

/// Lets a batch of starts and heartbeats wait up to `LINGER` for an attempt's end, which then
/// goes in the same transaction. A short task's start and end arrive a moment apart: applied
/// one after the other, the end (which makes the next task ready) would wait for the start's
/// whole transaction. Nothing waits on a start being stored but the views.
async fn linger(inbox: &mut mpsc::Receiver<Envelope>, batch: &mut Vec<Envelope>) {
    let deadline = tokio::time::Instant::now() + LINGER;
    while batch.len() < MAX_BATCH {
        let room = MAX_BATCH - batch.len();
        match tokio::time::timeout_at(deadline, inbox.recv_many(batch, room)).await {
            Ok(0) | Err(_) => return,
            Ok(_) if batch.iter().any(|envelope| ends_attempt(&envelope.report)) => return,
            Ok(_) => {}
        }
    }
}

impl BatchPath {
    /// One batch, its path in order: stored in one transaction, the tasks it made ready placed
    /// on this node's workers (`place_now.rs`); those dispatches sent (`dispatch_send.rs`);
    /// its spans queued (`telemetry.rs`); its workers answered and the node's state moved on
    /// (here); its failures alerted (`failure_alerts.rs`). Returns the placed attempts that
    /// could not be sent, to put back WAITING.
    async fn apply(&self, batch: &[Envelope]) -> Vec<Undone> {
        let mut reports: Vec<Report> = batch
            .iter()
            .map(|envelope| envelope.report.clone())
            .collect();
        for report in &mut reports {
            if let Report::Finished { outputs, .. } = report
                && !outputs.is_empty()
            {
                self.secrets.mask_outputs(outputs).await;
            }
        }
        let started = std::time::Instant::now();
        let started_at = std::time::SystemTime::now();
        let (results, placed, placement) = self.store(&reports).await;
        let undone = placement.send(placed).await;
        let elapsed = started.elapsed();
        self.metrics.report_batch.observe(elapsed.as_secs_f64());
        self.trace(&reports, batch.len(), started_at, elapsed);
        tracing::debug!(
            reports = reports.len(),
            elapsed_us = elapsed.as_micros() as u64,
            "report batch applied"
        );
        let effects = self.answer(batch, results).await;
        self.progress.bump();
        if effects.wake_dispatch {
            self.dispatch.notify_one();
        }
        self.alerts.raise(effects.failures);
        undone
    }

    /// Stores the reports in one transaction, with the tasks they make ready placed on this
    /// node's free slots. A store outage must not lose reports: they are retried until the
    /// store takes them, which is safe because every report is a conditional transition.
    async fn store(
        &self,
        reports: &[Report],
    ) -> (Vec<ReportResult>, Vec<PlacedAttempt>, PlaceNow<'_>) {
        let mut delay = Duration::from_millis(50);
        loop {
            let mut placement = self.placing.begin();
            match self
                .store
                .apply_reports_placed(reports, now_ms(), &mut placement)
                .await
            {
                Ok((results, placed)) => return (results, placed, placement),
                Err(err) => {
                    placement.abandon();
                    if err.is_unreachable() {
                        self.watching.store_lost();
                    }
                    tracing::error!(error = %err, reports = reports.len(), "applying reports failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Queues the batch's report spans, when the node exports traces.
    fn trace(
        &self,
        reports: &[Report],
        batch: usize,
        started: std::time::SystemTime,
        elapsed: Duration,
    ) {
        if !self.traces.enabled() {
            return;
        }
        let reports = reports
            .iter()
            .filter_map(|report| {
                let kind = match report {
                    Report::Started { .. } => "started",
                    Report::Finished { .. } => "finished",
                    Report::Rejected { .. } => "rejected",
                    Report::TaskHeartbeat { .. } => return None,
                };
                let (instance, attempt) = report.key();
                Some((instance, attempt, kind))
            })
            .collect();
        self.traces.send(Event::Reports {
            started,
            ended: started + elapsed,
            reports,
            batch,
        });
    }

    /// What each stored report's result does here: its worker's slot and start lock freed,
    /// the worker acknowledged or refused, the ended run's spans, the counts.
    async fn answer(&self, batch: &[Envelope], results: Vec<ReportResult>) -> Effects {
        let mut effects = Effects::default();
        for (envelope, result) in batch.iter().zip(results) {
            if let Report::Finished {
                instance_id,
                attempt,
                ..
            }
            | Report::Started {
                instance_id,
                attempt,
                ..
            } = &envelope.report
            {
                // One line per start and end, for following an attempt through a fault.
                tracing::debug!(instance = %instance_id, %attempt, worker = %envelope.worker, from_worker = envelope.from_worker, end = ends_attempt(&envelope.report), ?result, "attempt report stored");
            }
            match (&envelope.report, result) {
                (report, ReportResult::Applied(applied)) => {
                    self.applied(envelope, report, applied, &mut effects).await
                }
                (report, ReportResult::NotYours) if envelope.from_worker => {
                    self.refuse_stranger(&envelope.worker, report)
                }
                (report, refusal) if envelope.from_worker => {
                    self.refuse(&envelope.worker, report, &refusal).await
                }
                // This node's own verdict lost a race (the worker reported first, or another
                // node judged it): nothing to undo.
                (_, _) => {}
            }
        }
        effects
    }

    async fn applied(
        &self,
        envelope: &Envelope,
        report: &Report,
        applied: Applied,
        effects: &mut Effects,
    ) {
        effects.wake_dispatch |= applied.new_waiting > 0;
        self.count(envelope, &applied);
        match report {
            Report::Rejected {
                instance_id,
                attempt,
                ..
            } => {
                self.registry
                    .end_attempt(&envelope.worker, *instance_id, *attempt);
                self.guards.clear_dispatch(*instance_id, *attempt).await;
                self.guards.release_start(*instance_id, *attempt).await;
                effects.wake_dispatch = true;
            }
            Report::Finished {
                instance_id,
                attempt,
                message,
                ..
            } => {
                if applied
                    .attempt_state
                    .is_some_and(|state| state != InstanceState::Success)
                {
                    effects.failures.push(Failure {
                        instance: *instance_id,
                        attempt: *attempt,
                        applied: applied.clone(),
                        message: message.clone(),
                    });
                }
                self.registry
                    .end_attempt(&envelope.worker, *instance_id, *attempt);
                // A timeout this node declared ends the attempt in the store, not its
                // process: the start lock stays with it, so the retry never runs beside
                // it, until its worker reports the end (or the lock expires).
                let process_may_run =
                    !envelope.from_worker && applied.attempt_state == Some(InstanceState::Timeout);
                if !process_may_run {
                    self.guards.release_start(*instance_id, *attempt).await;
                }
                if envelope.from_worker {
                    self.acknowledge_finished(&envelope.worker, *instance_id, *attempt);
                }
                // A finished attempt frees a slot on its worker.
                effects.wake_dispatch = true;
            }
            Report::Started { .. } | Report::TaskHeartbeat { .. } => {}
        }
        if let Some((run, state)) = applied.run_finished {
            tracing::info!(run = %run, state = %state, "run finished");
            self.traces.run_ended(run);
            if state == RunState::Failed {
                effects.failures.push(Failure::run(run));
            }
            self.progress.bump();
        }
    }

    /// Counts what an applied report did, for `/metrics`.
    fn count(&self, envelope: &Envelope, applied: &Applied) {
        let metrics = &self.metrics;
        match &envelope.report {
            Report::Finished { end, message, .. } => {
                let Some(state) = applied.attempt_state else {
                    // A late ending of an attempt already ended: counted when it ended.
                    return;
                };
                let outcome = match state {
                    InstanceState::Success => "success",
                    InstanceState::Timeout => {
                        metrics.timeouts.inc();
                        "timeout"
                    }
                    _ if *end == AttemptEnd::SpawnFailed => "spawn_failed",
                    _ if !envelope.from_worker && message.starts_with(LOST) => {
                        metrics.lost.inc();
                        "lost"
                    }
                    _ => "failed",
                };
                metrics.attempt_finished(outcome);
            }
            Report::Rejected {
                withdrawn: true, ..
            } if applied.attempt_ended => {
                metrics.attempt_finished("withdrawn");
            }
            Report::Rejected { .. } | Report::Started { .. } | Report::TaskHeartbeat { .. } => {}
        }
        if applied.retry_scheduled {
            metrics.retries.inc();
        }
    }

    /// Tells the worker its AttemptFinished is stored, so it stops resending it.
    fn acknowledge_finished(&self, worker: &str, instance: InstanceId, attempt: Attempt) {
        if let Some(outbox) = self.registry.outbox(worker) {
            // A full queue: the worker sends the report again (on this stream after 15 s
            // unanswered, or on its next one), and the store's answer to a repeated end acks it.
            outbox.tell(ToWorker::FinishedAck { instance, attempt });
        }
    }

    /// A report about an attempt that was not dispatched to its sender (another worker's, or one
    /// that does not exist yet): nothing was stored, and nothing of the attempt is touched here
    /// (not its slot, not its start lock: they are its own worker's). The refusal is counted and
    /// audited, and the sender told (to kill what it runs under that attempt: it is not its own).
    fn refuse_stranger(&self, worker: &str, report: &Report) {
        let (instance_id, attempt) = report.key();
        let (kind, frame) = match report {
            Report::Started { .. } => ("started", "AttemptStarted"),
            Report::Finished { .. } => ("finished", "AttemptFinished"),
            Report::TaskHeartbeat { .. } => ("heartbeat", "TaskHeartbeat"),
            Report::Rejected { .. } => ("rejected", "DispatchRejected"),
        };
        let why = format!(
            "{frame} for attempt {attempt} of instance {instance_id}, which was not dispatched to \
             worker {worker}: not stored"
        );
        let stream = self.registry.stream_info(worker).unwrap_or_default();
        self.refusals.record(
            &self.metrics,
            Refusal {
                worker: worker.to_string(),
                action: FRAME_REFUSED,
                kind,
                detail: why.clone(),
                remote: stream.remote,
                token: stream.token,
            },
        );
        if let Some(outbox) = self.registry.outbox(worker) {
            outbox.tell(ToWorker::Refused {
                instance: instance_id,
                attempt,
                reason: why,
                kill: !matches!(report, Report::Finished { .. }),
                why: to_worker::Refusal::Stranger,
            });
        }
    }

    /// A report for an attempt that is not current: the worker is told, and told to kill the
    /// process (the attempt number is the fencing token), as a cancel when the scheduler ended
    /// the attempt itself ([`answer_to_stale`]).
    async fn refuse(&self, worker: &str, report: &Report, result: &ReportResult) {
        let (instance_id, attempt) = report.key();
        let finished = matches!(report, Report::Finished { .. } | Report::Rejected { .. });
        if finished {
            self.registry.end_attempt(worker, instance_id, attempt);
        }
        if matches!(report, Report::Finished { .. }) {
            // The worker says this attempt's process is over: the start lock is free for the next
            // (a no-op unless this attempt holds it).
            self.guards.release_start(instance_id, attempt).await;
        }
        match answer_to_stale(report, result) {
            StaleAnswer::Cancel(reason) => {
                tracing::info!(instance = %instance_id, %attempt, worker, %reason, "report of an attempt the scheduler ended; telling the worker to kill it");
                self.metrics.report_refused("stale");
                self.registry
                    .tell_cancel(worker, instance_id, attempt, &reason);
                return;
            }
            StaleAnswer::Stored => {
                tracing::debug!(instance = %instance_id, %attempt, worker, "an end stored already was reported again");
                self.acknowledge_finished(worker, instance_id, attempt);
                return;
            }
            StaleAnswer::Refuse => {}
        }
        let why = match result {
            ReportResult::NotFound => to_worker::Refusal::Unknown,
            _ => to_worker::Refusal::Stale,
        };
        self.metrics.report_refused(match result {
            ReportResult::NotFound => "not_found",
            _ => "stale",
        });
        let reason = match result {
            ReportResult::Stale {
                current_attempt,
                state,
            } => format!(
                "attempt {attempt} of instance {instance_id} is not current (current attempt {current_attempt}, state {state})"
            ),
            _ => format!("instance {instance_id} not found"),
        };
        tracing::warn!(instance = %instance_id, attempt = %attempt, worker, %reason, "report refused");
        if let Some(outbox) = self.registry.outbox(worker) {
            outbox.tell(ToWorker::Refused {
                instance: instance_id,
                attempt,
                reason,
                kill: !finished,
                why,
            });
        }
    }
}

/// How a worker is answered about a report the store did not apply.
#[derive(Debug, PartialEq, Eq)]
enum StaleAnswer {
    /// Kill the process as a cancel and report its end: the store keeps that end as the
    /// attempt's late ending.
    Cancel(String),
    /// The end is the one stored already (a worker offers the ends acknowledged in its last
    /// seconds again to each new stream): acknowledge it again.
    Stored,
    /// Refuse the report (a refused report of a running process has the worker kill and forget
    /// it).
    Refuse,
}

/// A report of a running process (started, task heartbeat) whose attempt the scheduler itself
/// ended while the report was on its way (a cancel, the backstop's timeout) is answered with a
/// cancel, as the worker would have been told had the end come first: a refusal would have it
/// forget the attempt, and the process's exit code or signal would be lost.
fn answer_to_stale(report: &Report, result: &ReportResult) -> StaleAnswer {
    let (instance_id, attempt) = report.key();
    let running = matches!(
        report,
        Report::Started { .. } | Report::TaskHeartbeat { .. }
    );
    match result {
        ReportResult::Stale {
            current_attempt,
            state: state @ (InstanceState::Cancelled | InstanceState::Timeout),
        } if running && *current_attempt == attempt => StaleAnswer::Cancel(format!(
            "attempt {attempt} of instance {instance_id} was ended {state}"
        )),
        ReportResult::Stale {
            current_attempt,
            state: InstanceState::Success,
        } if *current_attempt == attempt
            && matches!(
                report,
                Report::Finished {
                    end: AttemptEnd::Finished(ax_core::state::Outcome::Success),
                    ..
                }
            ) =>
        {
            StaleAnswer::Stored
        }
        _ => StaleAnswer::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_core::state::Outcome;

    fn started(attempt: u32) -> Report {
        Report::Started {
            instance_id: InstanceId(7),
            attempt: Attempt(attempt),
            worker_id: "w1".into(),
            pid: 1,
            at: 0,
        }
    }

    fn stale(current: u32, state: InstanceState) -> ReportResult {
        ReportResult::Stale {
            current_attempt: Attempt(current),
            state,
        }
    }

    #[test]
    fn a_running_report_of_an_attempt_the_scheduler_ended_is_answered_with_a_cancel() {
        for state in [InstanceState::Cancelled, InstanceState::Timeout] {
            assert_eq!(
                answer_to_stale(&started(2), &stale(2, state)),
                StaleAnswer::Cancel(format!("attempt 2 of instance 7 was ended {state}"))
            );
        }
        let heartbeat = Report::TaskHeartbeat {
            instance_id: InstanceId(7),
            attempt: Attempt(1),
            worker_id: Some("w1".into()),
            at: 0,
        };
        assert!(matches!(
            answer_to_stale(&heartbeat, &stale(1, InstanceState::Cancelled)),
            StaleAnswer::Cancel(_)
        ));
    }

    #[test]
    fn other_stale_reports_are_refused() {
        // The instance went on to a later attempt: this one is not the worker's to report.
        assert_eq!(
            answer_to_stale(&started(1), &stale(2, InstanceState::Cancelled)),
            StaleAnswer::Refuse
        );
        // The attempt ended some other way (its own end, another worker's).
        assert_eq!(
            answer_to_stale(&started(1), &stale(1, InstanceState::Failed)),
            StaleAnswer::Refuse
        );
        assert_eq!(
            answer_to_stale(&started(1), &ReportResult::NotFound),
            StaleAnswer::Refuse
        );
        // An end is never answered with a cancel: its process is over.
        assert_eq!(
            answer_to_stale(
                &finished(1, Outcome::Failed),
                &stale(1, InstanceState::Cancelled)
            ),
            StaleAnswer::Refuse
        );
    }

    fn finished(attempt: u32, outcome: Outcome) -> Report {
        Report::Finished {
            instance_id: InstanceId(7),
            attempt: Attempt(attempt),
            worker_id: Some("w1".into()),
            end: AttemptEnd::Finished(outcome),
            exit_code: Some(0),
            signal: None,
            at: 0,
            log_lines: 0,
            message: String::new(),
            outputs: Default::default(),
        }
    }

    #[test]
    fn a_success_reported_again_is_acknowledged_and_anything_else_refused() {
        assert_eq!(
            answer_to_stale(
                &finished(2, Outcome::Success),
                &stale(2, InstanceState::Success)
            ),
            StaleAnswer::Stored
        );
        // Another attempt succeeded, or this one ended otherwise: the report is not the stored end.
        assert_eq!(
            answer_to_stale(
                &finished(1, Outcome::Success),
                &stale(2, InstanceState::Success)
            ),
            StaleAnswer::Refuse
        );
        assert_eq!(
            answer_to_stale(
                &finished(1, Outcome::Success),
                &stale(1, InstanceState::Failed)
            ),
            StaleAnswer::Refuse
        );
        assert_eq!(
            answer_to_stale(
                &finished(1, Outcome::Failed),
                &stale(1, InstanceState::Success)
            ),
            StaleAnswer::Refuse
        );
    }
}
