//! A page of a mapped task's items (`ListInstances` with `items_of`): the run page and
//! `axctl get items` read a task of 10,000 items a page at a time.

use ax_core::ids::InstanceId;
use ax_core::state::InstanceState;
use ax_proto::v1 as pb;
use ax_store::{ItemPage, MAX_ITEM_PAGE, RunRecord};
use tonic::Status;

use super::ControlApi;
use crate::grpc::convert::{self, store_status};

/// Items per page when the caller does not say.
const DEFAULT_ITEM_PAGE: u32 = 100;

impl ControlApi {
    /// `run` is visible to the caller; the instance must be one of its mapped tasks'.
    pub(super) async fn list_items(
        &self,
        run: &RunRecord,
        request: &pb::ListInstancesRequest,
    ) -> Result<pb::ListInstancesResponse, Status> {
        let parent = InstanceId(request.items_of);
        let not_found =
            || Status::not_found(format!("instance {parent} not found in run {}", run.id));
        let record = self
            .node
            .store
            .get_instance(parent)
            .await
            .map_err(store_status)?
            .ok_or_else(not_found)?;
        if record.run_id != run.id {
            return Err(not_found());
        }
        if request.limit > MAX_ITEM_PAGE {
            return Err(Status::invalid_argument(format!(
                "limit {} is more than the {MAX_ITEM_PAGE} items a page holds",
                request.limit
            )));
        }
        let limit = if request.limit == 0 {
            DEFAULT_ITEM_PAGE
        } else {
            request.limit
        };
        let state = match request.state {
            0 => None,
            n => Some(core_state(n)?),
        };
        // One more than the page tells whether a next page exists.
        let mut items = self
            .node
            .store
            .list_items(
                parent,
                ItemPage {
                    state,
                    from_index: request.items_from,
                    limit: limit + 1,
                },
            )
            .await
            .map_err(store_status)?;
        let next_items_from = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items
                .last()
                .and_then(|i| i.shard.as_ref())
                .map_or(0, |s| s.index + 1)
        } else {
            0
        };
        Ok(pb::ListInstancesResponse {
            instances: items.iter().map(|i| convert::instance(i, &[])).collect(),
            tasks: Vec::new(),
            next_items_from,
        })
    }
}

fn core_state(n: i32) -> Result<InstanceState, Status> {
    InstanceState::ALL
        .into_iter()
        .find(|s| convert::instance_state(*s) as i32 == n)
        .ok_or_else(|| Status::invalid_argument(format!("state {n} is not an instance state")))
}
