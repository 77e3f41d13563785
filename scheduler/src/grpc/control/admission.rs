//! The bounds on waiting instances at the control API's door (`crate::admission`): a trigger
//! or a backfill is judged before it creates anything, and a refusal is RESOURCE_EXHAUSTED with
//! its hint (`ax_proto::overloaded`), which the HTTP API answers as a 429 with `Retry-After`
//! (`json_errors.rs`).

use ax_core::admission::{Bound, refusal_message};
use ax_core::spec::WorkflowSpec;
use ax_proto::v1 as pb;
use tonic::Status;

use super::access::Call;
use crate::admission::Ticket;
use crate::clock::now_ms;
use crate::node::Node;

/// The WAITING instances a started run of `spec` begins with: one per root task.
pub(super) fn root_instances(spec: &WorkflowSpec) -> u64 {
    spec.tasks.iter().filter(|t| t.upstream.is_empty()).count() as u64
}

/// Admits `runs` new runs of `spec` for `call` (settle the ticket once they are created), or
/// refuses them all. The workflow's app's count is shown to whoever may see the workflow; the
/// cluster's count, which spans every app, only to a caller not scoped to one.
pub(super) fn admit<'a>(
    node: &'a Node,
    call: &Call,
    spec: &WorkflowSpec,
    runs: u64,
) -> Result<Ticket<'a>, Status> {
    let instances = root_instances(spec).saturating_mul(runs);
    let refusal = match node.admission.request(&spec.app, instances, now_ms()) {
        Ok(ticket) => return Ok(ticket),
        Err(refusal) => refusal,
    };
    let count_visible = refusal.past.bound == Bound::App || call.app_scope().is_none();
    let overloaded = pb::Overloaded {
        bound: refusal.past.bound.as_str().into(),
        app: spec.app.clone(),
        waiting: if count_visible {
            refusal.past.waiting
        } else {
            0
        },
        limit: refusal.past.limit,
        retry_after_ms: refusal.retry_after_ms,
    };
    let message = refusal_message(
        &spec.name,
        &spec.app,
        &refusal.past,
        refusal.retry_after_ms,
        count_visible,
    );
    Err(ax_proto::overloaded::status(message, &overloaded))
}
