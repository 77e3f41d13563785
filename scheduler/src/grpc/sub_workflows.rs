//! The links between a parent run and its children in the API's answers: a run's parent task
//! and child runs (`GetRun`), an attempt's child run (`GetInstance`, and `ListInstances` with
//! attempts: one indexed read per list). A run's links are read only where one run is answered.

use std::collections::HashMap;

use ax_core::ids::RunId;
use ax_proto::v1 as pb;
use ax_store::{InstanceRecord, RunRecord, Store};
use tonic::Status;

use crate::grpc::convert::store_status;

/// Fills `message`'s parent task and child runs.
pub(crate) async fn add_links(
    store: &Store,
    record: &RunRecord,
    message: &mut pb::Run,
) -> Result<(), Status> {
    if let Some(parent) = record.parent_instance_id {
        message.parent_task = store
            .get_instance(parent)
            .await
            .map_err(store_status)?
            .map(|instance| instance.task)
            .unwrap_or_default();
    }
    message.child_run_ids = store
        .child_runs(record.id)
        .await
        .map_err(store_status)?
        .into_iter()
        .map(|id| id.0)
        .collect();
    Ok(())
}

/// Fills the child run of each of `message`'s attempts that started one.
pub(crate) async fn add_child_runs(
    store: &Store,
    record: &InstanceRecord,
    message: &mut pb::Instance,
) -> Result<(), Status> {
    let children = store
        .child_runs_of_instance(record.id)
        .await
        .map_err(store_status)?;
    for attempt in &mut message.attempts {
        if let Some((_, child)) = children.iter().find(|(a, _)| a.0 == attempt.attempt) {
            attempt.child_run_id = child.0;
        }
    }
    Ok(())
}

/// Fills the child run of each listed attempt of `run`'s instances that started one.
pub(crate) async fn add_child_runs_to_list(
    store: &Store,
    run: RunId,
    instances: &mut [pb::Instance],
) -> Result<(), Status> {
    let children = store
        .child_runs_of_run_attempts(run)
        .await
        .map_err(store_status)?;
    if children.is_empty() {
        return Ok(());
    }
    let by_attempt: HashMap<(i64, u32), i64> = children
        .into_iter()
        .map(|(instance, attempt, child)| ((instance.0, attempt.0), child.0))
        .collect();
    for instance in instances {
        for attempt in &mut instance.attempts {
            if let Some(child) = by_attempt.get(&(instance.id, attempt.attempt)) {
                attempt.child_run_id = *child;
            }
        }
    }
    Ok(())
}
