//! The scheduler's backstop for attempts whose worker went quiet: judged by
//! `ax_core::liveness`, carried out as ordinary reports through the reporter, so each verdict is
//! the same conditional transition a worker's report would be (and a node racing another on the
//! same verdict simply loses).
//!
//! A node judges nothing until workers have had the dead-worker threshold, from the moment it
//! began to watch, to reconnect and replay their reports ([`Watching`]): that moment is its
//! start, and again whenever it gets its store back after losing it. Its own downtime, or its
//! blindness, never counts against a worker.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::liveness::{AttemptFacts, Intervals, Judge, Verdict};
use ax_core::state::Outcome;
use ax_store::{ActiveAttempt, AttemptEnd, DecisionRecord, Report};
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alert, AlertKind};
use crate::clock::now_ms;
use crate::node::Node;
use crate::reporter::Envelope;

/// Attempts judged per pass.
const MAX_ACTIVE: u32 = 100_000;

pub fn intervals(node: &Node) -> Intervals {
    Intervals {
        worker_heartbeat_ms: node.options.heartbeat_interval.as_millis() as Millis,
        task_heartbeat_ms: node.options.task_heartbeat_interval.as_millis() as Millis,
        dead_after_missed: node.options.dead_after_missed_heartbeats,
        timeout_grace_ms: node.options.timeout_grace.as_millis() as Millis,
    }
}

/// Since when this node has been able to see its workers: its start, or the moment its store
/// answered again after a failure (meanwhile other nodes may not have been able to record
/// their workers' heartbeats either).
#[derive(Debug)]
pub struct Watching {
    since: AtomicI64,
    store_lost: AtomicBool,
}

impl Watching {
    pub fn new(now: Millis) -> Watching {
        Watching {
            since: AtomicI64::new(now),
            store_lost: AtomicBool::new(false),
        }
    }

    /// A store call failed: if the store could not be reached, what workers did meanwhile may
    /// not be recorded. Any other failure (a statement refused) says nothing about that.
    pub fn store_failed(&self, error: &anyhow::Error) {
        let unreachable = error.chain().any(|cause| {
            cause
                .downcast_ref::<ax_store::StoreError>()
                .is_some_and(ax_store::StoreError::is_unreachable)
        });
        if unreachable {
            self.store_lost();
        }
    }

    /// The store could not be reached.
    pub fn store_lost(&self) {
        self.store_lost.store(true, Ordering::Relaxed);
    }

    /// The store answered at `now`: after a failure, watching starts anew.
    fn store_answered(&self, now: Millis) -> Millis {
        if self.store_lost.swap(false, Ordering::Relaxed) {
            self.since.store(now, Ordering::Relaxed);
            tracing::info!(
                "the store answers again; judging no worker until they had the dead-worker threshold to reconnect"
            );
        }
        self.since.load(Ordering::Relaxed)
    }
}

