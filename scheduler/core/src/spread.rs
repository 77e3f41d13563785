//! Spreading workers over the scheduler nodes: how many workers each live node holds, and which
//! worker, if any, a node asks to move where.
//!
//! A node's fair share is ceil(workers / live nodes). A node holding more than its share plus a
//! tolerance (a tenth of the share, so a large fleet does not churn over one worker) asks one
//! of its workers to move to the live node holding the fewest, choosing the worker running the
//! fewest attempts (the cheapest to re-attach). One worker per decision: the node decides once
//! per interval, so moves spread over time and a lopsided cluster evens out without a storm of
//! reconnects. Counts come from rows other nodes write now and then, so two nodes may both send
//! a worker to the same light node; the next decisions even that out, and no move is ever asked
//! towards a node that already holds its share.

use std::collections::{BTreeMap, HashSet};

use crate::Millis;

/// A node whose lease is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    pub node_id: String,
    /// Where workers reach it, as its lease says.
    pub address: String,
}

/// A worker's row as the store has it: which node it is connected to, and when that node last
/// refreshed the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSeen {
    pub worker_id: String,
    pub node_id: String,
    pub connected: bool,
    pub last_heartbeat: Millis,
}

/// How many workers a live node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoad {
    pub node_id: String,
    pub address: String,
    pub workers: u32,
}

/// One of this node's workers that may be asked to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub worker_id: String,
    /// Attempts in flight on it.
    pub running: u32,
}

/// What a node asks: `worker_id` to go to `to_node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub worker_id: String,
    pub to_node: String,
    pub to_address: String,
    /// Workers this node holds, its fair share, and the workers `to_node` holds.
    pub holding: u32,
    pub share: u32,
    pub target_holds: u32,
}

/// ceil(workers / nodes); 0 without nodes.
pub fn fair_share(workers: u32, nodes: u32) -> u32 {
    if nodes == 0 {
        0
    } else {
        workers.div_ceil(nodes)
    }
}

/// How far past its share a node may hold before it asks a worker to move.
pub fn tolerance(share: u32) -> u32 {
    share / 10
}

/// The workers each live node holds. This node's (`me`) are the ids connected to it now
/// (`mine`), exact; another node's are the rows naming it that say connected and were
/// refreshed within `fresh_ms` of `now`. A worker counts once: where this node sees it, else
/// where its row says. A row naming this node for a worker not connected here is stale.
pub fn census(
    me: &str,
    mine: &[String],
    nodes: &[LiveNode],
    rows: &[WorkerSeen],
    now: Millis,
    fresh_ms: Millis,
) -> Vec<NodeLoad> {
    let live: HashSet<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    let here: HashSet<&str> = mine.iter().map(String::as_str).collect();
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for row in rows {
        let counted = row.connected
            && row.node_id != me
            && live.contains(row.node_id.as_str())
            && !here.contains(row.worker_id.as_str())
            && now - row.last_heartbeat <= fresh_ms;
        if counted {
            *counts.entry(row.node_id.as_str()).or_default() += 1;
        }
    }
    nodes
        .iter()
        .map(|node| NodeLoad {
            node_id: node.node_id.clone(),
            address: node.address.clone(),
            workers: if node.node_id == me {
                here.len() as u32
            } else {
                counts.get(node.node_id.as_str()).copied().unwrap_or(0)
            },
        })
        .collect()
}

