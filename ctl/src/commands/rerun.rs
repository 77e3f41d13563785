//! `axctl rerun RUN --failed` / `axctl rerun RUN --from TASK` / `axctl rerun RUN --task A --task
//! B`: new attempts for the failed part of a run, for one task and everything below it, or for a
//! selection of tasks and everything below each.

use ax_proto::v1::RerunRunRequest;

use crate::client::Ctx;
use crate::output;
use crate::view::{RunView, run_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run to rerun part of.
    pub id: i64,
    /// Retry every FAILED, TIMEOUT and CANCELLED instance; their downstream follows.
    #[arg(long, required_unless_present_any = ["from", "tasks"], conflicts_with_all = ["from", "tasks"])]
    pub failed: bool,
    /// Run this task and everything below it (transitively) again as new attempts; the earlier
    /// attempts keep their records.
    #[arg(long, value_name = "TASK", conflicts_with = "tasks")]
    pub from: Option<String>,
    /// Run exactly these tasks (repeat --task, or separate with commas) and everything below
    /// each again, like Airflow's "clear with downstream".
    #[arg(long = "task", value_name = "TASK", value_delimiter = ',')]
    pub tasks: Vec<String>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = RerunRunRequest {
        id: args.id,
        failed: args.failed,
        actor: ctx.actor.clone(),
        from_task: args.from.unwrap_or_default(),
        tasks: args.tasks,
    };
    let run = client
        .rerun_run(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    output::emit(ctx.output, &RunView::from(&run), || {
        format!("run {} {}\n", run.id, run_state(run.state))
    })
}
