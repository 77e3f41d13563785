//! What every part of one scheduler node shares.

use std::sync::Arc;

use ax_core::placement::Placer;
use ax_store::Store;
use tokio::sync::{Mutex, Notify, watch};

use crate::SchedulerOptions;
use crate::alerts::Alerter;
use crate::audit_writer::{AuditRows, AuditWriter};
use crate::guards::Guards;
use crate::log_writer::LogWriter;
use crate::registry::Registry;
use crate::reporter::ReportSender;
use crate::run_creator::{NewRuns, RunCreator};
use crate::specs::SpecCache;
use crate::worker_rows::WorkerRows;

pub struct Node {
    pub options: SchedulerOptions,
    /// Whether the node reaches its store: cut off, it dispatches nothing and serves no worker.
    pub standing: Arc<crate::membership::Standing>,
    pub store: Arc<Store>,
    pub guards: Arc<dyn Guards>,
    pub registry: Registry,
    pub specs: SpecCache,
    pub placer: Mutex<Placer>,
    pub reports: ReportSender,
    pub logs: LogWriter,
    /// Creates runs in groups (one transaction per burst of triggers).
    pub runs: RunCreator,
    /// Records audit rows in groups (one transaction per burst of control calls).
    pub audit: AuditWriter,
    /// Who may call what (tokens); every request on the port passes it.
    pub gate: Arc<crate::auth::Gate>,
    /// Worker Registers and frames this node refused, counted and audited.
    pub refusals: Arc<crate::worker_refusals::WorkerRefusals>,
    /// Secrets for dispatches and log masking.
    pub secrets: crate::secrets::Secrets,
    /// Saves workers' rows; heartbeat refreshes are written in groups.
    pub worker_rows: Arc<WorkerRows>,
    pub alerter: Alerter,
    /// Wakes the dispatcher: new WAITING instances, or a worker with a free slot.
    pub dispatch_wake: Notify,
    /// Wakes the cron loop: a schedule was applied, paused or resumed.
    pub schedule_wake: Notify,
    /// Since when this node has been able to see its workers (the liveness backstop's grace).
    pub watching: crate::backstop::Watching,
    /// Throttled and NoWorker decisions this node already recorded.
    pub decisions: std::sync::Mutex<crate::dispatcher::DecisionMemo>,
    /// Laid-out task graphs by workflow version, for the web UI.
    pub dag_layouts: crate::dag_layouts::DagLayouts,
    /// The spans of runs, dispatches and report batches, when the process exports traces.
    pub traces: Option<crate::telemetry::Traces>,
    /// The node's Prometheus metrics (`GET /metrics`).
    pub metrics: crate::metrics::Metrics,
    /// What the connection limits did (`connections.rs`), for the metrics.
    pub connections: Arc<crate::connections::ConnectionCounters>,
    /// Bumped whenever runs, instances or logs change, for followers (`logs -f`).
    progress: watch::Sender<u64>,
}

impl Node {
    pub fn new(
        options: SchedulerOptions,
        standing: Arc<crate::membership::Standing>,
        store: Arc<Store>,
        guards: Arc<dyn Guards>,
        reports: ReportSender,
        logs: LogWriter,
        alerter: Alerter,
    ) -> Node {
        let audit = AuditWriter::start(AuditRows(store.clone()));
        let mut metrics = crate::metrics::Metrics::new();
        let connections = Arc::new(crate::connections::ConnectionCounters::default());
        metrics.register_readings(crate::metrics::Readings {
            alerter: alerter.clone(),
            guards: guards.clone(),
            standing: standing.clone(),
            logs: logs.clone(),
            connections: connections.clone(),
        });
        Node {
            connections,
            traces: crate::telemetry::Traces::installed(),
            metrics,
            placer: Mutex::new(Placer::new(options.strategy)),
            specs: SpecCache::new(store.clone()),
            runs: RunCreator::start(NewRuns::new(store.clone())),
            gate: Arc::new(crate::auth::Gate::new(
                options.auth,
                options.auth_failures_per_address,
                store.clone(),
                audit.clone(),
            )),
            refusals: Arc::new(crate::worker_refusals::WorkerRefusals::new(audit.clone())),
            audit,
            secrets: crate::secrets::Secrets::new(options.secret_key.clone(), store.clone()),
            worker_rows: WorkerRows::start(store.clone(), options.heartbeat_interval),
            registry: Registry::new(),
            options,
            standing,
            store,
            guards,
            reports,
            logs,
            alerter,
            dispatch_wake: Notify::new(),
            schedule_wake: Notify::new(),
            watching: crate::backstop::Watching::new(crate::clock::now_ms()),
            decisions: Default::default(),
            dag_layouts: Default::default(),
            progress: watch::channel(0).0,
        }
    }

    pub fn bump_progress(&self) {
        self.progress.send_modify(|generation| *generation += 1);
    }

    pub fn watch_progress(&self) -> watch::Receiver<u64> {
        self.progress.subscribe()
    }
}
