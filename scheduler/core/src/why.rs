//! `axctl why`: one screen that answers why a workflow's tasks did or did not run around a time.
//!
//! [`explain`] is pure: the API gathers the facts (the workflow's schedule, the decisions
//! recorded around the time, the run nearest to it with its instances, the live workers) and
//! this module turns them into a schedule summary, a verdict and one reason per task. Times in
//! the text are shown in the workflow's time zone. A span of dropped slots (misfired, paused) is
//! one decision at its first slot, its detail counting the slots with the first and the last:
//! the later slots of the span have no row of their own.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use crate::Millis;
use crate::cron::{CronSchedule, parse_timezone};
use crate::decision::DecisionKind;
use crate::run::RunState;
use crate::spec::{Handler, TaskSpec, TriggerKind, WorkflowSpec};
use crate::state::InstanceState;
use crate::trigger_rule::{UpstreamEnd, Upstreams, Verdict, judge, not_run_reason};

/// A decision recorded by the schedule loop, the run queue or the dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub at: Millis,
    pub slot_at: Millis,
    pub kind: DecisionKind,
    pub run_id: Option<i64>,
    pub instance_id: Option<i64>,
    pub task: Option<String>,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFacts {
    pub id: i64,
    pub task: String,
    pub state: InstanceState,
    pub attempt: u32,
    pub worker_id: Option<String>,
    /// A WAITING retry waits until then (its backoff).
    pub not_before: Millis,
    pub created_at: Millis,
    /// When the current attempt was dispatched (for DISPATCHED and RUNNING instances).
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    /// Set on a shard of a `sharded_broadcast` task (its parent instance): a shard never
    /// stands for its task, the parent does.
    pub shard_of: Option<i64>,
    /// For a `run_workflow` task's RUNNING attempt: the child run it waits on.
    pub child_run: Option<ChildRunFacts>,
}

/// The child run a `run_workflow` task's attempt started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRunFacts {
    pub id: i64,
    pub workflow: String,
    pub state: RunState,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunFacts {
    pub id: i64,
    pub version: u32,
    pub state: RunState,
    pub trigger: TriggerKind,
    pub logical_time: Millis,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    pub triggered_by: String,
    /// The tasks of the run's workflow version, in file order.
    pub tasks: Vec<TaskSpec>,
    pub instances: Vec<InstanceFacts>,
}

/// A worker the node knows of, as the dispatcher would see it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerFacts {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub live: bool,
    pub draining: bool,
    pub capacity: u32,
    pub running: u32,
}

/// Everything [`explain`] reads.
#[derive(Debug, Clone, PartialEq)]
pub struct WhyInput {
    pub workflow: String,
    pub version: u32,
    /// The latest version's spec: its schedule is the one in force.
    pub spec: WorkflowSpec,
    pub paused: bool,
    /// The time asked about.
    pub at: Millis,
    pub now: Millis,
    /// Decisions around `at` and of the run, in any order.
    pub decisions: Vec<Decision>,
    /// The run nearest to `at` (by logical time), if the workflow has any.
    pub run: Option<RunFacts>,
    pub workers: Vec<WorkerFacts>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSummary {
    pub trigger: TriggerKind,
    pub cron: Option<String>,
    pub timezone: String,
    pub paused: bool,
    pub start_at: Option<Millis>,
    pub end_at: Option<Millis>,
    pub misfire: String,
    pub overlap: String,
    pub after: Vec<String>,
    /// The last cron slot at or before `at`.
    pub previous_slot: Option<Millis>,
    /// The first cron slot after `at`.
    pub next_slot: Option<Millis>,
}

/// Why one task is where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// It ended (SUCCESS, FAILED, TIMEOUT or CANCELLED).
    Done {
        state: InstanceState,
        at: Option<Millis>,
        attempt: u32,
    },
    /// No run yet: the next cron slot has not come.
    NotYetTime { next_fire: Option<Millis> },
    /// No run, though the slot asked about has passed: the one at or before a time in the
    /// past, else the next one once it has come. `recorded`: decisions about the slot exist.
    SlotPassed { slot: Millis, recorded: bool },
    /// No run yet, and none comes by itself: the workflow runs when triggered.
    NotTriggered,
    /// Its upstreams have not all succeeded yet: (task, state).
    WaitingOnUpstream { upstream: Vec<(String, String)> },
    /// Its trigger rule decided it does not run (SKIPPED or UPSTREAM_FAILED): `because` names
    /// the upstreams that decided it and the rule.
    NotRun {
        state: InstanceState,
        because: String,
    },
    /// A task of the run's `on_failure` or `on_success` list, waiting for the graph's outcome.
    Handler { handler: Handler },
    /// It has no instance and its run ended.
    RunEnded { state: RunState },
    /// A retry waiting for its backoff.
    Backoff { until: Millis },
    /// The run waits in a queue (overlap `queue`, max active runs, a run key's limit).
    Queued { detail: String },
    /// A concurrency limit holds it back.
    Throttled { detail: String },
    /// A secret its task names cannot be given to it.
    SecretUnavailable { detail: String },
    /// No live worker carries its labels.
    NoLiveWorker {
        labels: BTreeMap<String, String>,
        live_workers: Vec<String>,
    },
    /// Workers with its labels are live but full.
    WorkersBusy { workers: Vec<String> },
    /// A worker with its labels has a free slot: the dispatcher takes it on its next pass.
    ReadyToDispatch { workers: Vec<String> },
    Dispatched {
        worker: String,
        since: Option<Millis>,
    },
    Running {
        worker: String,
        since: Option<Millis>,
    },
    /// A `run_workflow` task whose attempt waits on its child run.
    WaitingOnChild {
        run: i64,
        workflow: String,
        state: RunState,
    },
    /// A `run_workflow` task ready to start its child run (it needs no worker).
    ChildStarting { workflow: String },
}

