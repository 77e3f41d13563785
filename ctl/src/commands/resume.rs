//! `axctl resume NAME`

use ax_proto::v1::ResumeWorkflowRequest;

use crate::client::Ctx;
use crate::output;
use crate::view::WorkflowView;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The paused workflow whose schedule to resume.
    pub name: String,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = ResumeWorkflowRequest {
        name: args.name,
        actor: ctx.actor.clone(),
    };
    let workflow = client
        .resume_workflow(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    output::emit(ctx.output, &WorkflowView::from(&workflow), || {
        format!("workflow {} resumed\n", workflow.name)
    })
}
