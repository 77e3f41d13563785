//! Alerts about failures, for the alert channels (`alerts/`): an attempt that did not succeed
//! (failed, timed out, gave up after its retries), a run that failed, a task whose heartbeat
//! stalled, a worker that died with attempts on it. They need names from the store, so the
//! reporter's are built off its path, on the node's tasks; an alert never holds up scheduling.

use std::sync::Arc;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use ax_store::{ActiveAttempt, Applied, Store};
use tokio_util::task::TaskTracker;

use crate::alerts::{Alert, AlertKind, Alerter};
use crate::clock::now_ms;

/// A failure worth an alert: an attempt that did not succeed, or a run that failed.
pub struct Failure {
    pub instance: InstanceId,
    pub attempt: Attempt,
    pub applied: Applied,
    pub message: String,
}

impl Failure {
    pub fn run(run: RunId) -> Failure {
        Failure {
            instance: InstanceId(0),
            attempt: Attempt(0),
            applied: Applied {
                run_finished: Some((run, RunState::Failed)),
                ..Applied::default()
            },
            message: String::new(),
        }
    }
}

/// Raises the node's failure alerts; clones share the alerter.
#[derive(Clone)]
pub struct FailureAlerts {
    alerter: Alerter,
    store: Arc<Store>,
    /// Where alerts are built, off the reporter's path.
    tasks: TaskTracker,
}

impl FailureAlerts {
    pub fn new(alerter: Alerter, store: Arc<Store>, tasks: TaskTracker) -> FailureAlerts {
        FailureAlerts {
            alerter,
            store,
            tasks,
        }
    }

    /// Alerts about a batch's failures, built off the caller's path.
    pub fn raise(&self, failures: Vec<Failure>) {
        if failures.is_empty() || !self.alerter.is_enabled() {
            return;
        }
        self.tasks
            .spawn(raise(self.alerter.clone(), self.store.clone(), failures));
    }

    /// One alert per stalled attempt.
    pub async fn stalled(&self, attempt: &ActiveAttempt, worker: &str, detail: &str, now: Millis) {
        if !self.alerter.is_enabled() {
            return;
        }
        let Ok(Some(instance)) = self.store.get_instance(attempt.instance_id).await else {
            return;
        };
        let message = format!(
            "task {} (instance {}, attempt {}): {detail}",
            instance.task, attempt.instance_id, attempt.attempt
        );
        self.alerter.notify(
            Alert::new(AlertKind::TaskStalled, instance.workflow, message, now).with_worker(worker),
        );
    }

    /// One alert per dead worker, naming what it was running.
    pub async fn worker_lost(&self, worker: &str, attempts: &[ActiveAttempt], now: Millis) {
        if !self.alerter.is_enabled() {
            return;
        }
        let mut workflow = String::new();
        if let Some(first) = attempts.first()
            && let Ok(Some(instance)) = self.store.get_instance(first.instance_id).await
        {
            workflow = instance.workflow;
        }
        let ids: Vec<String> = attempts
            .iter()
            .map(|a| format!("{}#{}", a.instance_id, a.attempt))
            .collect();
        let message = format!(
            "worker {worker} is dead; {} running attempts lost and retried where retries allow: {}",
            attempts.len(),
            ids.join(", ")
        );
        self.alerter
            .notify(Alert::new(AlertKind::WorkerLost, workflow, message, now).with_worker(worker));
    }
}

async fn raise(alerter: Alerter, store: Arc<Store>, failures: Vec<Failure>) {
    let now = now_ms();
    for failure in failures {
        if failure.instance.0 == 0 {
            let Some((run, _)) = failure.applied.run_finished else {
                continue;
            };
            let Ok(Some(record)) = store.get_run(run).await else {
                continue;
            };
            let counts = store.run_counts(run).await.unwrap_or_default();
            let message = format!(
                "run failed: {} succeeded, {} failed, {} timed out, {} not run",
                counts.success, counts.failed, counts.timeout, counts.not_created
            );
            alerter.notify(
                Alert::new(AlertKind::RunFailed, record.workflow, message, now).with_run(run.0),
            );
            continue;
        }
        let Ok(Some(instance)) = store.get_instance(failure.instance).await else {
            continue;
        };
        let alert = |kind, message: String| {
            Alert::new(kind, instance.workflow.clone(), message, now)
                .with_run(instance.run_id.0)
                .with_instance(instance.id.0, instance.task.clone(), failure.attempt.0)
        };
        let detail = if failure.message.is_empty() {
            "failed".to_string()
        } else {
            failure.message.clone()
        };
        let timed_out = failure.applied.attempt_state == Some(InstanceState::Timeout);
        if timed_out {
            alerter.notify(alert(AlertKind::InstanceTimeout, detail.clone()));
        }
        if failure.applied.retry_scheduled {
            continue;
        }
        if !timed_out {
            alerter.notify(alert(AlertKind::InstanceFailed, detail.clone()));
        }
        if failure.attempt.0 > 1 {
            let message = format!("gave up after {} attempts: {detail}", failure.attempt.0);
            alerter.notify(alert(AlertKind::RetriesExhausted, message));
        }
    }
}
