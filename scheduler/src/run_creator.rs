//! Creates runs in groups (`group_commit.rs`). Every new run (a cron fire, an API trigger, a
//! backfill slot) goes through one task; the runs that arrive together are one transaction
//! (`Store::create_runs`).

use std::sync::Arc;

use ax_store::{NewRun, RunRecord, Store, StoreError};

use crate::group_commit::{GroupCommit, GroupWrite};

/// The handle through which a node creates runs.
pub type RunCreator = GroupCommit<NewRuns>;

/// New runs, written by the store.
pub struct NewRuns(pub Arc<dyn Store>);

impl GroupWrite for NewRuns {
    type Item = NewRun;
    type Done = (RunRecord, bool);

    async fn write_group(&self, runs: &[NewRun]) -> Result<Vec<(RunRecord, bool)>, StoreError> {
        self.0.create_runs(runs).await
    }

    async fn write_one(&self, run: &NewRun) -> Result<(RunRecord, bool), StoreError> {
        self.0.create_run(run).await
    }
}

impl RunCreator {
    /// Creates `run` as `Store::create_run` does: returns the run and whether it is new (a run
    /// with the same dedup or idempotency key is returned as it is).
    pub async fn create(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError> {
        self.submit(run).await
    }
}
