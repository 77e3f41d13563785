//! What `ControlService` and the web edge hold: handles to the node's parts, made once in
//! [`crate::start`] (the worker streams hold their own, `grpc::worker::Streams`). The node's
//! loops do not reach through it; each is given the handles it needs when it is built.

use std::sync::Arc;

use ax_store::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::SchedulerOptions;
use crate::admission::Admission;
use crate::audit_writer::AuditWriter;
use crate::auth::Gate;
use crate::dag_layouts::DagLayouts;
use crate::log_writer::Logs;
use crate::metrics::{Metrics, Scraped};
use crate::progress::Progress;
use crate::registry::Registry;
use crate::run_creator::RunCreator;
use crate::secrets::Secrets;
use crate::specs::SpecCache;
use crate::telemetry::Traces;
use crate::wake::Wake;

pub struct Node {
    pub options: SchedulerOptions,
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub specs: Arc<SpecCache>,
    /// The log writer, flushed before logs are read.
    pub logs: Logs,
    /// Creates runs in groups (one transaction per burst of triggers).
    pub runs: RunCreator,
    /// The bounds on waiting instances a trigger passes before it creates anything.
    pub admission: Arc<Admission>,
    /// Records audit rows in groups (one transaction per burst of control calls).
    pub audit: AuditWriter,
    /// Who may call what (tokens); every request on the port passes it.
    pub gate: Arc<Gate>,
    /// Secrets for dispatches and log masking.
    pub secrets: Arc<Secrets>,
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
    /// Where the services' own tasks run (log followers), so that shutdown waits for them.
    pub tasks: TaskTracker,
    /// Cancelled when the node stops serving (the first step of its shutdown): the streams a
    /// client follows (`WatchRun`, `GetLogs` with follow) end then, with UNAVAILABLE, so the
    /// server's connections close without waiting for them.
    pub serving: CancellationToken,
}

impl Node {
    pub fn bump_progress(&self) {
        self.progress.bump();
    }

    pub fn watch_progress(&self) -> watch::Receiver<u64> {
        self.progress.watch()
    }
}
