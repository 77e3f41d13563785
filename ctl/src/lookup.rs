//! Names a person types for ids: a run's task for its instance.

use ax_proto::v1::ListInstancesRequest;

use crate::client::{Client, Ctx};
use crate::error::{CtlError, Exit};
use crate::output;

/// The instance of `task` in run `run`; a mapped task's items are retried one by one, by id.
pub async fn task_instance(
    ctx: &Ctx,
    client: &mut Client,
    run: i64,
    task: &str,
) -> anyhow::Result<i64> {
    let instances = client
        .list_instances(ListInstancesRequest {
            run_id: run,
            group_items: true,
            ..Default::default()
        })
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner()
        .instances;
    let of_task: Vec<_> = instances.iter().filter(|i| i.task == task).collect();
    match of_task.as_slice() {
        [one] => Ok(one.id),
        [] => Err(CtlError::new(
            Exit::NotFound,
            format!("run {run} has no instance of task {}", output::escape(task)),
        )
        .into()),
        many => Err(CtlError::new(
            Exit::InvalidArgument,
            format!(
                "task {} of run {run} has {} instances; retry one by its id (axctl get run {run})",
                output::escape(task),
                many.len()
            ),
        )
        .into()),
    }
}
