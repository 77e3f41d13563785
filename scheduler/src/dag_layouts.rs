//! Laid-out task graphs, kept per workflow version: a version never changes, so its layout is
//! computed once (off the async threads) and every later page of it is a lookup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ax_core::ids::WorkflowId;
use ax_core::layout::{self, Layout, Omitted};
use ax_core::render::Graph;

/// Versions kept; past this the cache starts over (a layout is cheap to compute again).
const KEPT: usize = 256;

pub type Laid = Arc<Result<Layout, Omitted>>;

#[derive(Default)]
pub struct DagLayouts {
    kept: Mutex<HashMap<(WorkflowId, u32), Laid>>,
}

impl DagLayouts {
    /// The layout of `graph`, the graph of version `version` of workflow `workflow`.
    pub async fn of(&self, workflow: WorkflowId, version: u32, graph: &Graph) -> Laid {
        let key = (workflow, version);
        if let Some(laid) = self.lock().get(&key) {
            return laid.clone();
        }
        let (tasks, edges) = (graph.nodes.len(), graph.edges.clone());
        let laid = match tokio::task::spawn_blocking(move || layout::layout(tasks, &edges)).await {
            Ok(result) => Arc::new(result),
            // The layout panicked: say so once in the log, and draw nothing rather than fail
            // the page.
            Err(err) => {
                tracing::error!(workflow = %workflow, version, error = %err, "laying out the DAG failed");
                return Arc::new(Err(Omitted::Failed));
            }
        };
        let mut kept = self.lock();
        if kept.len() >= KEPT {
            kept.clear();
        }
        kept.insert(key, laid.clone());
        laid
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(WorkflowId, u32), Laid>> {
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
