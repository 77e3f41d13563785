//! OpenTelemetry traces, opt-in by `--otlp-endpoint`: without it no exporter, no span and no
//! `TRACEPARENT` exist, and the hot paths pay one `Option` check.
//!
//! A run's trace outlives any process and moves across nodes, so its ids are derived, not
//! drawn: the trace id from (workflow id, run id, logical time), the span ids of the run, its
//! instances and attempts from the trace id and theirs. Any node can then name an attempt's
//! span at dispatch, and the task gets it as `TRACEPARENT` (`00-<trace>-<attempt span>-01`) in
//! its environment, so the task's own spans join the run's trace; the worker's span for the
//! process is the attempt span's child too. The run, instance and attempt spans are emitted by
//! the node that records the run's end, with their stored start and end times, read from the
//! store then. Dispatch spans (`dispatcher.rs`, through `tracing-opentelemetry`) and report-batch
//! spans (one per report of a batch, with the batch's times) are ordinary in-process spans,
//! children of their attempt's span.
//!
//! The exporter is OTLP over HTTP/protobuf (`<endpoint>/v1/traces`), batched on the batch
//! processor's own thread.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;
use ax_store::Store;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The process's tracer provider, once [`install`] made one.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The instrumentation scope of every span the scheduler makes.
const SCOPE: &str = "ax-scheduler";

/// Trace events waiting for the emitting task at most; past it they are dropped and counted.
const QUEUE: usize = 4096;

/// What [`install`] set up; [`Installed::shutdown`] flushes the spans still queued.
pub struct Installed {
    provider: Option<SdkTracerProvider>,
}

impl Installed {
    /// Exports what is queued and stops the exporter (blocking: call off the async threads).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(err) = provider.shutdown()
        {
            tracing::warn!(error = %err, "flushing the last spans failed");
        }
    }
}

/// Sets up the process's logging (`RUST_LOG`, `info` by default) and, with an endpoint, its
/// trace exporter: the `tracing` spans of the process and the run spans of [`Traces`] go to
/// `endpoint`.
pub fn install(endpoint: Option<&str>, service: &'static str) -> anyhow::Result<Installed> {
    let provider = endpoint
        .map(|endpoint| provider(endpoint, service))
        .transpose()?;
    let otel = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(SCOPE)));
    tracing_subscriber::registry()
        .with(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with(tracing_subscriber::fmt::layer())
        .with(otel)
        .try_init()
        .context("setting up logging")?;
    if let Some(provider) = &provider {
        let _ = PROVIDER.set(provider.clone());
        tracing::info!(
            endpoint = endpoint.unwrap_or_default(),
            "exporting traces over OTLP"
        );
    }
    Ok(Installed { provider })
}

/// The url spans are posted to: the endpoint as given when it names a path, else
/// `<endpoint>/v1/traces` (OTLP/HTTP's path for traces).
pub fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let endpoint = endpoint.trim();
    let Some(rest) = endpoint.strip_prefix("http://") else {
        if endpoint.starts_with("https://") {
            bail!(
                "otlp endpoint {endpoint:?}: the exporter speaks plain http; point it at a collector or agent near the node"
            );
        }
        bail!("otlp endpoint {endpoint:?}: expected http://HOST:PORT, e.g. http://127.0.0.1:4318");
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        bail!("otlp endpoint {endpoint:?}: no host");
    }
    if path.trim_end_matches('/').is_empty() {
        Ok(format!("http://{host}/v1/traces"))
    } else {
        Ok(endpoint.to_string())
    }
}

