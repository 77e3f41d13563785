//! `axctl retry INSTANCE` or `axctl retry RUN TASK`: another attempt of a failed, timed-out or
//! cancelled instance.

use ax_proto::v1::RetryInstanceRequest;

use crate::client::Ctx;
use crate::lookup;
use crate::output;
use crate::view::{InstanceView, instance_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The instance to retry (its earlier attempts keep their records and logs), or with TASK,
    /// the run whose task to retry.
    pub id: i64,
    /// A task of run ID: its instance is retried (`axctl retry 12 load`).
    pub task: Option<String>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let id = match &args.task {
        None => args.id,
        Some(task) => lookup::task_instance(ctx, &mut client, args.id, task).await?,
    };
    let request = RetryInstanceRequest {
        id,
        actor: ctx.actor.clone(),
    };
    let instance = client
        .retry_instance(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    output::emit(ctx.output, &InstanceView::from(&instance), || {
        format!(
            "instance {} {} as attempt {}\n",
            instance.id,
            instance_state(instance.state),
            instance.attempt
        )
    })
}
