//! Creates runs in groups (`group_commit.rs`). Every new run (a cron fire, an API trigger, a
//! backfill slot) goes through one task; the runs that arrive together are one transaction
//! (`Store::create_runs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ax_core::ids::RunId;
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

/// A run as created: the run, whether it is new, and how many of its root tasks were placed
/// on a worker in its transaction (created DISPATCHED, not WAITING).
pub type Created = (RunRecord, bool, u32);

impl GroupWrite for NewRuns {
    type Item = NewRun;
    type Done = Created;

    async fn write_group(&self, runs: &[NewRun]) -> Result<Vec<Created>, StoreError> {
        // Placement answers from memory: the versions are loaded before the transaction.
        let versions: BTreeSet<_> = runs
            .iter()
            .map(|run| (run.workflow_id, run.workflow_version))
            .collect();
        for (workflow, version) in versions {
            self.specs.get(workflow, version).await?;
        }
        let mut placement = self.placing.begin();
        let started = std::time::Instant::now();
        match self.store.create_runs_placed(runs, &mut placement).await {
            Ok((created, placed)) => {
                tracing::debug!(
                    runs = runs.len(),
                    placed = placed.len(),
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "runs created"
                );
                let mut placed_of: HashMap<RunId, u32> = HashMap::new();
                for attempt in &placed {
                    *placed_of.entry(attempt.attempt.run_id).or_default() += 1;
                }
                for undone in placement.send(placed).await {
                    self.reports.put_back(undone).await;
                }
                Ok(created
                    .into_iter()
                    .map(|(run, new)| {
                        let placed = if new {
                            placed_of.get(&run.id).copied().unwrap_or(0)
                        } else {
                            0
                        };
                        (run, new, placed)
                    })
                    .collect())
            }
            Err(err) => {
                placement.abandon();
                Err(err)
            }
        }
    }

    async fn write_one(&self, run: &NewRun) -> Result<Created, StoreError> {
        let (run, new) = self.store.create_run(run).await?;
        Ok((run, new, 0))
    }
}

impl RunCreator {
    /// Creates `run` as `Store::create_run` does: returns the run and whether it is new (a run
    /// with the same dedup or idempotency key is returned as it is).
    pub async fn create(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError> {
        let (run, new, _) = self.submit(run).await?;
        Ok((run, new))
    }

    /// [`RunCreator::create`], also answering how many of a new run's root tasks were placed
    /// on a worker at once (the others wait), for the bounds on waiting instances.
    pub async fn create_placed(&self, run: NewRun) -> Result<Created, StoreError> {
        self.submit(run).await
    }
}
