//! `axctl why WORKFLOW [--at TIME]`: why its tasks did or did not run around a time.

use ax_core::why::format_time;
use ax_proto::v1 as pb;
use chrono_tz::Tz;
use serde::Serialize;

use crate::client::Ctx;
use crate::error::CtlError;
use crate::output::{self, Table, or_dash, rfc3339};
use crate::view::{run_state, trigger_kind};

/// 1971-01-01T00:00:00Z: `--at` before it is refused (the request's `at_ms` 0 means now).
const EARLIEST_AT_MS: i64 = 31_536_000_000;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The workflow to explain.
    pub workflow: String,
    /// The time asked about (default now): RFC 3339, or YYYY-MM-DD[THH:MM[:SS]] read in the
    /// workflow's time zone; 1971 or later.
    #[arg(long)]
    pub at: Option<String>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let st = |status| ctx.status(status);
    let at_ms = match &args.at {
        None => 0,
        Some(text) => {
            let workflow = client
                .get_workflow(pb::GetWorkflowRequest {
                    name: args.workflow.clone(),
                })
                .await
                .map_err(st)?
                .into_inner();
            let tz = zone(
                workflow
                    .schedule
                    .as_ref()
                    .map_or("", |s| s.timezone.as_str()),
            );
            let at = ax_core::spec::parse_instant(text, tz).ok_or_else(|| {
                CtlError::usage(format!(
                    "--at {text:?}: expected RFC 3339 (2026-01-31T02:30:00Z) or \
                     YYYY-MM-DD[THH:MM[:SS]] in the workflow's time zone ({})",
                    tz.name()
                ))
            })?;
            // The request's 0 means "now": no time that early (nor any before) is asked about.
            if at < EARLIEST_AT_MS {
                return Err(CtlError::usage(format!(
                    "--at {text:?} is before 1971-01-01T00:00:00Z: ax has no runs that early \
                     (leave --at out to ask about now)"
                ))
                .into());
            }
            at
        }
    };
    let explanation = client
        .explain_workflow(pb::ExplainWorkflowRequest {
            name: args.workflow,
            at_ms,
        })
        .await
        .map_err(st)?
        .into_inner();
    output::emit(ctx.output, &WhyView::from(&explanation), || {
        screen(&explanation)
    })
}

fn zone(name: &str) -> Tz {
    ax_core::cron::parse_timezone(if name.is_empty() { "UTC" } else { name })
        .unwrap_or(chrono_tz::UTC)
}

/// The one screen: schedule, verdict, decisions, the nearest run's tasks.
pub fn screen(e: &pb::Explanation) -> String {
    let tz = if output::utc() {
        chrono_tz::UTC
    } else {
        zone(&e.timezone)
    };
    let t = |ms: i64| {
        if ms > 0 {
            format_time(ms, tz)
        } else {
            "-".to_string()
        }
    };
    let mut out = String::new();
    let s = e.schedule.clone().unwrap_or_default();
    let schedule = match trigger_kind(s.trigger).as_str() {
        "CRON" => format!(
            "cron {:?} in {}, misfire {}, overlap {}",
            s.cron, s.timezone, s.misfire, s.overlap
        ),
        "DEPENDENCY" => format!("after {}", s.after.join(", ")),
        other => other.to_lowercase(),
    };
    let mut pairs = vec![
        (
            "Workflow",
            format!("{} (version {})", e.workflow, e.version),
        ),
        ("At", t(e.at_ms)),
        ("Schedule", schedule),
        (
            "State",
            if s.paused { "PAUSED" } else { "active" }.to_string(),
        ),
    ];
    if s.start_at_ms > 0 || s.end_at_ms > 0 {
        pairs.push((
            "Window",
            format!("{} .. {}", t(s.start_at_ms), t(s.end_at_ms)),
        ));
    }
    if s.previous_slot_ms > 0 || s.next_slot_ms > 0 {
        pairs.push(("Previous slot", t(s.previous_slot_ms)));
        pairs.push(("Next slot", t(s.next_slot_ms)));
    }
    out.push_str(&output::fields(&pairs));

    out.push_str("\nWhy:\n");
    for line in &e.verdict {
        out.push_str(&format!("  - {line}\n"));
    }

    out.push_str("\nDecisions around this time:\n");
    if e.decisions.is_empty() {
        out.push_str("  (none recorded)\n");
    } else {
        let mut table = Table::new(&["  DECIDED", "KIND", "DETAIL"]);
        for d in &e.decisions {
            table.row(vec![
                format!("  {}", t(d.at_ms)),
                d.kind.clone(),
                d.text.clone(),
            ]);
        }
        out.push_str(&table.render());
    }

    match &e.run {
        Some(run) => out.push_str(&format!(
            "\nRun {} ({}, logical time {}): {}\n",
            run.id,
            trigger_kind(run.trigger).to_lowercase(),
            t(run.logical_time_ms),
            run_state(run.state)
        )),
        None => out.push_str("\nNo run yet.\n"),
    }
    let mut table = Table::new(&["TASK", "STATE", "INSTANCE", "WORKER", "WHY"]);
    for task in &e.tasks {
        table.row(vec![
            task.task.clone(),
            task.state.clone(),
            if task.instance_id > 0 {
                format!("{} (attempt {})", task.instance_id, task.attempt)
            } else {
                "-".into()
            },
            or_dash(&task.worker_id),
            task.text.clone(),
        ]);
    }
    out.push_str(&table.render());
    out
}

