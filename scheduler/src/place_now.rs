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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ax_core::dispatch_plan::route_at_creation;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::limits::limits_for;
use ax_core::placement::{Candidate, Placer, Strategy, Wanted};
use ax_store::{NewAttempt, PlacedAttempt, Placement};

use crate::dispatch_send::{Claimed, DispatchSender, Ready, Undone};
use crate::guards::{Guards, StartLock};
use crate::membership::Standing;
use crate::progress::Progress;
use crate::registry::{Registry, WorkerSlot};
use crate::specs::SpecCache;

/// Places new tasks on this node's workers; clones share the node's parts. Each transaction
/// that creates tasks takes a [`PlaceNow`] of it.
#[derive(Clone)]
pub struct Placing {
    node_id: String,
    strategy: Strategy,
    pools: Arc<BTreeMap<String, u32>>,
    standing: Arc<Standing>,
    registry: Arc<Registry>,
    specs: Arc<SpecCache>,
    placer: Arc<tokio::sync::Mutex<Placer>>,
    guards: Arc<dyn Guards>,
    sender: DispatchSender,
    progress: Progress,
}

/// The node's parts a placement works with.
pub struct PlacingParts {
    pub standing: Arc<Standing>,
    pub registry: Arc<Registry>,
    pub specs: Arc<SpecCache>,
    pub placer: Arc<tokio::sync::Mutex<Placer>>,
    pub guards: Arc<dyn Guards>,
    pub sender: DispatchSender,
    pub progress: Progress,
}

impl Placing {
    pub fn new(
        node_id: String,
        strategy: Strategy,
        pools: BTreeMap<String, u32>,
        parts: PlacingParts,
    ) -> Placing {
        Placing {
            node_id,
            strategy,
            pools: Arc::new(pools),
            standing: parts.standing,
            registry: parts.registry,
            specs: parts.specs,
            placer: parts.placer,
            guards: parts.guards,
            sender: parts.sender,
            progress: parts.progress,
        }
    }

    /// The placement of one transaction.
    pub fn begin(&self) -> PlaceNow<'_> {
        PlaceNow {
            placing: self,
            slots: None,
            reserved: HashMap::new(),
        }
    }

    /// Sends one placed attempt, or gives it back undone.
    async fn send_placed(
        &self,
        placed: &PlacedAttempt,
        claimed: &Claimed<'_>,
    ) -> Result<(), Undone> {
        let attempt = &placed.attempt;
        let spec = self
            .specs
            .cached(attempt.workflow_id, attempt.workflow_version);
        let task = spec.as_ref().and_then(|spec| spec.task(&attempt.task));
        let (Some(spec), Some(task)) = (spec.as_ref(), task) else {
            return Err(self.undo(claimed, "its workflow version left the node's memory"));
        };
        let ttl = self.sender.lock_ttl(task.timeout_ms);
        if let StartLock::HeldBy(holder) = self
            .guards
            .acquire_start(claimed.instance, claimed.attempt, ttl)
            .await
        {
            // A new instance's first attempt has no earlier one; a lock held means a guard
            // store out of step with this one. The dispatcher decides again.
            tracing::warn!(instance = %claimed.instance, holder = %holder, "start lock of a new instance held; leaving it to the dispatcher");
            return Err(self.undo(claimed, "start lock held"));
        }
        let ready = Ready {
            instance: claimed.instance,
            run: attempt.run_id,
            workflow_id: attempt.workflow_id,
            attempt: claimed.attempt,
            logical_time: placed.logical_time,
            params: &placed.params,
            run_env: &placed.run_env,
            outputs: &placed.run_outputs,
            shard: None,
        };
        let (message, span) = self
            .sender
            .message(spec, task, &ready, claimed.worker, Vec::new());
        self.sender.send(claimed, message, &span)
    }

    /// Gives back a placed attempt's slot; it goes back to WAITING (never sent, so the same
    /// attempt may go out again).
    fn undo(&self, claimed: &Claimed<'_>, reason: &str) -> Undone {
        self.registry
            .release(claimed.worker, claimed.instance, claimed.attempt);
        Undone::new(claimed, format!("not sent at creation: {reason}"))
    }
}

/// The placement of one transaction on this node's workers.
pub struct PlaceNow<'a> {
    placing: &'a Placing,
    /// The node's slots, read at the first offer: most transactions (a batch of starts and
    /// heartbeats) create nothing and never read them.
    slots: Option<Vec<WorkerSlot>>,
    /// The worker (and its stream) each placed instance reserved a slot on.
    reserved: HashMap<InstanceId, (String, u64)>,
}

impl PlaceNow<'_> {
    /// Sends what the transaction placed (it has committed) and gives back every other
    /// reservation; returns the placed attempts that were not sent, to put back WAITING.
    pub async fn send(mut self, placed: Vec<PlacedAttempt>) -> Vec<Undone> {
        let placing = self.placing;
        let any = !placed.is_empty();
        let mut undone = Vec::new();
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
            if let Err(not_sent) = placing.send_placed(&placed, &claimed).await {
                undone.push(not_sent);
            }
        }
        if any {
            placing.progress.bump();
        }
        self.abandon();
        undone
    }

    /// Gives back the reservations of attempts that were not created.
    pub fn abandon(mut self) {
        for (instance, (worker, _)) in self.reserved.drain() {
            self.placing.registry.release(&worker, instance, Attempt(1));
        }
    }
}

impl Placement for PlaceNow<'_> {
    fn node_id(&self) -> &str {
        &self.placing.node_id
    }

    fn place(&mut self, attempt: &NewAttempt) -> Option<String> {
        let placing = self.placing;
        if placing.standing.is_cut_off() {
            return None;
        }
        let slots = self.slots.get_or_insert_with(|| placing.registry.slots());
        if !slots
            .iter()
            .any(|slot| slot.accepting && slot.running < slot.capacity)
        {
            return None;
        }
        let spec = placing
            .specs
            .cached(attempt.workflow_id, attempt.workflow_version)?;
        let task = spec.task(&attempt.task)?;
        if task.run_workflow.is_some() {
            // A sub-workflow runs on no worker: the dispatcher starts its child run.
            return None;
        }
        let limited = !limits_for(
            attempt.workflow_id,
            task,
            spec.spec.concurrency.max_running_tasks,
            &placing.pools,
        )
        .is_empty();
        let key = format!("{}/{}", spec.name, task.name);
        let route = route_at_creation(
            task.routing,
            placing.strategy,
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
        let chosen = placing.placer.try_lock().ok()?.choose_routed(
            route,
            &candidates,
            &wanted,
            rand::random(),
        )?;
        let slot = &mut slots[chosen];
        if !placing
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
