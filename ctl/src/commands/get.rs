//! `axctl get workflows|workflow NAME|runs|run ID|instances --run ID|items INSTANCE|instance ID`

use std::num::NonZeroU64;

use ax_proto::v1 as pb;
use clap::Subcommand;

use crate::client::Ctx;
use crate::error::CtlError;
use crate::output::{self, Table, elapsed, fields, or_dash, time};
use crate::view::{
    InstanceView, RunDetailView, RunView, TaskStatusView, WorkflowView, instance_state, run_state,
    trigger_kind,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, Subcommand)]
pub enum What {
    /// All workflows.
    Workflows {
        /// Only the workflows of this app.
        #[arg(long)]
        app: Option<String>,
    },
    /// One workflow: schedule, tasks and their upstreams, next fire times.
    Workflow { name: String },
    /// Recent runs, newest first.
    Runs {
        #[arg(long)]
        workflow: Option<String>,
        /// Only runs in this state.
        #[arg(long, value_enum)]
        state: Option<StateFilter>,
        /// Only runs started this way.
        #[arg(long, value_enum)]
        trigger: Option<TriggerFilter>,
        /// Only runs whose logical time is at or after this: RFC 3339, or YYYY-MM-DD[THH:MM[:SS]]
        /// in the workflow's time zone (with --workflow; UTC without).
        #[arg(long, value_name = "TIME")]
        from: Option<String>,
        /// Only runs whose logical time is at or before this (a bare date takes in its whole
        /// day).
        #[arg(long, value_name = "TIME")]
        to: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One run and its instances.
    Run { id: i64 },
    /// The instances of a run.
    Instances {
        #[arg(long = "run", value_name = "RUN_ID")]
        run_id: i64,
    },
    /// One instance and the history of its attempts.
    Instance { id: i64 },
    /// The items of a mapped task (`for_each`), by index: give the task's instance id (the
    /// ID column of `axctl get run`).
    Items {
        /// The mapped task's instance, or with TASK, the run whose mapped task to list.
        #[arg(value_name = "INSTANCE_ID")]
        instance: i64,
        /// A mapped task of run INSTANCE_ID (`axctl get items 12 copy`).
        task: Option<String>,
        /// Only items in this state (waiting, running, success, failed, timeout, cancelled...).
        #[arg(long)]
        state: Option<String>,
        /// Start at this item index (0-based).
        #[arg(long, default_value_t = 0)]
        from: u32,
        /// At most this many items (at most 1,000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StateFilter {
    Running,
    Success,
    Failed,
    Cancelled,
    Queued,
}

impl From<StateFilter> for pb::RunState {
    fn from(s: StateFilter) -> Self {
        match s {
            StateFilter::Running => pb::RunState::Running,
            StateFilter::Success => pb::RunState::Success,
            StateFilter::Failed => pb::RunState::Failed,
            StateFilter::Cancelled => pb::RunState::Cancelled,
            StateFilter::Queued => pb::RunState::Queued,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TriggerFilter {
    Cron,
    Manual,
    Api,
    Dependency,
    Backfill,
    Parent,
}

impl From<TriggerFilter> for pb::TriggerKind {
    fn from(t: TriggerFilter) -> Self {
        match t {
            TriggerFilter::Cron => pb::TriggerKind::Cron,
            TriggerFilter::Manual => pb::TriggerKind::Manual,
            TriggerFilter::Api => pb::TriggerKind::Api,
            TriggerFilter::Dependency => pb::TriggerKind::Dependency,
            TriggerFilter::Backfill => pb::TriggerKind::Backfill,
            TriggerFilter::Parent => pb::TriggerKind::Parent,
        }
    }
}

/// The zone a workflow's bare times are read in: its schedule's, UTC when it has none.
pub(crate) fn workflow_zone(workflow: &pb::Workflow) -> Result<(chrono_tz::Tz, String), CtlError> {
    let zone = workflow
        .schedule
        .as_ref()
        .map(|s| s.timezone.as_str())
        .filter(|tz| !tz.is_empty())
        .unwrap_or("UTC");
    let tz = zone
        .parse()
        .map_err(|_| CtlError::usage(format!("workflow time zone {zone:?} is unknown here")))?;
    Ok((tz, zone.to_string()))
}

/// A `--from`/`--to` time in ms: RFC 3339, or a bare time read in `tz` (named `zone`); a bare
/// `--to` date takes in its whole day.
pub(crate) fn logical_bound(
    flag: &str,
    text: &str,
    tz: chrono_tz::Tz,
    zone: &str,
) -> Result<i64, CtlError> {
    let parsed = if flag == "to" {
        ax_core::spec::parse_range_end(text, tz)
    } else {
        ax_core::spec::parse_instant(text, tz)
    };
    parsed.ok_or_else(|| {
        CtlError::usage(format!(
            "--{flag} {text:?}: expected RFC 3339 (2026-01-31T08:30:00+08:00) or \
             YYYY-MM-DD[THH:MM[:SS]] in {zone}"
        ))
    })
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let st = |status| ctx.status(status);
    match args.what {
        What::Workflows { app } => {
            let request = pb::ListWorkflowsRequest {
                app: app.unwrap_or_default(),
                ..Default::default()
            };
            let list = client
                .list_workflows(request)
                .await
                .map_err(st)?
                .into_inner();
            let views: Vec<WorkflowView> = list.workflows.iter().map(WorkflowView::from).collect();
            output::emit(ctx.output, &views, || workflows_table(&list.workflows))
        }
        What::Workflow { name } => {
            let request = pb::GetWorkflowRequest { name };
            let workflow = client.get_workflow(request).await.map_err(st)?.into_inner();
            output::emit(ctx.output, &WorkflowView::from(&workflow), || {
                workflow_detail(&workflow)
            })
        }
        What::Runs {
            workflow,
            state,
            trigger,
            from,
            to,
            limit,
        } => {
            // Bare times are in the workflow's zone, as its schedule and backfills read them;
            // across workflows, in UTC.
            let (tz, zone) = match (&workflow, from.is_some() || to.is_some()) {
                (Some(name), true) => {
                    let request = pb::GetWorkflowRequest { name: name.clone() };
                    workflow_zone(&client.get_workflow(request).await.map_err(st)?.into_inner())?
                }
                _ => (chrono_tz::UTC, "UTC".to_string()),
            };
            let bound = |flag: &str, text: &Option<String>| match text {
                Some(text) => logical_bound(flag, text, tz, &zone),
                None => Ok(0),
            };
            let request = pb::ListRunsRequest {
                logical_from_ms: bound("from", &from)?,
                logical_to_ms: bound("to", &to)?,
                workflow: workflow.unwrap_or_default(),
                limit,
                state: state.map_or(0, |s| pb::RunState::from(s) as i32),
                trigger: trigger.map_or(0, |t| pb::TriggerKind::from(t) as i32),
                ..Default::default()
            };
            let list = client.list_runs(request).await.map_err(st)?.into_inner();
            let views: Vec<RunView> = list.runs.iter().map(RunView::from).collect();
            output::emit(ctx.output, &views, || runs_table(&list.runs))
        }
        What::Run { id } => {
            let run = client
                .get_run(pb::GetRunRequest { id })
                .await
                .map_err(st)?
                .into_inner();
            let request = pb::ListInstancesRequest {
                run_id: id,
                group_items: true,
                ..Default::default()
            };
            let instances = client
                .list_instances(request)
                .await
                .map_err(st)?
                .into_inner();
            let view = RunDetailView {
                run: RunView::from(&run),
                instances: instances.instances.iter().map(InstanceView::from).collect(),
                tasks: instances.tasks.iter().map(TaskStatusView::from).collect(),
            };
            output::emit(ctx.output, &view, || {
                format!(
                    "{}\n{}",
                    run_detail(&run),
                    run_tasks_table(&instances.instances, &instances.tasks)
                )
            })
        }
        What::Instances { run_id } => {
            let request = pb::ListInstancesRequest {
                run_id,
                attempts: false,
                ..Default::default()
            };
            let list = client
                .list_instances(request)
                .await
                .map_err(st)?
                .into_inner();
            let views: Vec<InstanceView> = list.instances.iter().map(InstanceView::from).collect();
            output::emit(ctx.output, &views, || instances_table(&list.instances))
        }
        What::Items {
            instance,
            task,
            state,
            from,
            limit,
        } => {
            let instance = match &task {
                None => instance,
                Some(task) => {
                    crate::lookup::task_instance(ctx, &mut client, instance, task).await?
                }
            };
            let state = match state.as_deref() {
                None => pb::InstanceState::Unspecified,
                Some(name) => {
                    let full = format!("INSTANCE_STATE_{}", name.to_ascii_uppercase());
                    pb::InstanceState::from_str_name(&full).ok_or_else(|| {
                        CtlError::usage(format!(
                            "--state {name:?} is not an instance state (waiting, dispatched, \
                             running, success, failed, timeout, cancelled, skipped, upstream_failed)"
                        ))
                    })?
                }
            };
            let parent = client
                .get_instance(pb::GetInstanceRequest { id: instance })
                .await
                .map_err(st)?
                .into_inner();
            let request = pb::ListInstancesRequest {
                run_id: parent.run_id,
                items_of: instance,
                items_from: from,
                limit,
                state: state as i32,
                ..Default::default()
            };
            let page = client
                .list_instances(request)
                .await
                .map_err(st)?
                .into_inner();
            let views: Vec<InstanceView> = page.instances.iter().map(InstanceView::from).collect();
            output::emit(ctx.output, &views, || {
                items_table(&page.instances, page.next_items_from, instance)
            })
        }
        What::Instance { id } => {
            let request = pb::GetInstanceRequest { id };
            let instance = client.get_instance(request).await.map_err(st)?.into_inner();
            output::emit(ctx.output, &InstanceView::from(&instance), || {
                instance_detail(&instance)
            })
        }
    }
}

fn schedule_text(schedule: Option<&pb::Schedule>) -> String {
    match schedule {
        Some(s) if !s.cron.is_empty() => {
            let tz = if s.timezone.is_empty() {
                "UTC"
            } else {
                &s.timezone
            };
            format!("{} ({tz})", s.cron)
        }
        Some(s) => trigger_kind(s.trigger),
        None => "-".into(),
    }
}

pub fn workflows_table(workflows: &[pb::Workflow]) -> String {
    let mut table = Table::new(&[
        "NAME",
        "APP",
        "VERSION",
        "SCHEDULE",
        "PAUSED",
        "TASKS",
        "NEXT FIRE",
    ]);
    for w in workflows {
        table.row(vec![
            w.name.clone(),
            or_dash(&w.app),
            w.version.to_string(),
            schedule_text(w.schedule.as_ref()),
            if w.paused { "yes" } else { "no" }.into(),
            w.tasks.len().to_string(),
            w.next_fires_ms.first().map_or("-".into(), |ms| time(*ms)),
        ]);
    }
    table.render()
}

pub fn workflow_detail(w: &pb::Workflow) -> String {
    let (trigger, cron, tz) = match &w.schedule {
        Some(s) => (
            trigger_kind(s.trigger),
            or_dash(&s.cron),
            if s.timezone.is_empty() {
                "UTC".into()
            } else {
                s.timezone.clone()
            },
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    let mut out = fields(&[
        ("Name", w.name.clone()),
        ("App", or_dash(&w.app)),
        ("Owner", or_dash(&w.owner)),
        ("Description", or_dash(&w.description)),
        ("Version", w.version.to_string()),
        ("Trigger", trigger),
        ("Schedule", cron),
        ("Time zone", tz),
        ("Paused", if w.paused { "yes" } else { "no" }.into()),
        ("Policies", policies(w)),
        ("Updated", time(w.updated_at_ms)),
    ]);
    out.push('\n');
    if !w.params.is_empty() {
        out.push_str(&params_table(&w.params));
        out.push('\n');
    }
    let mut tasks = Table::new(&["TASK", "UPSTREAM", "RETRIES", "TIMEOUT", "COMMAND"]);
    for t in &w.tasks {
        let command = if t.argv.is_empty() {
            // A table row is one line: a script shows its first line (`-o yaml` has it all).
            first_line(&t.command)
        } else {
            t.argv.join(" ")
        };
        tasks.row(vec![
            t.name.clone(),
            if t.upstream.is_empty() {
                "-".into()
            } else {
                t.upstream.join(",")
            },
            t.retries.to_string(),
            // The wire's 0 is no timeout.
            NonZeroU64::new(t.timeout_ms).map_or("-".into(), |timeout| {
                ax_core::humane_duration(timeout.get() as i64)
            }),
            command,
        ]);
    }
    out.push_str(&tasks.render());
    if !w.next_fires_ms.is_empty() {
        let zone = w
            .schedule
            .as_ref()
            .and_then(|s| s.timezone.parse::<chrono_tz::Tz>().ok())
            .filter(|_| !crate::output::utc())
            .unwrap_or(chrono_tz::UTC);
        out.push_str("\nNext fires:\n");
        for ms in w.next_fires_ms.iter().take(5) {
            let in_zone = chrono::DateTime::from_timestamp_millis(*ms)
                .map(|t| {
                    t.with_timezone(&zone)
                        .format("%Y-%m-%d %H:%M:%S %Z")
                        .to_string()
                })
                .unwrap_or_else(|| "-".into());
            out.push_str(&format!("  {in_zone}  ({} local)\n", time(*ms)));
        }
    }
    out
}

/// A text's first line, with ` …` when more follow: a table row is one line.
fn first_line(text: &str) -> String {
    let mut lines = text.trim().lines();
    let first = lines.next().unwrap_or_default().to_string();
    if lines.next().is_some() {
        format!("{first} …")
    } else {
        first
    }
}

/// The params a workflow declares, in file order: a default or a choice as it is, quoted when it
/// would read as nothing (`""`, `"-"`), `-` for no default and for any value.
fn params_table(params: &[pb::WorkflowParam]) -> String {
    fn value(text: &str) -> String {
        if text.is_empty() || text == "-" || text.trim() != text {
            format!("{text:?}")
        } else {
            text.to_string()
        }
    }
    let mut table = Table::new(&["PARAM", "DEFAULT", "REQUIRED", "CHOICES", "DESCRIPTION"]);
    for p in params {
        table.row(vec![
            p.name.clone(),
            if p.has_default {
                value(&p.default_value)
            } else {
                "-".into()
            },
            if p.required { "yes" } else { "no" }.into(),
            if p.choices.is_empty() {
                "-".into()
            } else {
                p.choices
                    .iter()
                    .map(|c| value(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            or_dash(&first_line(&p.description)),
        ]);
    }
    table.render()
}

/// `misfire fire_once, overlap queue, max active runs 2, window 2026-01-01 .. -, key ${customer} ≤ 1`
fn policies(w: &pb::Workflow) -> String {
    let Some(s) = &w.schedule else {
        return "-".into();
    };
    let misfire = match s.misfire.as_str() {
        "" => "fire_once".to_string(),
        "catch_up" => format!("catch_up {}", s.max_catch_up),
        other => other.to_string(),
    };
    let overlap = if s.overlap.is_empty() {
        "allow"
    } else {
        &s.overlap
    };
    let mut text = format!("misfire {misfire}, overlap {overlap}");
    if s.max_active_runs > 0 {
        text.push_str(&format!(", max active runs {}", s.max_active_runs));
    }
    if s.start_at_ms != 0 || s.end_at_ms != 0 {
        let edge = |ms: i64| if ms == 0 { "-".to_string() } else { time(ms) };
        text.push_str(&format!(
            ", window {} .. {}",
            edge(s.start_at_ms),
            edge(s.end_at_ms)
        ));
    }
    if let Some(c) = &w.concurrency
        && !c.key.is_empty()
    {
        text.push_str(&format!(
            ", key {} max {} per key",
            c.key, c.max_runs_per_key
        ));
    }
    text
}

/// `3/5 success, 1 failed, 1 running`: what a person scanning a list of runs wants to see.
fn progress(run: &pb::Run) -> String {
    let Some(c) = run.counts else {
        return "-".into();
    };
    let total = c.waiting
        + c.dispatched
        + c.running
        + c.success
        + c.failed
        + c.timeout
        + c.cancelled
        + c.skipped
        + c.upstream_failed
        + c.not_created;
    let mut text = format!("{}/{total} success", c.success);
    for (n, label) in [
        (c.failed + c.timeout, "failed"),
        (c.dispatched + c.running, "running"),
        (c.cancelled, "cancelled"),
        (c.skipped, "skipped"),
        (c.upstream_failed, "upstream failed"),
    ] {
        if n > 0 {
            text.push_str(&format!(", {n} {label}"));
        }
    }
    text
}

pub fn runs_table(runs: &[pb::Run]) -> String {
    let mut table = Table::new(&[
        "ID", "WORKFLOW", "VERSION", "STATE", "TRIGGER", "TASKS", "CREATED", "DURATION", "BY",
    ]);
    for r in runs {
        table.row(vec![
            r.id.to_string(),
            r.workflow.clone(),
            r.workflow_version.to_string(),
            run_state(r.state),
            trigger_kind(r.trigger),
            progress(r),
            time(r.created_at_ms),
            elapsed(r.created_at_ms, r.finished_at_ms),
            or_dash(&r.triggered_by),
        ]);
    }
    table.render()
}

fn run_detail(r: &pb::Run) -> String {
    let mut params: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    params.sort();
    fields(&[
        ("Run", r.id.to_string()),
        (
            "Workflow",
            format!("{} (version {})", r.workflow, r.workflow_version),
        ),
        ("State", run_state(r.state)),
        ("Trigger", trigger_kind(r.trigger)),
        ("Triggered by", or_dash(&r.triggered_by)),
        ("Logical time", time(r.logical_time_ms)),
        ("Idempotency key", or_dash(&r.idempotency_key)),
        ("Params", or_dash(&params.join(" "))),
        ("Created", time(r.created_at_ms)),
        ("Finished", time(r.finished_at_ms)),
        ("Duration", elapsed(r.created_at_ms, r.finished_at_ms)),
        ("Deadline", deadline(r)),
        ("Parent", crate::links::parent(r)),
        ("Children", crate::links::children(r)),
        ("Tasks", progress(r)),
    ])
}

/// `-` without a deadline; its time, and when it was missed.
fn deadline(r: &pb::Run) -> String {
    match (r.deadline_at_ms, r.deadline_missed_at_ms) {
        (0, _) => "-".into(),
        (at, 0) => time(at),
        (at, missed) => format!("{} (missed, judged {})", time(at), time(missed)),
    }
}

fn exit_text(code: Option<i32>) -> String {
    code.map_or("-".into(), |c| c.to_string())
}

/// A shard of a sharded broadcast task shows its index: `collect [shard 2/3]` (1-based); an
/// item of a mapped task its index and element: `copy [item 3/10: b.csv]`.
pub fn task_label(i: &pb::Instance) -> String {
    if let Some(item) = &i.item {
        format!(
            "{} [item {}/{}: {}]",
            i.task,
            i.shard_index + 1,
            i.shard_total,
            short(item, 40)
        )
    } else if i.shard_total > 0 {
        format!("{} [shard {}/{}]", i.task, i.shard_index + 1, i.shard_total)
    } else {
        i.task.clone()
    }
}

pub fn instances_table(instances: &[pb::Instance]) -> String {
    let mut table = Table::new(&[
        "ID", "TASK", "STATE", "ATTEMPT", "WORKER", "EXIT", "STARTED", "DURATION",
    ]);
    for i in instances {
        table.row(vec![
            i.id.to_string(),
            task_label(i),
            instance_state(i.state),
            i.attempt.to_string(),
            or_dash(&i.worker_id),
            exit_text(i.exit_code),
            time(i.started_at_ms),
            elapsed(i.started_at_ms, i.finished_at_ms),
        ]);
    }
    table.render()
}

/// The run's instances, then a row for each task without one (or with a PENDING one), in the
/// STATE column: `UPSTREAM_FAILED` below a failure, `PENDING` while its upstreams are going.
pub fn run_tasks_table(instances: &[pb::Instance], tasks: &[pb::TaskStatus]) -> String {
    let mut table = Table::new(&[
        "ID", "TASK", "STATE", "ATTEMPT", "WORKER", "EXIT", "STARTED", "DURATION",
    ]);
    let shown_by_status: std::collections::HashMap<&str, &str> = tasks
        .iter()
        .filter(|t| matches!(t.status.as_str(), "pending" | "upstream_failed"))
        .map(|t| (t.task.as_str(), t.status.as_str()))
        .collect();
    for i in instances {
        let state = match shown_by_status.get(i.task.as_str()) {
            // A PENDING instance below a failure will not run again: say why.
            Some(&"upstream_failed") => "UPSTREAM_FAILED".to_string(),
            _ => instance_state(i.state),
        };
        table.row(vec![
            i.id.to_string(),
            task_label(i),
            state,
            i.attempt.to_string(),
            or_dash(&i.worker_id),
            exit_text(i.exit_code),
            time(i.started_at_ms),
            elapsed(i.started_at_ms, i.finished_at_ms),
        ]);
    }
    let mapped: Vec<(&pb::TaskStatus, &pb::ItemCounts)> = tasks
        .iter()
        .filter_map(|t| t.items.as_ref().map(|items| (t, items)))
        .collect();
    for t in tasks.iter().filter(|t| t.instance_id == 0) {
        table.row(vec![
            "-".into(),
            t.task.clone(),
            t.status.to_uppercase(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    let mut out = table.render();
    for (t, items) in mapped {
        out.push_str(&items_summary(t, items));
    }
    out
}

/// A mapped task's items in a few lines: counts by state, the first failures, and the command
/// that lists them.
fn items_summary(t: &pb::TaskStatus, items: &pb::ItemCounts) -> String {
    let mut states: Vec<(&String, &u32)> = items.states.iter().collect();
    states.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
    let counts: Vec<String> = states
        .iter()
        .map(|(state, n)| format!("{n} {}", state.to_lowercase()))
        .collect();
    let mut out = format!(
        "\nItems of {}: {} ({})\n",
        t.task,
        items.total,
        counts.join(", ")
    );
    for failed in &items.first_failures {
        out.push_str(&format!(
            "  {} item {} {:?}: instance {}, exit {}, worker {}\n",
            instance_state(failed.state),
            failed.shard_index,
            short(failed.item.as_deref().unwrap_or(""), 40),
            failed.id,
            exit_text(failed.exit_code),
            or_dash(&failed.worker_id),
        ));
    }
    out.push_str(&format!(
        "  axctl get items {}  lists them\n",
        t.instance_id
    ));
    out
}

/// A page of items, and how to read the next one.
fn items_table(items: &[pb::Instance], next_from: u32, parent: i64) -> String {
    let mut table = Table::new(&[
        "ID", "INDEX", "ITEM", "STATE", "ATTEMPT", "WORKER", "EXIT", "STARTED", "DURATION",
    ]);
    for i in items {
        table.row(vec![
            i.id.to_string(),
            i.shard_index.to_string(),
            short(i.item.as_deref().unwrap_or(""), 40),
            instance_state(i.state),
            i.attempt.to_string(),
            or_dash(&i.worker_id),
            exit_text(i.exit_code),
            time(i.started_at_ms),
            elapsed(i.started_at_ms, i.finished_at_ms),
        ]);
    }
    let mut out = table.render();
    if next_from > 0 {
        out.push_str(&format!(
            "more: axctl get items {parent} --from {next_from}\n"
        ));
    }
    out
}

/// At most `max` characters of an item, with `…` when it is cut.
fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max - 1).collect();
        format!("{cut}…")
    }
}

fn instance_detail(i: &pb::Instance) -> String {
    let mut out = fields(&[
        ("Instance", i.id.to_string()),
        ("Run", i.run_id.to_string()),
        ("Workflow", i.workflow.clone()),
        ("Task", task_label(i)),
        ("State", instance_state(i.state)),
        ("Attempt", i.attempt.to_string()),
        ("Worker", or_dash(&i.worker_id)),
        ("Priority", i.priority.to_string()),
        ("Exit code", exit_text(i.exit_code)),
        ("Created", time(i.created_at_ms)),
        ("Started", time(i.started_at_ms)),
        ("Finished", time(i.finished_at_ms)),
        ("Duration", elapsed(i.started_at_ms, i.finished_at_ms)),
    ]);
    out.push('\n');
    let mut table = Table::new(&[
        "ATTEMPT", "STATE", "WORKER", "PID", "STARTED", "DURATION", "EXIT", "SIGNAL", "LINES",
        "MESSAGE",
    ]);
    for a in &i.attempts {
        table.row(vec![
            a.attempt.to_string(),
            instance_state(a.state),
            crate::links::worker_or_child(a),
            if a.pid == 0 {
                "-".into()
            } else {
                a.pid.to_string()
            },
            time(a.started_at_ms),
            elapsed(a.started_at_ms, a.finished_at_ms),
            exit_text(a.exit_code),
            exit_text(a.signal),
            a.log_lines.to_string(),
            or_dash(&a.message),
        ]);
    }
    out.push_str(&table.render());
    // The outputs of the attempt that succeeded: what the tasks below it were given.
    if let Some(done) = i.attempts.iter().rev().find(|a| !a.outputs.is_empty()) {
        out.push_str(&format!("\nOutputs (attempt {}):\n", done.attempt));
        let mut outputs: Vec<(&String, &String)> = done.outputs.iter().collect();
        outputs.sort();
        for (key, value) in outputs {
            out.push_str(&format!("  {key}={value}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_shows_its_deadline_and_whether_it_was_missed() {
        let mut run = pb::Run::default();
        assert_eq!(deadline(&run), "-");
        run.deadline_at_ms = 1_767_225_600_000;
        assert_eq!(deadline(&run), time(1_767_225_600_000));
        run.deadline_missed_at_ms = 1_767_225_601_000;
        assert_eq!(
            deadline(&run),
            format!(
                "{} (missed, judged {})",
                time(1_767_225_600_000),
                time(1_767_225_601_000)
            )
        );
        assert!(run_detail(&run).contains("(missed, judged "));
        let view = crate::view::RunView::from(&run);
        assert!(view.deadline_missed_at.is_some());
        // A run without a deadline keeps its JSON as it was.
        let plain = serde_json::to_string(&crate::view::RunView::from(&pb::Run::default()));
        assert!(!plain.unwrap().contains("deadline"));
    }

    #[test]
    fn a_mapped_task_shows_its_items_as_counts_and_first_failures() {
        let parent = pb::Instance {
            id: 21,
            task: "copy".into(),
            state: pb::InstanceState::Failed as i32,
            attempt: 1,
            shard_total: 3,
            ..Default::default()
        };
        let failed = pb::Instance {
            id: 24,
            task: "copy".into(),
            state: pb::InstanceState::Failed as i32,
            exit_code: Some(3),
            worker_id: "w1".into(),
            shard_parent_id: 21,
            shard_index: 2,
            shard_total: 3,
            item: Some("broken.csv".into()),
            ..Default::default()
        };
        let status = pb::TaskStatus {
            task: "copy".into(),
            status: "failed".into(),
            instance_id: 21,
            attempt: 1,
            items: Some(pb::ItemCounts {
                total: 3,
                states: [("SUCCESS".to_string(), 2), ("FAILED".to_string(), 1)].into(),
                first_failures: vec![failed.clone()],
            }),
        };
        let table = run_tasks_table(&[parent], &[status]);
        assert!(
            table.contains("Items of copy: 3 (2 success, 1 failed)"),
            "{table}"
        );
        assert!(
            table.contains("FAILED item 2 \"broken.csv\": instance 24, exit 3, worker w1"),
            "{table}"
        );
        assert!(table.contains("axctl get items 21"), "{table}");
        assert_eq!(task_label(&failed), "copy [item 3/3: broken.csv]");
        let page = items_table(&[failed], 3, 21);
        assert!(page.contains("broken.csv"), "{page}");
        assert!(page.contains("more: axctl get items 21 --from 3"), "{page}");
        assert_eq!(short(&"x".repeat(50), 10), format!("{}…", "x".repeat(9)));
    }

    #[test]
    fn a_workflow_shows_its_declared_params_and_their_json() {
        let param = |name: &str, default: Option<&str>, required: bool, choices: &[&str]| {
            pb::WorkflowParam {
                name: name.into(),
                description: String::new(),
                default_value: default.unwrap_or_default().into(),
                has_default: default.is_some(),
                required,
                choices: choices.iter().map(|c| c.to_string()).collect(),
            }
        };
        let mut region = param("region", Some("eu"), false, &[]);
        region.description = "Where the data lives\nsecond line".into();
        let w = pb::Workflow {
            name: "declared".into(),
            params: vec![
                region,
                param("env", None, true, &["staging", "prod"]),
                param("blank", Some(""), false, &[]),
                param("note", None, false, &[]),
            ],
            ..Default::default()
        };
        let text = workflow_detail(&w);
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("PARAM"))
            .take(5)
            .collect();
        assert_eq!(
            rows,
            [
                "PARAM    DEFAULT   REQUIRED   CHOICES         DESCRIPTION",
                "region   eu        no         -               Where the data lives …",
                "env      -         yes        staging, prod   -",
                "blank    \"\"        no         -               -",
                "note     -         no         -               -",
            ],
            "{text}"
        );
        let json = serde_json::to_value(crate::view::WorkflowView::from(&w)).unwrap();
        assert_eq!(json["params"][0]["default"], "eu");
        assert_eq!(json["params"][1]["default"], serde_json::Value::Null);
        assert_eq!(json["params"][1]["choices"][1], "prod");
        assert_eq!(json["params"][2]["default"], "");
        assert_eq!(json["params"][3]["required"], false);
        // A workflow that declares none shows no table and keeps its JSON as it was.
        let plain = pb::Workflow::default();
        assert!(!workflow_detail(&plain).contains("PARAM"));
        let json = serde_json::to_string(&crate::view::WorkflowView::from(&plain)).unwrap();
        assert!(!json.contains("params"), "{json}");
    }
}
