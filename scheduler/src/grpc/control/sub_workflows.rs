//! The apply's checks of `run_workflow` references (`ax_core::sub_workflow::check_references`)
//! against the workflows as they will be once the file or set is applied: each names a
//! workflow of its own app that exists (or comes with the set), and no loop of calls closes.
//! Another app's workflow reads as one that does not exist, whatever the caller's token: a
//! sub-workflow is of its caller's app, and an app learns no other app's names.

use std::collections::BTreeSet;

use ax_core::sub_workflow::{self, Member};
use tonic::Status;

use super::ControlApi;
use crate::grpc::convert::store_status;

impl ControlApi {
    /// Refuses the set's `run_workflow` references that name no workflow of their app, or close
    /// a loop (InvalidArgument, one `FILE:LINE: field: why` line per refusal).
    pub(super) async fn check_run_workflows(
        &self,
        members: &[Member<'_>],
        pruned: &BTreeSet<String>,
    ) -> Result<(), Status> {
        if members
            .iter()
            .all(|m| m.spec.tasks.iter().all(|t| t.run_workflow.is_none()))
        {
            // Nothing to check unless a file calls: a set that drops its calls cannot close a
            // loop, and stored calls alone were checked when they were applied.
            return Ok(());
        }
        let store = &self.node.store;
        let apps = store.live_workflow_apps().await.map_err(store_status)?;
        let stored = store.workflow_calls().await.map_err(store_status)?;
        let refusals = sub_workflow::check_references(members, &apps, &stored, pruned);
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(Status::invalid_argument(refusals.join("\n")))
        }
    }
}
