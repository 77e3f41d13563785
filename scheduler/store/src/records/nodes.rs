//! Scheduler nodes' leases, on the database's clock, and the answer to a claim of one.

use ax_core::Millis;

/// A scheduler node's lease: who holds the node id, where it listens, and until when. Times are
/// on the database's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLease {
    pub node_id: String,
    /// Random per process start: tells a restarted node from the one it replaces.
    pub incarnation: String,
    /// The address workers and clients reach the node at.
    pub address: String,
    pub version: String,
    pub started_at: Millis,
    pub renewed_at: Millis,
    pub expires_at: Millis,
    /// The node's clock minus the database's, as the node last measured it.
    pub clock_offset_ms: i64,
    /// Its `[pools]` as `name=limit` pairs in name order, comma-separated.
    pub pools: String,
}

/// What [`Store::claim_node_lease`](crate::Store::claim_node_lease) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseClaim {
    /// The lease is the caller's until `db_now + lease_ms`.
    Claimed { db_now: Millis },
    /// Live leases stand in the way: the same node id held by another incarnation, or (on
    /// SQLite, which serves one node) any other node.
    Refused {
        db_now: Millis,
        holders: Vec<NodeLease>,
    },
}
