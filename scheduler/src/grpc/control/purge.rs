//! `PurgeRuns` (admin, `axctl purge`): history deleted on demand, in the purger's steps
//! (`crate::retention`).

use ax_core::retention::{check_older_than, older_than};
use ax_core::spec::Retention;
use ax_proto::v1 as pb;
use ax_store::PurgeCounts;
use tokio_util::sync::CancellationToken;
use tonic::{Response, Status};

use super::ControlApi;
use super::access::Call;
use crate::clock::now_ms;
use crate::grpc::convert::store_status;
use crate::retention::purge_workflow;

impl ControlApi {
    pub(super) async fn purge_runs_call(
        &self,
        call: &Call,
        request: pb::PurgeRunsRequest,
    ) -> Result<Response<pb::PurgeRunsResponse>, Status> {
        let older_than_ms =
            check_older_than(request.older_than_ms).map_err(Status::invalid_argument)?;
        let ended_before = older_than(older_than_ms, now_ms());
        let name = request.workflow.trim();
        let mut kept_forever = Vec::new();
        let targets = if name.is_empty() {
            call.unscoped("purging every workflow")?;
            let mut targets = Vec::new();
            for workflow in self
                .node
                .store
                .history_heads(None)
                .await
                .map_err(store_status)?
            {
                let versioned = self
                    .node
                    .specs
                    .get(workflow.id, workflow.version)
                    .await
                    .map_err(store_status)?;
                if versioned.spec.retention == Some(Retention::Forever) {
                    kept_forever.push(workflow.name);
                } else {
                    targets.push((workflow.id, workflow.name));
                }
            }
            targets
        } else {
            let workflow = self.workflow_named(call, name).await?;
            vec![(workflow.id, workflow.name)]
        };
        // A client that goes away drops this call between two steps; what was deleted stays
        // deleted, each step whole.
        let never = CancellationToken::new();
        let mut counts = PurgeCounts::default();
        for (id, _) in &targets {
            counts += purge_workflow(
                &self.node.store,
                &self.node.metrics,
                *id,
                ended_before,
                request.dry_run,
                &never,
            )
            .await
            .map_err(store_status)?;
        }
        if !request.dry_run {
            let target = if name.is_empty() {
                "workflows".to_string()
            } else {
                format!("workflow/{name}")
            };
            let detail = format!(
                "ended before {}: {} runs, {} instances, {} attempts, {} log chunks, {} \
                 decisions deleted",
                ax_core::rfc3339(ended_before),
                counts.runs,
                counts.instances,
                counts.attempts,
                counts.log_chunks,
                counts.decisions
            );
            self.audit(&request.actor, "purge", target, detail, &call.caller)
                .await;
        }
        Ok(Response::new(pb::PurgeRunsResponse {
            runs: counts.runs,
            instances: counts.instances,
            attempts: counts.attempts,
            log_chunks: counts.log_chunks,
            decisions: counts.decisions,
            ended_before_ms: ended_before,
            dry_run: request.dry_run,
            kept_forever,
        }))
    }
}
