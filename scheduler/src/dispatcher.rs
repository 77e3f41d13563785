//! Sends WAITING instances to live workers.
//!
//! One pass: read a batch of WAITING instances (highest priority first), gather what deciding
//! them needs (their workflow versions, limits and secrets, the limits' counters in one read,
//! this node's worker slots), then ask the plan (`ax_core::dispatch_plan::Planner`, pure) about
//! each instance in turn and carry out its answer: reserve the chosen slot and prepare the
//! dispatch, fan a sharded task out, fail a shard whose worker is gone, or note why it waits.
//! The plan asks for the cluster's worker records when a rule needs them, and is told when a
//! reservation fails. Then record the decisions once, take the guards (start lock, dedup
//! marker), claim the dispatches in one transaction (conditional WAITING → DISPATCHED, which
//! also takes the limits race-free), and send. Persist, then send: a dispatch a worker never
//! received is still recorded and comes back. The rules of the plan (limits, labels,
//! routes across nodes, shards, NoWorker and Throttled) are described and tested there.
//!
//! In a cluster every node runs this, each placing instances on the workers connected to it; the
//! conditional claim lets one node win each attempt. Each node reads its own share of the queue
//! first (instance id modulo the live nodes holding workers), then whatever has waited
//! `TAKE_OTHERS_AFTER_MS` in any share. An instance that only another node's workers can take,
//! or whose `consistent_hash`/`failover` route picks a worker on another node, is left to that
//! node, which finds it at its next pass (woken by its own events, or within `IDLE_POLL`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::dispatch_plan::{
    Action, ClusterWorker, NeedsCluster, Planner, Settings, Slot, Waiting,
};
use ax_core::ids::InstanceId;
use ax_core::limits::{Limit, limits_for};
use ax_core::placement::Wanted;
use ax_core::placement::{Placer, Strategy};
use ax_core::spec::Routing;
use ax_store::{
    DecisionRecord, DispatchClaim, Store, SubWorkflowStart, SubWorkflowStarted, WaitingInstance,
    WorkerRecord,
};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::dispatch_send::{Claimed, DispatchSender, Ready, outcome};
use crate::guards::{Guards, StartLock};
use crate::membership::Standing;
use crate::progress::Progress;
use crate::registry::{Registry, WorkerSlot};
use crate::reporter::Reports;
use crate::secrets::Secrets;
use crate::specs::{SpecCache, VersionedSpec};
use crate::to_worker::Dispatch;
use crate::wake::Wake;
use crate::watching::Watching;

/// WAITING instances read per pass.
const BATCH: u32 = 512;
/// When a whole batch is held back (limits, no worker for its labels), the next read looks this
/// much deeper, so that lower-priority instances behind throttled ones still go.
const DEEPEST: u32 = 8192;
/// Once-only decisions remembered per node before the memory is cleared (the store dedups too).
const MEMO_LIMIT: usize = 100_000;

/// The decisions this node already recorded: (instance, kind, detail).
#[derive(Default)]
pub struct DecisionMemo {
    seen: HashSet<(InstanceId, DecisionKind, String)>,
}

impl DecisionMemo {
    /// True the first time this node sees (instance, kind, detail).
    fn first(&mut self, instance: InstanceId, kind: DecisionKind, detail: &str) -> bool {
        if self.seen.len() >= MEMO_LIMIT {
            self.seen.clear();
        }
        self.seen.insert((instance, kind, detail.to_string()))
    }

    fn forget(&mut self, instance: InstanceId, kind: DecisionKind, detail: &str) {
        self.seen.remove(&(instance, kind, detail.to_string()));
    }
}
/// How long an attempt's dedup marker lives. It guards the moment between the marker and the
/// claim: once the claim commits, the attempt is no longer WAITING and the claim itself keeps it
/// single (an attempt put back WAITING has its marker cleared). A node killed between the two
/// leaves a marker that holds the instance back this long at most, not for the attempt's life.
const DISPATCH_MARKER_TTL: Duration = Duration::from_secs(30);

