//! The node's Prometheus metrics: the one place that names them, says what each means and owns
//! the registry that `GET /metrics` encodes (on the main port and on the ops listener).
//!
//! Hot paths (dispatch, reports, log writes) only bump counters and observe histograms, atomics
//! and a short mutex each, never held across an await. What needs the store (instances by
//! state, the run queue's depth, live and dead workers) is read when scraped, at most once per
//! [`STORE_READ_EVERY`] whatever the number of scrapers, with indexed counts
//! ([`ax_store::Store::active_counts`]) and the workers' rows: a scrape never scans history.
//! Counters kept elsewhere (alert deliveries, Redis fallbacks) are read from their own atomics.
//!
//! The crate is `prometheus-client`, the Prometheus organisation's Rust client; the text is
//! the Prometheus exposition format 0.0.4, which every Prometheus and agent reads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ax_core::Millis;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::Mutex;

use ax_store::Store;

/// The content type of what [`Metrics::encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A scrape reads the store at most this often; scrapes in between show the last reading.
pub const STORE_READ_EVERY: Duration = Duration::from_secs(1);

/// How long a scrape waits for the store before it shows the last reading.
const STORE_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Latency buckets, in seconds: 1 ms to about 2 min.
fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        120.0,
    ]
    .into_iter()
}

