//! Creates runs in groups (`group_commit.rs`). Every new run (a cron fire, an API trigger, a
//! backfill slot) goes through one task; the runs that arrive together are one transaction
//! (`Store::create_runs`).

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock, Weak};

use ax_store::{NewRun, RunRecord, Store, StoreError};

use crate::group_commit::{GroupCommit, GroupWrite};
use crate::node::Node;
use crate::place_now::PlaceNow;

/// The handle through which a node creates runs.
pub type RunCreator = GroupCommit<NewRuns>;

/// New runs, written by the store; once the node is attached, their root tasks are placed on
/// its workers in the same transaction (`place_now.rs`).
pub struct NewRuns {
    store: Arc<Store>,
    node: OnceLock<Weak<Node>>,
}

impl NewRuns {
    pub fn new(store: Arc<Store>) -> NewRuns {
        NewRuns {
            store,
            node: OnceLock::new(),
        }
    }

    /// Places the root tasks of new runs on `node`'s workers from now on.
    pub fn attach(&self, node: &Arc<Node>) {
        let _ = self.node.set(Arc::downgrade(node));
    }
}

impl GroupWrite for NewRuns {
    type Item = NewRun;
    type Done = (RunRecord, bool);

    async fn write_group(&self, runs: &[NewRun]) -> Result<Vec<(RunRecord, bool)>, StoreError> {
        let Some(node) = self.node.get().and_then(Weak::upgrade) else {
            return self.store.create_runs(runs).await;
        };
        // Placement answers from memory: the versions are loaded before the transaction.
        let versions: BTreeSet<_> = runs
            .iter()
            .map(|run| (run.workflow_id, run.workflow_version))
            .collect();
        for (workflow, version) in versions {
            node.specs.get(workflow, version).await?;
        }
        let mut placement = PlaceNow::new(&node);
        match self.store.create_runs_placed(runs, &mut placement).await {
            Ok((created, placed)) => {
                placement.send(placed).await;
                Ok(created)
            }
            Err(err) => {
                placement.abandon();
                Err(err)
            }
        }
    }

    async fn write_one(&self, run: &NewRun) -> Result<(RunRecord, bool), StoreError> {
        self.store.create_run(run).await
    }
}

impl RunCreator {
    /// Creates `run` as `Store::create_run` does: returns the run and whether it is new (a run
    /// with the same dedup or idempotency key is returned as it is).
    pub async fn create(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError> {
        self.submit(run).await
    }
}
