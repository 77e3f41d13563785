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
use std::time::Duration;

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::liveness::{AttemptFacts, Intervals, Judge, Verdict};
use ax_core::state::Outcome;
use ax_store::{ActiveAttempt, AttemptEnd, DecisionRecord, Report, Store};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::failure_alerts::FailureAlerts;
use crate::registry::Registry;
use crate::reporter::{Envelope, LOST, Reports};
use crate::watching::Watching;

/// Attempts judged per pass.
const MAX_ACTIVE: u32 = 100_000;

/// The backstop: its settings and the node's parts it judges with.
pub struct Backstop {
    node_id: String,
    intervals: Intervals,
    heartbeat_interval: Duration,
    store: Arc<Store>,
    registry: Arc<Registry>,
    reports: Reports,
    alerts: FailureAlerts,
    watching: Arc<Watching>,
}

/// The node's parts the backstop works with.
pub struct BackstopParts {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub reports: Reports,
    pub alerts: FailureAlerts,
    pub watching: Arc<Watching>,
}

impl Backstop {
    /// Judges by `intervals` (the expected heartbeats, the dead-worker threshold, the timeout
    /// grace), every worker heartbeat interval or every second, whichever is shorter.
    pub fn new(
        node_id: String,
        intervals: Intervals,
        heartbeat_interval: Duration,
        parts: BackstopParts,
    ) -> Backstop {
        Backstop {
            node_id,
            intervals,
            heartbeat_interval,
            store: parts.store,
            registry: parts.registry,
            reports: parts.reports,
            alerts: parts.alerts,
            watching: parts.watching,
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        // Judging every second (or every heartbeat interval, when shorter) keeps a verdict within
        // a second of its threshold: a dead worker's attempts move 20 s after its last heartbeat,
        // not up to a heartbeat interval later. A pass is one read of the active attempts.
        let mut tick = tokio::time::interval(self.heartbeat_interval.min(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut told = Told::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            if let Err(err) = self.judge_active(&mut told).await {
                self.watching.store_failed(&err);
                tracing::error!(error = %err, "liveness pass failed");
            }
        }
    }

    /// When each worker was last seen, by this node (fresh) or by any node (through the store).
    async fn workers_last_seen(&self) -> anyhow::Result<HashMap<String, Millis>> {
        let mut seen: HashMap<String, Millis> = self
            .store
            .list_workers()
            .await?
            .into_iter()
            .map(|worker| (worker.id, worker.last_heartbeat))
            .collect();
        for view in self.registry.views() {
            let entry = seen.entry(view.profile.id).or_insert(view.last_heartbeat);
            *entry = (*entry).max(view.last_heartbeat);
        }
        Ok(seen)
    }

    async fn judge_active(&self, told: &mut Told) -> anyhow::Result<()> {
        // Read before the store, so every attempt in it was claimed before the store is read (a
        // claim commits before its attempt goes in flight): one missing from the store's active
        // attempts has ended.
        let in_flight = self.registry.in_flight();
        let active = self.store.active_attempts(None, MAX_ACTIVE).await?;
        let still_active: HashSet<(InstanceId, Attempt)> = active
            .iter()
            .map(|attempt| (attempt.instance_id, attempt.attempt))
            .collect();
        told.stalled.retain(|key| still_active.contains(key));
        if active.len() < MAX_ACTIVE as usize {
            self.kill_ended_elsewhere(&in_flight, &still_active, &mut told.ended_elsewhere);
        }
        let now = now_ms();
        self.withdraw_unreached(&in_flight, &active, now).await;
        let stalled = &mut told.stalled;
        let seen = self.workers_last_seen().await?;
        let judge = Judge {
            intervals: self.intervals,
            watching_since: self.watching.store_answered(now),
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
                    self.alerts.stalled(&attempt, &worker, &detail, now).await;
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
            if let Some((kind, report)) = self.carry_out(&attempt, &worker, verdict, now) {
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
                if self.reports.send(envelope).await.is_err() {
                    return Ok(());
                }
            }
        }
        record_endings(&self.store, &self.node_id, endings, now).await;
        for (worker, attempts) in lost_workers {
            self.alerts.worker_lost(&worker, &attempts, now).await;
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
        &self,
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
                    .is_some_and(|by| by != self.node_id)
                && !flying.contains(&(attempt.instance_id, attempt.attempt))
                && attempt.dispatched_at.is_some_and(|at| {
                    now - at > SETTLED_MS
                        && self.registry.view(worker).is_some_and(|here| {
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
                self.node_id
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
            if self.reports.send(envelope).await.is_err() {
                return;
            }
            endings.push((attempt.clone(), DecisionKind::Withdrawn, reason));
        }
        record_endings(&self.store, &self.node_id, endings, now).await;
    }

    /// Tells this node's workers to kill the attempts the store has ended while they run them: an
    /// attempt cancelled or timed out through another node, whose workers are not connected there.
    /// Each is told once; a worker that no longer runs the attempt ignores the cancel.
    fn kill_ended_elsewhere(
        &self,
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
            if self.registry.tell_cancel(
                worker,
                *instance,
                *attempt,
                "the attempt was ended through another node (cancelled or timed out)",
            ) {
                told.insert(key);
            }
        }
    }

    fn carry_out(
        &self,
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
            outputs: Default::default(),
        };
        match verdict {
            Verdict::Healthy | Verdict::Stalled => None,
            Verdict::TimedOut => {
                let message = format!(
                    "timed out: running longer than its timeout of {} ms plus the {} ms grace, and no report from worker {worker}",
                    attempt.timeout_ms.map_or(0, std::num::NonZeroU64::get),
                    self.intervals.timeout_grace_ms
                );
                tracing::warn!(instance = %instance_id, attempt = %number, worker, "backstop timeout");
                // If the worker is connected here, it must kill the process; the retry waits for
                // the start lock, which this attempt keeps until its worker says it ended.
                self.registry
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
}

/// What a pass already told, so each attempt is told once.
#[derive(Default)]
struct Told {
    /// Attempts recorded and alerted as stalled.
    stalled: HashSet<(InstanceId, Attempt)>,
    /// Attempts in flight here that the store has ended, whose workers were told to kill them.
    ended_elsewhere: HashSet<(InstanceId, Attempt)>,
}

/// One decision per attempt this node ended for its worker's sake (lost, withdrawn, timed
/// out) or found stalled, on the attempt's workflow, so `axctl why` tells why a task ran
/// again or seems stuck. A failure is
/// logged: explanations never hold up scheduling.
pub async fn record_endings(
    store: &Store,
    node_id: &str,
    ended: Vec<(ActiveAttempt, DecisionKind, String)>,
    now: Millis,
) {
    let mut records = Vec::with_capacity(ended.len());
    for (attempt, kind, detail) in ended {
        let Ok(Some(instance)) = store.get_instance(attempt.instance_id).await else {
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
            node_id: node_id.to_string(),
        });
    }
    if records.is_empty() {
        return;
    }
    if let Err(err) = store.record_decisions(&records).await {
        tracing::warn!(error = %err, "recording why attempts ended failed");
    }
}