impl Reason {
    /// A stable name for programs (`axctl why -o json`).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::Done { .. } => "done",
            Reason::NotYetTime { .. } => "not_yet_time",
            Reason::SlotPassed { .. } => "slot_passed",
            Reason::NotTriggered => "not_triggered",
            Reason::WaitingOnUpstream { .. } => "waiting_upstream",
            Reason::NotRun {
                state: InstanceState::Skipped,
                ..
            } => "skipped",
            Reason::NotRun { .. } => "upstream_failed",
            Reason::Handler { .. } => "handler",
            Reason::RunEnded { .. } => "run_ended",
            Reason::Backoff { .. } => "backoff",
            Reason::Queued { .. } => "queued",
            Reason::Throttled { .. } => "throttled",
            Reason::SecretUnavailable { .. } => "secret_unavailable",
            Reason::NoLiveWorker { .. } => "no_worker",
            Reason::WorkersBusy { .. } => "workers_busy",
            Reason::ReadyToDispatch { .. } => "ready",
            Reason::Dispatched { .. } => "dispatched",
            Reason::Running { .. } => "running",
            Reason::WaitingOnChild { .. } => "waiting_child",
            Reason::ChildStarting { .. } => "child_starting",
        }
    }

    /// One line for a person, times in `tz`.
    pub fn text(&self, tz: Tz) -> String {
        let t = |ms: Millis| format_time(ms, tz);
        let since =
            |ms: &Option<Millis>| ms.map(|ms| format!(" since {}", t(ms))).unwrap_or_default();
        match self {
            Reason::Done { state, at, attempt } => {
                let when = at.map(|ms| format!(" at {}", t(ms))).unwrap_or_default();
                let verb = match state {
                    InstanceState::Success => "succeeded",
                    InstanceState::Failed => "failed",
                    InstanceState::Timeout => "timed out",
                    InstanceState::Cancelled => "was cancelled",
                    _ => "ended",
                };
                format!("{verb}{when} (attempt {attempt})")
            }
            Reason::NotYetTime {
                next_fire: Some(next),
            } => {
                format!("not yet time: the next slot is {}", t(*next))
            }
            Reason::NotYetTime { next_fire: None } => {
                "not yet time, and the schedule has no further slot".into()
            }
            Reason::SlotPassed {
                slot,
                recorded: true,
            } => format!(
                "no run: the slot at {} passed without one (see the decisions)",
                t(*slot)
            ),
            Reason::SlotPassed {
                slot,
                recorded: false,
            } => format!(
                "no run: the slot at {} passed without one, and no decision about it is \
                 recorded",
                t(*slot)
            ),
            Reason::NotTriggered => "no run: the workflow runs only when triggered".into(),
            Reason::WaitingOnUpstream { upstream } => {
                let list: Vec<String> = upstream
                    .iter()
                    .map(|(task, state)| format!("{task} ({state})"))
                    .collect();
                format!("waiting on upstream {}", list.join(", "))
            }
            Reason::NotRun {
                state: InstanceState::Skipped,
                because,
            } => format!("skipped: {because}"),
            Reason::NotRun { because, .. } => format!("will not run: {because}"),
            Reason::Handler { handler } => {
                let outcome = match handler {
                    Handler::OnFailure => "FAILED",
                    Handler::OnSuccess => "SUCCESS",
                };
                format!(
                    "{}: runs once the run's tasks ended and only if the run is {outcome}",
                    handler.field()
                )
            }
            Reason::RunEnded { state } => format!("not run: the run ended {state}"),
            Reason::Backoff { until } => format!("retry waits for its backoff until {}", t(*until)),
            Reason::Queued { detail } => format!("run queued: {detail}"),
            Reason::Throttled { detail } => format!("throttled: {detail}"),
            Reason::SecretUnavailable { detail } => format!("waits for a secret: {detail}"),
            Reason::NoLiveWorker {
                labels,
                live_workers,
            } => {
                let wanted = if labels.is_empty() {
                    "any labels".to_string()
                } else {
                    labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let live = if live_workers.is_empty() {
                    "no worker is live".to_string()
                } else {
                    format!("live: {}", live_workers.join(", "))
                };
                format!("no live worker with labels {wanted} ({live})")
            }
            Reason::WorkersBusy { workers } => {
                format!("waiting for a free slot on {}", workers.join(", "))
            }
            Reason::ReadyToDispatch { workers } => {
                format!(
                    "ready: dispatched on the next pass to one of {}",
                    workers.join(", ")
                )
            }
            Reason::Dispatched { worker, since: s } => {
                format!("dispatched to worker {worker}{}", since(s))
            }
            Reason::Running { worker, since: s } => {
                format!("running on worker {worker}{}", since(s))
            }
            Reason::WaitingOnChild {
                run,
                workflow,
                state,
            } => format!(
                "waiting on its child run {run} ({workflow}), which is {state}; the task ends \
                 as that run ends"
            ),
            Reason::ChildStarting { workflow } => format!(
                "ready: the dispatcher starts its child run of {workflow} on its next pass (no \
                 worker needed)"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExplanation {
    pub task: String,
    /// The instance's state, `PENDING` / `UPSTREAM_FAILED` without one, `-` without a run.
    pub state: String,
    pub instance_id: Option<i64>,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    pub reason: Reason,
    /// `reason` for a person.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    pub id: i64,
    pub version: u32,
    pub state: RunState,
    pub trigger: TriggerKind,
    pub logical_time: Millis,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    pub triggered_by: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionLine {
    pub decision: Decision,
    /// `slot 02:30:00: skipped_overlap — previous run 41 still running`
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub workflow: String,
    pub version: u32,
    pub at: Millis,
    pub timezone: String,
    pub schedule: ScheduleSummary,
    /// The answer in a few sentences, most important first.
    pub verdict: Vec<String>,
    /// Oldest first, at most [`MAX_DECISIONS`].
    pub decisions: Vec<DecisionLine>,
    pub run: Option<RunSummary>,
    /// One per task: the run's tasks, or the workflow's when there is no run.
    pub tasks: Vec<TaskExplanation>,
}

/// The decisions shown: the latest ones when there are more.
pub const MAX_DECISIONS: usize = 50;

/// `2026-01-31 02:30:00 CET`.
pub fn format_time(ms: Millis, tz: Tz) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t
            .with_timezone(&tz)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        None => ms.to_string(),
    }
}

/// The last fire of `cron` at or before `at`: searches backwards in widening windows (a minute,
/// then four times wider each step, up to about eight years).
pub fn previous_fire(cron: &CronSchedule, at: Millis, tz: Tz) -> Option<Millis> {
    let mut lookback: Millis = 60_000;
    let limit: Millis = 8 * 366 * 86_400_000;
    while lookback <= limit {
        let mut cursor = at - lookback;
        let mut last = None;
        while let Some(next) = cron.next_after(cursor, tz) {
            if next > at {
                break;
            }
            last = Some(next);
            cursor = next;
        }
        if last.is_some() {
            return last;
        }
        lookback *= 4;
    }
    None
}

fn schedule_summary(input: &WhyInput, tz: Tz) -> ScheduleSummary {
    let schedule = &input.spec.schedule;
    let cron = match (schedule.trigger, schedule.cron.as_deref()) {
        (TriggerKind::Cron, Some(expression)) => CronSchedule::parse(expression).ok(),
        _ => None,
    };
    let (previous_slot, next_slot) = match &cron {
        Some(cron) => {
            // The next slot that can fire: not before the start, not after the end.
            let from = match schedule.start_at {
                Some(start) if start > input.at => start - 1,
                _ => input.at,
            };
            let next = cron
                .next_after(from, tz)
                .filter(|&next| schedule.end_at.is_none_or(|end| next <= end));
            (previous_fire(cron, input.at, tz), next)
        }
        None => (None, None),
    };
    ScheduleSummary {
        trigger: schedule.trigger,
        cron: schedule.cron.clone(),
        timezone: schedule.timezone.clone(),
        paused: input.paused,
        start_at: schedule.start_at,
        end_at: schedule.end_at,
        misfire: schedule.misfire.name().into(),
        overlap: schedule.overlap.as_str().into(),
        after: schedule.after.clone(),
        previous_slot,
        next_slot,
    }
}

/// Builds the explanation. Tasks' states are the ones `input` carries (their states now); the
/// schedule and the decisions are read around `input.at`.
pub fn explain(input: &WhyInput) -> Explanation {
    let tz = parse_timezone(&input.spec.schedule.timezone).unwrap_or(chrono_tz::UTC);
    let t = |ms: Millis| format_time(ms, tz);
    let schedule = schedule_summary(input, tz);

    let mut decisions = input.decisions.clone();
    decisions.sort_by_key(|d| (d.slot_at, d.at));
    decisions.dedup();
    let skip = decisions.len().saturating_sub(MAX_DECISIONS);
    let lines: Vec<DecisionLine> = decisions
        .iter()
        .skip(skip)
        .map(|d| DecisionLine {
            decision: d.clone(),
            text: decision_text(d, tz),
        })
        .collect();

    let mut verdict = Vec::new();
    if input.paused {
        verdict
            .push("the workflow is paused: its schedule fires no run until it is resumed".into());
    }
    match schedule.trigger {
        TriggerKind::Cron => {
            if let Some(start) = schedule.start_at.filter(|&start| input.at < start) {
                verdict.push(format!(
                    "{} is before the schedule's start ({})",
                    t(input.at),
                    t(start)
                ));
            }
            if let Some(end) = schedule.end_at.filter(|&end| input.at > end) {
                verdict.push(format!(
                    "{} is after the schedule's end ({})",
                    t(input.at),
                    t(end)
                ));
            }
            match schedule.previous_slot {
                Some(slot) if schedule.start_at.is_some_and(|start| slot < start) => {
                    verdict.push(format!(
                        "the slot at {} was before the schedule's start, so it did not fire",
                        t(slot)
                    ))
                }
                Some(slot) => verdict.push(slot_verdict(slot, input, &decisions, tz)),
                None => verdict.push(format!("no cron slot at or before {}", t(input.at))),
            }
            if let Some(next) = schedule.next_slot {
                verdict.push(format!("the next slot after it is {}", t(next)));
            }
        }
        TriggerKind::Dependency => verdict.push(format!(
            "the workflow runs when each of {} has a successful run for the same logical time",
            schedule.after.join(", ")
        )),
        TriggerKind::Manual | TriggerKind::Api | TriggerKind::Backfill | TriggerKind::Parent => {
            verdict.push("the workflow has no schedule: runs start only when triggered".into())
        }
    }

    let (run, tasks) = match &input.run {
        Some(run) => {
            verdict.push(format!(
                "nearest run: {} ({}, logical time {}), {}",
                run.id,
                run.trigger,
                t(run.logical_time),
                run.state
            ));
            if let Some(missed) = decisions
                .iter()
                .find(|d| d.kind == DecisionKind::DeadlineMissed && d.run_id == Some(run.id))
            {
                verdict.push(format!(
                    "run {} missed its deadline at {}: {}",
                    run.id,
                    t(missed.at),
                    missed.detail
                ));
            }
            if let Some(past) = decisions
                .iter()
                .find(|d| d.kind == DecisionKind::AdmittedOverBound && d.run_id == Some(run.id))
            {
                verdict.push(format!("run {} was {}", run.id, past.detail));
            }
            let summary = RunSummary {
                id: run.id,
                version: run.version,
                state: run.state,
                trigger: run.trigger,
                logical_time: run.logical_time,
                created_at: run.created_at,
                finished_at: run.finished_at,
                triggered_by: run.triggered_by.clone(),
            };
            (Some(summary), run_tasks(run, input, &decisions, tz))
        }
        None => {
            verdict.push("the workflow has no run yet".into());
            let passed = |slot: Millis| Reason::SlotPassed {
                slot,
                recorded: decisions.iter().any(|d| d.slot_at == slot),
            };
            // A time in the past asks about the slot it falls in; the present, about what
            // comes next.
            let reason = match schedule.trigger {
                TriggerKind::Cron => match (schedule.previous_slot, schedule.next_slot) {
                    (Some(slot), _)
                        if input.at < input.now
                            && schedule.start_at.is_none_or(|start| slot >= start) =>
                    {
                        passed(slot)
                    }
                    (_, Some(slot)) if slot <= input.now => passed(slot),
                    (_, next_fire) => Reason::NotYetTime { next_fire },
                },
                _ => Reason::NotTriggered,
            };
            let tasks = input
                .spec
                .tasks
                .iter()
                .map(|task| TaskExplanation {
                    task: task.name.clone(),
                    state: "-".into(),
                    instance_id: None,
                    attempt: None,
                    worker: None,
                    text: reason.text(tz),
                    reason: reason.clone(),
                })
                .collect();
            (None, tasks)
        }
    };

    Explanation {
        workflow: input.workflow.clone(),
        version: input.version,
        at: input.at,
        timezone: tz.name().to_string(),
        schedule,
        verdict,
        decisions: lines,
        run,
        tasks,
    }
}

fn decision_text(d: &Decision, tz: Tz) -> String {
    let mut text = format!("slot {}: {}", format_time(d.slot_at, tz), d.kind);
    if let Some(run) = d.run_id {
        text.push_str(&format!(" run {run}"));
    }
    if let Some(task) = &d.task {
        text.push_str(&format!(" task {task}"));
    }
    if !d.detail.is_empty() {
        text.push_str(&format!(": {}", d.detail));
    }
    text
}

/// What happened to the cron slot `slot` (the last one at or before the time asked about).
fn slot_verdict(slot: Millis, input: &WhyInput, decisions: &[Decision], tz: Tz) -> String {
    let t = |ms| format_time(ms, tz);
    let about_slot: Vec<&Decision> = decisions
        .iter()
        .filter(|d| d.slot_at == slot && d.instance_id.is_none() && d.task.is_none())
        .collect();
    // The last decision about the slot is its fate; an earlier `queued` may be followed by
    // `dequeued`, a `fired` by nothing. Being admitted past a bound is said of the run beside
    // its fate (`explain`), so it is the fate only when nothing else was recorded.
    let fate = about_slot
        .iter()
        .rev()
        .find(|d| d.kind != DecisionKind::AdmittedOverBound)
        .or(about_slot.last());
    if let Some(last) = fate {
        let detail = if last.detail.is_empty() {
            String::new()
        } else {
            format!(": {}", last.detail)
        };
        let run = last
            .run_id
            .map(|id| format!(" (run {id})"))
            .unwrap_or_default();
        return format!(
            "the slot at {} was {}{run}{detail}",
            t(slot),
            past_tense(last.kind)
        );
    }
    match &input.run {
        Some(run) if run.logical_time == slot => {
            format!("the slot at {} fired run {}", t(slot), run.id)
        }
        _ if input.paused => format!("the slot at {} passed while paused", t(slot)),
        _ => format!(
            "the slot at {} has no run and no recorded decision (the scheduler was not running, \
             or the workflow was applied or resumed after it)",
            t(slot)
        ),
    }
}

fn past_tense(kind: DecisionKind) -> &'static str {
    match kind {
        DecisionKind::Fired => "fired",
        DecisionKind::Misfired => "dropped by the misfire policy",
        DecisionKind::CaughtUp => "caught up late by the misfire policy",
        DecisionKind::SkippedOverlap => "skipped: an earlier run was still active",
        DecisionKind::Replaced => "fired, replacing the active run",
        DecisionKind::Queued => "queued",
        DecisionKind::Dequeued => "queued, then started",
        DecisionKind::Paused => "skipped: the workflow was paused",
        DecisionKind::OutsideWindow => "skipped: outside the schedule's start/end",
        DecisionKind::NoWorker => "held: no live worker",
        DecisionKind::Throttled => "throttled",
        DecisionKind::WaitingUpstream => "waiting for its upstream workflows",
        DecisionKind::Lost => "an attempt was lost with its worker",
        DecisionKind::Withdrawn => "a dispatch was withdrawn from its worker",
        DecisionKind::TimedOut => "an attempt was timed out by the scheduler",
        DecisionKind::Stalled => "an attempt's task heartbeat stopped on a live worker",
        DecisionKind::SecretUnavailable => "held: a secret it needs is unavailable",
        DecisionKind::ConditionFalse => "skipped: its if: was false",
        DecisionKind::EmptyList => "skipped: its for_each list was empty",
        DecisionKind::DeadlineMissed => "fired, and its run missed its deadline",
        DecisionKind::AdmittedOverBound => "fired past the bound on waiting instances",
    }
}

/// A mapped task's items after its reason: `; 4 items: 3 SUCCESS, 1 FAILED (first: instance
/// 5)`, the failure being the one to look at next; nothing before it fans out.
fn items_text(parent: i64, instances: &[InstanceFacts]) -> String {
    let items: Vec<&InstanceFacts> = instances
        .iter()
        .filter(|i| i.shard_of == Some(parent))
        .collect();
    if items.is_empty() {
        return String::new();
    }
    let counts: Vec<String> = InstanceState::ALL
        .into_iter()
        .filter_map(|state| {
            let n = items.iter().filter(|i| i.state == state).count();
            (n > 0).then(|| format!("{n} {state}"))
        })
        .collect();
    let failed = items
        .iter()
        .filter(|i| {
            matches!(
                i.state,
                InstanceState::Failed | InstanceState::Timeout | InstanceState::Cancelled
            )
        })
        .min_by_key(|i| i.id);
    let first = failed.map_or_else(String::new, |i| format!(" (first: instance {})", i.id));
    format!("; {} items: {}{first}", items.len(), counts.join(", "))
}

fn run_tasks(
    run: &RunFacts,
    input: &WhyInput,
    decisions: &[Decision],
    tz: Tz,
) -> Vec<TaskExplanation> {
    // The latest instance per task; a sharded task is its parent, never a shard.
    let mut by_task: BTreeMap<&str, &InstanceFacts> = BTreeMap::new();
    for instance in run.instances.iter().filter(|i| i.shard_of.is_none()) {
        let entry = by_task.entry(instance.task.as_str()).or_insert(instance);
        if entry.id < instance.id {
            *entry = instance;
        }
    }
    let run_decisions: Vec<&Decision> = decisions
        .iter()
        .filter(|d| d.run_id == Some(run.id))
        .collect();
    // The run is queued when its last queue decision is `queued`.
    let queued = run_decisions
        .iter()
        .rev()
        .find(|d| matches!(d.kind, DecisionKind::Queued | DecisionKind::Dequeued))
        .filter(|d| d.kind == DecisionKind::Queued);

    // States for upstream lookups (`None`: not decided yet): tasks are visited upstream first
    // (a file may list a task before its upstream), and the answer is put back in file order.
    let mut states: BTreeMap<String, Option<InstanceState>> = BTreeMap::new();
    let order = crate::dag::topological_positions(&run.tasks);
    let mut results: BTreeMap<usize, TaskExplanation> = BTreeMap::new();
    for i in order {
        let task = &run.tasks[i];
        let upstreams: Vec<(&str, Option<InstanceState>)> = task
            .upstream
            .iter()
            .map(|up| (up.as_str(), states.get(up).copied().flatten()))
            .collect();
        let not_run = |state: InstanceState| {
            let verdict = if state == InstanceState::Skipped {
                Verdict::Skip
            } else {
                Verdict::UpstreamFailed
            };
            Reason::NotRun {
                state,
                because: not_run_reason(task.trigger_rule, verdict, &upstreams),
            }
        };
        let own = by_task
            .get(task.name.as_str())
            .filter(|instance| instance.state != InstanceState::Pending);
        let explanation = match own {
            Some(instance) => {
                // A task skipped by its `if:` (or an empty list) says so with the values it read; one skipped
                // by its rule names the upstreams that decided it.
                let condition_false = run_decisions.iter().rev().find(|d| {
                    matches!(
                        d.kind,
                        DecisionKind::ConditionFalse | DecisionKind::EmptyList
                    ) && d.instance_id == Some(instance.id)
                });
                let reason = match (instance.state, condition_false) {
                    (InstanceState::Skipped, Some(decision)) => Reason::NotRun {
                        state: InstanceState::Skipped,
                        because: decision.detail.clone(),
                    },
                    (state @ (InstanceState::Skipped | InstanceState::UpstreamFailed), _) => {
                        not_run(state)
                    }
                    _ => instance_reason(instance, task, input, &run_decisions, queued),
                };
                let mut text = reason.text(tz);
                if task.for_each.is_some() {
                    text.push_str(&items_text(instance.id, &run.instances));
                }
                TaskExplanation {
                    task: task.name.clone(),
                    state: instance.state.as_str().into(),
                    instance_id: Some(instance.id),
                    attempt: Some(instance.attempt),
                    worker: instance.worker_id.clone(),
                    text,
                    reason,
                }
            }
            None => {
                let decided = if task.handler.is_some() {
                    None
                } else {
                    let ups = Upstreams::count(upstreams.iter().map(|(_, s)| UpstreamEnd::of(*s)));
                    judge(task.trigger_rule, ups).and_then(|verdict| verdict.state())
                };
                let (state, reason) = if let Some(state) = decided {
                    (state.as_str(), not_run(state))
                } else if run.state.is_terminal() {
                    ("PENDING", Reason::RunEnded { state: run.state })
                } else if run.state == RunState::Queued {
                    // A queued run has no instances until it starts.
                    let detail = queued.map_or_else(
                        || "waiting for a run slot".to_string(),
                        |d| d.detail.clone(),
                    );
                    ("PENDING", Reason::Queued { detail })
                } else if let Some(handler) = task.handler {
                    ("PENDING", Reason::Handler { handler })
                } else {
                    let upstream = upstreams
                        .iter()
                        .filter(|(_, state)| *state != Some(InstanceState::Success))
                        .map(|(up, state)| {
                            let state = state.map_or("PENDING", InstanceState::as_str);
                            (up.to_string(), state.to_string())
                        })
                        .collect();
                    ("PENDING", Reason::WaitingOnUpstream { upstream })
                };
                TaskExplanation {
                    task: task.name.clone(),
                    state: state.into(),
                    instance_id: None,
                    attempt: None,
                    worker: None,
                    text: reason.text(tz),
                    reason,
                }
            }
        };
        let decided = explanation.state.parse::<InstanceState>().ok();
        states.insert(task.name.clone(), decided);
        results.insert(i, explanation);
    }
    results.into_values().collect()
}

fn instance_reason(
    instance: &InstanceFacts,
    task: &TaskSpec,
    input: &WhyInput,
    run_decisions: &[&Decision],
    queued: Option<&&Decision>,
) -> Reason {
    if let (InstanceState::Running, Some(child)) = (instance.state, &instance.child_run) {
        return Reason::WaitingOnChild {
            run: child.id,
            workflow: child.workflow.clone(),
            state: child.state,
        };
    }
    match instance.state {
        state if state.is_terminal() => Reason::Done {
            state,
            at: instance.finished_at,
            attempt: instance.attempt,
        },
        InstanceState::Dispatched => Reason::Dispatched {
            worker: instance.worker_id.clone().unwrap_or_else(|| "?".into()),
            since: instance.dispatched_at,
        },
        InstanceState::Waiting
            if task.run_workflow.is_some() && instance.not_before <= input.now =>
        {
            Reason::ChildStarting {
                workflow: task.run_workflow.clone().unwrap_or_default(),
            }
        }
        InstanceState::Running => Reason::Running {
            worker: instance.worker_id.clone().unwrap_or_else(|| "?".into()),
            since: instance.started_at.or(instance.dispatched_at),
        },
        _ => {
            if instance.not_before > input.now {
                return Reason::Backoff {
                    until: instance.not_before,
                };
            }
            if let Some(queued) = queued {
                return Reason::Queued {
                    detail: queued.detail.clone(),
                };
            }
            let mine = |d: &&&Decision| {
                d.instance_id == Some(instance.id)
                    || (d.instance_id.is_none() && d.task.as_deref() == Some(task.name.as_str()))
            };
            let latest = run_decisions.iter().rev().find(mine);
            if let Some(d) = latest.filter(|d| d.kind == DecisionKind::Throttled) {
                return Reason::Throttled {
                    detail: d.detail.clone(),
                };
            }
            if let Some(d) = latest.filter(|d| d.kind == DecisionKind::SecretUnavailable) {
                return Reason::SecretUnavailable {
                    detail: d.detail.clone(),
                };
            }
            let live: Vec<&WorkerFacts> = input
                .workers
                .iter()
                .filter(|w| w.live && !w.draining)
                .collect();
            let eligible: Vec<&WorkerFacts> = live
                .iter()
                .copied()
                .filter(|w| task.labels.iter().all(|(k, v)| w.labels.get(k) == Some(v)))
                .collect();
            if eligible.is_empty() {
                return Reason::NoLiveWorker {
                    labels: task.labels.clone(),
                    live_workers: live.iter().map(|w| describe_worker(w)).collect(),
                };
            }
            let names = |ws: &[&WorkerFacts]| ws.iter().map(|w| w.id.clone()).collect();
            let free: Vec<&WorkerFacts> = eligible
                .iter()
                .copied()
                .filter(|w| w.running < w.capacity)
                .collect();
            if free.is_empty() {
                return Reason::WorkersBusy {
                    workers: names(&eligible),
                };
            }
            Reason::ReadyToDispatch {
                workers: names(&free),
            }
        }
    }
}

fn describe_worker(worker: &WorkerFacts) -> String {
    if worker.labels.is_empty() {
        return worker.id.clone();
    }
    let labels: Vec<String> = worker
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("{} [{}]", worker.id, labels.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{OverlapPolicy, ScheduleSpec};

    /// 2026-01-31 02:30:00 UTC.
    const SLOT: Millis = 1_769_826_600_000;
    const MINUTE: Millis = 60_000;
    const HOUR: Millis = 60 * MINUTE;

    fn task(name: &str, upstream: &[&str]) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            command: "true".into(),
            upstream: upstream.iter().map(|s| s.to_string()).collect(),
            ..TaskSpec::default()
        }
    }

    /// A daily 02:30 UTC workflow: extract → {clean, audit} → load.
    fn input(now: Millis) -> WhyInput {
        WhyInput {
            workflow: "etl".into(),
            version: 2,
            spec: WorkflowSpec {
                name: "etl".into(),
                schedule: ScheduleSpec {
                    trigger: TriggerKind::Cron,
                    cron: Some("30 2 * * *".into()),
                    timezone: "UTC".into(),
                    overlap: OverlapPolicy::Skip,
                    ..ScheduleSpec::default()
                },
                tasks: vec![
                    task("extract", &[]),
                    task("clean", &["extract"]),
                    task("audit", &["extract"]),
                    task("load", &["clean", "audit"]),
                ],
                ..WorkflowSpec::default()
            },
            paused: false,
            at: now,
            now,
            decisions: Vec::new(),
            run: None,
            workers: vec![worker("w1", &[])],
        }
    }

    fn worker(id: &str, labels: &[(&str, &str)]) -> WorkerFacts {
        WorkerFacts {
            id: id.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            live: true,
            draining: false,
            capacity: 4,
            running: 0,
        }
    }

    fn instance(id: i64, task: &str, state: InstanceState) -> InstanceFacts {
        InstanceFacts {
            id,
            task: task.into(),
            state,
            attempt: 1,
            worker_id: (state != InstanceState::Waiting).then(|| "w1".to_string()),
            not_before: 0,
            created_at: SLOT,
            dispatched_at: Some(SLOT + 1_000),
            started_at: Some(SLOT + 2_000),
            finished_at: state.is_terminal().then_some(SLOT + 60_000),
            shard_of: None,
            child_run: None,
        }
    }

    fn run(input: &WhyInput, state: RunState, instances: Vec<InstanceFacts>) -> RunFacts {
        RunFacts {
            id: 41,
            version: input.version,
            state,
            trigger: TriggerKind::Cron,
            logical_time: SLOT,
            created_at: SLOT,
            finished_at: state.is_terminal().then_some(SLOT + HOUR),
            triggered_by: "schedule".into(),
            tasks: input.spec.tasks.clone(),
            instances,
        }
    }

    fn decision(kind: DecisionKind, slot_at: Millis, detail: &str) -> Decision {
        Decision {
            at: slot_at,
            slot_at,
            kind,
            run_id: None,
            instance_id: None,
            task: None,
            detail: detail.into(),
        }
    }

    fn reasons(explanation: &Explanation) -> Vec<(String, &'static str, String)> {
        explanation
            .tasks
            .iter()
            .map(|t| (t.task.clone(), t.reason.kind(), t.text.clone()))
            .collect()
    }

    #[test]
    fn before_the_first_slot_it_is_not_yet_time() {
        let mut input = input(SLOT - 10 * MINUTE);
        input.spec.schedule.start_at = Some(SLOT - 5 * MINUTE);
        let e = explain(&input);
        assert_eq!(e.schedule.next_slot, Some(SLOT));
        assert_eq!(e.schedule.previous_slot, Some(SLOT - 24 * HOUR));
        assert!(e.run.is_none());
        for (_, kind, text) in reasons(&e) {
            assert_eq!(kind, "not_yet_time");
            assert_eq!(
                text,
                "not yet time: the next slot is 2026-01-31 02:30:00 UTC"
            );
        }
        assert!(
            e.verdict
                .iter()
                .any(|v| v.contains("before the schedule's start")),
            "{:?}",
            e.verdict
        );
        assert!(
            e.verdict
                .contains(&"the workflow has no run yet".to_string())
        );
        assert_eq!(
            e.verdict[1],
            "the slot at 2026-01-30 02:30:00 UTC was before the schedule's start, so it did not fire"
        );
        // Past the end there is no next slot.
        input.spec.schedule.start_at = None;
        input.spec.schedule.end_at = Some(SLOT - MINUTE);
        let e = explain(&input);
        assert_eq!(e.schedule.next_slot, None);
        assert_eq!(
            e.tasks[0].text,
            "not yet time, and the schedule has no further slot"
        );
    }

    #[test]
    fn a_past_time_without_a_run_is_explained_by_its_own_slot() {
        // Asked about 02:20 the next morning's slot is not the one meant: the slot the time
        // falls in is the day before's.
        let mut input = input(SLOT - 10 * MINUTE);
        input.now = SLOT + HOUR;
        let e = explain(&input);
        let slot = SLOT - 24 * HOUR;
        assert_eq!(
            e.tasks[0].reason,
            Reason::SlotPassed {
                slot,
                recorded: false
            }
        );
        assert_eq!(
            e.tasks[0].text,
            "no run: the slot at 2026-01-30 02:30:00 UTC passed without one, and no decision \
             about it is recorded"
        );
        // With decisions about that slot, the tasks point to them.
        input.decisions = vec![decision(DecisionKind::SkippedOverlap, slot, "")];
        let e = explain(&input);
        assert_eq!(
            e.tasks[0].text,
            "no run: the slot at 2026-01-30 02:30:00 UTC passed without one (see the decisions)"
        );
        assert!(e.decisions.iter().any(|line| line.decision.slot_at == slot));
        // Before the schedule's start, the first slot is the one asked about, once it has come.
        let mut input = input.clone();
        input.decisions.clear();
        input.at = SLOT - 2 * MINUTE;
        input.spec.schedule.start_at = Some(SLOT - MINUTE);
        let e = explain(&input);
        assert_eq!(
            e.tasks[0].reason,
            Reason::SlotPassed {
                slot: SLOT,
                recorded: false
            }
        );
    }

    #[test]
    fn a_manual_workflow_without_runs_waits_for_a_trigger() {
        let mut input = input(SLOT);
        input.spec.schedule = ScheduleSpec::default();
        let e = explain(&input);
        assert_eq!(e.schedule.previous_slot, None);
        assert!(
            reasons(&e)
                .iter()
                .all(|(_, kind, _)| *kind == "not_triggered")
        );
        assert!(e.verdict[0].contains("runs start only when triggered"));
    }

    #[test]
    fn a_fired_and_succeeded_slot() {
        let mut input = input(SLOT + 5 * MINUTE);
        input.decisions = vec![Decision {
            run_id: Some(41),
            ..decision(DecisionKind::Fired, SLOT, "")
        }];
        let done = |id, task| instance(id, task, InstanceState::Success);
        input.run = Some(run(
            &input,
            RunState::Success,
            vec![
                done(1, "extract"),
                done(2, "clean"),
                done(3, "audit"),
                done(4, "load"),
            ],
        ));
        let e = explain(&input);
        assert_eq!(e.schedule.previous_slot, Some(SLOT));
        assert_eq!(
            e.verdict[0],
            "the slot at 2026-01-31 02:30:00 UTC was fired (run 41)"
        );
        assert!(e.verdict.iter().any(|v| v.starts_with("nearest run: 41")));
        let all = reasons(&e);
        assert!(all.iter().all(|(_, kind, _)| *kind == "done"), "{all:?}");
        assert_eq!(all[0].2, "succeeded at 2026-01-31 02:31:00 UTC (attempt 1)");
        assert_eq!(e.decisions.len(), 1);
        assert_eq!(
            e.decisions[0].text,
            "slot 2026-01-31 02:30:00 UTC: fired run 41"
        );
    }

    #[test]
    fn downstream_waits_on_a_running_upstream_and_a_failure_blocks_it() {
        let mut input = input(SLOT + 5 * MINUTE);
        input.run = Some(run(
            &input,
            RunState::Running,
            vec![
                instance(1, "extract", InstanceState::Success),
                instance(2, "clean", InstanceState::Running),
                instance(3, "audit", InstanceState::Success),
            ],
        ));
        let e = explain(&input);
        let all = reasons(&e);
        assert_eq!(
            all[1].2,
            "running on worker w1 since 2026-01-31 02:30:02 UTC"
        );
        assert_eq!(all[3].1, "waiting_upstream");
        assert_eq!(all[3].2, "waiting on upstream clean (RUNNING)");
        assert_eq!(e.tasks[3].state, "PENDING");

        let mut failed = input.clone();
        let run = failed.run.as_mut().unwrap();
        run.instances[1].state = InstanceState::Failed;
        run.instances[1].finished_at = Some(SLOT + MINUTE);
        let e = explain(&failed);
        assert_eq!(e.tasks[3].state, "UPSTREAM_FAILED");
        assert_eq!(
            e.tasks[3].text,
            "will not run: upstream clean was FAILED and trigger_rule is all_success"
        );
    }

    #[test]
    fn a_mapped_task_counts_its_items_and_names_the_first_failure() {
        let mut parent = instance(4, "copy", InstanceState::Failed);
        parent.attempt = 1;
        let item = |id: i64, state| InstanceFacts {
            shard_of: Some(4),
            ..instance(id, "copy", state)
        };
        let text = items_text(
            4,
            &[
                parent,
                item(5, InstanceState::Success),
                item(7, InstanceState::Failed),
                item(6, InstanceState::Timeout),
            ],
        );
        assert_eq!(
            text,
            "; 3 items: 1 SUCCESS, 1 FAILED, 1 TIMEOUT (first: instance 6)"
        );
        assert_eq!(
            items_text(4, &[instance(4, "copy", InstanceState::Waiting)]),
            ""
        );
    }

    #[test]
    fn a_sharded_task_is_explained_by_its_parent_never_a_shard() {
        let mut input = input(SLOT);
        input.spec.tasks = vec![task("fan", &[])];
        let mut shard = instance(9, "fan", InstanceState::Running);
        shard.shard_of = Some(4);
        input.run = Some(run(
            &input,
            RunState::Success,
            vec![instance(4, "fan", InstanceState::Success), shard],
        ));
        let e = explain(&input);
        assert_eq!(e.tasks[0].state, "SUCCESS");
        assert_eq!(e.tasks[0].instance_id, Some(4));
    }

    #[test]
    fn a_task_listed_before_its_upstream_still_waits_on_it() {
        let mut input = input(SLOT);
        input.spec.tasks = vec![task("late", &["early"]), task("early", &[])];
        input.run = Some(run(
            &input,
            RunState::Running,
            vec![instance(1, "early", InstanceState::Waiting)],
        ));
        let e = explain(&input);
        assert_eq!(e.tasks[0].task, "late", "file order is kept");
        assert_eq!(e.tasks[0].text, "waiting on upstream early (WAITING)");
    }

    #[test]
    fn no_live_worker_with_the_task_labels() {
        let mut input = input(SLOT + MINUTE);
        input.spec.tasks[0]
            .labels
            .insert("gpu".into(), "a100".into());
        input.workers = vec![
            worker("w1", &[("gpu", "t4")]),
            WorkerFacts {
                live: false,
                ..worker("w2", &[("gpu", "a100")])
            },
        ];
        input.run = Some(run(
            &input,
            RunState::Running,
            vec![instance(1, "extract", InstanceState::Waiting)],
        ));
        let e = explain(&input);
        assert_eq!(e.tasks[0].reason.kind(), "no_worker");
        assert_eq!(
            e.tasks[0].text,
            "no live worker with labels gpu=a100 (live: w1 [gpu=t4])"
        );

        // A worker with the labels that is full: busy, not missing.
        input.workers.push(WorkerFacts {
            running: 4,
            ..worker("w3", &[("gpu", "a100")])
        });
        assert_eq!(
            explain(&input).tasks[0].text,
            "waiting for a free slot on w3"
        );
        input.workers[2].running = 1;
        assert_eq!(explain(&input).tasks[0].reason.kind(), "ready");
        input.workers.clear();
        assert_eq!(
            explain(&input).tasks[0].text,
            "no live worker with labels gpu=a100 (no worker is live)"
        );
    }

    #[test]
    fn a_paused_workflow_says_so_and_its_slot_passed() {
        let mut input = input(SLOT + MINUTE);
        input.paused = true;
        let e = explain(&input);
        assert!(e.schedule.paused);
        assert_eq!(
            e.verdict[0],
            "the workflow is paused: its schedule fires no run until it is resumed"
        );
        assert_eq!(
            e.verdict[1],
            "the slot at 2026-01-31 02:30:00 UTC passed while paused"
        );

        input.decisions = vec![decision(DecisionKind::Paused, SLOT, "")];
        let e = explain(&input);
        assert_eq!(
            e.verdict[1],
            "the slot at 2026-01-31 02:30:00 UTC was skipped: the workflow was paused"
        );
    }

    #[test]
    fn a_fire_admitted_past_the_bound_is_told_beside_the_slots_fate() {
        let mut input = input(SLOT + MINUTE);
        input.run = Some(run(&input, RunState::Running, Vec::new()));
        let run_id = 41;
        let detail = "admitted past the bound on waiting instances: 12 instances of app \"etl\" \
                      were waiting (bound 10 per app); a cron fire is never refused";
        input.decisions = vec![
            Decision {
                run_id: Some(run_id),
                ..decision(DecisionKind::AdmittedOverBound, SLOT, detail)
            },
            Decision {
                run_id: Some(run_id),
                ..decision(DecisionKind::Fired, SLOT, "cron slot")
            },
        ];
        for order in [false, true] {
            if order {
                input.decisions.reverse();
            }
            let e = explain(&input);
            assert!(
                e.verdict.contains(&format!(
                    "the slot at 2026-01-31 02:30:00 UTC was fired (run {run_id}): cron slot"
                )),
                "{:?}",
                e.verdict
            );
            assert!(
                e.verdict.contains(&format!("run {run_id} was {detail}")),
                "{:?}",
                e.verdict
            );
        }
    }

    #[test]
    fn a_missed_deadline_is_told_with_the_nearest_run() {
        let mut input = input(SLOT + MINUTE);
        input.run = Some(run(&input, RunState::Running, Vec::new()));
        let run_id = 41;
        input.decisions = vec![Decision {
            at: SLOT + 4 * 60 * MINUTE,
            run_id: Some(run_id),
            ..decision(
                DecisionKind::DeadlineMissed,
                SLOT,
                "deadline 06:30 (2026-01-31 06:30:00 UTC) passed before the run ended; the run \
                 goes on",
            )
        }];
        let e = explain(&input);
        assert!(
            e.verdict.contains(&format!(
                "run {run_id} missed its deadline at 2026-01-31 06:30:00 UTC: deadline 06:30 \
                 (2026-01-31 06:30:00 UTC) passed before the run ended; the run goes on"
            )),
            "{:?}",
            e.verdict
        );
        assert_eq!(e.decisions[0].decision.kind, DecisionKind::DeadlineMissed);
    }

    #[test]
    fn every_decision_kind_is_shown_and_the_last_one_about_the_slot_decides() {
        let mut input = input(SLOT + MINUTE);
        for kind in DecisionKind::ALL {
            input.decisions = vec![decision(kind, SLOT, "previous run 40 still running")];
            let e = explain(&input);
            assert_eq!(e.decisions.len(), 1);
            assert!(e.decisions[0].text.contains(kind.as_str()), "{kind}");
            assert!(
                e.verdict[0].contains(past_tense(kind)),
                "{kind}: {:?}",
                e.verdict
            );
        }
        input.decisions = vec![
            decision(DecisionKind::Queued, SLOT, "max active runs 1"),
            Decision {
                at: SLOT + 10 * MINUTE,
                ..decision(DecisionKind::Dequeued, SLOT, "")
            },
        ];
        assert_eq!(
            explain(&input).verdict[0],
            "the slot at 2026-01-31 02:30:00 UTC was queued, then started"
        );
        input.decisions = vec![decision(
            DecisionKind::SkippedOverlap,
            SLOT,
            "previous run 40 still running",
        )];
        assert_eq!(
            explain(&input).verdict[0],
            "the slot at 2026-01-31 02:30:00 UTC was skipped: an earlier run was still active: \
             previous run 40 still running"
        );
    }

    #[test]
    fn queued_runs_throttled_instances_and_backoffs() {
        let mut input = input(SLOT + MINUTE);
        input.run = Some(run(
            &input,
            RunState::Running,
            vec![instance(1, "extract", InstanceState::Waiting)],
        ));
        input.decisions = vec![Decision {
            run_id: Some(41),
            ..decision(DecisionKind::Queued, SLOT, "max active runs 1 reached")
        }];
        assert_eq!(
            explain(&input).tasks[0].text,
            "run queued: max active runs 1 reached"
        );
        input.decisions.push(Decision {
            at: SLOT + 2 * MINUTE,
            run_id: Some(41),
            ..decision(DecisionKind::Dequeued, SLOT, "")
        });
        input.decisions.push(Decision {
            at: SLOT + 3 * MINUTE,
            run_id: Some(41),
            instance_id: Some(1),
            ..decision(DecisionKind::Throttled, SLOT + 3 * MINUTE, "task limit 2")
        });
        assert_eq!(explain(&input).tasks[0].text, "throttled: task limit 2");

        let run = input.run.as_mut().unwrap();
        run.instances[0].not_before = SLOT + 10 * MINUTE;
        run.instances[0].attempt = 2;
        assert_eq!(
            explain(&input).tasks[0].text,
            "retry waits for its backoff until 2026-01-31 02:40:00 UTC"
        );
    }

    #[test]
    fn a_queued_run_without_instances_says_it_is_queued() {
        let mut input = input(SLOT + MINUTE);
        input.run = Some(run(&input, RunState::Queued, Vec::new()));
        let e = explain(&input);
        assert!(
            e.tasks
                .iter()
                .all(|t| t.text == "run queued: waiting for a run slot")
        );
        input.decisions = vec![Decision {
            run_id: Some(41),
            ..decision(DecisionKind::Queued, SLOT, "max_active_runs 1 reached")
        }];
        let e = explain(&input);
        assert!(!e.tasks.is_empty());
        for task in &e.tasks {
            assert_eq!(task.state, "PENDING");
            assert_eq!(task.text, "run queued: max_active_runs 1 reached");
        }
    }

    #[test]
    fn a_run_workflow_task_waits_on_its_child_run() {
        let mut input = input(SLOT + MINUTE);
        input.spec.tasks[1].run_workflow = Some("load-region".into());
        let mut waiting = instance(2, "clean", InstanceState::Running);
        waiting.worker_id = None;
        waiting.child_run = Some(ChildRunFacts {
            id: 77,
            workflow: "load-region".into(),
            state: RunState::Running,
        });
        input.run = Some(run(
            &input,
            RunState::Running,
            vec![instance(1, "extract", InstanceState::Success), waiting],
        ));
        let e = explain(&input);
        assert_eq!(e.tasks[1].reason.kind(), "waiting_child");
        assert_eq!(
            e.tasks[1].text,
            "waiting on its child run 77 (load-region), which is RUNNING; the task ends as that \
             run ends"
        );
        // Before its child is started it needs no worker, only the dispatcher.
        input.workers.clear();
        input.run = Some(run(
            &input,
            RunState::Running,
            vec![
                instance(1, "extract", InstanceState::Success),
                instance(2, "clean", InstanceState::Waiting),
            ],
        ));
        let e = explain(&input);
        assert_eq!(
            e.tasks[1].text,
            "ready: the dispatcher starts its child run of load-region on its next pass (no \
             worker needed)"
        );
    }

    #[test]
    fn dispatched_and_cancelled_runs() {
        let mut input = input(SLOT + MINUTE);
        input.run = Some(run(
            &input,
            RunState::Cancelled,
            vec![
                instance(1, "extract", InstanceState::Success),
                instance(2, "clean", InstanceState::Cancelled),
                instance(3, "audit", InstanceState::Dispatched),
            ],
        ));
        let e = explain(&input);
        assert_eq!(
            e.tasks[1].text,
            "was cancelled at 2026-01-31 02:31:00 UTC (attempt 1)"
        );
        assert_eq!(
            e.tasks[2].text,
            "dispatched to worker w1 since 2026-01-31 02:30:01 UTC"
        );
        assert_eq!(
            e.tasks[3].text,
            "will not run: upstream clean was CANCELLED and trigger_rule is all_success"
        );
    }

    #[test]
    fn times_are_shown_in_the_workflow_time_zone_and_slots_follow_it() {
        let mut input = input(SLOT);
        input.spec.schedule.timezone = "Europe/Paris".into();
        // 02:30 Paris is 01:30 UTC in winter.
        let e = explain(&input);
        assert_eq!(e.schedule.previous_slot, Some(SLOT - HOUR));
        assert!(
            e.verdict[0].contains("2026-01-31 02:30:00 CET"),
            "{:?}",
            e.verdict
        );
    }

    #[test]
    fn previous_fire_finds_sparse_and_dense_slots() {
        let tz = chrono_tz::UTC;
        let yearly = CronSchedule::parse("0 0 1 1 *").unwrap();
        // 2026-01-01T00:00Z
        assert_eq!(previous_fire(&yearly, SLOT, tz), Some(1_767_225_600_000));
        let every_minute = CronSchedule::parse("* * * * *").unwrap();
        assert_eq!(previous_fire(&every_minute, SLOT + 59_999, tz), Some(SLOT));
        assert_eq!(previous_fire(&every_minute, SLOT, tz), Some(SLOT));
    }
}
