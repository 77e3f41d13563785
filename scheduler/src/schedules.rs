//! Fires cron schedules, applying the misfire policy, the start/end window and the overlap
//! policy (`ax_core::firing`).
//!
//! Each fire creates a run whose dedup key is its logical fire time, so a fire is exactly-once
//! across nodes and restarts: a second node (or a retry after a crash between creating the run
//! and advancing the schedule) finds the run already there. Slots missed during a downtime are
//! handled by the workflow's misfire policy (`skip`, `fire_once`, `catch_up N`, see the module
//! doc of `ax_core::firing` for "due" and "missed"); slots that are merely a little late
//! (within `MISFIRE_GRACE_MS`) always fire. The overlap policy is applied
//! at each fire: `skip` drops the slot while a run is unfinished, `replace` cancels the
//! unfinished runs (killing their attempts like `axctl cancel`) and then creates the run, `allow`
//! and `queue` create it and let the store start or queue it under `max_active_runs`, the keyed
//! limit and overlap `queue`.
//!
//! Decisions are recorded: `fired`, `caught_up`, `skipped_overlap`, `replaced` for what this
//! node did; `misfired` and `outside_window` only by the node whose advance of the schedule won,
//! so two nodes never record one drop twice. (`queued` and `dequeued` are recorded by the store.)
//!
//! Resume (`resume_point`): the slots that passed while the workflow was paused are handled by the
//! misfire policy, as after a downtime; the dropped ones are recorded as `paused` decisions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ax_core::Millis;
use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::decision::DecisionKind;
use ax_core::firing::{
    self, FireDecision, SlotSpan, Window, on_fire, overlap_reads_unfinished, plan_fires,
};
use ax_core::ids::{RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::{TriggerKind, WorkflowSpec};
use ax_store::{
    CancelledAttempt, DecisionRecord, DueSchedule, NewRun, RunRecord, Store, WorkflowRecord,
};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::registry::Registry;
use crate::run_creator::RunCreator;
use crate::specs::SpecCache;
use crate::telemetry::Traces;
use crate::wake::Wake;

/// How far ahead the loop looks, so it can sleep until the exact fire instant.
const LOOKAHEAD_MS: Millis = 1_000;
/// The longest sleep when nothing is due soon (a schedule applied on another node shows up
/// within this).
const IDLE_POLL: Duration = Duration::from_millis(500);
/// Unfinished runs looked at for the overlap policy.
const OVERLAP_SCAN: u32 = 1_000;

/// Schedules fired side by side. Their new runs are written in groups (`RunCreator`) and their
/// moves in one transaction per pass, so a second full of due schedules (100 per-second crons)
/// costs a few transactions, not a queue of them.
const CONCURRENT_FIRES: usize = 128;

/// The cron loop: its node's id and the node's parts a fire reaches.
pub struct Schedules {
    node_id: String,
    store: Arc<Store>,
    specs: Arc<SpecCache>,
    runs: RunCreator,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    traces: Traces,
    progress: Progress,
    /// The dispatcher's wake-up: a fire created runs.
    dispatch: Wake,
    /// Wakes it: a schedule was applied, paused or resumed.
    wake: Wake,
}

/// The node's parts the cron loop works with.
pub struct SchedulesParts {
    pub store: Arc<Store>,
    pub specs: Arc<SpecCache>,
    pub runs: RunCreator,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub traces: Traces,
    pub progress: Progress,
    pub dispatch: Wake,
}

impl Schedules {
    pub fn new(node_id: String, parts: SchedulesParts) -> Schedules {
        Schedules {
            node_id,
            store: parts.store,
            specs: parts.specs,
            runs: parts.runs,
            registry: parts.registry,
            metrics: parts.metrics,
            traces: parts.traces,
            progress: parts.progress,
            dispatch: parts.dispatch,
            wake: Wake::new(),
        }
    }

    /// Wakes the loop: a schedule was applied, paused or resumed.
    pub fn handle(&self) -> Wake {
        self.wake.clone()
    }

    pub async fn run(self, cancel: CancellationToken) {
        loop {
            let sleep = match self.fire_due().await {
                Ok(next) => next,
                Err(err) => {
                    tracing::error!(error = %err, "cron pass failed");
                    IDLE_POLL
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// Fires every schedule that is due and returns how long to sleep until the next one.
    async fn fire_due(&self) -> anyhow::Result<Duration> {
        let upcoming = self
            .store
            .due_schedules(now_ms() + LOOKAHEAD_MS, 1_000)
            .await?;
        let mut next_wake = IDLE_POLL;
        let mut due_now = Vec::new();
        let now = now_ms();
        for due in upcoming {
            if due.next_fire_at > now {
                let wait = Duration::from_millis((due.next_fire_at - now) as u64);
                next_wake = next_wake.min(wait);
            } else {
                due_now.push(due);
            }
        }
        let fired: Vec<Fired> = futures::stream::iter(due_now)
            .map(|due| async move {
                // Read per schedule: a long catch-up of one must not make another fire with a
                // stale `now`.
                match self.fire(&due, now_ms()).await {
                    Ok(fired) => Some(fired),
                    Err(err) => {
                        tracing::error!(workflow = %due.workflow, error = %err, "cron fire failed");
                        None
                    }
                }
            })
            .buffer_unordered(CONCURRENT_FIRES)
            .filter_map(std::future::ready)
            .collect()
            .await;
        // The schedules move on together. Should that fail, they are due again at the next pass,
        // and firing a slot again finds its run (the slot's dedup key): nothing fires twice.
        let moves: Vec<_> = fired.iter().map(|fired| fired.advance).collect();
        let won = match self.store.advance_schedules(&moves).await {
            Ok(won) => won,
            Err(err) => {
                tracing::error!(error = %err, schedules = moves.len(), "moving schedules on failed; they are due again");
                vec![false; moves.len()]
            }
        };
        let mut decisions = Vec::new();
        for (fired, won) in fired.into_iter().zip(won) {
            decisions.extend(fired.own);
            if won {
                decisions.extend(fired.contested);
            }
        }
        // One write for the pass's decisions, off each fire's path.
        if !decisions.is_empty()
            && let Err(err) = self.store.record_decisions(&decisions).await
        {
            tracing::warn!(error = %err, decisions = decisions.len(), "recording decisions failed");
        }
        Ok(next_wake)
    }

    /// Fires `due`'s slots; the caller moves its schedule on and records the decisions.
    async fn fire(&self, due: &DueSchedule, now: Millis) -> anyhow::Result<Fired> {
        let cron = CronSchedule::parse(&due.cron)?;
        let tz = parse_timezone(&due.timezone)?;
        let versioned = self
            .specs
            .get(due.workflow_id, due.workflow_version)
            .await
            .context("workflow version")?;
        let spec = &versioned.spec;
        let plan = plan_fires(
            &cron,
            tz,
            due.next_fire_at,
            now,
            spec.schedule.misfire,
            Window::of(&spec.schedule),
        );
        let mut own = Vec::new();
        let mut contested = Vec::new();
        for planned in &plan.fire {
            let fire = ScheduledFire {
                workflow_id: due.workflow_id,
                workflow_version: due.workflow_version,
                spec,
                slot: planned.at,
                trigger: TriggerKind::Cron,
                late: planned.late,
                // A fire passes no params: the run gets the declared defaults.
                params: ax_core::params::defaults(&spec.params),
                triggered_by: format!("cron@{}", self.node_id),
            };
            let outcome = self.fire_slot(&fire, now).await?;
            own.extend(outcome.own);
            contested.extend(outcome.contested);
        }
        let to = plan.next_fire_at.unwrap_or(Millis::MAX);
        if let Some(span) = plan.misfired {
            contested.push(span_decision(
                &self.node_id,
                due.workflow_id,
                span,
                DecisionKind::Misfired,
                format!(
                    "{} missed (scheduler down or busy); dropped by misfire policy {}",
                    span.describe(),
                    spec.schedule.misfire.name()
                ),
                now,
            ));
        }
        if let Some(span) = plan.outside_window {
            contested.push(outside_window(&self.node_id, due.workflow_id, span, now));
        }
        Ok(Fired {
            advance: (due.workflow_id, due.next_fire_at, to),
            own,
            contested,
        })
    }

    /// Applies the overlap policy to one scheduled slot and creates its run (the store then starts
    /// or queues it). The caller records the returned decisions.
    async fn fire_slot(
        &self,
        fire: &ScheduledFire<'_>,
        now: Millis,
    ) -> anyhow::Result<FireOutcome> {
        let mut outcome = FireOutcome {
            run: None,
            created: false,
            own: Vec::new(),
            contested: Vec::new(),
        };
        let dedup_key = format!("cron:{}", fire.slot);
        let key = fire
            .spec
            .concurrency
            .run_key(&fire.params)
            .map(|key| key.chars().take(191).collect::<String>());
        // The slot's own run (made by another node, before a crash, or by a backfill of this slot)
        // is not an overlap: creating it again returns it.
        // Only overlap skip and replace look at them; allow and queue leave it to the store.
        let others: Vec<RunRecord> = if overlap_reads_unfinished(fire.spec.schedule.overlap) {
            self.store
                .unfinished_runs(fire.workflow_id, OVERLAP_SCAN)
                .await?
                .into_iter()
                .filter(|run| run.logical_time != fire.slot)
                .filter(|run| key.is_none() || run.run_key == key)
                .collect()
        } else {
            Vec::new()
        };
        let names = |runs: &[RunRecord]| {
            runs.iter()
                .map(|run| format!("{} ({})", run.id, run.state))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match on_fire(fire.spec.schedule.overlap, others.len() as u32) {
            FireDecision::Skip => {
                outcome.contested.push(decision(
                    &self.node_id,
                    fire.workflow_id,
                    fire.slot,
                    None,
                    DecisionKind::SkippedOverlap,
                    format!(
                        "overlap policy skip: runs {} have not ended",
                        names(&others)
                    ),
                    now,
                ));
                return Ok(outcome);
            }
            FireDecision::Replace => {
                // Queued ones first, so ending the active ones promotes none of them.
                let mut order = others.clone();
                order.sort_by_key(|run| (run.state != RunState::Queued, run.id));
                for run in &order {
                    let reason = format!("replaced by the fire at {}", ax_core::rfc3339(fire.slot));
                    if self.cancel_run(run.id, &reason, now).await? {
                        outcome.own.push(decision(
                            &self.node_id,
                            fire.workflow_id,
                            fire.slot,
                            Some(run.id),
                            DecisionKind::Replaced,
                            format!("overlap policy replace: run {} cancelled", run.id),
                            now,
                        ));
                    }
                }
            }
            FireDecision::Create => {}
        }
        let new_run = NewRun {
            workflow_id: fire.workflow_id,
            workflow_version: fire.workflow_version,
            trigger: fire.trigger,
            logical_time: fire.slot,
            dedup_key: Some(dedup_key),
            idempotency_key: None,
            params: fire.params.clone(),
            triggered_by: fire.triggered_by.clone(),
            now,
            audit_from: None,
        };
        let (record, created) = self.runs.create(new_run).await?;
        if created {
            let lateness = now - fire.slot;
            if fire.trigger == TriggerKind::Cron {
                Metrics::observe_ms(&self.metrics.cron_lateness, fire.slot, now);
            }
            tracing::info!(workflow = %fire.spec.name, run = %record.id, logical_time = fire.slot, lateness_ms = lateness, state = %record.state, "scheduled fire");
            let (kind, detail) = if fire.late {
                (
                    DecisionKind::CaughtUp,
                    format!(
                        "missed slot run {} late by misfire policy {}",
                        ax_core::humane_duration(lateness),
                        fire.spec.schedule.misfire.name()
                    ),
                )
            } else {
                (DecisionKind::Fired, format!("{} slot", fire.trigger))
            };
            outcome.own.push(decision(
                &self.node_id,
                fire.workflow_id,
                fire.slot,
                Some(record.id),
                kind,
                detail,
                now,
            ));
            self.dispatch.notify_one();
            self.progress.bump();
        }
        outcome.created = created;
        outcome.run = Some(record);
        Ok(outcome)
    }

    /// Cancels a run as `axctl cancel` does: the store ends it and its attempts' workers are told to
    /// kill them. False when the run had already ended.
    async fn cancel_run(&self, id: RunId, reason: &str, now: Millis) -> anyhow::Result<bool> {
        let before = self.store.get_run(id).await?;
        if before.is_none_or(|run| run.state.is_terminal()) {
            return Ok(false);
        }
        let cancelled = self.store.cancel_run(id, now).await?.unwrap_or_default();
        send_cancels(&self.registry, &cancelled, reason);
        self.traces.run_ended(id);
        self.dispatch.notify_one();
        self.progress.bump();
        Ok(true)
    }
}

fn decision(
    node_id: &str,
    workflow_id: WorkflowId,
    slot_at: Millis,
    run_id: Option<RunId>,
    kind: DecisionKind,
    detail: String,
    now: Millis,
) -> DecisionRecord {
    DecisionRecord {
        at: now,
        workflow_id,
        slot_at,
        run_id,
        instance_id: None,
        task: None,
        kind,
        detail,
        node_id: node_id.to_string(),
    }
}

/// What firing one due schedule did, and the move of its schedule still to make.
struct Fired {
    /// (workflow, from, to) for `Store::advance_schedules`.
    advance: (WorkflowId, Millis, Millis),
    /// Decisions about what this node did.
    own: Vec<DecisionRecord>,
    /// Decisions only the node whose move wins records (misfires, slots outside the window,
    /// skips), so two nodes never record one drop twice.
    contested: Vec<DecisionRecord>,
}

fn span_decision(
    node_id: &str,
    workflow_id: WorkflowId,
    span: SlotSpan,
    kind: DecisionKind,
    detail: String,
    now: Millis,
) -> DecisionRecord {
    decision(node_id, workflow_id, span.first, None, kind, detail, now)
}

/// The decision about slots that fell outside the schedule's start/end window.
fn outside_window(
    node_id: &str,
    workflow_id: WorkflowId,
    span: SlotSpan,
    now: Millis,
) -> DecisionRecord {
    let detail = format!(
        "{} outside the schedule's start/end window",
        span.describe()
    );
    span_decision(
        node_id,
        workflow_id,
        span,
        DecisionKind::OutsideWindow,
        detail,
        now,
    )
}

/// One scheduled slot to run: a cron slot, or a dependency fire made by other code through
/// [`fire_slot`].
pub struct ScheduledFire<'a> {
    pub workflow_id: WorkflowId,
    pub workflow_version: u32,
    pub spec: &'a WorkflowSpec,
    /// The logical time; the run's dedup key is `cron:<slot>`.
    pub slot: Millis,
    pub trigger: TriggerKind,
    /// A missed slot run by the misfire policy (`caught_up`), not a due one (`fired`).
    pub late: bool,
    pub params: BTreeMap<String, String>,
    pub triggered_by: String,
}

/// What a fire did.
pub struct FireOutcome {
    /// The run of the slot (new or already there); `None` when the overlap policy skipped it.
    pub run: Option<RunRecord>,
    pub created: bool,
    /// Decisions about what this node did (a run it created, runs it cancelled).
    pub own: Vec<DecisionRecord>,
    /// Decisions another node may make too (a skip): record them only after winning the slot.
    pub contested: Vec<DecisionRecord>,
}

/// Tells the workers of cancelled attempts to kill them. A worker connected to another node is
/// told by that node, which finds the attempt ended in the store within a second (`backstop`).
pub fn send_cancels(registry: &Registry, cancelled: &[CancelledAttempt], reason: &str) {
    for attempt in cancelled {
        if let Some(worker) = &attempt.worker_id {
            registry.tell_cancel(worker, attempt.instance_id, attempt.attempt, reason);
        }
    }
}

/// Where a resumed workflow's schedule picks up, and the `paused` decisions for the slots that
/// passed while it was paused and that the misfire policy drops. The kept slots (fire_once: the
/// latest, catch_up N: the latest N) are fired late by the cron loop. A workflow that is not
/// paused keeps its stored next fire time.
pub async fn resume_point(
    store: &Store,
    node_id: &str,
    workflow: &WorkflowRecord,
    now: Millis,
) -> anyhow::Result<(Option<Millis>, Vec<DecisionRecord>)> {
    let schedule = &workflow.spec.schedule;
    let (Some(expression), TriggerKind::Cron) = (schedule.cron.as_deref(), schedule.trigger) else {
        return Ok((None, Vec::new()));
    };
    let cron = CronSchedule::parse(expression)?;
    let tz = parse_timezone(&schedule.timezone)?;
    let window = Window::of(schedule);
    let stored = store.schedule_next_fire(workflow.id).await?;
    let Some(stored) = stored.filter(|&at| at != Millis::MAX) else {
        return Ok((firing::first_slot(&cron, tz, now, window), Vec::new()));
    };
    if !workflow.paused {
        return Ok((Some(stored), Vec::new()));
    }
    let (plan, next) = firing::resume_point(&cron, tz, stored, now, schedule.misfire, window);
    let mut decisions = Vec::new();
    if let Some(span) = plan.misfired {
        decisions.push(span_decision(
            node_id,
            workflow.id,
            span,
            DecisionKind::Paused,
            format!(
                "{} passed while paused; dropped by misfire policy {}",
                span.describe(),
                schedule.misfire.name()
            ),
            now,
        ));
    }
    if let Some(span) = plan.outside_window {
        decisions.push(outside_window(node_id, workflow.id, span, now));
    }
    // The plan's due slots (within the grace) are fired by the loop from `next` as well.
    Ok((next, decisions))
}
