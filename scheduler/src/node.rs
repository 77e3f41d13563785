//! What the gRPC and web services hold: handles to the node's parts, made once in
//! [`crate::start`]. The node's loops do not reach through it; each is given the handles it
//! needs when it is built.

use std::sync::Arc;

use ax_store::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::SchedulerOptions;
use crate::audit_writer::AuditWriter;
use crate::auth::Gate;
use crate::dag_layouts::DagLayouts;
use crate::log_writer::Logs;
use crate::membership::Standing;
use crate::metrics::{Metrics, Scraped};
use crate::progress::Progress;
use crate::registry::Registry;
use crate::reporter::Reports;
use crate::run_creator::RunCreator;
use crate::secrets::Secrets;
use crate::specs::SpecCache;
use crate::telemetry::Traces;
use crate::wake::Wake;
use crate::worker_refusals::WorkerRefusals;
use crate::worker_rows::WorkerRows;

pub struct Node {
    pub options: SchedulerOptions,
    /// Silence after which a worker is dead (the heartbeat interval times the missed beats).
    pub worker_dead_after_ms: ax_core::Millis,
    /// Whether the node reaches its store: cut off, it serves no worker.
    pub standing: Arc<Standing>,
    pub store: Arc<dyn Store>,
    pub registry: Arc<Registry>,
    pub specs: Arc<SpecCache>,
    /// Worker reports, to the reporter.
    pub reports: Reports,
    /// Log lines, to the log writer.
    pub logs: Logs,
    /// Creates runs in groups (one transaction per burst of triggers).
    pub runs: RunCreator,
    /// Records audit rows in groups (one transaction per burst of control calls).
    pub audit: AuditWriter,
    /// Who may call what (tokens); every request on the port passes it.
    pub gate: Arc<Gate>,
    /// Worker Registers and frames this node refused, counted and audited.
    pub refusals: Arc<WorkerRefusals>,
    /// Secrets for dispatches and log masking.
    pub secrets: Arc<Secrets>,
    /// Saves workers' rows; heartbeat refreshes are written in groups.
    pub worker_rows: Arc<WorkerRows>,
    /// Wakes the dispatcher: new WAITING instances, or a worker with a free slot.
    pub dispatch_wake: Wake,
    /// Wakes the cron loop: a schedule was applied, paused or resumed.
    pub schedule_wake: Wake,
    /// Laid-out task graphs by workflow version, for the web UI.
    pub dag_layouts: DagLayouts,
    /// The spans of runs, when the process exports traces.
    pub traces: Traces,
    pub metrics: Arc<Metrics>,
    /// `GET /metrics`.
    pub scraped: Scraped,
    /// Bumped whenever runs, instances or logs change, for followers (`logs -f`).
    pub progress: Progress,
    /// Where the services' own tasks run (a worker's stream, a log follower), so that
    /// shutdown waits for them.
    pub tasks: TaskTracker,
    /// Cancelled when the node stops serving: the services' tasks end.
    pub stopping: CancellationToken,
}

impl Node {
    pub fn bump_progress(&self) {
        self.progress.bump();
    }

    pub fn watch_progress(&self) -> watch::Receiver<u64> {
        self.progress.watch()
    }
}
