//! Applies worker reports to the store in batches.
//!
//! Every report is a conditional transition; applying many in one transaction is what lets a
//! durable store keep up with thousands of transitions a second (one commit per transition,
//! serially, caps a scheduler at a few hundred). Reports of one stream stay in order because
//! they pass through this one queue.

use std::sync::Arc;
use std::time::Duration;

use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use ax_proto::v1::{FinishedAck, ReportRefused, SchedulerMessage, scheduler_message};
use ax_store::{Applied, AttemptEnd, Report, ReportResult};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alert, AlertKind};
use crate::clock::now_ms;
use crate::node::Node;

/// The most reports applied in one transaction.
const MAX_BATCH: usize = 512;

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

pub type ReportSender = mpsc::Sender<Envelope>;

pub fn channel() -> (ReportSender, mpsc::Receiver<Envelope>) {
    mpsc::channel(8192)
}

/// Runs until the channel closes or `cancel` fires with the queue drained.
pub async fn run(node: Arc<Node>, mut inbox: mpsc::Receiver<Envelope>, cancel: CancellationToken) {
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
        apply(&node, &batch).await;
        batch.clear();
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

async fn apply(node: &Arc<Node>, batch: &[Envelope]) {
    let reports: Vec<Report> = batch
        .iter()
        .map(|envelope| envelope.report.clone())
        .collect();
    let started = std::time::Instant::now();
    let started_at = std::time::SystemTime::now();
    let mut delay = Duration::from_millis(50);
    // A store outage must not lose reports: they are retried until the store takes them.
    // Retrying is safe because every report is a conditional transition.
    let results = loop {
        // The tasks the batch makes ready go straight to this node's free slots.
        let mut placement = crate::place_now::PlaceNow::new(node);
        match node
            .store
            .apply_reports_placed(&reports, now_ms(), &mut placement)
            .await
        {
            Ok((results, placed)) => {
                placement.send(placed).await;
                break results;
            }
            Err(err) => {
                placement.abandon();
                if err.is_unreachable() {
                    node.watching.store_lost();
                }
                tracing::error!(error = %err, reports = reports.len(), "applying reports failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    };
    let elapsed = started.elapsed();
    node.metrics.report_batch.observe(elapsed.as_secs_f64());
    if let Some(traces) = &node.traces {
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
        traces.send(crate::telemetry::Event::Reports {
            started: started_at,
            ended: started_at + elapsed,
            reports,
            batch: batch.len(),
        });
    }
    tracing::debug!(
        reports = reports.len(),
        elapsed_us = elapsed.as_micros() as u64,
        "report batch applied"
    );
    let mut wake_dispatch = false;
    let mut failures = Vec::new();
    for (envelope, result) in batch.iter().zip(results) {
        match (&envelope.report, result) {
            (report, ReportResult::Applied(applied)) => {
                wake_dispatch |= applied.new_waiting > 0;
                count(node, envelope, &applied);
                match report {
                    Report::Rejected {
                        instance_id,
                        attempt,
                        ..
                    } => {
                        node.registry
                            .end_attempt(&envelope.worker, *instance_id, *attempt);
                        node.guards.clear_dispatch(*instance_id, *attempt).await;
                        node.guards.release_start(*instance_id, *attempt).await;
                        wake_dispatch = true;
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
                            failures.push(Failure {
                                instance: *instance_id,
                                attempt: *attempt,
                                applied: applied.clone(),
                                message: message.clone(),
                            });
                        }
                        node.registry
                            .end_attempt(&envelope.worker, *instance_id, *attempt);
                        // A timeout this node declared ends the attempt in the store, not its
                        // process: the start lock stays with it, so the retry never runs beside
                        // it, until its worker reports the end (or the lock expires).
                        let process_may_run = !envelope.from_worker
                            && applied.attempt_state == Some(InstanceState::Timeout);
                        if !process_may_run {
                            node.guards.release_start(*instance_id, *attempt).await;
                        }
                        if envelope.from_worker {
                            acknowledge_finished(node, &envelope.worker, *instance_id, *attempt);
                        }
                        // A finished attempt frees a slot on its worker.
                        wake_dispatch = true;
                    }
                    Report::Started { .. } | Report::TaskHeartbeat { .. } => {}
                }
                if let Some((run, state)) = applied.run_finished {
                    tracing::info!(run = %run, state = %state, "run finished");
                    crate::telemetry::run_ended(node, run);
                    if state == RunState::Failed {
                        failures.push(Failure::run(run));
                    }
                    node.bump_progress();
                }
            }
            (report, ReportResult::NotYours) if envelope.from_worker => {
                refuse_stranger(node, &envelope.worker, report)
            }
            (report, refusal) if envelope.from_worker => {
                refuse(node, &envelope.worker, report, &refusal).await
            }
            // This node's own verdict lost a race (the worker reported first, or another node
            // judged it): nothing to undo.
            (_, _) => {}
        }
    }
    node.bump_progress();
    if wake_dispatch {
        node.dispatch_wake.notify_one();
    }
    if !failures.is_empty() && node.alerter.is_enabled() {
        // Alerts need names from the store; they are built off the reporter's path.
        tokio::spawn(raise_alerts(node.clone(), failures));
    }
}

/// Counts what an applied report did, for `/metrics`.
fn count(node: &Node, envelope: &Envelope, applied: &Applied) {
    let metrics = &node.metrics;
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
                _ if !envelope.from_worker && message.starts_with(crate::backstop::LOST) => {
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

/// A failure worth an alert: an attempt that did not succeed, or a run that failed.
struct Failure {
    instance: InstanceId,
    attempt: Attempt,
    applied: Applied,
    message: String,
}

impl Failure {
    fn run(run: RunId) -> Failure {
        Failure {
            instance: InstanceId(0),
            attempt: Attempt(0),
            applied: Applied {
                run_finished: Some((run, RunState::Failed)),
                ..Applied::default()
            },
            message: String::new(),
        }
    }
}

async fn raise_alerts(node: Arc<Node>, failures: Vec<Failure>) {
    let now = now_ms();
    for failure in failures {
        if failure.instance.0 == 0 {
            let Some((run, _)) = failure.applied.run_finished else {
                continue;
            };
            let Ok(Some(record)) = node.store.get_run(run).await else {
                continue;
            };
            let counts = node.store.run_counts(run).await.unwrap_or_default();
            let message = format!(
                "run failed: {} succeeded, {} failed, {} timed out, {} not run",
                counts.success, counts.failed, counts.timeout, counts.not_created
            );
            node.alerter.notify(
                Alert::new(AlertKind::RunFailed, record.workflow, message, now).with_run(run.0),
            );
            continue;
        }
        let Ok(Some(instance)) = node.store.get_instance(failure.instance).await else {
            continue;
        };
        let alert = |kind, message: String| {
            Alert::new(kind, instance.workflow.clone(), message, now)
                .with_run(instance.run_id.0)
                .with_instance(instance.id.0, instance.task.clone(), failure.attempt.0)
        };
        let detail = if failure.message.is_empty() {
            "failed".to_string()
        } else {
            failure.message.clone()
        };
        let timed_out = failure.applied.attempt_state == Some(InstanceState::Timeout);
        if timed_out {
            node.alerter
                .notify(alert(AlertKind::InstanceTimeout, detail.clone()));
        }
        if failure.applied.retry_scheduled {
            continue;
        }
        if !timed_out {
            node.alerter
                .notify(alert(AlertKind::InstanceFailed, detail.clone()));
        }
        if failure.attempt.0 > 1 {
            let message = format!("gave up after {} attempts: {detail}", failure.attempt.0);
            node.alerter
                .notify(alert(AlertKind::RetriesExhausted, message));
        }
    }
}

/// Tells the worker its AttemptFinished is stored, so it stops resending it.
fn acknowledge_finished(node: &Node, worker: &str, instance: InstanceId, attempt: Attempt) {
    if let Some(sender) = node.registry.sender(worker) {
        let ack = SchedulerMessage {
            body: Some(scheduler_message::Body::FinishedAck(FinishedAck {
                instance_id: instance.0,
                attempt: attempt.0,
            })),
        };
        // A full queue: the worker resends the report on its next stream, and it is acked then.
        let _ = sender.try_send(Ok(ack));
    }
}

/// A report about an attempt that was not dispatched to its sender (another worker's, or one
/// that does not exist yet): nothing was stored, and nothing of the attempt is touched here
/// (not its slot, not its start lock: they are its own worker's). The refusal is counted and
/// audited, and the sender told (to kill what it runs under that attempt: it is not its own).
fn refuse_stranger(node: &Node, worker: &str, report: &Report) {
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
    let stream = node.registry.stream_info(worker).unwrap_or_default();
    node.refusals.record(
        &node.metrics,
        crate::worker_refusals::Refusal {
            worker: worker.to_string(),
            action: crate::worker_refusals::FRAME_REFUSED,
            kind,
            detail: why.clone(),
            remote: stream.remote,
            token: stream.token,
        },
    );
    if let Some(sender) = node.registry.sender(worker) {
        let message = SchedulerMessage {
            body: Some(scheduler_message::Body::Refused(ReportRefused {
                instance_id: instance_id.0,
                attempt: attempt.0,
                reason: why,
                kill: !matches!(report, Report::Finished { .. }),
                code: tonic::Code::PermissionDenied as i32,
            })),
        };
        let _ = sender.try_send(Ok(message));
    }
}

/// A report for an attempt that is not current: the worker is told, and told to kill the
/// process (the attempt number is the fencing token).
async fn refuse(node: &Node, worker: &str, report: &Report, result: &ReportResult) {
    let (instance_id, attempt) = report.key();
    let finished = matches!(report, Report::Finished { .. } | Report::Rejected { .. });
    if finished {
        node.registry.end_attempt(worker, instance_id, attempt);
    }
    if matches!(report, Report::Finished { .. }) {
        // The worker says this attempt's process is over: the start lock is free for the next
        // (a no-op unless this attempt holds it).
        node.guards.release_start(instance_id, attempt).await;
    }
    let code = match result {
        ReportResult::NotFound => tonic::Code::NotFound,
        _ => tonic::Code::FailedPrecondition,
    };
    node.metrics.report_refused(match result {
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
    if let Some(sender) = node.registry.sender(worker) {
        let message = SchedulerMessage {
            body: Some(scheduler_message::Body::Refused(ReportRefused {
                instance_id: instance_id.0,
                attempt: attempt.0,
                reason,
                kill: !finished,
                code: code as i32,
            })),
        };
        let _ = sender.try_send(Ok(message));
    }
}
