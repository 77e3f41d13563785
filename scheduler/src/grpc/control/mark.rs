//! `MarkInstance`: a person marks a task instance SUCCESS or FAILED without running it.
//!
//! What a mark may do from which state is `ax_core::mark`; the transaction is the store's
//! (`sql/mark.rs`). Here: the request is checked (a state of the two, a reason), the store's
//! refusals become statuses that say what to do instead, a killed attempt's worker is told
//! (as for a cancel: the worker kills the process and its late end changes nothing), and the
//! mark goes into the audit trail as `mark` of `instance/ID` with the state and the reason.

use ax_core::ids::InstanceId;
use ax_core::mark::{MarkAs, check_reason};
use ax_proto::v1 as pb;
use ax_store::MarkAnswer;
use tonic::Status;

use super::ControlApi;
use super::access::Call;
use crate::clock::now_ms;
use crate::grpc::convert::store_status;

/// The state a request asks for, or why it names none of the two.
fn mark_as(state: i32) -> Result<MarkAs, Status> {
    match pb::InstanceState::try_from(state) {
        Ok(pb::InstanceState::Success) => Ok(MarkAs::Success),
        Ok(pb::InstanceState::Failed) => Ok(MarkAs::Failed),
        Ok(other) => Err(Status::invalid_argument(format!(
            "state {}: an instance can be marked SUCCESS or FAILED only",
            other.as_str_name().trim_start_matches("INSTANCE_STATE_")
        ))),
        Err(_) => Err(Status::invalid_argument(format!(
            "state {state}: an instance can be marked SUCCESS or FAILED only"
        ))),
    }
}

impl ControlApi {
    pub(super) async fn mark(
        &self,
        call: &Call,
        request: pb::MarkInstanceRequest,
    ) -> Result<pb::Instance, Status> {
        let id = InstanceId(super::positive_id(request.id, "instance")?);
        let to = mark_as(request.state)?;
        let reason = check_reason(&request.reason).map_err(Status::invalid_argument)?;
        let instance = self.visible_instance(call, id).await?;
        self.refuse_deleted(instance.workflow_id, &instance.workflow)
            .await?;
        let actor = match request.actor.trim() {
            "" => "anonymous",
            actor => actor,
        };
        let state = to.state();
        let note = format!("marked {state} by {actor}: {reason}");
        let answer = self
            .node
            .store
            .mark_instance(id, to, &note, now_ms())
            .await
            .map_err(store_status)?;
        let (record, from, killed) = match answer {
            MarkAnswer::Marked {
                record,
                from,
                killed,
            } => (record, from, killed),
            MarkAnswer::NotFound => {
                return Err(Status::not_found(format!("instance {id} not found")));
            }
            MarkAnswer::Refused(why) => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} cannot be marked {state}: {why}"
                )));
            }
            MarkAnswer::ChildrenGoing { unfinished } => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} still has {unfinished} unfinished items or shards: mark them \
                     one by one, cancel the task, or wait for them"
                )));
            }
            MarkAnswer::OldChild { parent } => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} belongs to an earlier attempt of its task (instance \
                     {parent}): mark the current attempt's items or the task's instance"
                )));
            }
        };
        if let Some(killed) = &killed {
            crate::schedules::send_cancels(
                &self.node.registry,
                std::slice::from_ref(killed),
                &note,
            );
        }
        self.node
            .traces
            .run_ended_if_over(&self.node.store, record.run_id)
            .await;
        self.node.dispatch_wake.notify_one();
        let detail = format!("{state} (was {from}): {reason}");
        self.audit(
            &request.actor,
            "mark",
            format!("instance/{id}"),
            detail,
            &call.caller,
        )
        .await;
        self.node.bump_progress();
        self.instance_message(&record).await
    }
}
