//! Spreading workers over the nodes: every interval (with jitter) the node counts the workers
//! of every live node and, when it holds more than its share, asks one of its own workers to
//! move to the lightest node (`MoveElsewhere` on the worker's stream). The decision is
//! `ax_core::spread`'s; this loop reads the store and the registry and sends the request.
//!
//! Live nodes are those whose lease expires after the database's now, as
//! `Store::list_node_leases` returns it; another node's workers are its rows that say connected
//! and were refreshed within the dead-worker threshold; this node's are those in its registry.
//! The loop asks nothing during the node's start grace (one dead-worker threshold: workers are
//! still reconnecting, and dead nodes' rows still look fresh), and does not ask a worker again
//! for a while after asking it (ten intervals), so a worker that cannot or will not move is not
//! pestered. A worker asked is left out of dispatch for a few seconds (`Registry::ask_to_move`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ax_core::Millis;
use ax_core::spread::{Candidate, LiveNode, Move, WorkerSeen, census, choose_move};
use ax_store::Store;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::registry::Registry;
use crate::to_worker::ToWorker;

/// How long a worker asked to move is left out of dispatch: ample for a worker that follows
/// the request to leave, short for one that does not.
const MOVE_HOLD: Duration = Duration::from_secs(5);

/// Intervals after asking a worker during which it is not asked again.
const ASK_AGAIN_AFTER: u32 = 10;

/// The spreading loop: how often it looks, and the node's parts it reads and asks through.
pub struct Spread {
    node_id: String,
    /// `None`: the node never asks a worker to move.
    interval: Option<Duration>,
    worker_dead_after_ms: Millis,
    store: Arc<Store>,
    registry: Arc<Registry>,
}

impl Spread {
    pub fn new(
        node_id: String,
        interval: Option<Duration>,
        worker_dead_after_ms: Millis,
        store: Arc<Store>,
        registry: Arc<Registry>,
    ) -> Spread {
        Spread {
            node_id,
            interval,
            worker_dead_after_ms,
            store,
            registry,
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let Some(interval) = self.interval else {
            return;
        };
        let started = now_ms();
        let grace = self.worker_dead_after_ms;
        let ask_again_after = (interval * ASK_AGAIN_AFTER).as_millis() as Millis;
        let mut asked: HashMap<String, Millis> = HashMap::new();
        loop {
            // Jitter keeps the nodes' decisions apart, so each reads the others' last moves.
            let pause = interval.mul_f64(rand::rng().random_range(0.75..1.25));
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = cancel.cancelled() => return,
            }
            let now = now_ms();
            if now - started < grace {
                continue;
            }
            asked.retain(|_, at| now - *at < ask_again_after);
            match self.spread_once(&asked).await {
                Ok(Some(worker)) => {
                    asked.insert(worker, now);
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "spreading workers failed; trying again next interval")
                }
            }
        }
    }

    /// One decision: asks at most one worker to move; returns the one asked.
    async fn spread_once(&self, asked: &HashMap<String, Millis>) -> anyhow::Result<Option<String>> {
        let (db_now, leases) = self
            .store
            .list_node_leases()
            .await
            .context("listing node leases")?;
        let live: Vec<LiveNode> = leases
            .into_iter()
            .filter(|lease| lease.expires_at > db_now)
            .map(|lease| LiveNode {
                node_id: lease.node_id,
                address: lease.address,
            })
            .collect();
        if live.len() < 2 {
            return Ok(None);
        }
        let rows: Vec<WorkerSeen> = self
            .store
            .list_workers()
            .await
            .context("listing workers")?
            .into_iter()
            .map(|row| WorkerSeen {
                worker_id: row.id,
                node_id: row.node_id,
                connected: row.connected,
                last_heartbeat: row.last_heartbeat,
            })
            .collect();
        let slots = self.registry.slots();
        let mine: Vec<String> = slots.iter().map(|slot| slot.id.clone()).collect();
        let me = self.node_id.as_str();
        let fresh = self.worker_dead_after_ms;
        let loads = census(me, &mine, &live, &rows, db_now, fresh);
        let candidates: Vec<Candidate> = slots
            .iter()
            .filter(|slot| slot.accepting && !asked.contains_key(&slot.id))
            .map(|slot| Candidate {
                worker_id: slot.id.clone(),
                running: slot.running,
            })
            .collect();
        let Some(chosen) = choose_move(me, &loads, &candidates) else {
            return Ok(None);
        };
        let Some(connection) = slots
            .iter()
            .find(|slot| slot.id == chosen.worker_id)
            .map(|slot| slot.connection)
        else {
            return Ok(None);
        };
        Ok(self.ask(&chosen, connection).then_some(chosen.worker_id))
    }

    /// Sends the request on the worker's stream; false when it could not be queued.
    fn ask(&self, chosen: &Move, connection: u64) -> bool {
        let me = &self.node_id;
        let Some(outbox) = self
            .registry
            .ask_to_move(&chosen.worker_id, connection, MOVE_HOLD)
        else {
            return false;
        };
        let request = ToWorker::MoveElsewhere {
            reason: format!(
                "node {me} holds {} workers, more than its share of {}; node {} holds {}",
                chosen.holding, chosen.share, chosen.to_node, chosen.target_holds
            ),
            to_address: chosen.to_address.clone(),
        };
        // A full queue means the worker is far behind: it is left alone this time.
        if !outbox.tell(request) {
            self.registry.stay(&chosen.worker_id, connection);
            return false;
        }
        tracing::info!(
            worker = %chosen.worker_id,
            from_node = %me,
            to_node = %chosen.to_node,
            to_address = %chosen.to_address,
            holding = chosen.holding,
            share = chosen.share,
            "asked a worker to move to another node"
        );
        true
    }
}