/// With several nodes, each reads its own share of the WAITING queue first (instance id modulo
/// the live nodes), so nodes do not all plan and claim the same instances; then it takes what
/// has waited this long in any share: a dead node's, one only this node's workers can run, or
/// one whose node has no free slot. A node with room takes its share within a pass or two, and
/// a pass takes up to about 50 ms on a loaded MySQL, so an instance this old is one its owner
/// cannot take now: taken sooner, the nodes would race their owners' claims; left longer, free
/// slots idle beside a full node (a second here was most of three nodes' p99 at 500 triggers/s,
/// each node's workers filling in turn while the others had room).
const TAKE_OTHERS_AFTER_MS: Millis = 200;

/// How often, at most, the dispatcher looks for `run_workflow` tasks to start outside its
/// batches (which read only as deep as its workers have room): they take no worker, so they go
/// even when every slot is full.
const SUB_WORKFLOWS_EVERY: Duration = Duration::from_millis(100);
/// `run_workflow` tasks started per look.
const SUB_WORKFLOWS_PER_LOOK: u32 = 256;

/// How often the dispatcher looks without being woken (retries whose backoff ended, a start
/// lock that expired).
const IDLE_POLL: Duration = Duration::from_millis(500);

/// How often a node of several looks while it is busy (woken within [`BUSY_FOR`]) and has free
/// slots. Another node's trigger that found no free slot there creates its instance WAITING in
/// this node's share, and nothing wakes this node for it: at a hundred triggers a second over
/// three nodes, waiting for this node's own next event was most of its p99 (54 ms against 18
/// on one node). An idle cluster still looks every `IDLE_POLL`.
const BUSY_POLL: Duration = Duration::from_millis(20);
/// How long after its last wake-up a node counts as busy.
const BUSY_FOR: Duration = Duration::from_secs(1);

/// The dispatcher: its settings, the node's parts it reads and writes, and what it remembers
/// between passes.
pub struct Dispatcher {
    node_id: String,
    strategy: Strategy,
    pools: BTreeMap<String, u32>,
    worker_dead_after_ms: Millis,
    store: Arc<Store>,
    registry: Arc<Registry>,
    guards: Arc<dyn Guards>,
    specs: Arc<SpecCache>,
    secrets: Arc<Secrets>,
    /// Worker choice, shared with placements at creation (`place_now.rs`).
    placer: Arc<tokio::sync::Mutex<Placer>>,
    sender: DispatchSender,
    reports: Reports,
    standing: Arc<Standing>,
    watching: Arc<Watching>,
    progress: Progress,
    /// Wakes it: new WAITING instances, or a worker with a free slot.
    wake: Wake,
    /// Throttled and NoWorker decisions this node already recorded.
    decisions: std::sync::Mutex<DecisionMemo>,
    /// When it last looked for `run_workflow` tasks outside its batches.
    sub_workflows_looked: std::sync::Mutex<Option<std::time::Instant>>,
}

/// What the dispatcher is built from besides its handles.
pub struct DispatcherOptions {
    pub node_id: String,
    pub strategy: Strategy,
    pub pools: BTreeMap<String, u32>,
    pub worker_dead_after_ms: Millis,
}

/// The node's parts the dispatcher works with.
pub struct DispatcherParts {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub guards: Arc<dyn Guards>,
    pub specs: Arc<SpecCache>,
    pub secrets: Arc<Secrets>,
    pub placer: Arc<tokio::sync::Mutex<Placer>>,
    pub sender: DispatchSender,
    pub reports: Reports,
    pub standing: Arc<Standing>,
    pub watching: Arc<Watching>,
    pub progress: Progress,
    pub wake: Wake,
}

