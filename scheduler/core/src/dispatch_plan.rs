//! The dispatch plan: what one dispatcher pass does with each WAITING instance, decided from
//! what the pass gathered and the time.
//!
//! The dispatcher (`scheduler/src/dispatcher.rs`) gathers its inputs (this node's worker slots,
//! the limits' counters, the secrets, and the cluster's worker records when a rule needs them),
//! asks a [`Planner`] for each instance in priority order, and carries out the [`Action`] it
//! gets: reserve the slot and send, fan out, fail a shard, record why the instance waits. The
//! planner does no I/O and reads no clock, so each rule is tested here with a fake clock, the
//! way `liveness` is. It is a sans-IO state machine: it keeps what the pass has planned so far
//! (slots filling up, limit units taken, the round-robin cursor), and it is told what happened
//! outside ([`Planner::refused`] when a reservation failed, [`Planner::learn_cluster`] when it
//! asked for the cluster's workers).
//!
//! The rules, in the order they apply to one instance:
//! - A sharded task's parent is never placed: it fans out into one shard per live worker of the
//!   cluster that may serve it (connected, heard from within the dead-worker threshold, not
//!   draining, its token allowing the app, carrying the labels), or waits as NoWorker when there
//!   is none.
//! - A task whose secrets this node cannot give waits, recorded as SecretUnavailable.
//! - An instance over one of its limits (task, workflow, pool) waits, recorded as Throttled. It
//!   takes a unit of each limit only when it goes to a worker here, and gives them back when
//!   its slot's reservation fails: one that goes elsewhere or nowhere holds none, so a
//!   lower-priority instance of the pass may use them.
//! - A worker is chosen by the task's route (`placement::Route`). A plain strategy chooses among
//!   this node's workers; `consistent_hash` and `failover` choose among the cluster's live
//!   workers (draining ones count as full), and an instance whose worker is on another node is
//!   left to that node.
//! - With no worker chosen: a shard waits for its own worker, and fails once that worker is gone
//!   for good (no record of it heard from within the threshold); an instance no worker here may
//!   serve is left to the other nodes, recorded as NoWorker when no live worker of the cluster
//!   may serve it; otherwise it waits for a free slot.
//!
//! The cluster's workers are a store read, asked for ([`NeedsCluster`]) only when a rule needs
//! them, once a pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::Millis;
use crate::decision::DecisionKind;
use crate::ids::{Attempt, InstanceId};
use crate::limits::{Fitter, Limit};
use crate::placement::{Candidate, Placer, Route, Strategy, Wanted, any_may_serve};
use crate::spec::Routing;

/// The node's settings the plan depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The configured placement strategy (a task's `routing` may override it).
    pub strategy: Strategy,
    /// Silence after which a worker is dead (`liveness::Intervals::worker_dead_after_ms`).
    pub worker_dead_after_ms: Millis,
}

/// A worker connected to this node, as the pass found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub id: String,
    /// The stream the slot was read from: a dispatch planned on it goes to that stream only.
    pub connection: u64,
    pub labels: BTreeMap<String, String>,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<Arc<[String]>>,
    pub capacity: u32,
    /// Attempts in flight or reserved on it, counting what this pass planned.
    pub running: u32,
    pub accepting: bool,
}

impl Slot {
    /// The slot as placement weighs it.
    pub fn candidate(&self) -> Candidate<'_> {
        Candidate {
            id: &self.id,
            labels: &self.labels,
            apps: self.apps.as_deref(),
            capacity: self.capacity,
            running: self.running,
            accepting: self.accepting,
        }
    }
}

/// A worker of the cluster as the store last heard of it, whichever node holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterWorker {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<Vec<String>>,
    pub capacity: u32,
    /// As of its last heartbeat.
    pub running: u32,
    pub draining: bool,
    /// Its stream to some node is open.
    pub connected: bool,
    pub last_heartbeat: Millis,
}

/// A WAITING instance as the plan needs it.
#[derive(Debug, Clone, Copy)]
pub struct Waiting<'a> {
    pub instance: InstanceId,
    pub attempt: Attempt,
    /// Its task's key for consistent hashing: `workflow/task`.
    pub key: &'a str,
    pub routing: Routing,
    /// Its task's labels and its workflow's app.
    pub wanted: Wanted<'a>,
    /// The limits it counts against (`limits::limits_for`).
    pub limits: &'a [Limit],
    /// The worker a shard is pinned to; `None` for anything but a shard.
    pub pinned: Option<&'a str>,
    /// Why this node cannot give the task its secrets, when it cannot.
    pub secrets_unavailable: Option<&'a str>,
}

impl Waiting<'_> {
    /// The parent of a sharded task (not one of its shards).
    fn is_sharded_parent(&self) -> bool {
        self.routing == Routing::ShardedBroadcast && self.pinned.is_none()
    }
}

