//! The node's parts, built in one place: each component from its options and the handles it
//! needs, its loop spawned on the node's tasks to run until its token in the shutdown order
//! (`shutdown.rs`): the deciding loops until the server stops (`serving`), the queues until
//! they drain (`draining`). What the services hold comes out: [`Node`] and the worker
//! streams' [`Streams`].

use std::sync::Arc;

use ax_core::Millis;
use ax_core::liveness::Intervals;
use ax_core::placement::Placer;
use ax_store::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::SchedulerOptions;
use crate::alerts::Alerter;
use crate::auth::Gate;
use crate::connections::ConnectionCounters;
use crate::grpc::worker::Streams;
use crate::guards::Guards;
use crate::membership::Standing;
use crate::metrics::Scraped;
use crate::node::Node;
use crate::registry::Registry;
use crate::{
    admission, audit_writer, auth, backstop, clock, deadlines, dispatch_send, dispatcher,
    failure_alerts, grpc, log_writer, metrics, place_now, progress, registry, reporter, retention,
    run_creator, schedules, secrets, specs, spread, sub_workflows, telemetry, wake, watching,
    worker_refusals, worker_rows,
};

/// What `start` opened before the parts are built.
pub struct Opened {
    pub store: Arc<Store>,
    pub guards: Arc<dyn Guards>,
    pub alerter: Alerter,
    pub standing: Arc<Standing>,
}

/// Where the parts' loops run, and until when.
pub struct Runs<'a> {
    pub tasks: &'a TaskTracker,
    /// The deciding loops' token: the server stops with it.
    pub serving: &'a CancellationToken,
    /// The queues' token: they drain once it is cancelled.
    pub draining: &'a CancellationToken,
}

/// What the server and shutdown need of the built node.
pub struct Built {
    pub node: Arc<Node>,
    pub streams: Arc<Streams>,
    pub registry: Arc<Registry>,
    pub gate: Arc<Gate>,
    pub scraped: Scraped,
    pub connection_counters: Arc<ConnectionCounters>,
}

