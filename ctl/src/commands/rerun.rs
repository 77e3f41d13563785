//! `axctl rerun RUN --failed` / `axctl rerun RUN --from TASK`: new attempts for the failed part
//! of a run, or for one task and everything below it.

use ax_proto::v1::RerunRunRequest;

use crate::client::Ctx;
use crate::output;
use crate::view::{RunView, run_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run to rerun part of.
    pub id: i64,
    /// Retry every FAILED, TIMEOUT and CANCELLED instance; their downstream follows.
    #[arg(long, required_unless_present = "from", conflicts_with = "from")]
    pub failed: bool,
    /// Run this task and everything below it (transitively) again as new attempts; the earlier
    /// attempts keep their records.
    #[arg(long, value_name = "TASK")]
    pub from: Option<String>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = RerunRunRequest {
        id: args.id,
        failed: args.failed,
        actor: ctx.actor.clone(),
        from_task: args.from.unwrap_or_default(),
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