#[derive(Debug, Serialize)]
pub struct WhyView {
    pub workflow: String,
    pub version: u32,
    pub at: Option<String>,
    pub timezone: String,
    pub schedule: ScheduleView,
    pub verdict: Vec<String>,
    pub decisions: Vec<DecisionView>,
    pub run: Option<RunRef>,
    pub tasks: Vec<TaskView>,
}

#[derive(Debug, Serialize)]
pub struct ScheduleView {
    pub trigger: String,
    pub cron: String,
    pub timezone: String,
    pub paused: bool,
    pub start_at: Option<String>,
    pub end_at: Option<String>,
    pub misfire: String,
    pub overlap: String,
    pub after: Vec<String>,
    pub previous_slot: Option<String>,
    pub next_slot: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DecisionView {
    pub at: Option<String>,
    pub slot_at: Option<String>,
    pub kind: String,
    pub run_id: Option<i64>,
    pub instance_id: Option<i64>,
    pub task: Option<String>,
    pub detail: String,
    pub text: String,
}

#[derive(Debug, Serialize)]
pub struct RunRef {
    pub id: i64,
    pub state: String,
    pub trigger: String,
    pub logical_time: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct TaskView {
    pub task: String,
    pub state: String,
    pub instance_id: Option<i64>,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    pub reason: String,
    pub text: String,
}

fn positive(id: i64) -> Option<i64> {
    (id > 0).then_some(id)
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

impl From<&pb::Explanation> for WhyView {
    fn from(e: &pb::Explanation) -> Self {
        let s = e.schedule.clone().unwrap_or_default();
        WhyView {
            workflow: e.workflow.clone(),
            version: e.version,
            at: rfc3339(e.at_ms),
            timezone: e.timezone.clone(),
            schedule: ScheduleView {
                trigger: trigger_kind(s.trigger),
                cron: s.cron,
                timezone: s.timezone,
                paused: s.paused,
                start_at: rfc3339(s.start_at_ms),
                end_at: rfc3339(s.end_at_ms),
                misfire: s.misfire,
                overlap: s.overlap,
                after: s.after,
                previous_slot: rfc3339(s.previous_slot_ms),
                next_slot: rfc3339(s.next_slot_ms),
            },
            verdict: e.verdict.clone(),
            decisions: e
                .decisions
                .iter()
                .map(|d| DecisionView {
                    at: rfc3339(d.at_ms),
                    slot_at: rfc3339(d.slot_at_ms),
                    kind: d.kind.clone(),
                    run_id: positive(d.run_id),
                    instance_id: positive(d.instance_id),
                    task: non_empty(&d.task),
                    detail: d.detail.clone(),
                    text: d.text.clone(),
                })
                .collect(),
            run: e.run.as_ref().map(|run| RunRef {
                id: run.id,
                state: run_state(run.state),
                trigger: trigger_kind(run.trigger),
                logical_time: rfc3339(run.logical_time_ms),
            }),
            tasks: e
                .tasks
                .iter()
                .map(|t| TaskView {
                    task: t.task.clone(),
                    state: t.state.clone(),
                    instance_id: positive(t.instance_id),
                    attempt: (t.attempt > 0).then_some(t.attempt),
                    worker: non_empty(&t.worker_id),
                    reason: t.reason.clone(),
                    text: t.text.clone(),
                })
                .collect(),
        }
    }
}
