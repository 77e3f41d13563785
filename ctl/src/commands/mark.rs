//! `axctl mark INSTANCE --success|--failed --reason TEXT` (or `axctl mark RUN TASK ...`): a
//! person's verdict on an instance, set without running it. A running attempt is killed; what
//! depends on the task follows its trigger rules; an ended run reopens until nothing is left.

use ax_proto::v1::{InstanceState, MarkInstanceRequest};

use crate::client::Ctx;
use crate::lookup;
use crate::output;
use crate::view::{InstanceView, instance_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The instance to mark, or with TASK, the run whose task to mark.
    pub id: i64,
    /// A task of run ID: its instance is marked (`axctl mark 12 load --success --reason ...`).
    pub task: Option<String>,
    /// Mark it SUCCESS: what depends on it runs, and it never runs again unless rerun.
    #[arg(long, required_unless_present = "failed", conflicts_with = "failed")]
    pub success: bool,
    /// Mark it FAILED: a running attempt is killed and not retried; what needs it does not run.
    #[arg(long)]
    pub failed: bool,
    /// Why the outcome is overridden (required; kept in the audit trail).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let id = match &args.task {
        None => args.id,
        Some(task) => lookup::task_instance(ctx, &mut client, args.id, task).await?,
    };
    let state = if args.success {
        InstanceState::Success
    } else {
        InstanceState::Failed
    };
    let request = MarkInstanceRequest {
        id,
        state: state.into(),
        reason: args.reason,
        actor: ctx.actor.clone(),
    };
    let instance = client
        .mark_instance(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    output::emit(ctx.output, &InstanceView::from(&instance), || {
        format!(
            "instance {} {} (attempt {})\n",
            instance.id,
            instance_state(instance.state),
            instance.attempt
        )
    })
}