pub async fn run(node: Arc<Node>, cancel: CancellationToken) {
    // Judging every second (or every heartbeat interval, when shorter) keeps a verdict within
    // a second of its threshold: a dead worker's attempts move 20 s after its last heartbeat,
    // not up to a heartbeat interval later. A pass is one read of the active attempts.
    let mut tick =
        tokio::time::interval(node.options.heartbeat_interval.min(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut told = Told::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        if let Err(err) = judge_active(&node, &mut told).await {
            node.watching.store_failed(&err);
            tracing::error!(error = %err, "liveness pass failed");
        }
    }
}

/// When each worker was last seen, by this node (fresh) or by any node (through the store).
async fn workers_last_seen(node: &Node) -> anyhow::Result<HashMap<String, Millis>> {
    let mut seen: HashMap<String, Millis> = node
        .store
        .list_workers()
        .await?
        .into_iter()
        .map(|worker| (worker.id, worker.last_heartbeat))
        .collect();
    for view in node.registry.views() {
        let entry = seen.entry(view.profile.id).or_insert(view.last_heartbeat);
        *entry = (*entry).max(view.last_heartbeat);
    }
    Ok(seen)
}

/// What a pass already told, so each attempt is told once.
#[derive(Default)]
struct Told {
    /// Attempts recorded and alerted as stalled.
    stalled: HashSet<(InstanceId, Attempt)>,
    /// Attempts in flight here that the store has ended, whose workers were told to kill them.
    ended_elsewhere: HashSet<(InstanceId, Attempt)>,
}

async fn judge_active(node: &Node, told: &mut Told) -> anyhow::Result<()> {
    // Read before the store, so every attempt in it was claimed before the store is read (a
    // claim commits before its attempt goes in flight): one missing from the store's active
    // attempts has ended.
    let in_flight = node.registry.in_flight();
    let active = node.store.active_attempts(None, MAX_ACTIVE).await?;
    let still_active: HashSet<(InstanceId, Attempt)> = active
        .iter()
        .map(|attempt| (attempt.instance_id, attempt.attempt))
        .collect();
    told.stalled.retain(|key| still_active.contains(key));
    if active.len() < MAX_ACTIVE as usize {
        kill_ended_elsewhere(node, &in_flight, &still_active, &mut told.ended_elsewhere);
    }
    let now = now_ms();
    withdraw_unreached(node, &in_flight, &active, now).await;
    let stalled = &mut told.stalled;
    let seen = workers_last_seen(node).await?;
    let judge = Judge {
        intervals: intervals(node),
        watching_since: node.watching.store_answered(now),
    };
    if active.is_empty() || judge.in_grace(now) {
        return Ok(());
    }
    let mut lost_workers: HashMap<String, Vec<ActiveAttempt>> = HashMap::new();
    let mut endings = Vec::new();
    for attempt in active {
        let worker = attempt.worker_id.clone().unwrap_or_default();
        let facts = AttemptFacts {
            state: attempt.state,
            dispatched_at: attempt.dispatched_at,
            started_at: attempt.started_at,
            last_task_heartbeat: attempt.last_heartbeat_at,
            timeout_ms: attempt.timeout_ms,
            worker_last_seen: seen.get(&worker).copied(),
        };
        let verdict = judge.judge(&facts, now);
        if verdict == Verdict::Stalled {
            if stalled.insert((attempt.instance_id, attempt.attempt)) {
                let silent_ms = now
                    - facts
                        .last_task_heartbeat
                        .or(facts.started_at)
                        .unwrap_or(now);
                let detail = format!(
                    "no task heartbeat for {} while worker {worker} is alive; the attempt keeps \
                     running",
                    ax_core::humane_duration(silent_ms)
                );
                tracing::warn!(instance = %attempt.instance_id, attempt = %attempt.attempt, worker, "task heartbeat stalled on a live worker");
                alert_stalled(node, &attempt, &worker, &detail, now).await;
                endings.push((attempt, DecisionKind::Stalled, detail));
            }
            continue;
        }
        if verdict == Verdict::Lost {
            lost_workers
                .entry(worker.clone())
                .or_default()
                .push(attempt.clone());
        }
        if let Some((kind, report)) = carry_out(node, &attempt, &worker, verdict, now) {
            let detail = match &report {
                Report::Finished { message, .. } => message.clone(),
                Report::Rejected { reason, .. } => reason.clone(),
                _ => String::new(),
            };
            endings.push((attempt, kind, detail));
            let envelope = Envelope {
                worker,
                report,
                from_worker: false,
            };
            if node.reports.send(envelope).await.is_err() {
                return Ok(());
            }
        }
    }
    record_endings(node, endings, now).await;
    for (worker, attempts) in lost_workers {
        alert_worker_lost(node, &worker, &attempts, now).await;
    }
    Ok(())
}

/// A dispatch that another node claimed after the worker had registered here never reached the
/// worker (a worker holds one stream at a time: the other node sent it to the stream the worker
/// had left): withdrawn, to go again as the next attempt. One claimed before the registration is
/// the registration's business (ended if the worker did not list it, its report awaited if the
/// worker said it ended). A heartbeat on the stream here from after the claim (by more than the
/// nodes' clocks may differ) proves this stream is the worker's current one, not one it left
/// silently. The age keeps clear of the other node's own rejection of an undeliverable dispatch.
async fn withdraw_unreached(
    node: &Node,
    in_flight: &[(String, InstanceId, Attempt)],
    active: &[ActiveAttempt],
    now: Millis,
) {
    const SETTLED_MS: Millis = 2_000;
    const CLOCK_MARGIN_MS: Millis = 1_000;
    let flying: HashSet<(InstanceId, Attempt)> =
        in_flight.iter().map(|(_, i, a)| (*i, *a)).collect();
    let mut endings = Vec::new();
    for attempt in active {
        let Some(worker) = attempt.worker_id.as_deref() else {
            continue;
        };
        let unreached = attempt.state == ax_core::state::InstanceState::Dispatched
            && attempt
                .dispatched_by
                .as_deref()
                .is_some_and(|by| by != node.options.node_id)
            && !flying.contains(&(attempt.instance_id, attempt.attempt))
            && attempt.dispatched_at.is_some_and(|at| {
                now - at > SETTLED_MS
                    && node.registry.view(worker).is_some_and(|here| {
                        here.connected_at <= at && here.last_heartbeat > at + CLOCK_MARGIN_MS
                    })
            });
        if !unreached {
            continue;
        }
        let reason = format!(
            "dispatched by node {} to worker {worker} after it had moved to node {}; never \
             reached it",
            attempt.dispatched_by.as_deref().unwrap_or_default(),
            node.options.node_id
        );
        tracing::warn!(instance = %attempt.instance_id, attempt = %attempt.attempt, worker, "{reason}; withdrawn");
        let report = Report::Rejected {
            instance_id: attempt.instance_id,
            attempt: attempt.attempt,
            worker_id: Some(worker.to_string()),
            reason: reason.clone(),
            withdrawn: true,
            dispatched_at: attempt.dispatched_at,
        };
        let envelope = Envelope::decided(worker, report);
        if node.reports.send(envelope).await.is_err() {
            return;
        }
        endings.push((attempt.clone(), DecisionKind::Withdrawn, reason));
    }
    record_endings(node, endings, now).await;
}

/// Tells this node's workers to kill the attempts the store has ended while they run them: an
/// attempt cancelled or timed out through another node, whose workers are not connected there.
/// Each is told once; a worker that no longer runs the attempt ignores the cancel.
fn kill_ended_elsewhere(
    node: &Node,
    in_flight: &[(String, InstanceId, Attempt)],
    still_active: &HashSet<(InstanceId, Attempt)>,
    told: &mut HashSet<(InstanceId, Attempt)>,
) {
    let flying: HashSet<(InstanceId, Attempt)> =
        in_flight.iter().map(|(_, i, a)| (*i, *a)).collect();
    told.retain(|key| flying.contains(key));
    for (worker, instance, attempt) in in_flight {
        let key = (*instance, *attempt);
        if still_active.contains(&key) || told.contains(&key) {
            continue;
        }
        tracing::info!(%instance, %attempt, worker, "attempt ended in the store while its worker runs it; telling the worker to kill it");
        if node.registry.tell_cancel(
            worker,
            *instance,
            *attempt,
            "the attempt was ended through another node (cancelled or timed out)",
        ) {
            told.insert(key);
        }
    }
}

/// One decision per attempt this node ended for its worker's sake (lost, withdrawn, timed
/// out) or found stalled, on the attempt's workflow, so `axctl why` tells why a task ran
/// again or seems stuck. A failure is
/// logged: explanations never hold up scheduling.
pub async fn record_endings(
    node: &Node,
    ended: Vec<(ActiveAttempt, DecisionKind, String)>,
    now: Millis,
) {
    let mut records = Vec::with_capacity(ended.len());
    for (attempt, kind, detail) in ended {
        let Ok(Some(instance)) = node.store.get_instance(attempt.instance_id).await else {
            continue;
        };
        records.push(DecisionRecord {
            at: now,
            workflow_id: instance.workflow_id,
            slot_at: now,
            run_id: Some(instance.run_id),
            instance_id: Some(instance.id),
            task: Some(instance.task),
            kind,
            detail: format!("attempt {}: {detail}", attempt.attempt),
            node_id: node.options.node_id.clone(),
        });
    }
    if records.is_empty() {
        return;
    }
    if let Err(err) = node.store.record_decisions(&records).await {
        tracing::warn!(error = %err, "recording why attempts ended failed");
    }
}

/// One alert per stalled attempt.
async fn alert_stalled(
    node: &Node,
    attempt: &ActiveAttempt,
    worker: &str,
    detail: &str,
    now: Millis,
) {
    if !node.alerter.is_enabled() {
        return;
    }
    let Ok(Some(instance)) = node.store.get_instance(attempt.instance_id).await else {
        return;
    };
    let message = format!(
        "task {} (instance {}, attempt {}): {detail}",
        instance.task, attempt.instance_id, attempt.attempt
    );
    node.alerter.notify(
        Alert::new(AlertKind::TaskStalled, instance.workflow, message, now).with_worker(worker),
    );
}

/// One alert per dead worker, naming what it was running.
async fn alert_worker_lost(node: &Node, worker: &str, attempts: &[ActiveAttempt], now: Millis) {
    if !node.alerter.is_enabled() {
        return;
    }
    let mut workflow = String::new();
    if let Some(first) = attempts.first()
        && let Ok(Some(instance)) = node.store.get_instance(first.instance_id).await
    {
        workflow = instance.workflow;
    }
    let ids: Vec<String> = attempts
        .iter()
        .map(|a| format!("{}#{}", a.instance_id, a.attempt))
        .collect();
    let message = format!(
        "worker {worker} is dead; {} running attempts lost and retried where retries allow: {}",
        attempts.len(),
        ids.join(", ")
    );
    node.alerter
        .notify(Alert::new(AlertKind::WorkerLost, workflow, message, now).with_worker(worker));
}

/// How the message of a lost attempt begins (the reporter counts lost attempts by it).
pub const LOST: &str = "lost: ";

fn carry_out(
    node: &Node,
    attempt: &ActiveAttempt,
    worker: &str,
    verdict: Verdict,
    now: Millis,
) -> Option<(DecisionKind, Report)> {
    let (instance_id, number) = (attempt.instance_id, attempt.attempt);
    let finished = |outcome, message: String| Report::Finished {
        instance_id,
        attempt: number,
        worker_id: None,
        end: AttemptEnd::Finished(outcome),
        exit_code: None,
        signal: None,
        at: now,
        log_lines: 0,
        message,
    };
    match verdict {
        Verdict::Healthy | Verdict::Stalled => None,
        Verdict::TimedOut => {
            let message = format!(
                "timed out: running longer than its timeout of {} ms plus the {} ms grace, and no report from worker {worker}",
                attempt.timeout_ms.map_or(0, std::num::NonZeroU64::get),
                intervals(node).timeout_grace_ms
            );
            tracing::warn!(instance = %instance_id, attempt = %number, worker, "backstop timeout");
            // If the worker is connected here, it must kill the process; the retry waits for
            // the start lock, which this attempt keeps until its worker says it ended.
            node.registry
                .tell_cancel(worker, instance_id, number, &message);
            Some((DecisionKind::TimedOut, finished(Outcome::Timeout, message)))
        }
        Verdict::Lost => {
            tracing::warn!(instance = %instance_id, attempt = %number, worker, "attempt lost with its worker");
            Some((
                DecisionKind::Lost,
                finished(Outcome::Failed, format!("{LOST}worker {worker} is dead")),
            ))
        }
        Verdict::Withdrawn => {
            tracing::warn!(instance = %instance_id, attempt = %number, worker, "dispatch never confirmed by a dead worker; withdrawn, to go again as the next attempt");
            Some((
                DecisionKind::Withdrawn,
                Report::Rejected {
                    instance_id,
                    attempt: number,
                    worker_id: Some(worker.to_string()),
                    reason: format!("worker {worker} died without confirming a start"),
                    withdrawn: true,
                    dispatched_at: attempt.dispatched_at,
                },
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_store_starts_the_watch_anew() {
        let watching = Watching::new(100);
        // A statement the store refused: the node saw everything it could.
        watching.store_failed(&anyhow::Error::new(ax_store::StoreError::NotFound(
            "instance 7".into(),
        )));
        assert_eq!(watching.store_answered(500), 100);
        // The store could not be reached: the node starts watching again when it answers.
        let lost = anyhow::Error::new(ax_store::StoreError::Database(sqlx::Error::PoolTimedOut))
            .context("reading waiting instances");
        watching.store_failed(&lost);
        assert_eq!(watching.store_answered(900), 900);
        assert_eq!(watching.store_answered(1_500), 900);
    }
}
