//! The purger: ended runs past their workflow's retention are deleted in small steps, with
//! their instances, attempts, log chunks and decisions (`ax_core::retention` decides which;
//! `Store::purge_runs` deletes a step in one short transaction), and audit rows past the audit
//! retention (`--audit-retention`, 365 days by default) the same way.
//!
//! Every node runs the loop; in a pass only the live node with the lowest id purges
//! (`ax_core::retention::is_purger`, over the node leases), so a cluster deletes on one node at
//! a time. Two nodes that both believe it for a moment (a lease just expired) only repeat each
//! other's deletes: a step locks its runs and skips those already gone. Between two steps the
//! purger pauses at least as long as the step took, so it never holds the store's writers
//! (SQLite's one writer lock above all) more than about half the time, and the dispatch and
//! report paths go on beside it. `axctl purge` (`PurgeRuns`) runs the same steps on demand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ax_core::Millis;
use ax_core::ids::WorkflowId;
use ax_store::{PurgeCounts, PurgeStep, Store, StoreError};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::specs::SpecCache;

/// Runs per step (one transaction).
pub const STEP_RUNS: u32 = 200;
/// Instances, attempts, log chunks and decisions per step, besides the runs themselves.
pub const STEP_ROWS: u32 = 4_000;
/// The shortest pause between two steps; after a longer step the pause is as long as it.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// The purger: how long history is kept, and the node's parts it reads and deletes with.
pub struct Retention {
    node_id: String,
    /// The cluster's default retention of ended runs; `None` keeps them.
    retention: Option<Duration>,
    /// How long audit rows are kept; `None` keeps them.
    audit_retention: Option<Duration>,
    purge_interval: Duration,
    store: Arc<Store>,
    specs: Arc<SpecCache>,
    metrics: Arc<Metrics>,
}

/// How long history is kept, and how often the purger looks.
pub struct RetentionOptions {
    pub node_id: String,
    pub retention: Option<Duration>,
    pub audit_retention: Option<Duration>,
    pub purge_interval: Duration,
}

impl Retention {
    pub fn new(
        options: RetentionOptions,
        store: Arc<Store>,
        specs: Arc<SpecCache>,
        metrics: Arc<Metrics>,
    ) -> Retention {
        Retention {
            node_id: options.node_id,
            retention: options.retention,
            audit_retention: options.audit_retention,
            purge_interval: options.purge_interval,
            store,
            specs,
            metrics,
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let interval = self.purge_interval;
        loop {
            let pause = interval.mul_f64(rand::rng().random_range(0.9..1.1));
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = cancel.cancelled() => return,
            }
            match self.purge_due(&cancel).await {
                Ok(counts) if counts.rows() > 0 => tracing::info!(
                    runs = counts.runs,
                    instances = counts.instances,
                    attempts = counts.attempts,
                    log_chunks = counts.log_chunks,
                    decisions = counts.decisions,
                    "purged runs past their retention"
                ),
                Ok(_) => {}
                Err(err) => tracing::warn!(
                    error = %format!("{err:#}"),
                    "purging runs past their retention failed; trying again next interval"
                ),
            }
        }
    }

    /// One pass: on the purging node, every workflow's ended runs past its retention.
    async fn purge_due(&self, cancel: &CancellationToken) -> anyhow::Result<PurgeCounts> {
        let mut total = PurgeCounts::default();
        if !self.is_purger().await? {
            return Ok(total);
        }
        let default_ms = self.retention.map(|keep| keep.as_millis() as u64);
        let workflows = self
            .store
            .history_heads(None)
            .await
            .context("listing workflows")?;
        for workflow in workflows {
            let spec = self.specs.get(workflow.id, workflow.version).await?;
            let cutoff = ax_core::retention::cutoff(spec.spec.retention, default_ms, now_ms());
            let Some(cutoff) = cutoff else { continue };
            total += purge_workflow(
                &self.store,
                &self.metrics,
                workflow.id,
                cutoff,
                false,
                cancel,
            )
            .await
            .with_context(|| format!("purging workflow {}", workflow.name))?;
            if cancel.is_cancelled() {
                return Ok(total);
            }
        }
        if let Some(keep) = self.audit_retention {
            let before = now_ms().saturating_sub(keep.as_millis() as Millis);
            let rows = self
                .purge_audit(before, cancel)
                .await
                .context("purging audit rows")?;
            if rows > 0 {
                tracing::info!(rows, "purged audit rows past the audit retention");
            }
        }
        Ok(total)
    }

    /// Deletes the audit rows written before `before`, a step at a time; returns how many.
    async fn purge_audit(
        &self,
        before: Millis,
        cancel: &CancellationToken,
    ) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let started = Instant::now();
            let rows = self.store.purge_audit(before, STEP_ROWS, false).await?;
            total += rows;
            if rows < u64::from(STEP_ROWS) || pause(started, false, cancel).await {
                return Ok(total);
            }
        }
    }

    async fn is_purger(&self) -> anyhow::Result<bool> {
        let (db_now, leases) = self
            .store
            .list_node_leases()
            .await
            .context("listing node leases")?;
        let live = leases
            .iter()
            .filter(|lease| lease.expires_at > db_now)
            .map(|lease| lease.node_id.as_str());
        Ok(ax_core::retention::is_purger(live, &self.node_id))
    }
}

/// Deletes (or with `dry_run` counts) the workflow's ended runs that ended before
/// `ended_before`, step by step, then its decisions about dropped slots before it. Stops
/// between two steps once `cancel` is cancelled.
pub async fn purge_workflow(
    store: &Store,
    metrics: &Metrics,
    workflow_id: WorkflowId,
    ended_before: Millis,
    dry_run: bool,
    cancel: &CancellationToken,
) -> Result<PurgeCounts, StoreError> {
    let mut total = PurgeCounts::default();
    let mut step = PurgeStep {
        workflow_id,
        ended_before,
        after: None,
        max_runs: STEP_RUNS,
        max_rows: STEP_ROWS,
        dry_run,
    };
    loop {
        let started = Instant::now();
        let progress = store.purge_runs(&step).await?;
        total += progress.counts;
        if !dry_run {
            metrics.purged(&progress.counts);
        }
        let Some(next) = progress.next else { break };
        step.after = Some(next);
        if pause(started, dry_run, cancel).await {
            return Ok(total);
        }
    }
    loop {
        let started = Instant::now();
        let decisions = store
            .purge_slot_decisions(workflow_id, ended_before, STEP_ROWS, dry_run)
            .await?;
        total.decisions += decisions;
        if dry_run {
            break;
        }
        metrics.purged(&PurgeCounts {
            decisions,
            ..PurgeCounts::default()
        });
        if decisions < u64::from(STEP_ROWS) || pause(started, dry_run, cancel).await {
            break;
        }
    }
    Ok(total)
}

/// Waits between two steps: as long as the last one took (at least [`MIN_PAUSE`]); a dry run,
/// which locks and writes nothing, does not wait. True when `cancel` ended the wait.
async fn pause(started: Instant, dry_run: bool, cancel: &CancellationToken) -> bool {
    if dry_run {
        return cancel.is_cancelled();
    }
    let pause = started.elapsed().max(MIN_PAUSE);
    tokio::select! {
        () = tokio::time::sleep(pause) => false,
        () = cancel.cancelled() => true,
    }
}