/// The outcomes of `ax_attempts_finished_total`.
const OUTCOMES: [&str; 6] = [
    "success",
    "failed",
    "timeout",
    "lost",
    "spawn_failed",
    "withdrawn",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The kinds of `ax_worker_frames_refused_total`.
const REFUSED_FRAMES: [&str; 5] = ["logs", "started", "finished", "heartbeat", "rejected"];
/// The reasons of `ax_worker_registers_refused_total`.
const REFUSED_REGISTERS: [&str; 4] = ["id", "labels", "certificate", "second_stream"];

/// The kinds of `ax_purged_rows_total`.
const PURGED_KINDS: [&str; 5] = ["runs", "instances", "attempts", "log_chunks", "decisions"];

/// The labels of `ax_triggers_refused_total`: the workflow's app ("" for none) and the bound
/// met (`app` or `total`). Apps are few by design, as labels must be.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedTriggerLabel {
    app: String,
    bound: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

/// Every metric of a node.
pub struct Metrics {
    /// Locked to register the readings kept elsewhere once, and to encode a scrape.
    registry: std::sync::Mutex<Registry>,
    /// From an instance's becoming ready (created, or its retry backoff over) to its Dispatch
    /// leaving this node.
    pub dispatch_latency: Histogram,
    /// From an instance's becoming ready to its worker's report that the process started.
    pub start_latency: Histogram,
    /// How long after its slot a cron fire created its run.
    pub cron_lateness: Histogram,
    /// How long one batch of worker reports took to apply (one transaction).
    pub report_batch: Histogram,
    /// Dispatches sent to workers.
    pub dispatches: Counter,
    /// Attempts that ended, by outcome ([`OUTCOMES`]).
    attempts: Family<OutcomeLabel, Counter>,
    pub retries: Counter,
    pub timeouts: Counter,
    pub lost: Counter,
    /// Worker reports refused as not current, by reason (stale, not_found).
    refused: Family<ReasonLabel, Counter>,
    /// Frames of worker streams about attempts not dispatched to their worker, by kind
    /// ([`REFUSED_FRAMES`]).
    frames_refused: Family<KindLabel, Counter>,
    /// Registers refused, by reason ([`REFUSED_REGISTERS`]).
    registers_refused: Family<ReasonLabel, Counter>,
    /// Log lines stored by this node's log writer.
    pub log_lines: Counter,
    /// How long the oldest chunk of the log writer's last write waited in its queue.
    pub log_lag: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Rows this node's purges deleted (retention, `axctl purge`), by kind ([`PURGED_KINDS`]).
    purged: Family<KindLabel, Counter>,
    /// Runs this node judged past their deadline (`deadlines.rs`): each run once in a cluster.
    pub deadlines_missed: Counter,
    /// Triggers and backfills this node refused at a bound on waiting instances
    /// (`admission.rs`), by app and bound.
    triggers_refused: Family<RefusedTriggerLabel, Counter>,
    /// Scrapes whose store reading failed or took too long.
    store_read_errors: Counter,
    gauges: Mutex<StoreGauges>,
    instances: Family<StateLabel, Gauge>,
    runs: Family<StateLabel, Gauge>,
    queue_depth: Gauge,
    waiting_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    workers: Family<StateLabel, Gauge>,
    running_per_worker: Family<WorkerLabel, Gauge>,
}

/// When the store was last read for the gauges.
#[derive(Default)]
struct StoreGauges {
    read_at: Option<Instant>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let histogram = || Histogram::new(latency_buckets());
        let metrics = Metrics {
            dispatch_latency: histogram(),
            start_latency: histogram(),
            cron_lateness: histogram(),
            report_batch: histogram(),
            dispatches: Counter::default(),
            attempts: Family::default(),
            retries: Counter::default(),
            timeouts: Counter::default(),
            lost: Counter::default(),
            refused: Family::default(),
            frames_refused: Family::default(),
            registers_refused: Family::default(),
            log_lines: Counter::default(),
            log_lag: Gauge::default(),
            purged: Family::default(),
            deadlines_missed: Counter::default(),
            triggers_refused: Family::default(),
            store_read_errors: Counter::default(),
            gauges: Mutex::new(StoreGauges::default()),
            instances: Family::default(),
            runs: Family::default(),
            queue_depth: Gauge::default(),
            waiting_age: Gauge::default(),
            workers: Family::default(),
            running_per_worker: Family::default(),
            registry: std::sync::Mutex::default(),
        };
        // Counters are registered without `_total`: the encoder appends it.
        registry.register(
            "ax_dispatch_latency_seconds",
            "Time from an instance becoming ready (created, or its retry backoff over) to its dispatch leaving this node",
            metrics.dispatch_latency.clone(),
        );
        registry.register(
            "ax_start_latency_seconds",
            "Time from an instance becoming ready to its worker reporting the process started (queue to start)",
            metrics.start_latency.clone(),
        );
        registry.register(
            "ax_cron_fire_lateness_seconds",
            "How long after its scheduled slot a cron fire created its run",
            metrics.cron_lateness.clone(),
        );
        registry.register(
            "ax_report_batch_duration_seconds",
            "Time to apply one batch of worker reports to the store (one transaction)",
            metrics.report_batch.clone(),
        );
        registry.register(
            "ax_dispatches",
            "Dispatches this node sent to workers",
            metrics.dispatches.clone(),
        );
        registry.register(
            "ax_attempts_finished",
            "Attempts this node recorded as ended, by outcome (success, failed, timeout, lost, spawn_failed, withdrawn: a dispatch a dead worker never confirmed, sent again as the next attempt)",
            metrics.attempts.clone(),
        );
        registry.register(
            "ax_retries",
            "Failed attempts this node sent back to WAITING as a retry",
            metrics.retries.clone(),
        );
        registry.register(
            "ax_timeouts",
            "Attempts this node recorded as timed out (the worker's report or this node's verdict)",
            metrics.timeouts.clone(),
        );
        registry.register(
            "ax_lost_attempts",
            "Attempts this node recorded as lost with their dead worker",
            metrics.lost.clone(),
        );
        registry.register(
            "ax_reports_refused",
            "Worker reports refused because their attempt is not current (stale) or unknown (not_found); the worker is told to kill the process. A report about an attempt not dispatched to its worker is counted in ax_worker_frames_refused_total instead",
            metrics.refused.clone(),
        );
        registry.register(
            "ax_worker_frames_refused",
            "Frames of worker streams about an attempt not dispatched to the stream's worker (another worker's, or one that does not exist yet), by kind (logs, started, finished, heartbeat, rejected); none is stored, each is audited (aggregated)",
            metrics.frames_refused.clone(),
        );
        registry.register(
            "ax_worker_registers_refused",
            "Worker Registers refused, by reason: id (not one the token may register), labels (a label the token may not claim), certificate (mutual TLS: the certificate does not name the id), second_stream (the id's stream is still live)",
            metrics.registers_refused.clone(),
        );
        registry.register(
            "ax_log_lines_stored",
            "Task log lines this node's log writer stored",
            metrics.log_lines.clone(),
        );
        registry.register(
            "ax_log_writer_lag_seconds",
            "How long the oldest chunk of the log writer's latest write waited in its queue",
            metrics.log_lag.clone(),
        );
        registry.register(
            "ax_purged_rows",
            "Rows this node deleted as history past its retention or by axctl purge, by kind (runs, instances, attempts, log_chunks, decisions)",
            metrics.purged.clone(),
        );
        registry.register(
            "ax_deadlines_missed",
            "Runs this node judged not ended by their workflow's deadline (each run is judged once in the cluster, by one node; with on_deadline: cancel it was cancelled)",
            metrics.deadlines_missed.clone(),
        );
        registry.register(
            "ax_triggers_refused",
            "Triggers (TriggerWorkflow, the HTTP API's trigger, BackfillWorkflow) this node refused with RESOURCE_EXHAUSTED (HTTP 429) because the workflow's app or the cluster had as many instances waiting as its bound allows, by app and bound (app, total); nothing was created for them",
            metrics.triggers_refused.clone(),
        );
        registry.register(
            "ax_metrics_store_read_errors",
            "Scrapes whose reading of the store failed or timed out (they show the previous reading)",
            metrics.store_read_errors.clone(),
        );
        registry.register(
            "ax_instances",
            "Instances in the whole store by active state (waiting, dispatched, running)",
            metrics.instances.clone(),
        );
        registry.register(
            "ax_runs",
            "Runs in the whole store by active state (queued, running)",
            metrics.runs.clone(),
        );
        registry.register(
            "ax_run_queue_depth",
            "Runs waiting in the run queue (QUEUED) for a limit to let them start",
            metrics.queue_depth.clone(),
        );
        registry.register(
            "ax_waiting_oldest_age_seconds",
            "How long the oldest WAITING instance has been ready to start (0 when none is): how far behind dispatch is. Steady while the workers keep up; growing while tasks become ready faster than they are taken (past the knee, or no free slot), or while a limit holds them back",
            metrics.waiting_age.clone(),
        );
        registry.register(
            "ax_workers",
            "Workers of the cluster by state: live (connected and heard from within the dead-worker threshold) or dead (connected by their row but silent past it)",
            metrics.workers.clone(),
        );
        registry.register(
            "ax_worker_running_attempts",
            "Attempts in flight on each worker connected to this node",
            metrics.running_per_worker.clone(),
        );
        // Every known label value from the start, so a rate over a series that has not moved
        // yet reads 0 rather than nothing.
        for outcome in OUTCOMES {
            drop(metrics.attempts.get_or_create(&OutcomeLabel { outcome }));
        }
        for reason in ["stale", "not_found"] {
            drop(metrics.refused.get_or_create(&ReasonLabel { reason }));
        }
        for kind in REFUSED_FRAMES {
            drop(metrics.frames_refused.get_or_create(&KindLabel { kind }));
        }
        for reason in REFUSED_REGISTERS {
            drop(
                metrics
                    .registers_refused
                    .get_or_create(&ReasonLabel { reason }),
            );
        }
        for kind in PURGED_KINDS {
            drop(metrics.purged.get_or_create(&KindLabel { kind }));
        }
        Metrics {
            registry: std::sync::Mutex::new(registry),
            ..metrics
        }
    }

    /// Registers the readings kept outside this module (alerts, Redis, the lease, the log
    /// queue), read at each scrape; called once, as the node is made.
    pub fn register_readings(&self, readings: Readings) {
        self.encoder().register_collector(Box::new(readings));
    }

    fn encoder(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn attempt_finished(&self, outcome: &'static str) {
        self.attempts.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Counts the rows of a purge step.
    pub fn purged(&self, counts: &ax_store::PurgeCounts) {
        let by_kind = [
            counts.runs,
            counts.instances,
            counts.attempts,
            counts.log_chunks,
            counts.decisions,
        ];
        for (kind, n) in PURGED_KINDS.into_iter().zip(by_kind) {
            if n > 0 {
                self.purged.get_or_create(&KindLabel { kind }).inc_by(n);
            }
        }
    }

    /// Counts a trigger refused at a bound on waiting instances (`admission.rs`).
    pub fn trigger_refused(&self, app: &str, bound: ax_core::admission::Bound) {
        self.triggers_refused
            .get_or_create(&RefusedTriggerLabel {
                app: app.to_string(),
                bound: bound.as_str(),
            })
            .inc();
    }

    pub fn report_refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts a Register refused (`worker_refusals`), by reason.
    pub fn register_refused(&self, reason: &'static str) {
        self.registers_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a frame refused (`worker_refusals`), by kind.
    pub fn frame_refused(&self, kind: &'static str) {
        self.frames_refused.get_or_create(&KindLabel { kind }).inc();
    }

    /// The metrics as a scrape shows them, without the store's readings.
    #[cfg(test)]
    pub fn encode_now(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.encoder())
            .expect("encode");
        text
    }

    /// Observes a latency from `from` (ms) to `to` (ms); a negative one (clocks) counts as 0.
    pub fn observe_ms(histogram: &Histogram, from: Millis, to: Millis) {
        histogram.observe((to - from).max(0) as f64 / 1000.0);
    }

    /// The text of a scrape: the store-backed gauges brought up to date (at most once per
    /// [`STORE_READ_EVERY`]), then every metric.
    pub async fn scrape(&self, sources: &Scraped) -> String {
        self.refresh(sources).await;
        let mut text = String::with_capacity(16 << 10);
        if let Err(err) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.encoder())
        {
            tracing::error!(error = %err, "encoding metrics failed");
        }
        text
    }

    async fn refresh(&self, sources: &Scraped) {
        let mut gauges = self.gauges.lock().await;
        if gauges
            .read_at
            .is_some_and(|at| at.elapsed() < STORE_READ_EVERY)
        {
            return;
        }
        gauges.read_at = Some(Instant::now());
        // This node's own workers need no store.
        self.running_per_worker.clear();
        for slot in sources.registry.slots() {
            self.running_per_worker
                .get_or_create(&WorkerLabel { worker: slot.id })
                .set(i64::from(slot.running));
        }
        let read = async {
            let counts = sources.store.active_counts().await?;
            let workers = sources.store.list_workers().await?;
            anyhow::Ok((counts, workers))
        };
        let (counts, workers) = match tokio::time::timeout(STORE_READ_TIMEOUT, read).await {
            Ok(Ok(read)) => read,
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "reading the store for /metrics failed");
                self.store_read_errors.inc();
                return;
            }
            Err(_) => {
                tracing::warn!("reading the store for /metrics timed out");
                self.store_read_errors.inc();
                return;
            }
        };
        let set = |family: &Family<StateLabel, Gauge>, state, value: u64| {
            family
                .get_or_create(&StateLabel { state })
                .set(value as i64);
        };
        set(&self.instances, "waiting", counts.waiting);
        set(&self.instances, "dispatched", counts.dispatched);
        set(&self.instances, "running", counts.running);
        set(&self.runs, "queued", counts.queued_runs);
        set(&self.runs, "running", counts.running_runs);
        self.queue_depth.set(counts.queued_runs as i64);
        let now = crate::clock::now_ms();
        let age_ms = counts
            .oldest_ready_since
            .map_or(0, |since| (now - since).max(0));
        self.waiting_age.set(age_ms as f64 / 1000.0);
        let dead_after = sources.worker_dead_after_ms;
        let connected = workers.iter().filter(|worker| worker.connected);
        let live = connected
            .clone()
            .filter(|worker| worker.last_heartbeat >= now - dead_after)
            .count();
        let dead = connected.count() - live;
        set(&self.workers, "live", live as u64);
        set(&self.workers, "dead", dead as u64);
    }
}

