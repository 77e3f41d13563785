//! `RerunRun` with `tasks`: a selection of a run's tasks runs again, each with everything below
//! it (Airflow's "clear with downstream"). Downstream is always included: a task rerun alone
//! would leave what read its outputs stale. To run one failed task again alone, retry it.

use ax_core::audit_text;
use ax_core::ids::RunId;
use ax_proto::v1 as pb;
use ax_store::RerunSelection;
use tonic::Status;

use super::ControlApi;
use super::dag::rerun_refused;
use crate::clock::now_ms;
use crate::grpc::convert::store_status;

impl ControlApi {
    /// Reruns `request.tasks` of run `id` (and their downstream); refuses, changing nothing, a
    /// request that also says `failed` or `from_task`, an empty task name, an unknown run or
    /// task (NotFound) and a selection that cannot run again now (FailedPrecondition).
    pub(super) async fn rerun_selection(
        &self,
        id: RunId,
        request: &pb::RerunRunRequest,
        caller: &ax_store::Caller,
    ) -> Result<pb::Run, Status> {
        if request.failed || !request.from_task.trim().is_empty() {
            return Err(Status::invalid_argument(
                "say one thing to rerun: tasks, failed = true or from_task, not several",
            ));
        }
        let mut tasks: Vec<&str> = Vec::new();
        for task in &request.tasks {
            let task = task.trim();
            if task.is_empty() {
                return Err(Status::invalid_argument(
                    "tasks: a task name is empty (name each task to rerun)",
                ));
            }
            if !tasks.contains(&task) {
                tasks.push(task);
            }
        }
        let answer = self
            .node
            .store
            .rerun_tasks(id, &tasks, now_ms())
            .await
            .map_err(store_status)?;
        let (again, pending) = match answer {
            RerunSelection::Rerun { again, pending } => (again, pending),
            RerunSelection::Refused { task, why } => return Err(rerun_refused(id, &task, why)),
        };
        let detail = format!(
            "tasks {} with downstream: instances {} again, {} downstream instances pending ({})",
            tasks.join(", "),
            audit_text::capped_list(&again),
            pending.len(),
            audit_text::capped_list(&pending),
        );
        self.audit(&request.actor, "rerun", format!("run/{id}"), detail, caller)
            .await;
        self.node.dispatch_wake.notify_one();
        self.node.bump_progress();
        self.run_message(id).await
    }
}
