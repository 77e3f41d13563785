//! `axctl wait RUN`: waits for a run to end, with its progress on stderr; the exit code is its
//! outcome (0, 10 failed, 11 cancelled), as `axctl trigger --wait` ends.

use ax_proto::v1::GetRunRequest;

use crate::client::Ctx;
use crate::error::Exit;
use crate::output;
use crate::view::RunView;
use crate::wait;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run to wait for.
    pub id: i64,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<Exit> {
    let mut client = ctx.connect().await?;
    // A run that does not exist is named at once, not waited for.
    client
        .get_run(GetRunRequest { id: args.id })
        .await
        .map_err(|status| ctx.status(status))?;
    let run = wait::wait_for_run(ctx, &mut client, args.id).await?;
    output::emit(ctx.output, &RunView::from(&run), || {
        super::get::runs_table(std::slice::from_ref(&run))
    })?;
    Ok(wait::exit_for(run.state))
}
