//! `axctl retry INSTANCE`: another attempt of a failed, timed-out or cancelled instance.

use ax_proto::v1::RetryInstanceRequest;

use crate::client::Ctx;
use crate::output;
use crate::view::{InstanceView, instance_state};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The instance to retry (its earlier attempts keep their records and logs).
    pub id: i64,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = RetryInstanceRequest {
        id: args.id,
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
