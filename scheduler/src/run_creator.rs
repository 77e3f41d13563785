//! Creates runs in groups (`group_commit.rs`). Every new run (a cron fire, an API trigger, a
//! backfill slot) goes through one task; the runs that arrive together are one transaction
//! (`Store::create_runs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use ax_store::{NewRun, RunRecord, Store, StoreError};

use crate::group_commit::{GroupCommit, GroupWrite};
use crate::place_now::Placing;
use crate::reporter::Reports;
use crate::specs::SpecCache;

/// The handle through which a node creates runs.
pub type RunCreator = GroupCommit<NewRuns>;

/// New runs, written by the store, their root tasks placed on this node's workers in the same
/// transaction (`place_now.rs`).
pub struct NewRuns {
    store: Arc<Store>,
    specs: Arc<SpecCache>,
    placing: Placing,
    /// Where placed attempts that could not be sent go back to WAITING.
    reports: Reports,
}

impl NewRuns {
    pub fn new(
        store: Arc<Store>,
        specs: Arc<SpecCache>,
        placing: Placing,
        reports: Reports,
    ) -> NewRuns {
        NewRuns {
            store,
            specs,
            placing,
            reports,
        }
    }
}

impl GroupWrite for NewRuns {
    type Item = NewRun;
    type Done = (RunRecord, bool);

    async fn write_group(&self, runs: &[NewRun]) -> Result<Vec<(RunRecord, bool)>, StoreError> {
        // Placement answers from memory: the versions are loaded before the transaction.
        let versions: BTreeSet<_> = runs
            .iter()
            .map(|run| (run.workflow_id, run.workflow_version))
            .collect();
        for (workflow, version) in versions {
            self.specs.get(workflow, version).await?;
        }
        let mut placement = self.placing.begin();
        match self.store.create_runs_placed(runs, &mut placement).await {
            Ok((created, placed)) => {
                for undone in placement.send(placed).await {
                    self.reports.put_back(undone).await;
                }
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
