//! The ax scheduler node: decides what runs now (cron + dependencies), dispatches it to workers
//! over their streams, and records every transition in the store.

use std::net::SocketAddr;
use std::time::Duration;

pub use ax_core::placement::Strategy;

/// Everything a scheduler node needs to start. `Default` is the embedded single-node setup.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// gRPC listen address (port 0 picks a free port; see [`RunningScheduler::local_addr`]).
    pub listen: SocketAddr,
    /// `sqlite://PATH` (embedded default) or `mysql://USER:PASS@HOST:PORT/DB`.
    pub store_url: String,
    /// With Redis, dispatch dedup markers and start locks go through it; else in-process.
    pub redis_url: Option<String>,
    /// This node's name in the cluster (worker records, leases, logs).
    pub node_id: String,
    pub strategy: Strategy,
    /// Expected worker heartbeat interval (layer 1).
    pub heartbeat_interval: Duration,
    /// Expected task heartbeat interval (layer 2).
    pub task_heartbeat_interval: Duration,
    /// A worker silent for this many heartbeat intervals is dead.
    pub dead_after_missed_heartbeats: u32,
    /// How long the log writer waits to fill a batch.
    pub log_flush_interval: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            store_url: "sqlite://.ax/ax.db".into(),
            redis_url: None,
            node_id: "node-1".into(),
            strategy: Strategy::LeastRunning,
            heartbeat_interval: Duration::from_secs(5),
            task_heartbeat_interval: Duration::from_secs(30),
            dead_after_missed_heartbeats: 4,
            log_flush_interval: Duration::from_millis(20),
        }
    }
}

/// A started scheduler node. Dropping it does not stop it; call [`RunningScheduler::shutdown`].
pub struct RunningScheduler {
    local_addr: SocketAddr,
}

impl RunningScheduler {
    /// The address the gRPC server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, drains, flushes logs and returns.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Opens the store, runs migrations, binds the listener and starts serving.
pub async fn start(options: SchedulerOptions) -> anyhow::Result<RunningScheduler> {
    anyhow::bail!("scheduler not built yet (listen {})", options.listen)
}