/// The one move `me` should ask for now, if any: none while fewer than two nodes are live or
/// `me` is not among them, none while `me` holds at most its share plus the tolerance, none
/// towards a node that holds its share already, none without a candidate.
pub fn choose_move(me: &str, loads: &[NodeLoad], candidates: &[Candidate]) -> Option<Move> {
    if loads.len() < 2 {
        return None;
    }
    let holding = loads.iter().find(|load| load.node_id == me)?.workers;
    let total: u32 = loads.iter().map(|load| load.workers).sum();
    let share = fair_share(total, loads.len() as u32);
    if holding <= share + tolerance(share) {
        return None;
    }
    let target = loads
        .iter()
        .filter(|load| load.node_id != me && !load.address.is_empty())
        .min_by(|a, b| (a.workers, &a.node_id).cmp(&(b.workers, &b.node_id)))?;
    if target.workers >= share {
        return None;
    }
    let worker = candidates
        .iter()
        .min_by(|a, b| (a.running, &a.worker_id).cmp(&(b.running, &b.worker_id)))?;
    Some(Move {
        worker_id: worker.worker_id.clone(),
        to_node: target.node_id.clone(),
        to_address: target.address.clone(),
        holding,
        share,
        target_holds: target.workers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(counts: &[(&str, u32)]) -> Vec<NodeLoad> {
        counts
            .iter()
            .map(|(id, workers)| NodeLoad {
                node_id: id.to_string(),
                address: format!("http://{id}:7070"),
                workers: *workers,
            })
            .collect()
    }

    fn candidates(running: &[(&str, u32)]) -> Vec<Candidate> {
        running
            .iter()
            .map(|(id, running)| Candidate {
                worker_id: id.to_string(),
                running: *running,
            })
            .collect()
    }

    fn live(ids: &[&str]) -> Vec<LiveNode> {
        ids.iter()
            .map(|id| LiveNode {
                node_id: id.to_string(),
                address: format!("http://{id}:7070"),
            })
            .collect()
    }

    fn row(worker: &str, node: &str, connected: bool, last_heartbeat: Millis) -> WorkerSeen {
        WorkerSeen {
            worker_id: worker.into(),
            node_id: node.into(),
            connected,
            last_heartbeat,
        }
    }

    #[test]
    fn the_share_is_the_ceiling_and_the_tolerance_a_tenth_of_it() {
        assert_eq!(fair_share(6, 3), 2);
        assert_eq!(fair_share(7, 3), 3);
        assert_eq!(fair_share(0, 3), 0);
        assert_eq!(fair_share(5, 0), 0);
        assert_eq!(tolerance(2), 0);
        assert_eq!(tolerance(334), 33);
    }

    #[test]
    fn an_overloaded_node_sends_its_least_busy_worker_to_the_lightest_node() {
        let moved = choose_move(
            "a",
            &loads(&[("a", 4), ("b", 2), ("c", 0)]),
            &candidates(&[("w1", 3), ("w2", 0), ("w3", 1), ("w0", 0)]),
        )
        .expect("a holds 4 of 6 on three nodes");
        assert_eq!(
            moved,
            Move {
                worker_id: "w0".into(),
                to_node: "c".into(),
                to_address: "http://c:7070".into(),
                holding: 4,
                share: 2,
                target_holds: 0,
            }
        );
    }

    #[test]
    fn no_move_within_the_share_with_one_node_or_without_candidates() {
        let some = candidates(&[("w1", 0)]);
        // 7 workers on 3 nodes: a share of 3, held.
        assert_eq!(
            choose_move("a", &loads(&[("a", 3), ("b", 3), ("c", 1)]), &some),
            None
        );
        // Two nodes holding their share each.
        assert_eq!(choose_move("a", &loads(&[("a", 3), ("b", 3)]), &some), None);
        assert_eq!(choose_move("a", &loads(&[("a", 9)]), &some), None);
        assert_eq!(choose_move("a", &loads(&[("a", 6), ("b", 0)]), &[]), None);
        // A node not among the live ones asks nothing.
        assert_eq!(choose_move("z", &loads(&[("a", 0), ("b", 0)]), &some), None);
        // A large fleet: 36 over a share of 34 is within the tolerance of 3.
        assert_eq!(
            choose_move("a", &loads(&[("a", 36), ("b", 34), ("c", 31)]), &some),
            None
        );
        assert!(choose_move("a", &loads(&[("a", 38), ("b", 34), ("c", 29)]), &some).is_some());
    }

    #[test]
    fn a_node_without_an_address_is_no_target_and_ties_go_by_node_id() {
        let mut nodes = loads(&[("a", 5), ("b", 0), ("c", 0), ("d", 1)]);
        nodes[1].address.clear();
        let moved = choose_move("a", &nodes, &candidates(&[("w1", 0)])).expect("a move");
        assert_eq!(moved.to_node, "c");
    }

    /// Repeated decisions, one move per node per round, even a lopsided cluster out and stop.
    #[test]
    fn rounds_of_single_moves_converge_and_stop() {
        let mut counts = vec![6u32, 0, 0];
        let ids = ["a", "b", "c"];
        for _round in 0..10 {
            let view: Vec<(&str, u32)> = ids.iter().copied().zip(counts.iter().copied()).collect();
            let mut moves = Vec::new();
            for (index, id) in ids.iter().enumerate() {
                let mine: Vec<(&str, u32)> = (0..counts[index]).map(|_| ("w", 0)).collect();
                if let Some(moved) = choose_move(id, &loads(&view), &candidates(&mine)) {
                    moves.push((index, ids.iter().position(|n| *n == moved.to_node).unwrap()));
                }
            }
            for (from, to) in moves {
                counts[from] -= 1;
                counts[to] += 1;
            }
        }
        assert_eq!(counts, [2, 2, 2]);
    }

    #[test]
    fn the_census_counts_each_worker_once_where_it_is_connected_and_fresh() {
        let nodes = live(&["a", "b", "c"]);
        let now = 100_000;
        let rows = [
            // b's two fresh workers count for b.
            row("w1", "b", true, now - 1_000),
            row("w2", "b", true, now - 20_000),
            // Too old, or not connected: not counted.
            row("w3", "b", true, now - 20_001),
            row("w4", "c", false, now),
            // Connected to a node whose lease is not live.
            row("w5", "gone", true, now),
            // Connected here now, though its row still names c: counted here only.
            row("w6", "c", true, now),
            // Its row names this node, but it is not connected here: stale.
            row("w7", "a", true, now),
        ];
        let mine = vec!["w6".to_string(), "w8".to_string()];
        let counts: Vec<(String, u32)> = census("a", &mine, &nodes, &rows, now, 20_000)
            .into_iter()
            .map(|load| (load.node_id, load.workers))
            .collect();
        assert_eq!(
            counts,
            [
                ("a".to_string(), 2),
                ("b".to_string(), 2),
                ("c".to_string(), 0)
            ]
        );
    }
}
