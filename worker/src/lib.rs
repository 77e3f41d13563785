//! The ax worker: holds a stream to a scheduler node and runs dispatched attempts.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Everything a worker needs to start.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Scheduler endpoints (`http://host:port`); the worker connects to one at a time and moves
    /// to the next when a stream breaks.
    pub endpoints: Vec<String>,
    pub worker_id: String,
    pub labels: BTreeMap<String, String>,
    /// Attempts run at once.
    pub capacity: u32,
    pub heartbeat_interval: Duration,
    pub task_heartbeat_interval: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            endpoints: vec!["http://127.0.0.1:7070".into()],
            worker_id: "worker".into(),
            labels: BTreeMap::new(),
            capacity: 20,
            heartbeat_interval: Duration::from_secs(5),
            task_heartbeat_interval: Duration::from_secs(30),
        }
    }
}

/// Runs the worker until `shutdown` is cancelled, then stops taking work, lets running attempts
/// finish and reports them, and returns.
pub async fn run(options: WorkerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let _ = shutdown;
    anyhow::bail!(
        "worker not built yet ({} endpoints)",
        options.endpoints.len()
    )
}
