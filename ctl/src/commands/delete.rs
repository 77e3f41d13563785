//! `axctl delete workflow NAME [--cancel-runs]`

use ax_proto::v1::DeleteWorkflowRequest;
use serde::Serialize;

use crate::client::Ctx;
use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Delete a workflow: its schedule stops, its name can be applied again (as a new
    /// workflow), its runs are kept as history until retention purges them. Refused while it
    /// has running or queued runs, unless --cancel-runs.
    Workflow {
        /// The workflow to delete.
        name: String,
        /// Cancel its running and queued runs first (killing their tasks), then delete it.
        #[arg(long)]
        cancel_runs: bool,
    },
}

#[derive(Debug, Serialize)]
struct DeletedView {
    workflow: String,
    app: String,
    version: u32,
    cancelled_runs: Vec<i64>,
    warnings: Vec<String>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let What::Workflow { name, cancel_runs } = args.what;
    let mut client = ctx.connect().await?;
    let response = client
        .delete_workflow(DeleteWorkflowRequest {
            name,
            actor: ctx.actor.clone(),
            cancel_runs,
        })
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    for warning in &response.warnings {
        eprintln!("warning: {}", output::escape(warning));
    }
    let gone = response.workflow.unwrap_or_default();
    let view = DeletedView {
        workflow: gone.name,
        app: gone.app,
        version: gone.version,
        cancelled_runs: response.cancelled_runs,
        warnings: response.warnings,
    };
    output::emit(ctx.output, &view, || {
        let mut text = String::new();
        for run in &view.cancelled_runs {
            text.push_str(&format!("run {run} cancelled\n"));
        }
        text.push_str(&format!(
            "workflow {} deleted (version {}); its runs are kept\n",
            view.workflow, view.version
        ));
        text
    })
}