/// Counters and ages kept by other parts of the node, read at each scrape.
pub struct Readings {
    pub alerter: crate::alerts::Alerter,
    pub guards: Arc<dyn crate::guards::Guards>,
    pub standing: Arc<crate::membership::Standing>,
    /// Bytes of log text queued for the store (the log writer's).
    pub queued_log_bytes: Box<dyn Fn() -> usize + Send + Sync>,
    pub connections: Arc<crate::connections::ConnectionCounters>,
}

impl std::fmt::Debug for Readings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readings").finish_non_exhaustive()
    }
}

impl Collector for Readings {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let node = self;
        let counter = |encoder: &mut DescriptorEncoder, name, help, value: u64| {
            let metric = ConstCounter::new(value);
            let described = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(described)
        };
        let gauge = |encoder: &mut DescriptorEncoder, name, help, value: f64| {
            let metric = ConstGauge::new(value);
            let described = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(described)
        };
        counter(
            &mut encoder,
            "ax_alerts_failed",
            "Alert messages a channel gave up on after its retries, or whose service refused them.",
            node.alerter.stats().failed,
        )?;
        counter(
            &mut encoder,
            "ax_redis_fallbacks",
            "Guard calls (start locks, dedup markers) made without Redis while it was unreachable; scheduling went on the store's guards alone.",
            node.guards.fallbacks(),
        )?;
        gauge(
            &mut encoder,
            "ax_cluster_lease_age_seconds",
            "Time since this node last renewed its lease in the store.",
            node.standing.lease_age().as_secs_f64(),
        )?;
        let queued = ConstGauge::new((node.queued_log_bytes)() as i64);
        let described = encoder.encode_descriptor(
            "ax_log_writer_queued_bytes",
            "Log text queued for the store and not yet written.",
            None,
            queued.metric_type(),
        )?;
        queued.encode(described)?;
        let connections = node.connections.read();
        gauge(
            &mut encoder,
            "ax_connections_open",
            "Connections open on the port and the ops listener.",
            connections.open as f64,
        )?;
        gauge(
            &mut encoder,
            "ax_connections_max",
            "The most connections open at once: --max-connections within the open-file limit.",
            connections.cap as f64,
        )?;
        for (name, help, value) in [
            (
                "ax_connections_accepted",
                "Connections accepted.",
                connections.accepted,
            ),
            (
                "ax_connections_first_request_timeouts",
                "Connections closed for sending no request (or not finishing their TLS handshake) within --first-request-timeout.",
                connections.first_request_timeouts,
            ),
            (
                "ax_connections_idle_closed",
                "Connections closed after --idle-connection-timeout with no request open.",
                connections.idle_closes,
            ),
            (
                "ax_connections_evicted",
                "Connections closed to make room for a new one at the connection cap (the one quiet the longest).",
                connections.evicted,
            ),
            (
                "ax_connections_refused",
                "New connections closed at once at the connection cap, every open one having a request open.",
                connections.refused,
            ),
            (
                "ax_connections_accept_errors",
                "Failed accepts (e.g. out of file descriptors), each followed by a back-off.",
                connections.accept_errors,
            ),
        ] {
            counter(&mut encoder, name, help, value)?;
        }
        Ok(())
    }
}

/// What a scrape reads besides the counters: this node's workers, the store, and the
/// dead-worker threshold that tells live workers from dead ones.
#[derive(Clone)]
pub struct Scraped {
    pub metrics: Arc<Metrics>,
    pub registry: Arc<crate::registry::Registry>,
    pub store: Arc<Store>,
    pub worker_dead_after_ms: Millis,
}

impl Scraped {
    /// A scrape as an HTTP answer.
    pub async fn response(&self) -> axum::response::Response {
        use axum::response::IntoResponse;
        let text = self.metrics.scrape(self).await;
        ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
    }
}

/// The ops listener's routes: only `GET /metrics` (the gRPC health service is added beside
/// them). Plaintext and without authentication, for Kubernetes probes (which speak no TLS) and
/// Prometheus; everything else is a 404.
pub fn ops_router(scraped: Scraped) -> axum::Router {
    axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(
                |axum::extract::State(scraped): axum::extract::State<Scraped>| async move {
                    scraped.response().await
                },
            ),
        )
        .with_state(scraped)
}
