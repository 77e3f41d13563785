//! `axctl backfill WORKFLOW --from TIME --to TIME [--max N] [--dry-run]`
//!
//! Times are RFC 3339 (`2026-01-31T08:30:00+08:00`) or `YYYY-MM-DD[THH:MM[:SS]]` read in the
//! workflow's time zone (asked of the scheduler first). Both ends are inclusive, and a bare date
//! given as `--to` takes in that whole day.

use ax_proto::v1::{BackfillWorkflowRequest, BackfillWorkflowResponse, GetWorkflowRequest};
use serde::Serialize;

use crate::client::Ctx;
use crate::commands::get::{logical_bound, workflow_zone};
use crate::error::CtlError;
use crate::output::{self, Table, rfc3339, time};
use crate::view::{RunView, run_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cron workflow to backfill.
    pub name: String,
    /// The first logical time (inclusive).
    #[arg(long)]
    pub from: String,
    /// The last logical time (inclusive; a bare date, 2026-01-31, includes that whole day).
    #[arg(long)]
    pub to: String,
    /// Refuse when the range has more slots than this, at least 1 (capped by the scheduler's
    /// max_backfill_runs, 1000 by default; left out, that cap is the limit).
    #[arg(long)]
    pub max: Option<u32>,
    /// List the slots without creating runs.
    #[arg(long)]
    pub dry_run: bool,
    /// While the scheduler refuses the backfill for load (too many instances waiting), try
    /// again after growing, jittered waits that honour its hint, for at most this long (0 does
    /// not try again); then exit 8.
    #[arg(long, value_name = "DURATION", default_value = crate::overload::DEFAULT_RETRY_FOR, value_parser = crate::overload::parse_retry_for)]
    pub retry_for: std::time::Duration,
}

#[derive(Debug, Serialize)]
struct SlotView {
    logical_time: Option<String>,
    created: bool,
    run: Option<RunView>,
}

#[derive(Debug, Serialize)]
struct BackfillView {
    workflow: String,
    dry_run: bool,
    created: u32,
    existing: u32,
    slots: Vec<SlotView>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    if args.max == Some(0) {
        return Err(CtlError::usage(
            "--max 0: give at least 1, or leave --max out for the scheduler's max_backfill_runs",
        )
        .into());
    }
    let mut client = ctx.connect().await?;
    let st = |status| ctx.status(status);
    let workflow = client
        .get_workflow(GetWorkflowRequest {
            name: args.name.clone(),
        })
        .await
        .map_err(st)?
        .into_inner();
    let (tz, zone) = workflow_zone(&workflow)?;
    let instant = |flag: &str, text: &str| logical_bound(flag, text, tz, &zone);
    let from_ms = instant("from", &args.from)?;
    let to_ms = instant("to", &args.to)?;
    let request = BackfillWorkflowRequest {
        name: args.name.clone(),
        from_ms,
        to_ms,
        max_runs: args.max.unwrap_or(0),
        actor: ctx.actor.clone(),
        dry_run: args.dry_run,
    };
    let what = format!("backfill {}", output::escape(&args.name));
    let response = crate::overload::with_retries(&what, args.retry_for, || {
        let mut client = client.clone();
        let request = request.clone();
        async move { client.backfill_workflow(request).await }
    })
    .await
    .map_err(|err| err.into_error(ctx))?
    .into_inner();
    let view = BackfillView {
        workflow: args.name.clone(),
        dry_run: args.dry_run,
        created: response.created,
        existing: response.existing,
        slots: response
            .slots
            .iter()
            .map(|slot| SlotView {
                logical_time: rfc3339(slot.logical_time_ms),
                created: slot.created,
                run: slot.run.as_ref().map(RunView::from),
            })
            .collect(),
    };
    output::emit(ctx.output, &view, || table(&args, &response))
}

fn table(args: &Args, response: &BackfillWorkflowResponse) -> String {
    let mut table = Table::new(&["LOGICAL TIME", "RUN", "STATE", "NOTE"]);
    for slot in &response.slots {
        let (id, state) = match &slot.run {
            Some(run) => (run.id.to_string(), run_state(run.state)),
            None => ("-".into(), "-".into()),
        };
        let note = if args.dry_run && slot.run.is_some() {
            "has a run already"
        } else if args.dry_run {
            "would run"
        } else if slot.created {
            "created"
        } else {
            "already had a run"
        };
        table.row(vec![time(slot.logical_time_ms), id, state, note.into()]);
    }
    let mut out = table.render();
    if args.dry_run {
        out.push_str(&format!(
            "dry run: {} slots of {}, nothing created\n",
            response.slots.len(),
            args.name
        ));
    } else {
        out.push_str(&format!(
            "{} runs created, {} slots already had a run\n",
            response.created, response.existing
        ));
    }
    out
}