/// What to do with one WAITING instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Reserve a slot on this node's worker (on that stream) and send it the attempt; tell the
    /// planner [`Planner::refused`] when the reservation fails.
    Dispatch { worker: String, connection: u64 },
    /// Fan the sharded parent out into one shard pinned to each of these workers (sorted ids).
    FanOut { workers: Vec<String> },
    /// Fail the shard: its worker is gone for good.
    FailShard { reason: String },
    /// It waits, held back for a reason worth recording once.
    Hold { kind: DecisionKind, detail: String },
    /// It waits for another node: only that node's workers may take it, or its route chose one
    /// of them. That node dispatches it at its next pass.
    LeaveToOtherNode,
    /// It waits for a free slot on a worker that may take it (or, for a shard, on its own).
    Wait,
}

impl Action {
    /// Whether the instance was held back by a limit, a missing secret or the lack of a worker
    /// here: lower-priority instances behind it may still go, so the dispatcher reads deeper.
    pub fn holds_back(&self) -> bool {
        matches!(self, Action::Hold { .. } | Action::LeaveToOtherNode)
    }
}

/// The plan needs the cluster's worker records: read them and call [`Planner::learn_cluster`],
/// then ask again for the same instance. Nothing changed in the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeedsCluster;

/// One pass's plan, decided instance by instance in priority order.
pub struct Planner<'p> {
    settings: Settings,
    now: Millis,
    slots: Vec<Slot>,
    fitter: Fitter,
    cluster: Option<Vec<ClusterWorker>>,
    placer: &'p mut Placer,
}

