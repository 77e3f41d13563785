//! The sub-workflow sweep: ends a `run_workflow` task's attempt once its child run has ended
//! (or TIMEOUT once the task's `timeout:` has passed, cancelling the child), and cancels a child whose parent attempt ended first (its run cancelled, the task cancelled
//! or retried by hand), so no child outlives what waits on it.
//!
//! Every node runs the loop over the open waits (`sub_workflow_wait`); what to do with each is
//! `ax_core::sub_workflow::judge`, and the store does it in one transaction that reads the wait
//! again under its locks (`Store::settle_sub_workflow`): two nodes sweeping the same wait at
//! once settle it once, the second finding it closed. The child runs themselves are started by
//! the dispatcher (`dispatcher.rs`), in the transaction that marks the parent's attempt started.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ax_core::sub_workflow::{self, SweepAction};
use ax_store::{Store, SubWorkflowWait};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::progress::Progress;
use crate::registry::Registry;
use crate::schedules::send_cancels;
use crate::wake::Wake;

/// How often the sweep looks: a parent task ends within about this long after its child.
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Open waits read per pass; more wait for the next one.
const WAITS_PER_PASS: u32 = 500;

/// What the sweep needs of the node.
pub struct SubWorkflowsParts {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub progress: Progress,
    /// Woken when a parent's attempt ended: a retry or the tasks below it may wait now.
    pub dispatch: Wake,
}

/// The sub-workflow sweep.
pub struct SubWorkflows {
    interval: Duration,
    parts: SubWorkflowsParts,
}

impl SubWorkflows {
    pub fn new(interval: Duration, parts: SubWorkflowsParts) -> SubWorkflows {
        SubWorkflows { interval, parts }
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
                    "sweeping sub-workflow waits failed; trying again next pass"
                );
            }
        }
    }

    async fn pass(&self) -> anyhow::Result<()> {
        let waits = self
            .parts
            .store
            .open_sub_workflow_waits(WAITS_PER_PASS)
            .await
            .context("listing open sub-workflow waits")?;
        // One wait that cannot be settled holds up no other: it is tried again next pass.
        let now = now_ms();
        for wait in waits {
            if sub_workflow::judge(wait.parent_side(now), wait.child_state) == SweepAction::Wait {
                continue;
            }
            if let Err(err) = self.settle(&wait).await {
                tracing::warn!(
                    instance = %wait.parent_instance_id,
                    child = %wait.child_run_id,
                    error = %format!("{err:#}"),
                    "settling a sub-workflow wait failed; trying again next pass"
                );
            }
        }
        Ok(())
    }

    async fn settle(&self, wait: &SubWorkflowWait) -> anyhow::Result<()> {
        let parts = &self.parts;
        let Some((action, killed)) = parts
            .store
            .settle_sub_workflow(wait.parent_instance_id, wait.parent_attempt, now_ms())
            .await?
        else {
            return Ok(());
        };
        match action {
            SweepAction::EndParent(end) => tracing::info!(
                instance = %wait.parent_instance_id,
                attempt = %wait.parent_attempt,
                child = %wait.child_run_id,
                end = ?end,
                "a sub-workflow's child run ended: its task ended so"
            ),
            SweepAction::TimeOut => tracing::warn!(
                instance = %wait.parent_instance_id,
                attempt = %wait.parent_attempt,
                child = %wait.child_run_id,
                "a sub-workflow task outlived its timeout: it timed out and its child run was cancelled"
            ),
            SweepAction::CancelChild => tracing::info!(
                instance = %wait.parent_instance_id,
                child = %wait.child_run_id,
                "a sub-workflow's parent attempt ended first: its child run was cancelled"
            ),
            SweepAction::Close | SweepAction::Wait => {}
        }
        send_cancels(&parts.registry, &killed, "the parent run's task ended");
        parts.dispatch.notify_one();
        parts.progress.bump();
        Ok(())
    }
}
