//! `axctl pause NAME`

use ax_proto::v1::PauseWorkflowRequest;

use crate::client::Ctx;
use crate::output;
use crate::view::WorkflowView;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The workflow whose schedule to pause.
    pub name: String,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = PauseWorkflowRequest {
        name: args.name,
        actor: ctx.actor.clone(),
    };
    let workflow = client
        .pause_workflow(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    output::emit(ctx.output, &WorkflowView::from(&workflow), || {
        format!("workflow {} paused\n", workflow.name)
    })
}
