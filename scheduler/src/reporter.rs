//! Applies worker reports to the store in batches.
//!
//! Every report is a conditional transition; applying many in one transaction is what lets a
//! durable store keep up with thousands of transitions a second (one commit per transition,
//! serially, caps a scheduler at a few hundred). Reports of one stream stay in order because
//! they pass through this one queue.

use std::sync::Arc;
use std::time::Duration;

use ax_proto::v1::{ReportRefused, SchedulerMessage, scheduler_message};
use ax_store::{Report, ReportResult};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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
        apply(&node, &batch).await;
        batch.clear();
    }
}

async fn apply(node: &Node, batch: &[Envelope]) {
    let reports: Vec<Report> = batch
        .iter()
        .map(|envelope| envelope.report.clone())
        .collect();
    let mut delay = Duration::from_millis(50);
    // A store outage must not lose reports: they are retried until the store takes them.
    // Retrying is safe because every report is a conditional transition.
    let results = loop {
        match node.store.apply_reports(&reports, now_ms()).await {
            Ok(results) => break results,
            Err(err) => {
                tracing::error!(error = %err, reports = reports.len(), "applying reports failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    };
    let mut wake_dispatch = false;
    for (envelope, result) in batch.iter().zip(results) {
        match (&envelope.report, result) {
            (report, ReportResult::Applied(applied)) => {
                wake_dispatch |= applied.new_waiting > 0;
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
                        ..
                    } => {
                        node.registry
                            .end_attempt(&envelope.worker, *instance_id, *attempt);
                        node.guards.release_start(*instance_id, *attempt).await;
                        // A finished attempt frees a slot on its worker.
                        wake_dispatch = true;
                    }
                    Report::Started { .. } | Report::TaskHeartbeat { .. } => {}
                }
                if let Some((run, state)) = applied.run_finished {
                    tracing::info!(run = %run, state = %state, "run finished");
                    node.bump_progress();
                }
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
}

/// A report for an attempt that is not current: the worker is told, and told to kill the
/// process (the attempt number is the fencing token).
async fn refuse(node: &Node, worker: &str, report: &Report, result: &ReportResult) {
    let (instance_id, attempt) = match report {
        Report::Rejected {
            instance_id,
            attempt,
            ..
        }
        | Report::Started {
            instance_id,
            attempt,
            ..
        }
        | Report::TaskHeartbeat {
            instance_id,
            attempt,
            ..
        }
        | Report::Finished {
            instance_id,
            attempt,
            ..
        } => (*instance_id, *attempt),
    };
    let finished = matches!(report, Report::Finished { .. } | Report::Rejected { .. });
    if finished {
        node.registry.end_attempt(worker, instance_id, attempt);
    }
    let code = match result {
        ReportResult::NotFound => tonic::Code::NotFound,
        _ => tonic::Code::FailedPrecondition,
    };
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
