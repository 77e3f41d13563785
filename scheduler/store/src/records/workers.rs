//! A worker's row: what it registered with and its last heartbeat.

use std::collections::BTreeMap;

use ax_core::Millis;

#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRecord {
    pub id: String,
    pub version: String,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub running: u32,
    pub started_at: Millis,
    pub last_heartbeat: Millis,
    pub node_id: String,
    pub draining: bool,
    pub connected: bool,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<Vec<String>>,
    /// The incarnation its worker process registered with (empty: none), so another node can
    /// tell the same process moving from a second one.
    pub incarnation: String,
}