/// Builds every part of the node and starts its loops.
pub fn build(options: SchedulerOptions, opened: Opened, runs: Runs<'_>) -> Built {
    let Opened {
        store,
        guards,
        alerter,
        standing,
    } = opened;
    let Runs {
        tasks,
        serving,
        draining,
    } = runs;
    let node_id = options.node_id.clone();
    let intervals = liveness_intervals(&options);
    let worker_dead_after_ms = intervals.worker_dead_after_ms();
    let registry = Arc::new(registry::Registry::new());
    let specs = Arc::new(specs::SpecCache::new(store.clone()));
    let secrets = Arc::new(secrets::Secrets::new(
        options.secret_key.clone(),
        store.clone(),
    ));
    let placer = Arc::new(tokio::sync::Mutex::new(Placer::new(options.strategy)));
    let watching = Arc::new(watching::Watching::new(clock::now_ms()));
    let progress = progress::Progress::new();
    let dispatch_wake = wake::Wake::new();
    let connection_counters = Arc::new(ConnectionCounters::default());
    let spans = telemetry::SpanEmitter::new(store.clone(), node_id.clone());
    let traces = spans.handle();
    let audit = audit_writer::AuditWriter::start(
        audit_writer::AuditRows(store.clone()),
        tasks,
        draining.clone(),
    );
    let refusals = Arc::new(worker_refusals::WorkerRefusals::new(
        audit.clone(),
        tasks.clone(),
    ));
    let gate = Arc::new(auth::Gate::new(
        options.auth,
        options.auth_failures_per_address,
        store.clone(),
        audit.clone(),
        tasks.clone(),
    ));
    let metrics = Arc::new(metrics::Metrics::new());
    let admission = Arc::new(admission::Admission::new(
        options.admission,
        node_id.clone(),
        store.clone(),
        metrics.clone(),
    ));
    // The store asks it about the runs it creates that are never refused (cron and dependency
    // fires, child runs); a store opened for this node alone has none set before.
    store.set_waiting_bounds(admission.clone());
    let failure_alerts =
        failure_alerts::FailureAlerts::new(alerter.clone(), store.clone(), tasks.clone());
    let dispatch_sender = dispatch_send::DispatchSender::new(
        registry.clone(),
        metrics.clone(),
        traces.clone(),
        options.timeout_grace,
    );
    let placing = place_now::Placing::new(
        node_id.clone(),
        options.strategy,
        options.pools.clone(),
        place_now::PlacingParts {
            standing: standing.clone(),
            registry: registry.clone(),
            specs: specs.clone(),
            placer: placer.clone(),
            guards: guards.clone(),
            sender: dispatch_sender.clone(),
            progress: progress.clone(),
        },
    );
    let reporter = reporter::Reporter::new(reporter::BatchPath {
        store: store.clone(),
        placing: placing.clone(),
        registry: registry.clone(),
        guards: guards.clone(),
        metrics: metrics.clone(),
        traces: traces.clone(),
        refusals: refusals.clone(),
        alerts: failure_alerts.clone(),
        watching: watching.clone(),
        progress: progress.clone(),
        dispatch: dispatch_wake.clone(),
        secrets: secrets.clone(),
    });
    let reports = reporter.handle();
    let runs = run_creator::RunCreator::start(
        run_creator::NewRuns::new(store.clone(), specs.clone(), placing, reports.clone()),
        tasks,
        draining.clone(),
    );
    let log_writer = log_writer::LogWriter::new(
        options.log_flush_interval,
        log_writer::Writing {
            store: store.clone(),
            specs: specs.clone(),
            secrets: secrets.clone(),
            registry: registry.clone(),
            metrics: metrics.clone(),
            refusals: refusals.clone(),
            progress: progress.clone(),
        },
    );
    let logs = log_writer.handle();
    let worker_rows = worker_rows::WorkerRows::start(
        store.clone(),
        options.heartbeat_interval,
        tasks,
        draining.clone(),
    );
    let dispatcher = dispatcher::Dispatcher::new(
        dispatcher::DispatcherOptions {
            node_id: node_id.clone(),
            strategy: options.strategy,
            pools: options.pools.clone(),
            worker_dead_after_ms,
        },
        dispatcher::DispatcherParts {
            store: store.clone(),
            registry: registry.clone(),
            guards: guards.clone(),
            specs: specs.clone(),
            secrets: secrets.clone(),
            placer,
            sender: dispatch_sender,
            reports: reports.clone(),
            standing: standing.clone(),
            watching: watching.clone(),
            progress: progress.clone(),
            wake: dispatch_wake.clone(),
        },
    );
    let backstop = backstop::Backstop::new(
        node_id.clone(),
        intervals,
        options.heartbeat_interval,
        backstop::BackstopParts {
            store: store.clone(),
            registry: registry.clone(),
            reports: reports.clone(),
            alerts: failure_alerts,
            watching,
        },
    );
    let schedules = schedules::Schedules::new(
        node_id.clone(),
        schedules::SchedulesParts {
            store: store.clone(),
            specs: specs.clone(),
            runs: runs.clone(),
            registry: registry.clone(),
            metrics: metrics.clone(),
            traces: traces.clone(),
            progress: progress.clone(),
            dispatch: dispatch_wake.clone(),
        },
    );
    let schedule_wake = schedules.handle();
    let spread = spread::Spread::new(
        node_id.clone(),
        options.spread_interval,
        worker_dead_after_ms,
        store.clone(),
        registry.clone(),
    );
    let retention = retention::Retention::new(
        retention::RetentionOptions {
            node_id: node_id.clone(),
            retention: options.retention,
            audit_retention: options.audit_retention,
            purge_interval: options.purge_interval,
        },
        store.clone(),
        specs.clone(),
        metrics.clone(),
    );
    let deadlines = deadlines::Deadlines::new(
        node_id.clone(),
        deadlines::JUDGE_EVERY,
        deadlines::DeadlinesParts {
            store: store.clone(),
            specs: specs.clone(),
            registry: registry.clone(),
            alerter: alerter.clone(),
            metrics: metrics.clone(),
            traces: traces.clone(),
            progress: progress.clone(),
            dispatch: dispatch_wake.clone(),
        },
    );
    let sub_workflows = sub_workflows::SubWorkflows::new(
        sub_workflows::SWEEP_EVERY,
        sub_workflows::SubWorkflowsParts {
            store: store.clone(),
            registry: registry.clone(),
            progress: progress.clone(),
            dispatch: dispatch_wake.clone(),
        },
    );
    metrics.register_readings(metrics::Readings {
        alerter: alerter.clone(),
        guards: guards.clone(),
        standing: standing.clone(),
        queued_log_bytes: Box::new({
            let logs = logs.clone();
            move || logs.queued_bytes()
        }),
        connections: connection_counters.clone(),
    });

    // The queues drain after the server has stopped (`draining`).
    tasks.spawn(reporter.run(draining.clone()));
    tasks.spawn(log_writer.run(draining.clone()));
    tasks.spawn(spans.run(draining.clone()));
    // The loops that decide stop with the server (`serving`).
    tasks.spawn(dispatcher.run(serving.clone()));
    tasks.spawn(schedules.run(serving.clone()));
    tasks.spawn(backstop.run(serving.clone()));
    tasks.spawn(spread.run(serving.clone()));
    tasks.spawn(retention.run(serving.clone()));
    tasks.spawn(deadlines.run(serving.clone()));
    tasks.spawn(sub_workflows.run(serving.clone()));
    tasks.spawn(admission.clone().run(serving.clone()));
    tasks.spawn(gate.clone().flush_failures_until(serving.clone()));
    tasks.spawn(worker_refusals::run(refusals.clone(), serving.clone()));

    let scraped = metrics::Scraped {
        metrics: metrics.clone(),
        registry: registry.clone(),
        store: store.clone(),
        worker_dead_after_ms,
    };
    let streams = Arc::new(grpc::worker::Streams {
        node_id: node_id.clone(),
        heartbeat_interval: options.heartbeat_interval,
        task_heartbeat_interval: options.task_heartbeat_interval,
        worker_certificates: options
            .tls
            .as_ref()
            .is_some_and(|tls| tls.client_ca.is_some()),
        worker_dead_after_ms,
        standing,
        store: store.clone(),
        registry: registry.clone(),
        reports,
        logs: logs.clone(),
        refusals,
        metrics: metrics.clone(),
        worker_rows,
        dispatch: dispatch_wake.clone(),
        tasks: tasks.clone(),
        stopping: draining.clone(),
    });
    let node = Arc::new(Node {
        store,
        registry: registry.clone(),
        specs,
        logs,
        runs,
        admission,
        audit,
        gate: gate.clone(),
        secrets,
        dispatch_wake,
        schedule_wake,
        dag_layouts: Default::default(),
        traces,
        metrics,
        scraped: scraped.clone(),
        progress,
        tasks: tasks.clone(),
        serving: serving.clone(),
        options,
    });
    Built {
        node,
        streams,
        registry,
        gate,
        scraped,
        connection_counters,
    }
}

/// The heartbeat settings the backstop's verdicts, the dead-worker threshold and the workers'
/// own fences depend on.
fn liveness_intervals(options: &SchedulerOptions) -> Intervals {
    Intervals {
        worker_heartbeat_ms: options.heartbeat_interval.as_millis() as Millis,
        task_heartbeat_ms: options.task_heartbeat_interval.as_millis() as Millis,
        dead_after_missed: options.dead_after_missed_heartbeats,
        timeout_grace_ms: options.timeout_grace.as_millis() as Millis,
    }
}
