//! Sends WAITING instances to live workers.
//!
//! One pass: read a batch of WAITING instances (highest priority first), choose a worker for
//! each with the core's placer within capacity and labels, take the guards (start lock, dedup
//! marker), claim them all in one transaction (conditional WAITING → DISPATCHED), then send.
//! Persist, then send: a dispatch a worker never received is still recorded and comes back.

use std::sync::Arc;
use std::time::Duration;

use ax_core::placement::Candidate;
use ax_proto::v1::{Dispatch, SchedulerMessage, scheduler_message};
use ax_store::{DispatchClaim, Report, WaitingInstance};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::guards::StartLock;
use crate::node::Node;
use crate::registry::WorkerSlot;
use crate::reporter::Envelope;

/// WAITING instances read per pass.
const BATCH: u32 = 512;
/// How often the dispatcher looks without being woken (retries whose backoff ended, a start
/// lock that expired).
const IDLE_POLL: Duration = Duration::from_millis(500);

pub async fn run(node: Arc<Node>, cancel: CancellationToken) {
    loop {
        if let Err(err) = dispatch_ready(&node).await {
            tracing::error!(error = %err, "dispatch pass failed");
        }
        tokio::select! {
            _ = node.dispatch_wake.notified() => {}
            _ = tokio::time::sleep(IDLE_POLL) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// Dispatches until nothing more can go out now.
async fn dispatch_ready(node: &Node) -> anyhow::Result<()> {
    loop {
        // Read about as many waiting instances as there are free slots (twice, so instances no
        // free worker can take do not hide the ones behind them), not a whole batch each time
        // a slot frees up.
        let slots = node.registry.slots();
        let free: u32 = slots
            .iter()
            .filter(|slot| slot.accepting)
            .map(|slot| slot.capacity.saturating_sub(slot.running))
            .sum();
        if free == 0 {
            return Ok(());
        }
        let limit = free.saturating_mul(2).clamp(32, BATCH);
        let waiting = node.store.waiting(now_ms(), limit).await?;
        let full_batch = waiting.len() as u32 == limit;
        let sent = dispatch_batch(node, slots, waiting).await?;
        if sent == 0 || !full_batch {
            return Ok(());
        }
    }
}

struct Planned {
    waiting: WaitingInstance,
    worker: String,
    message: Dispatch,
    lock_ttl: Duration,
}

async fn dispatch_batch(
    node: &Node,
    mut slots: Vec<WorkerSlot>,
    waiting: Vec<WaitingInstance>,
) -> anyhow::Result<usize> {
    let mut planned = Vec::new();
    {
        let mut placer = node.placer.lock().await;
        for item in waiting {
            let instance = &item.instance;
            let spec = node
                .specs
                .get(instance.workflow_id, instance.workflow_version)
                .await?;
            let Some(task) = spec.task(&instance.task) else {
                tracing::error!(instance = %instance.id, task = %instance.task, "task missing from its workflow version");
                continue;
            };
            let candidates: Vec<Candidate<'_>> = slots
                .iter()
                .map(|slot| Candidate {
                    id: &slot.id,
                    labels: &slot.labels,
                    capacity: slot.capacity,
                    running: slot.running,
                    accepting: slot.accepting,
                })
                .collect();
            let Some(chosen) = placer.choose(&candidates, &task.labels, rand::random()) else {
                continue;
            };
            slots[chosen].running += 1;
            let mut env = task.env.clone();
            for (name, value) in &item.params {
                env.insert(format!("AX_PARAM_{name}"), value.clone());
            }
            let message = Dispatch {
                instance_id: instance.id.0,
                attempt: instance.attempt.0,
                run_id: instance.run_id.0,
                workflow: spec.name.clone(),
                task: task.name.clone(),
                command: task.command.clone(),
                argv: task.argv.clone(),
                env: env.into_iter().collect(),
                working_dir: task.working_dir.clone().unwrap_or_default(),
                timeout_ms: task.timeout_ms,
                logical_time_ms: item.logical_time,
            };
            planned.push(Planned {
                worker: slots[chosen].id.clone(),
                lock_ttl: lock_ttl(node, task.timeout_ms),
                waiting: item,
                message,
            });
        }
    }
    if planned.is_empty() {
        return Ok(0);
    }

    // The fast guards: a retry whose previous attempt may still hold the start lock waits,
    // and an attempt that was already dispatched is not dispatched again.
    let mut guarded = Vec::with_capacity(planned.len());
    for plan in planned {
        let instance = plan.waiting.instance.id;
        let attempt = plan.waiting.instance.attempt;
        match node
            .guards
            .acquire_start(instance, attempt, plan.lock_ttl)
            .await
        {
            StartLock::Acquired | StartLock::Unavailable => {}
            StartLock::HeldBy(holder) => {
                tracing::info!(instance = %instance, attempt = %attempt, holder = %holder, "start lock held by an earlier attempt; waiting");
                continue;
            }
        }
        if node
            .guards
            .mark_dispatch(instance, attempt, plan.lock_ttl)
            .await
            == Some(false)
        {
            tracing::warn!(instance = %instance, attempt = %attempt, "duplicate dispatch dropped");
            continue;
        }
        guarded.push(plan);
    }

    let now = now_ms();
    let claims: Vec<DispatchClaim> = guarded
        .iter()
        .map(|plan| DispatchClaim {
            instance_id: plan.waiting.instance.id,
            attempt: plan.waiting.instance.attempt,
            worker_id: plan.worker.clone(),
            node_id: node.options.node_id.clone(),
            at: now,
        })
        .collect();
    let won = node.store.mark_dispatched(&claims).await?;

    let mut sent = 0;
    for (plan, won) in guarded.into_iter().zip(won) {
        let instance = plan.waiting.instance.id;
        let attempt = plan.waiting.instance.attempt;
        if !won {
            // Another node claimed it first; it owns the guards now.
            node.guards.clear_dispatch(instance, attempt).await;
            continue;
        }
        let delivered = match node.registry.begin_attempt(&plan.worker, instance, attempt) {
            Some(sender) => {
                let message = SchedulerMessage {
                    body: Some(scheduler_message::Body::Dispatch(plan.message)),
                };
                sender.try_send(Ok(message)).is_ok()
            }
            None => false,
        };
        if delivered {
            tracing::debug!(instance = %instance, attempt = %attempt, worker = %plan.worker, "dispatched");
            sent += 1;
        } else {
            // The worker went away or its queue is full: the claim is undone like a rejection.
            let report = Report::Rejected {
                instance_id: instance,
                attempt,
                worker_id: None,
                reason: "worker unreachable at dispatch".into(),
            };
            let _ = node
                .reports
                .send(Envelope {
                    worker: plan.worker,
                    report,
                    from_worker: false,
                })
                .await;
        }
    }
    node.bump_progress();
    Ok(sent)
}

/// The start lock lives as long as the attempt may: its timeout plus the grace the lost-attempt
/// rule allows (1.5 × the longest heartbeat interval), and a minute more for the kill to land.
/// A task without a timeout holds it for a day at most.
fn lock_ttl(node: &Node, timeout_ms: u64) -> Duration {
    let longest = node
        .options
        .heartbeat_interval
        .max(node.options.task_heartbeat_interval);
    let grace = longest.mul_f64(1.5) + Duration::from_secs(60);
    if timeout_ms == 0 {
        Duration::from_secs(24 * 3600)
    } else {
        Duration::from_millis(timeout_ms) + grace
    }
}
