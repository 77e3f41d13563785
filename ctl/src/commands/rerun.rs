//! `axctl rerun RUN --failed`: new attempts for the failed part of a run.

use ax_proto::v1::RerunRunRequest;

use crate::client::Ctx;
use crate::output;
use crate::view::{RunView, run_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run to rerun part of.
    pub id: i64,
    /// Retry every FAILED, TIMEOUT and CANCELLED instance; their downstream follows.
    #[arg(long, required = true)]
    pub failed: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = RerunRunRequest {
        id: args.id,
        failed: args.failed,
        actor: ctx.actor.clone(),
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