impl<'p> Planner<'p> {
    /// A plan on this node's `slots`, with the limits' counters as read (`used`, by scope), the
    /// node's placer (its round-robin cursor carries over between passes), at `now`.
    pub fn new(
        settings: Settings,
        now: Millis,
        slots: Vec<Slot>,
        used: BTreeMap<String, u32>,
        placer: &'p mut Placer,
    ) -> Planner<'p> {
        Planner {
            settings,
            now,
            slots,
            fitter: Fitter::new(used),
            cluster: None,
            placer,
        }
    }

    /// The cluster's worker records (every node's), asked for by [`NeedsCluster`].
    pub fn learn_cluster(&mut self, workers: Vec<ClusterWorker>) {
        self.cluster = Some(workers);
    }

    /// This node's slots, counting what the plan placed on them.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// What to do with `item`, the next instance in priority order. `random` is any random
    /// number (the `random` strategy uses it).
    pub fn decide(&mut self, item: &Waiting<'_>, random: u64) -> Result<Action, NeedsCluster> {
        if item.is_sharded_parent() {
            let workers = self.live_with(&item.wanted)?;
            if workers.is_empty() {
                return self.no_worker(&item.wanted);
            }
            return Ok(Action::FanOut { workers });
        }
        if let Some(why) = item.secrets_unavailable {
            return Ok(Action::Hold {
                kind: DecisionKind::SecretUnavailable,
                detail: why.to_string(),
            });
        }
        if let Some(full) = self.fitter.first_full(item.limits) {
            return Ok(throttled(full));
        }
        let route = Route::for_task(item.routing, self.settings.strategy, item.key, item.pinned);
        let chosen = if route.spans_the_cluster() {
            match self.choose_in_cluster(route, &item.wanted, random)? {
                Chosen::Here(index) => Some(index),
                Chosen::Elsewhere => return Ok(Action::LeaveToOtherNode),
                Chosen::Nobody => None,
            }
        } else {
            let candidates: Vec<Candidate<'_>> = self.slots.iter().map(Slot::candidate).collect();
            self.placer
                .choose_routed(route, &candidates, &item.wanted, random)
        };
        let Some(index) = chosen else {
            return self.unplaced(item);
        };
        // Its limit units are taken only now that it goes to a worker here (there was room
        // above, and nothing took any since).
        if let Err(full) = self.fitter.take(item.limits) {
            return Ok(throttled(full));
        }
        let slot = &mut self.slots[index];
        slot.running += 1;
        Ok(Action::Dispatch {
            worker: slot.id.clone(),
            connection: slot.connection,
        })
    }

    /// The reservation of `item`'s [`Action::Dispatch`] on `worker` failed (the slot filled up
    /// or its stream changed since the slots were read): the worker counts as full for the rest
    /// of the pass, and the instance's limit units are given back.
    pub fn refused(&mut self, item: &Waiting<'_>, worker: &str) {
        self.fitter.give_back(item.limits);
        if let Some(slot) = self.slots.iter_mut().find(|slot| slot.id == worker) {
            slot.running = slot.capacity;
        }
    }

    /// No worker was chosen (it took no limit unit).
    fn unplaced(&self, item: &Waiting<'_>) -> Result<Action, NeedsCluster> {
        if let Some(worker) = item.pinned {
            let here = self.slots.iter().any(|slot| slot.id == worker);
            if !here && self.gone_for_good(worker)? {
                return Ok(Action::FailShard {
                    reason: format!("worker {worker} of this shard is gone"),
                });
            }
            return Ok(Action::Wait);
        }
        let candidates: Vec<Candidate<'_>> = self.slots.iter().map(Slot::candidate).collect();
        if any_may_serve(&candidates, &item.wanted) {
            return Ok(Action::Wait);
        }
        if self.live_with(&item.wanted)?.is_empty() {
            return self.no_worker(&item.wanted);
        }
        Ok(Action::LeaveToOtherNode)
    }

    fn cluster(&self) -> Result<&[ClusterWorker], NeedsCluster> {
        self.cluster.as_deref().ok_or(NeedsCluster)
    }

    fn is_live(&self, worker: &ClusterWorker) -> bool {
        worker.last_heartbeat >= self.now - self.settings.worker_dead_after_ms
    }

    /// Chooses by a route that spans the cluster among every live worker: this node's from its
    /// slots (exact, and counting what this pass planned), the others' from their records (as
    /// of their last heartbeat).
    fn choose_in_cluster(
        &mut self,
        route: Route<'_>,
        wanted: &Wanted<'_>,
        random: u64,
    ) -> Result<Chosen, NeedsCluster> {
        let cluster = self.cluster.as_deref().ok_or(NeedsCluster)?;
        let dead_before = self.now - self.settings.worker_dead_after_ms;
        let mut everyone: Vec<Candidate<'_>> = self.slots.iter().map(Slot::candidate).collect();
        let here = everyone.len();
        everyone.extend(
            cluster
                .iter()
                .filter(|worker| worker.connected && worker.last_heartbeat >= dead_before)
                .filter(|worker| !self.slots.iter().any(|slot| slot.id == worker.id))
                .map(|worker| Candidate {
                    id: &worker.id,
                    labels: &worker.labels,
                    apps: worker.apps.as_deref(),
                    capacity: worker.capacity,
                    running: worker.running,
                    accepting: !worker.draining,
                }),
        );
        Ok(
            match self.placer.choose_routed(route, &everyone, wanted, random) {
                Some(index) if index < here => Chosen::Here(index),
                Some(_) => Chosen::Elsewhere,
                None => Chosen::Nobody,
            },
        )
    }

    /// Live workers of the cluster that may serve `wanted`, by id: connected, heard from within
    /// the dead-worker threshold, not draining.
    fn live_with(&self, wanted: &Wanted<'_>) -> Result<Vec<String>, NeedsCluster> {
        let mut ids: Vec<String> = self
            .cluster()?
            .iter()
            .filter(|w| w.connected && !w.draining && self.is_live(w))
            .filter(|w| {
                Candidate {
                    id: &w.id,
                    labels: &w.labels,
                    apps: w.apps.as_deref(),
                    capacity: w.capacity,
                    running: w.running,
                    accepting: true,
                }
                .may_serve(wanted)
            })
            .map(|w| w.id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// A worker is gone for good when the store has no record of it or has not heard from it
    /// within the dead-worker threshold.
    fn gone_for_good(&self, worker: &str) -> Result<bool, NeedsCluster> {
        Ok(!self
            .cluster()?
            .iter()
            .any(|w| w.id == worker && self.is_live(w)))
    }

    /// No live worker may serve `wanted`: a NoWorker decision saying what it needs, and its app
    /// when some live worker carries those labels but its token names other apps.
    fn no_worker(&self, wanted: &Wanted<'_>) -> Result<Action, NeedsCluster> {
        let carrying = self.cluster()?.iter().any(|w| {
            w.connected
                && !w.draining
                && self.is_live(w)
                && wanted
                    .labels
                    .iter()
                    .all(|(k, v)| w.labels.get(k) == Some(v))
        });
        let detail = if carrying {
            format!(
                "{} whose token allows app {}",
                labels_text(wanted.labels),
                wanted.app
            )
        } else {
            labels_text(wanted.labels)
        };
        Ok(Action::Hold {
            kind: DecisionKind::NoWorker,
            detail,
        })
    }
}

fn throttled(full: &Limit) -> Action {
    Action::Hold {
        kind: DecisionKind::Throttled,
        detail: full.reason(),
    }
}

/// Where a route spanning the cluster landed.
enum Chosen {
    /// On this node's slot of that index.
    Here(usize),
    /// On a worker another node holds.
    Elsewhere,
    /// Nowhere: no live worker may take it now.
    Nobody,
}

/// How an attempt placed at its creation on this node's workers (`place_now`, before it is ever
/// WAITING) is routed, or `None` when only a dispatcher pass may decide it: a task with limits
/// (their counters are the store's), with secrets (read at each dispatch), a sharded task, or
/// one whose route spans the cluster (the cluster's workers are the store's).
pub fn route_at_creation<'a>(
    routing: Routing,
    strategy: Strategy,
    key: &'a str,
    limited: bool,
    needs_secrets: bool,
) -> Option<Route<'a>> {
    if limited || needs_secrets || routing == Routing::ShardedBroadcast {
        return None;
    }
    let route = Route::for_task(routing, strategy, key, None);
    (!route.spans_the_cluster()).then_some(route)
}

/// The NoWorker detail for `labels`: "no live worker with labels gpu=a100,zone=east".
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "no live worker".into();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("no live worker with labels {}", pairs.join(","))
}

#[cfg(test)]
mod tests;
