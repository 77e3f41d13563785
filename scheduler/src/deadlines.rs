//! The deadline judge: runs not ended by their workflow's `deadline:` are judged missed, once
//! in the cluster. The judgement (`Store::miss_deadline`) records a `deadline_missed` decision
//! and, with `on_deadline: cancel`, cancels the run in the same transaction; the judging node
//! then alerts through the configured channels, counts `ax_deadlines_missed_total` and tells the
//! workers of a cancelled run's attempts to kill them.
//!
//! Every node runs the loop; in a pass only the live node with the lowest id judges (the
//! purger's rule, `ax_core::retention::is_purger`, over the node leases), on the store's clock
//! (`clock.rs`). Two nodes that both believe it for a moment (a lease just expired) cannot both
//! judge a run: the judgement is a conditional update that only one wins, and only the winner
//! alerts. The alert goes out after the commit: a node that dies between the two has recorded
//! the decision, and the alert is lost (an alert is at most once; the decision always stays).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ax_core::Millis;
use ax_core::deadline::{self, OnDeadline};
use ax_store::{DeadlineMiss, RunRecord, Store};
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alert, AlertKind, Alerter};
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::registry::Registry;
use crate::schedules::send_cancels;
use crate::specs::SpecCache;
use crate::telemetry::Traces;
use crate::wake::Wake;

/// How often the judge looks: a deadline is judged within about this long after it passed.
pub const JUDGE_EVERY: Duration = Duration::from_secs(1);
/// Runs judged per read; more wait for the next pass.
const RUNS_PER_PASS: u32 = 200;

/// What the judge needs of the node.
pub struct DeadlinesParts {
    pub store: Arc<Store>,
    pub specs: Arc<SpecCache>,
    pub registry: Arc<Registry>,
    pub alerter: Alerter,
    pub metrics: Arc<Metrics>,
    pub traces: Traces,
    pub progress: Progress,
    /// Woken when a cancel ended a run: queued runs of its workflow may have started.
    pub dispatch: Wake,
}

/// The deadline judge.
pub struct Deadlines {
    node_id: String,
    interval: Duration,
    parts: DeadlinesParts,
}

impl Deadlines {
    pub fn new(node_id: String, interval: Duration, parts: DeadlinesParts) -> Deadlines {
        Deadlines {
            node_id,
            interval,
            parts,
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = cancel.cancelled() => return,
            }
            if let Err(err) = self.pass().await {
                tracing::warn!(
                    error = %format!("{err:#}"),
                    "judging runs' deadlines failed; trying again next pass"
                );
            }
        }
    }

    /// One pass: on the judging node, every run past its deadline.
    async fn pass(&self) -> anyhow::Result<()> {
        if !self.is_judge().await? {
            return Ok(());
        }
        let now = now_ms();
        let past = self
            .parts
            .store
            .runs_past_deadline(now, RUNS_PER_PASS)
            .await
            .context("listing runs past their deadline")?;
        // One run that cannot be judged (its version unreadable, a failed write) holds up
        // no other: it is tried again next pass.
        for run in past {
            if let Err(err) = self.judge(&run, now).await {
                tracing::warn!(
                    run = %run.id,
                    error = %format!("{err:#}"),
                    "judging a run's deadline failed; trying again next pass"
                );
            }
        }
        Ok(())
    }

    async fn judge(&self, run: &RunRecord, now: Millis) -> anyhow::Result<()> {
        let parts = &self.parts;
        let Some(deadline_at) = run.deadline_at else {
            return Ok(());
        };
        let spec = parts
            .specs
            .get(run.workflow_id, run.workflow_version)
            .await?;
        let spec = &spec.spec;
        let action = spec.on_deadline;
        let detail = deadline::missed_text(
            spec.deadline.as_ref(),
            deadline_at,
            &spec.schedule.timezone,
            action,
        );
        let miss = DeadlineMiss {
            run_id: run.id,
            now,
            node_id: self.node_id.clone(),
            detail: detail.clone(),
            cancel: action == OnDeadline::Cancel,
        };
        let Some(missed) = parts.store.miss_deadline(&miss).await? else {
            return Ok(());
        };
        parts.metrics.deadlines_missed.inc();
        tracing::info!(run = %run.id, workflow = %run.workflow, %detail, "run missed its deadline");
        parts.alerter.notify(
            Alert::new(AlertKind::DeadlineMissed, run.workflow.clone(), detail, now)
                .with_run(run.id.0),
        );
        if let Some(cancelled) = &missed.cancelled {
            send_cancels(&parts.registry, cancelled, "the run missed its deadline");
            parts.traces.run_ended(run.id);
            parts.dispatch.notify_one();
        }
        parts.progress.bump();
        Ok(())
    }

    async fn is_judge(&self) -> anyhow::Result<bool> {
        let (db_now, leases) = self
            .parts
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
