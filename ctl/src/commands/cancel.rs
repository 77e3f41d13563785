//! `axctl cancel run ID` and `axctl cancel instance ID`

use ax_proto::v1::{CancelInstanceRequest, CancelRunRequest};
use clap::Subcommand;

use crate::client::Ctx;
use crate::output;
use crate::view::{InstanceView, RunView, instance_state, run_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, Subcommand)]
pub enum What {
    /// Cancel every unfinished instance of a run.
    Run {
        id: i64,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel one instance (its running attempt is killed).
    Instance {
        id: i64,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    match args.what {
        What::Run { id, reason } => {
            let request = CancelRunRequest {
                id,
                actor: ctx.actor.clone(),
                reason: reason.unwrap_or_default(),
            };
            let run = client
                .cancel_run(request)
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &RunView::from(&run), || {
                format!("run {} {}\n", run.id, run_state(run.state))
            })
        }
        What::Instance { id, reason } => {
            let request = CancelInstanceRequest {
                id,
                actor: ctx.actor.clone(),
                reason: reason.unwrap_or_default(),
            };
            let instance = client
                .cancel_instance(request)
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &InstanceView::from(&instance), || {
                format!(
                    "instance {} {}\n",
                    instance.id,
                    instance_state(instance.state)
                )
            })
        }
    }
}