impl Dispatcher {
    pub fn new(options: DispatcherOptions, parts: DispatcherParts) -> Dispatcher {
        Dispatcher {
            node_id: options.node_id,
            strategy: options.strategy,
            pools: options.pools,
            worker_dead_after_ms: options.worker_dead_after_ms,
            store: parts.store,
            registry: parts.registry,
            guards: parts.guards,
            specs: parts.specs,
            secrets: parts.secrets,
            placer: parts.placer,
            sender: parts.sender,
            reports: parts.reports,
            standing: parts.standing,
            watching: parts.watching,
            progress: parts.progress,
            wake: parts.wake,
            decisions: Default::default(),
            sub_workflows_looked: Default::default(),
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut woken_at = std::time::Instant::now();
        loop {
            // A node cut off from its store claims nothing (its workers are moving elsewhere) until
            // the store answers again.
            if !self.standing.is_cut_off()
                && let Err(err) = self.dispatch_ready().await
            {
                self.watching.store_failed(&err);
                tracing::error!(error = %err, "dispatch pass failed");
            }
            let poll = if self.standing.share().is_some()
                && woken_at.elapsed() < BUSY_FOR
                && free_slots(&self.registry.slots()) > 0
            {
                BUSY_POLL
            } else {
                IDLE_POLL
            };
            tokio::select! {
                _ = self.wake.notified() => woken_at = std::time::Instant::now(),
                _ = tokio::time::sleep(poll) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// Dispatches until nothing more can go out now.
    async fn dispatch_ready(&self) -> anyhow::Result<()> {
        self.start_waiting_sub_workflows().await?;
        loop {
            // Read about as many waiting instances as there are free slots (twice, so instances no
            // free worker can take do not hide the ones behind them), not a whole batch each time
            // a slot frees up.
            let free = free_slots(&self.registry.slots());
            if free == 0 {
                return Ok(());
            }
            let mut limit = free.saturating_mul(2).clamp(32, BATCH);
            let share = self.standing.share();
            let mut own_share = share.is_some();
            loop {
                // Each read plans on the slots as they are now: the pass before it (its own share)
                // may have filled some, and a plan on an older copy sends past a worker's capacity.
                let slots = self.registry.slots();
                let free = free_slots(&slots);
                if free == 0 {
                    return Ok(());
                }
                let started = std::time::Instant::now();
                let waiting = match share {
                    Some(share) if own_share => {
                        self.store.waiting_share(now_ms(), limit, share).await?
                    }
                    Some(_) => {
                        self.store
                            .waiting(now_ms() - TAKE_OTHERS_AFTER_MS, limit)
                            .await?
                    }
                    None => self.store.waiting(now_ms(), limit).await?,
                };
                let read_us = started.elapsed().as_micros() as u64;
                let full_batch = waiting.len() as u32 == limit;
                let pass = self.dispatch_batch(slots, waiting).await?;
                tracing::debug!(
                    free,
                    read_us,
                    sent = pass.sent,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "dispatch pass"
                );
                if pass.fanned_out {
                    // New shards are waiting: read again.
                    break;
                }
                if pass.sent > 0 && full_batch {
                    break;
                }
                if pass.sent == 0 && full_batch && pass.held_back && limit < DEEPEST {
                    limit = limit.saturating_mul(4).min(DEEPEST);
                    continue;
                }
                if own_share {
                    // Its own share is done for now: what others left waiting comes next.
                    own_share = false;
                    continue;
                }
                return Ok(());
            }
        }
    }

    /// Starts the WAITING `run_workflow` tasks the store lists, at most every
    /// [`SUB_WORKFLOWS_EVERY`]: those the batches reach are started there, these are the ones
    /// behind a full set of worker slots.
    async fn start_waiting_sub_workflows(&self) -> anyhow::Result<()> {
        {
            let mut looked = self
                .sub_workflows_looked
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if looked.is_some_and(|at| at.elapsed() < SUB_WORKFLOWS_EVERY) {
                return Ok(());
            }
            *looked = Some(std::time::Instant::now());
        }
        let waiting = self
            .store
            .waiting_sub_workflows(now_ms(), SUB_WORKFLOWS_PER_LOOK)
            .await?;
        for (instance, attempt) in waiting {
            self.start_sub_workflow(instance, attempt).await?;
        }
        Ok(())
    }

    /// Marks a `run_workflow` task's attempt started and starts its child run, in one
    /// transaction (`Store::start_sub_workflow`): exactly one child per attempt.
    async fn start_sub_workflow(
        &self,
        instance: InstanceId,
        attempt: ax_core::ids::Attempt,
    ) -> anyhow::Result<()> {
        let start = SubWorkflowStart {
            instance_id: instance,
            attempt,
            node_id: self.node_id.clone(),
            now: now_ms(),
        };
        match self.store.start_sub_workflow(&start).await? {
            SubWorkflowStarted::Started { child } => {
                tracing::info!(instance = %instance, attempt = %attempt, child = %child.id, workflow = %child.workflow, "sub-workflow started");
            }
            SubWorkflowStarted::Failed { reason } => {
                tracing::warn!(instance = %instance, attempt = %attempt, %reason, "sub-workflow could not start");
            }
            SubWorkflowStarted::NotWaiting => return Ok(()),
        }
        // The child's first tasks (or the parent's retry, the tasks below a failed start) wait
        // now: the next pass reads them.
        self.wake.notify_one();
        self.progress.bump();
        Ok(())
    }

    /// The plan's settings, from the node's options.
    fn plan_settings(&self) -> Settings {
        Settings {
            strategy: self.strategy,
            worker_dead_after_ms: self.worker_dead_after_ms,
        }
    }

    fn decision(
        &self,
        item: &WaitingInstance,
        kind: DecisionKind,
        detail: String,
        now: Millis,
    ) -> DecisionRecord {
        DecisionRecord {
            at: now,
            workflow_id: item.instance.workflow_id,
            slot_at: now,
            run_id: Some(item.instance.run_id),
            instance_id: Some(item.instance.id),
            task: Some(item.instance.task.clone()),
            kind,
            detail,
            node_id: self.node_id.clone(),
        }
    }

    /// One batch: gather its inputs, plan and place it, record the decisions, then claim and send.
    async fn dispatch_batch(
        &self,
        slots: Vec<WorkerSlot>,
        waiting: Vec<WaitingInstance>,
    ) -> anyhow::Result<Pass> {
        let now = now_ms();
        let mut pass = Pass {
            sent: 0,
            held_back: false,
            fanned_out: false,
        };
        let (items, used) = self.gather(waiting).await?;
        let mut placed = Placed::default();
        if let Err(err) = self
            .plan_and_place(slots, used, now, items, &mut placed)
            .await
        {
            // Nothing planned is claimed: its slots are free again.
            for plan in &placed.planned {
                let waiting = &plan.waiting.instance;
                self.registry
                    .release(&plan.worker, waiting.id, waiting.attempt);
            }
            return Err(err);
        }
        let Placed {
            planned,
            decisions,
            held_back,
            fanned_out,
        } = placed;
        pass.held_back = held_back;
        pass.fanned_out = fanned_out;
        self.record_once(decisions).await;
        if !planned.is_empty() {
            pass.sent = self.claim_and_send(planned).await?;
        }
        Ok(pass)
    }

    /// Takes the guards of the planned dispatches, claims them in one transaction, and sends those
    /// this node won; returns how many were sent.
    async fn claim_and_send(&self, planned: Vec<Planned>) -> anyhow::Result<usize> {
        // The fast guards: a retry whose previous attempt may still hold the start lock waits,
        // and an attempt that was already dispatched is not dispatched again.
        let mut guarded = Vec::with_capacity(planned.len());
        for plan in planned {
            let instance = plan.waiting.instance.id;
            let attempt = plan.waiting.instance.attempt;
            match self
                .guards
                .acquire_start(instance, attempt, plan.lock_ttl)
                .await
            {
                StartLock::Acquired | StartLock::Unavailable => {}
                StartLock::HeldBy(holder) => {
                    self.registry.release(&plan.worker, instance, attempt);
                    outcome(&plan.span, "start lock held");
                    tracing::info!(instance = %instance, attempt = %attempt, holder = %holder, "start lock held by an earlier attempt; waiting");
                    continue;
                }
            }
            if self
                .guards
                .mark_dispatch(instance, attempt, DISPATCH_MARKER_TTL)
                .await
                == Some(false)
            {
                self.registry.release(&plan.worker, instance, attempt);
                outcome(&plan.span, "duplicate");
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
                node_id: self.node_id.clone(),
                at: now,
                limits: plan.limits.clone(),
            })
            .collect();
        let won = match self.store.mark_dispatched(&claims).await {
            Ok(won) => won,
            Err(err) => {
                // Nothing was claimed: the markers must not hold these attempts back.
                for plan in &guarded {
                    let waiting = &plan.waiting.instance;
                    self.registry
                        .release(&plan.worker, waiting.id, waiting.attempt);
                    self.guards
                        .clear_dispatch(waiting.id, waiting.attempt)
                        .await;
                }
                return Err(err.into());
            }
        };

        let mut sent = 0;
        for (plan, won) in guarded.into_iter().zip(won) {
            let instance = plan.waiting.instance.id;
            let attempt = plan.waiting.instance.attempt;
            if !won {
                // Another node claimed it first (it owns the guards now), or a limit filled up on
                // another node since the counters were read (it stays WAITING for a later pass).
                outcome(&plan.span, "not claimed");
                self.registry.release(&plan.worker, instance, attempt);
                self.guards.clear_dispatch(instance, attempt).await;
                continue;
            }
            let waiting = &plan.waiting.instance;
            let claimed = Claimed {
                worker: &plan.worker,
                connection: plan.connection,
                instance,
                attempt,
                ready_at: waiting.created_at.max(waiting.not_before),
            };
            match self.sender.send(&claimed, plan.message, &plan.span) {
                Ok(()) => sent += 1,
                Err(undone) => self.reports.put_back(undone).await,
            }
        }
        self.progress.bump();
        Ok(sent)
    }

    /// The batch's workflow versions, limits and secrets, then the counters of every limited scope
    /// in one read. A task that names secrets gets them here, or why this node cannot give them:
    /// its app's, else global ones, never another app's (checked at each dispatch, not only at
    /// apply, so a secret deleted or an app changed since cannot lead elsewhere). A sharded task's
    /// parent is never sent: its shards get them.
    async fn gather(
        &self,
        waiting: Vec<WaitingInstance>,
    ) -> anyhow::Result<(Vec<Gathered>, BTreeMap<String, u32>)> {
        let mut items = Vec::with_capacity(waiting.len());
        let mut scopes: BTreeSet<String> = BTreeSet::new();
        for item in waiting {
            let instance = &item.instance;
            let spec = self
                .specs
                .get(instance.workflow_id, instance.workflow_version)
                .await?;
            let Some(task) = spec.task(&instance.task) else {
                tracing::error!(instance = %instance.id, task = %instance.task, "task missing from its workflow version");
                continue;
            };
            if task.run_workflow.is_some() {
                // No worker runs it: its child run is started here, in the claim's stead.
                self.start_sub_workflow(instance.id, instance.attempt)
                    .await?;
                continue;
            }
            let limits = limits_for(
                instance.workflow_id,
                task,
                spec.spec.concurrency.max_running_tasks,
                &self.pools,
            );
            scopes.extend(limits.iter().map(|limit| limit.scope.clone()));
            let sharded_parent = task.routing == Routing::ShardedBroadcast && item.shard.is_none();
            let secrets = if task.secret_env.is_empty() || sharded_parent {
                Ok(Vec::new())
            } else {
                self.secrets
                    .environment(&spec.spec.app, &task.secret_env)
                    .await?
            };
            items.push(Gathered {
                waiting: item,
                spec,
                limits,
                secrets,
            });
        }
        let used = if scopes.is_empty() {
            BTreeMap::new()
        } else {
            let scopes: Vec<String> = scopes.into_iter().collect();
            self.store.limit_usage(&scopes).await?
        };
        Ok((items, used))
    }

    /// Asks the plan about each instance in priority order and carries out its answer: reserves
    /// and prepares the dispatches, fans out and fails shards, collects the decisions to record.
    /// The slots are this node's as the pass read them; `used`, the limits' counters.
    async fn plan_and_place(
        &self,
        slots: Vec<WorkerSlot>,
        used: BTreeMap<String, u32>,
        now: Millis,
        items: Vec<Gathered>,
        placed: &mut Placed,
    ) -> anyhow::Result<()> {
        let slots = slots.into_iter().map(plan_slot).collect();
        let mut placer = self.placer.lock().await;
        let mut plan = Planner::new(self.plan_settings(), now, slots, used, &mut placer);
        for gathered in items {
            let Gathered {
                waiting: item,
                spec,
                limits,
                secrets,
            } = gathered;
            let instance = &item.instance;
            let Some(task) = spec.task(&instance.task) else {
                continue;
            };
            let key = format!("{}/{}", spec.name, task.name);
            let pinned = item
                .shard
                .as_ref()
                .and_then(|shard| shard.worker.as_deref());
            let ask = Waiting {
                instance: instance.id,
                attempt: instance.attempt,
                key: &key,
                routing: task.routing,
                wanted: Wanted {
                    labels: &task.labels,
                    app: &spec.spec.app,
                },
                limits: &limits,
                pinned,
                secrets_unavailable: secrets.as_ref().err().map(String::as_str),
            };
            let action = loop {
                match plan.decide(&ask, rand::random()) {
                    Ok(action) => break action,
                    Err(NeedsCluster) => {
                        let workers = self.store.list_workers().await?;
                        plan.learn_cluster(workers.into_iter().map(cluster_worker).collect());
                    }
                }
            };
            placed.held_back |= action.holds_back();
            match action {
                Action::Dispatch { worker, connection } => {
                    // Reserved now, so a placement elsewhere on this node (a run created, an
                    // advance) cannot fill the slot before this claim commits.
                    if !self
                        .registry
                        .reserve(&worker, connection, instance.id, instance.attempt)
                    {
                        plan.refused(&ask, &worker);
                        continue;
                    }
                    let ready = Ready {
                        instance: instance.id,
                        run: instance.run_id,
                        workflow_id: instance.workflow_id,
                        attempt: instance.attempt,
                        logical_time: item.logical_time,
                        params: &item.params,
                        run_env: &item.run_env,
                        outputs: &item.run_outputs,
                        shard: item.shard.as_ref(),
                    };
                    let secret_env = secrets.unwrap_or_default();
                    let (message, span) = self
                        .sender
                        .message(&spec, task, &ready, &worker, secret_env);
                    placed.planned.push(Planned {
                        span,
                        worker,
                        connection,
                        lock_ttl: self.sender.lock_ttl(task.timeout_ms),
                        waiting: item,
                        message,
                        limits,
                    });
                }
                Action::FanOut { workers } => {
                    if self
                        .store
                        .fan_out(instance.id, instance.attempt, &workers, now)
                        .await?
                    {
                        tracing::info!(instance = %instance.id, shards = workers.len(), "sharded task fanned out");
                        placed.fanned_out = true;
                    }
                }
                Action::FailShard { reason } => {
                    if self
                        .store
                        .fail_shard(instance.id, instance.attempt, &reason, now)
                        .await?
                    {
                        tracing::warn!(instance = %instance.id, worker = pinned, "shard failed: its worker is gone");
                    }
                }
                Action::Hold { kind, detail } => {
                    placed
                        .decisions
                        .push(self.decision(&item, kind, detail, now));
                }
                Action::LeaveToOtherNode | Action::Wait => {}
            }
        }
        Ok(())
    }

    /// Records decisions this node has not recorded before; the store skips those another node
    /// recorded. A failure is logged: explanations never stop dispatching.
    async fn record_once(&self, decisions: Vec<DecisionRecord>) {
        let fresh: Vec<DecisionRecord> = {
            let mut memo = self
                .decisions
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            decisions
                .into_iter()
                .filter(|d| {
                    d.instance_id
                        .is_some_and(|id| memo.first(id, d.kind, &d.detail))
                })
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        if let Err(err) = self.store.record_decisions_once(&fresh).await {
            tracing::warn!(error = %err, "recording dispatch decisions failed");
            // Forget them, so a later pass tries again.
            let mut memo = self
                .decisions
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for d in &fresh {
                if let Some(id) = d.instance_id {
                    memo.forget(id, d.kind, &d.detail);
                }
            }
        }
    }
}

/// Free slots on the workers that take attempts now.
fn free_slots(slots: &[WorkerSlot]) -> u32 {
    slots
        .iter()
        .filter(|slot| slot.accepting)
        .map(|slot| slot.capacity.saturating_sub(slot.running))
        .sum()
}

struct Pass {
    sent: usize,
    /// Some instance was throttled or found no worker for its labels.
    held_back: bool,
    /// A sharded task fanned out.
    fanned_out: bool,
}

/// A slot of this node's registry, as the plan sees it.
fn plan_slot(slot: WorkerSlot) -> Slot {
    Slot {
        id: slot.id,
        connection: slot.connection,
        labels: slot.labels,
        apps: slot.apps,
        capacity: slot.capacity,
        running: slot.running,
        accepting: slot.accepting,
    }
}

/// A worker record of the store, as the plan sees it.
fn cluster_worker(row: WorkerRecord) -> ClusterWorker {
    ClusterWorker {
        id: row.id,
        labels: row.labels,
        apps: row.apps,
        capacity: row.capacity,
        running: row.running,
        draining: row.draining,
        connected: row.connected,
        last_heartbeat: row.last_heartbeat,
    }
}

/// A WAITING instance with what its plan and its dispatch need: its workflow version, the
/// limits it counts against, and its secrets' values (none when its task names none) or why
/// this node cannot give them.
struct Gathered {
    waiting: WaitingInstance,
    spec: Arc<VersionedSpec>,
    limits: Vec<Limit>,
    secrets: Result<Vec<(String, String)>, String>,
}

struct Planned {
    /// The dispatch's span when the node exports traces; it ends when the plan is dropped.
    span: Option<tracing::Span>,
    waiting: WaitingInstance,
    worker: String,
    connection: u64,
    message: Dispatch,
    lock_ttl: Duration,
    limits: Vec<Limit>,
}

/// What a batch's plan left to do once placed: the dispatches reserved and prepared, and the
/// decisions to record.
#[derive(Default)]
struct Placed {
    planned: Vec<Planned>,
    decisions: Vec<DecisionRecord>,
    /// Some instance was held back (`Action::holds_back`).
    held_back: bool,
    /// A sharded task fanned out.
    fanned_out: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_new_once_per_instance_kind_and_detail() {
        let mut memo = DecisionMemo::default();
        let (a, b) = (InstanceId(1), InstanceId(2));
        assert!(memo.first(a, DecisionKind::Throttled, "task limit 2 reached"));
        assert!(!memo.first(a, DecisionKind::Throttled, "task limit 2 reached"));
        assert!(memo.first(a, DecisionKind::Throttled, "pool limit 4 reached"));
        assert!(memo.first(a, DecisionKind::NoWorker, "task limit 2 reached"));
        assert!(memo.first(b, DecisionKind::Throttled, "task limit 2 reached"));
        memo.forget(a, DecisionKind::Throttled, "task limit 2 reached");
        assert!(memo.first(a, DecisionKind::Throttled, "task limit 2 reached"));
    }
}
