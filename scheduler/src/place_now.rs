//! First attempts placed on this node's workers inside the transaction that creates them
//! (`ax_store::Placement`), then sent once it commits: a run's root tasks (`run_creator.rs`)
//! and the tasks an advance makes ready (`reporter.rs`) go out without passing through the
//! WAITING queue when a worker here has a free slot. That saves the dispatcher's read and its
//! claim's commit between a task becoming ready and its dispatch.
//!
//! Only what the node can decide from memory is placed
//! (`ax_core::dispatch_plan::route_at_creation`): a task without concurrency limits, secrets,
//! or a sharded or cluster-wide route, whose workflow version is cached, while no dispatch pass
//! is planning. Everything else is created WAITING for the dispatcher, as
//! before. Each placed attempt reserves its worker's slot as it is placed
//! (`Registry::reserve`); the reservations of attempts the transaction did not create after all
//! (it failed, or was retried with new ids) are given back. A placed attempt is attempt 1 of
//! a new instance: no other node ever sees it WAITING, so it needs no dispatch marker, and its
//! start lock is taken after the commit, before it is sent.

use std::collections::HashMap;

use ax_core::dispatch_plan::route_at_creation;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::limits::limits_for;
use ax_core::placement::{Candidate, Wanted};
use ax_store::{NewAttempt, PlacedAttempt, Placement, Report};

use crate::dispatcher::{Claimed, Ready, dispatch_message, lock_ttl, send_claimed};
use crate::guards::StartLock;
use crate::node::Node;
use crate::registry::WorkerSlot;
use crate::reporter::Envelope;

/// The placement of one transaction on this node's workers.
pub struct PlaceNow<'a> {
    node: &'a Node,
    /// The node's slots, read at the first offer: most transactions (a batch of starts and
    /// heartbeats) create nothing and never read them.
    slots: Option<Vec<WorkerSlot>>,
    /// The worker (and its stream) each placed instance reserved a slot on.
    reserved: HashMap<InstanceId, (String, u64)>,
}

impl<'a> PlaceNow<'a> {
    pub fn new(node: &'a Node) -> PlaceNow<'a> {
        PlaceNow {
            node,
            slots: None,
            reserved: HashMap::new(),
        }
    }

    /// Sends what the transaction placed (it has committed) and gives back every other
    /// reservation.
    pub async fn send(mut self, placed: Vec<PlacedAttempt>) {
        let node = self.node;
        let any = !placed.is_empty();
        for placed in placed {
            let instance = placed.attempt.instance_id;
            let Some((worker, connection)) = self.reserved.remove(&instance) else {
                continue;
            };
            let claimed = Claimed {
                worker: &worker,
                connection,
                instance,
                attempt: Attempt(1),
                ready_at: placed.attempt.created_at,
            };
            if !send_placed(node, &placed, &claimed).await {
                node.registry.release(&worker, instance, Attempt(1));
            }
        }
        if any {
            node.bump_progress();
        }
        self.abandon();
    }

    /// Gives back the reservations of attempts that were not created.
    pub fn abandon(mut self) {
        for (instance, (worker, _)) in self.reserved.drain() {
            self.node.registry.release(&worker, instance, Attempt(1));
        }
    }
}

/// Sends one placed attempt; false when it was undone without reaching `send_claimed`.
async fn send_placed(node: &Node, placed: &PlacedAttempt, claimed: &Claimed<'_>) -> bool {
    let attempt = &placed.attempt;
    let spec = node
        .specs
        .cached(attempt.workflow_id, attempt.workflow_version);
    let task = spec.as_ref().and_then(|spec| spec.task(&attempt.task));
    let (Some(spec), Some(task)) = (spec.as_ref(), task) else {
        return undo(node, claimed, "its workflow version left the node's memory").await;
    };
    let ttl = lock_ttl(node, task.timeout_ms);
    if let StartLock::HeldBy(holder) = node
        .guards
        .acquire_start(claimed.instance, claimed.attempt, ttl)
        .await
    {
        // A new instance's first attempt has no earlier one; a lock held means a guard store
        // out of step with this one. The dispatcher decides again.
        tracing::warn!(instance = %claimed.instance, holder = %holder, "start lock of a new instance held; leaving it to the dispatcher");
        return undo(node, claimed, "start lock held").await;
    }
    let ready = Ready {
        instance: claimed.instance,
        run: attempt.run_id,
        workflow_id: attempt.workflow_id,
        attempt: claimed.attempt,
        logical_time: placed.logical_time,
        params: &placed.params,
        shard: None,
    };
    let (message, span) = dispatch_message(node, spec, task, &ready, claimed.worker, Vec::new());
    send_claimed(node, claimed, message, &span).await;
    true
}

/// Puts a placed attempt back to WAITING (never sent, so the same attempt may go out again).
async fn undo(node: &Node, claimed: &Claimed<'_>, reason: &str) -> bool {
    let report = Report::Rejected {
        instance_id: claimed.instance,
        attempt: claimed.attempt,
        worker_id: Some(claimed.worker.to_string()),
        reason: format!("not sent at creation: {reason}"),
        withdrawn: false,
        dispatched_at: None,
    };
    let _ = node
        .reports
        .send(Envelope::decided(claimed.worker, report))
        .await;
    false
}

impl Placement for PlaceNow<'_> {
    fn node_id(&self) -> &str {
        &self.node.options.node_id
    }

    fn place(&mut self, attempt: &NewAttempt) -> Option<String> {
        let node = self.node;
        if node.standing.is_cut_off() {
            return None;
        }
        let slots = self.slots.get_or_insert_with(|| node.registry.slots());
        if !slots
            .iter()
            .any(|slot| slot.accepting && slot.running < slot.capacity)
        {
            return None;
        }
        let spec = node
            .specs
            .cached(attempt.workflow_id, attempt.workflow_version)?;
        let task = spec.task(&attempt.task)?;
        let limited = !limits_for(
            attempt.workflow_id,
            task,
            spec.spec.concurrency.max_running_tasks,
            &node.options.pools,
        )
        .is_empty();
        let key = format!("{}/{}", spec.name, task.name);
        let route = route_at_creation(
            task.routing,
            node.options.strategy,
            &key,
            limited,
            !task.secret_env.is_empty(),
        )?;
        let candidates: Vec<Candidate<'_>> = slots.iter().map(WorkerSlot::candidate).collect();
        // Taken for this choice only, never across the transaction: a dispatch pass that holds
        // it is not kept waiting on a commit, and meanwhile its instances stay WAITING for it.
        let wanted = Wanted {
            labels: &task.labels,
            app: &spec.spec.app,
        };
        let chosen = node.placer.try_lock().ok()?.choose_routed(
            route,
            &candidates,
            &wanted,
            rand::random(),
        )?;
        let slot = &mut slots[chosen];
        if !node
            .registry
            .reserve(&slot.id, slot.connection, attempt.instance_id, Attempt(1))
        {
            slot.running = slot.capacity;
            return None;
        }
        slot.running += 1;
        self.reserved
            .insert(attempt.instance_id, (slot.id.clone(), slot.connection));
        Some(slot.id.clone())
    }
}