fn provider(endpoint: &str, service: &'static str) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
    let url = traces_url(endpoint)?;
    // The blocking HTTP client owns a runtime of its own: it is made, and later dropped, off
    // any Tokio thread.
    let exporter = std::thread::spawn(move || {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(Duration::from_secs(10))
            .with_headers(HashMap::new())
            .build()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the OTLP exporter panicked"))?
    .context("building the OTLP exporter")?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_id_generator(PresetIds(RandomIdGenerator::default()))
        .with_resource(resource)
        .build())
}

thread_local! {
    /// The ids the next span built on this thread takes (see [`PresetIds`]).
    static PRESET: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// The SDK draws a span's ids from its id generator: this one gives the ids set for the span
/// being built on this thread ([`with_ids`]), random ones otherwise.
#[derive(Debug)]
struct PresetIds(RandomIdGenerator);

impl IdGenerator for PresetIds {
    fn new_trace_id(&self) -> TraceId {
        PRESET
            .get()
            .map(|(trace, _)| trace)
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        PRESET
            .get()
            .map(|(_, span)| span)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

fn with_ids<R>(trace: TraceId, span: SpanId, build: impl FnOnce() -> R) -> R {
    PRESET.set(Some((trace, span)));
    let built = build();
    PRESET.set(None);
    built
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u32).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// A run's trace id: the same on every node, for the run's whole life.
pub fn trace_id(workflow: WorkflowId, run: RunId, logical_time: Millis) -> TraceId {
    let hash = digest(&[
        b"ax run",
        &workflow.0.to_be_bytes(),
        &run.0.to_be_bytes(),
        &logical_time.to_be_bytes(),
    ]);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash[..16]);
    bytes[15] |= 1; // never the invalid all-zero id
    TraceId::from_bytes(bytes)
}

fn span_id(trace: TraceId, kind: &[u8], instance: InstanceId, attempt: Attempt) -> SpanId {
    let hash = digest(&[
        &trace.to_bytes(),
        kind,
        &instance.0.to_be_bytes(),
        &attempt.0.to_be_bytes(),
    ]);
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&hash[..8]);
    bytes[7] |= 1;
    SpanId::from_bytes(bytes)
}

pub fn run_span(trace: TraceId) -> SpanId {
    span_id(trace, b"run", InstanceId(0), Attempt(0))
}

pub fn instance_span(trace: TraceId, instance: InstanceId) -> SpanId {
    span_id(trace, b"instance", instance, Attempt(0))
}

pub fn attempt_span(trace: TraceId, instance: InstanceId, attempt: Attempt) -> SpanId {
    span_id(trace, b"attempt", instance, attempt)
}

/// The W3C `traceparent` of an attempt: its task's spans are the attempt span's children.
pub fn traceparent(trace: TraceId, instance: InstanceId, attempt: Attempt) -> String {
    format!("00-{trace}-{}-01", attempt_span(trace, instance, attempt))
}

/// A context whose (remote) parent is `span` of `trace`.
fn child_of(trace: TraceId, span: SpanId) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// The context of an attempt's span, for in-process spans under it.
pub fn attempt_context(trace: TraceId, instance: InstanceId, attempt: Attempt) -> Context {
    child_of(trace, attempt_span(trace, instance, attempt))
}

fn time(ms: Millis) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// The node's traces: what its parts hand spans and events to. Off (every call a no-op) when
/// the process exports no traces; clones share one queue and one memory of traces.
#[derive(Clone, Default)]
pub struct Traces {
    on: Option<Arc<Exporting>>,
}

struct Exporting {
    tracer: SdkTracer,
    events: mpsc::Sender<Event>,
    /// Each dispatched instance's trace, so reports need no store read to find it.
    known: Mutex<HashMap<InstanceId, TraceId>>,
}

/// Instances whose trace a node remembers at most; past it the memory starts again.
const KNOWN_LIMIT: usize = 200_000;

pub enum Event {
    /// A batch of reports applied between `started` and `ended`: (instance, attempt, report).
    Reports {
        started: SystemTime,
        ended: SystemTime,
        reports: Vec<(InstanceId, Attempt, &'static str)>,
        batch: usize,
    },
    /// The run ended (or was cancelled): its run, instance and attempt spans go out.
    RunEnded(RunId),
}

impl Traces {
    /// Whether the process exports traces.
    pub fn enabled(&self) -> bool {
        self.on.is_some()
    }

    /// Remembers an instance's trace (at its dispatch).
    pub fn remember(&self, instance: InstanceId, trace: TraceId) {
        let Some(on) = &self.on else { return };
        let mut known = on.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= KNOWN_LIMIT {
            known.clear();
        }
        known.insert(instance, trace);
    }

    fn forget(&self, instances: impl Iterator<Item = InstanceId>) {
        let Some(on) = &self.on else { return };
        let mut known = on.known.lock().unwrap_or_else(|p| p.into_inner());
        for instance in instances {
            known.remove(&instance);
        }
    }

    fn known(&self, instance: InstanceId) -> Option<TraceId> {
        let on = self.on.as_ref()?;
        on.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&instance)
            .copied()
    }

    /// Queues an event for the emitting task; never waits (a full queue drops it).
    pub fn send(&self, event: Event) {
        let Some(on) = &self.on else { return };
        if on.events.try_send(event).is_err() {
            tracing::debug!("trace event queue full; event dropped");
        }
    }

    /// Queues a run's end for its spans.
    pub fn run_ended(&self, run: RunId) {
        self.send(Event::RunEnded(run));
    }

    /// Queues a run's end for its spans if the run is over (a cancelled instance may have
    /// ended it); one read, only when the node exports traces.
    pub async fn run_ended_if_over(&self, store: &Store, run: RunId) {
        if !self.enabled() {
            return;
        }
        if let Ok(Some(record)) = store.get_run(run).await
            && record.state.is_terminal()
        {
            self.run_ended(run);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        name: String,
        trace: TraceId,
        id: Option<SpanId>,
        parent: Option<SpanId>,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
        error: Option<String>,
    ) {
        let Some(on) = &self.on else { return };
        let context = match parent {
            Some(parent) => child_of(trace, parent),
            None => Context::new(),
        };
        let builder = on
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes);
        let mut span = match id {
            Some(id) => with_ids(trace, id, || {
                on.tracer.build_with_context(builder, &context)
            }),
            None => on.tracer.build_with_context(builder, &context),
        };
        if let Some(message) = error {
            span.set_status(Status::error(message));
        }
        span.end_with_timestamp(end);
    }
}

/// The task that emits the spans of queued events: report batches and ended runs, read from
/// the store.
pub struct SpanEmitter {
    traces: Traces,
    inbox: Option<mpsc::Receiver<Event>>,
    store: Arc<Store>,
    node_id: String,
}

impl SpanEmitter {
    /// Emits spans when this process installed an exporter ([`install`]); else does nothing,
    /// and its [`Traces`] are off.
    pub fn new(store: Arc<Store>, node_id: String) -> SpanEmitter {
        let (traces, inbox) = match PROVIDER.get() {
            Some(provider) => {
                let (events, inbox) = mpsc::channel(QUEUE);
                let on = Exporting {
                    tracer: provider.tracer(SCOPE),
                    events,
                    known: Mutex::new(HashMap::new()),
                };
                let traces = Traces {
                    on: Some(Arc::new(on)),
                };
                (traces, Some(inbox))
            }
            None => (Traces::default(), None),
        };
        SpanEmitter {
            traces,
            inbox,
            store,
            node_id,
        }
    }

    pub fn handle(&self) -> Traces {
        self.traces.clone()
    }

    /// Emits the spans of queued events until `cancel`, then those still queued.
    pub async fn run(mut self, cancel: CancellationToken) {
        let Some(mut inbox) = self.inbox.take() else {
            return;
        };
        loop {
            let event = tokio::select! {
                event = inbox.recv() => event,
                _ = cancel.cancelled() => {
                    inbox.close();
                    inbox.recv().await
                }
            };
            let Some(event) = event else {
                return;
            };
            let done = match event {
                Event::Reports {
                    started,
                    ended,
                    reports,
                    batch,
                } => self.report_spans(started, ended, reports, batch).await,
                Event::RunEnded(run) => self.run_spans(run).await,
            };
            if let Err(err) = done {
                tracing::warn!(error = %err, "emitting spans failed");
            }
        }
    }

    /// An instance's trace: remembered from its dispatch, else read from the store.
    async fn trace_of(&self, instance: InstanceId) -> anyhow::Result<Option<TraceId>> {
        let (traces, store) = (&self.traces, &self.store);
        if let Some(trace) = traces.known(instance) {
            return Ok(Some(trace));
        }
        let Some(record) = store.get_instance(instance).await? else {
            return Ok(None);
        };
        let Some(run) = store.get_run(record.run_id).await? else {
            return Ok(None);
        };
        let trace = trace_id(run.workflow_id, run.id, run.logical_time);
        traces.remember(instance, trace);
        Ok(Some(trace))
    }

    async fn report_spans(
        &self,
        started: SystemTime,
        ended: SystemTime,
        reports: Vec<(InstanceId, Attempt, &'static str)>,
        batch: usize,
    ) -> anyhow::Result<()> {
        let traces = &self.traces;
        for (instance, attempt, report) in reports {
            let Some(trace) = self.trace_of(instance).await? else {
                continue;
            };
            traces.emit(
                "report batch".into(),
                trace,
                None,
                Some(attempt_span(trace, instance, attempt)),
                started,
                ended,
                vec![
                    KeyValue::new("ax.report", report),
                    KeyValue::new("ax.batch.reports", batch as i64),
                    KeyValue::new("ax.instance_id", instance.0),
                    KeyValue::new("ax.attempt", i64::from(attempt.0)),
                    KeyValue::new("ax.node", self.node_id.clone()),
                ],
                None,
            );
        }
        Ok(())
    }

    async fn run_spans(&self, id: RunId) -> anyhow::Result<()> {
        let (traces, store) = (&self.traces, &self.store);
        let Some(run) = store.get_run(id).await? else {
            return Ok(());
        };
        let trace = trace_id(run.workflow_id, run.id, run.logical_time);
        let run_end = run.finished_at.unwrap_or_else(crate::clock::now_ms);
        let instances = store.list_instances(id).await?;
        let attempts = store.list_run_attempts(id).await?;
        let failed =
            |state: RunState| (state != RunState::Success).then(|| state.as_str().to_string());
        traces.emit(
            format!("run {}", run.workflow),
            trace,
            Some(run_span(trace)),
            None,
            time(run.created_at),
            time(run_end),
            vec![
                KeyValue::new("ax.workflow", run.workflow.clone()),
                KeyValue::new("ax.run_id", run.id.0),
                KeyValue::new("ax.run.state", run.state.as_str()),
                KeyValue::new("ax.trigger", format!("{:?}", run.trigger).to_lowercase()),
                KeyValue::new("ax.logical_time", ax_core::rfc3339(run.logical_time)),
                KeyValue::new("ax.triggered_by", run.triggered_by.clone()),
            ],
            failed(run.state),
        );
        let by_id: HashMap<InstanceId, &ax_store::InstanceRecord> =
            instances.iter().map(|i| (i.id, i)).collect();
        let not_ok = |state: InstanceState| {
            (state != InstanceState::Success).then(|| state.as_str().to_string())
        };
        for instance in &instances {
            let end = instance.finished_at.unwrap_or(run_end);
            traces.emit(
                format!("task {}", instance.task),
                trace,
                Some(instance_span(trace, instance.id)),
                Some(run_span(trace)),
                time(instance.created_at),
                time(end.max(instance.created_at)),
                vec![
                    KeyValue::new("ax.workflow", run.workflow.clone()),
                    KeyValue::new("ax.task", instance.task.clone()),
                    KeyValue::new("ax.instance_id", instance.id.0),
                    KeyValue::new("ax.instance.state", instance.state.as_str()),
                    KeyValue::new("ax.attempts", i64::from(instance.attempt.0)),
                ],
                not_ok(instance.state),
            );
        }
        for attempt in &attempts {
            let Some(instance) = by_id.get(&attempt.instance_id) else {
                continue;
            };
            let start = attempt
                .dispatched_at
                .or(attempt.started_at)
                .unwrap_or(instance.created_at);
            let end = attempt.finished_at.unwrap_or(run_end).max(start);
            let mut attributes = vec![
                KeyValue::new("ax.workflow", run.workflow.clone()),
                KeyValue::new("ax.task", instance.task.clone()),
                KeyValue::new("ax.instance_id", instance.id.0),
                KeyValue::new("ax.attempt", i64::from(attempt.attempt.0)),
                KeyValue::new("ax.outcome", attempt.state.as_str().to_lowercase()),
            ];
            if let Some(worker) = &attempt.worker_id {
                attributes.push(KeyValue::new("ax.worker", worker.clone()));
            }
            if let Some(node_id) = &attempt.node_id {
                attributes.push(KeyValue::new("ax.node", node_id.clone()));
            }
            if let Some(code) = attempt.exit_code {
                attributes.push(KeyValue::new("process.exit.code", i64::from(code)));
            }
            if let Some(started) = attempt.started_at {
                attributes.push(KeyValue::new("ax.started_at", ax_core::rfc3339(started)));
            }
            let error = (attempt.state != InstanceState::Success).then(|| {
                if attempt.message.is_empty() {
                    attempt.state.as_str().to_string()
                } else {
                    attempt.message.clone()
                }
            });
            traces.emit(
                format!("attempt {}", instance.task),
                trace,
                Some(attempt_span(trace, instance.id, attempt.attempt)),
                Some(instance_span(trace, instance.id)),
                time(start),
                time(end),
                attributes,
                error,
            );
        }
        traces.forget(instances.iter().map(|instance| instance.id));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_derived_and_traceparent_is_w3c() {
        let trace = trace_id(WorkflowId(3), RunId(42), 1_700_000_000_000);
        assert_eq!(trace, trace_id(WorkflowId(3), RunId(42), 1_700_000_000_000));
        assert_ne!(trace, trace_id(WorkflowId(3), RunId(43), 1_700_000_000_000));
        assert_ne!(trace, trace_id(WorkflowId(4), RunId(42), 1_700_000_000_000));
        assert_ne!(trace, TraceId::INVALID);
        let attempt = attempt_span(trace, InstanceId(7), Attempt(1));
        assert_ne!(attempt, attempt_span(trace, InstanceId(7), Attempt(2)));
        assert_ne!(attempt, instance_span(trace, InstanceId(7)));
        let header = traceparent(trace, InstanceId(7), Attempt(1));
        let parts: Vec<&str> = header.split('-').collect();
        assert_eq!(parts.len(), 4, "{header}");
        assert_eq!((parts[0], parts[3]), ("00", "01"));
        assert_eq!(parts[1], format!("{trace}"));
        assert_eq!(parts[1].len(), 32);
        assert_eq!(parts[2], format!("{attempt}"));
        assert_eq!(parts[2].len(), 16);
    }

    #[test]
    fn the_endpoint_gets_the_traces_path_unless_it_names_one() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/custom/traces").unwrap(),
            "http://collector:4318/custom/traces"
        );
        let err = traces_url("https://collector:4318")
            .unwrap_err()
            .to_string();
        assert!(err.contains("plain http"), "{err}");
        let err = traces_url("collector:4318").unwrap_err().to_string();
        assert!(err.contains("expected http://HOST:PORT"), "{err}");
    }
}
