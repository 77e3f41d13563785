//! An attempt's `Dispatch`, built and sent to its worker once its claim has committed: by the
//! dispatcher after its claim transaction, and by a placement (`place_now.rs`) after the
//! transaction that created the attempt. The dispatch carries the task's command and
//! environment (its params, its context, its secrets and, when the node exports traces, its
//! `TRACEPARENT`). One that cannot be delivered (the worker went away, its queue is full) comes
//! back as [`Undone`]: never sent, so the same attempt may go out again once the reporter has
//! put it back WAITING.

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::spec::TaskSpec;
use ax_store::{Report, Shard};

use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::specs::VersionedSpec;
use crate::telemetry::{self, Traces};
use crate::to_worker::{Dispatch, ToWorker};

/// Builds and sends dispatches; clones share the node's registry and metrics.
#[derive(Clone)]
pub struct DispatchSender {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    traces: Traces,
    /// How long past a task's timeout the backstop waits for the worker's own report.
    timeout_grace: Duration,
}

/// A claimed attempt, to send.
pub struct Claimed<'a> {
    pub worker: &'a str,
    pub connection: u64,
    pub instance: InstanceId,
    pub attempt: Attempt,
    /// When its instance became ready, for the dispatch latency.
    pub ready_at: Millis,
}

/// What a dispatch carries from its instance and run.
pub struct Ready<'a> {
    pub instance: InstanceId,
    pub run: RunId,
    pub workflow_id: WorkflowId,
    pub attempt: Attempt,
    pub logical_time: Millis,
    pub params: &'a BTreeMap<String, String>,
    /// What the run tells its handlers (empty for the graph's tasks).
    pub run_env: &'a BTreeMap<String, String>,
    /// The outputs the run's tasks passed on, by task (empty for a run without any).
    pub outputs: &'a BTreeMap<String, ax_core::outputs::Outputs>,
    pub shard: Option<&'a ax_store::Shard>,
}

/// A claimed attempt that was not sent: the report that puts it back WAITING as the same
/// attempt, about its worker.
pub struct Undone {
    pub worker: String,
    /// Boxed: an `Undone` travels in `Result`s, and a report is large.
    pub report: Box<Report>,
}

impl Undone {
    /// `claimed` was not sent, because of `reason`.
    pub fn new(claimed: &Claimed<'_>, reason: String) -> Undone {
        Undone {
            worker: claimed.worker.to_string(),
            report: Box::new(Report::Rejected {
                instance_id: claimed.instance,
                attempt: claimed.attempt,
                worker_id: Some(claimed.worker.to_string()),
                reason,
                withdrawn: false,
                dispatched_at: None,
            }),
        }
    }
}

impl DispatchSender {
    pub fn new(
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        traces: Traces,
        timeout_grace: Duration,
    ) -> DispatchSender {
        DispatchSender {
            registry,
            metrics,
            traces,
            timeout_grace,
        }
    }

    /// The start lock lives as long as the attempt may: its timeout plus the grace the backstop
    /// gives the worker's own report, and a minute more for the kill to land. A task without a
    /// timeout holds it for a day at most.
    pub fn lock_ttl(&self, timeout_ms: Option<NonZeroU64>) -> Duration {
        let grace = self.timeout_grace + Duration::from_secs(60);
        match timeout_ms {
            Some(timeout) => Duration::from_millis(timeout.get()) + grace,
            None => Duration::from_secs(24 * 3600),
        }
    }

    /// The `Dispatch` of an attempt of `task` to `worker`, and its span when the node exports
    /// traces.
    pub fn message(
        &self,
        spec: &VersionedSpec,
        task: &TaskSpec,
        ready: &Ready<'_>,
        worker: &str,
        secret_env: Vec<(String, String)>,
    ) -> (Dispatch, Option<tracing::Span>) {
        let mut env = task_environment(task, ready, &spec.name);
        env.extend(secret_env);
        let span = self.traces.enabled().then(|| {
            let trace = telemetry::trace_id(ready.workflow_id, ready.run, ready.logical_time);
            self.traces.remember(ready.instance, trace);
            env.insert(
                "TRACEPARENT".into(),
                telemetry::traceparent(trace, ready.instance, ready.attempt),
            );
            dispatch_span(
                trace,
                &spec.name,
                &task.name,
                ready.instance,
                ready.attempt,
                worker,
            )
        });
        let message = Dispatch {
            instance: ready.instance,
            attempt: ready.attempt,
            run: ready.run,
            workflow: spec.name.clone(),
            task: task.name.clone(),
            command: with_outputs(&task.command, ready.outputs),
            argv: task
                .argv
                .iter()
                .map(|word| with_outputs(word, ready.outputs))
                .collect(),
            env,
            working_dir: task.working_dir.clone().unwrap_or_default(),
            timeout_ms: task.timeout_ms,
            logical_time: ready.logical_time,
            shard: ready
                .shard
                .filter(|shard| shard.item.is_none())
                .map(|shard| (shard.index, shard.total)),
            keep_when_cut_off: task.unfenced,
            survive_worker_restart: task.survives_worker_restart,
        };
        (message, span)
    }

    /// Sends a claimed attempt to its worker (its slot's reservation becomes an attempt in
    /// flight). One that cannot be delivered is given back as [`Undone`], to be put back
    /// WAITING.
    pub fn send(
        &self,
        claimed: &Claimed<'_>,
        message: Dispatch,
        span: &Option<tracing::Span>,
    ) -> Result<(), Undone> {
        let Claimed {
            worker,
            connection,
            instance,
            attempt,
            ready_at,
        } = *claimed;
        let stream = self
            .registry
            .begin_attempt(worker, connection, instance, attempt, ready_at);
        let delivered = stream.is_some_and(|outbox| outbox.tell(ToWorker::Dispatch(message)));
        if delivered {
            tracing::debug!(instance = %instance, attempt = %attempt, worker = %worker, "dispatched");
            outcome(span, "sent");
            self.metrics.dispatches.inc();
            Metrics::observe_ms(&self.metrics.dispatch_latency, ready_at, now_ms());
            return Ok(());
        }
        outcome(span, "worker unreachable");
        Err(Undone::new(
            claimed,
            "worker unreachable at dispatch".into(),
        ))
    }
}

/// How a dispatch went, on its span.
pub fn outcome(span: &Option<tracing::Span>, outcome: &'static str) {
    if let Some(span) = span {
        span.record("ax.outcome", outcome);
    }
}

/// A dispatch's span, a child of its attempt's span (`telemetry`): from the plan to the send.
fn dispatch_span(
    trace: opentelemetry::trace::TraceId,
    workflow: &str,
    task: &str,
    instance: InstanceId,
    attempt: Attempt,
    worker: &str,
) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let span = tracing::info_span!(
        parent: None,
        "dispatch",
        ax.workflow = workflow,
        ax.task = task,
        ax.instance_id = instance.0,
        ax.attempt = attempt.0,
        ax.worker = worker,
        ax.outcome = tracing::field::Empty,
    );
    let _ = span.set_parent(telemetry::attempt_context(trace, instance, attempt));
    span
}

/// The environment a dispatch carries: the task's own, the trigger's params as
/// `AX_PARAM_<NAME>`, and the attempt's context (with the run's outcome for a handler), so a worker sets what it is given and needs to
/// know no list of names.
fn task_environment(
    task: &TaskSpec,
    ready: &Ready<'_>,
    workflow: &str,
) -> std::collections::HashMap<String, String> {
    let mut env: std::collections::HashMap<String, String> = task
        .env
        .iter()
        .map(|(name, value)| (name.clone(), with_outputs(value, ready.outputs)))
        .collect();
    // The outputs of its direct upstreams, each as AX_UPSTREAM_<TASK>_<KEY>.
    for upstream in &task.upstream {
        for (key, value) in ready.outputs.get(upstream).into_iter().flatten() {
            env.insert(ax_core::outputs::env_name(upstream, key), value.clone());
        }
    }
    for (name, value) in ready.params {
        env.insert(format!("AX_PARAM_{name}"), value.clone());
    }
    let context = [
        ("AX_RUN_ID", ready.run.0.to_string()),
        ("AX_INSTANCE_ID", ready.instance.0.to_string()),
        ("AX_ATTEMPT", ready.attempt.0.to_string()),
        ("AX_WORKFLOW", workflow.to_string()),
        ("AX_TASK", task.name.clone()),
        ("AX_LOGICAL_TIME", rfc3339(ready.logical_time)),
    ];
    env.extend(context.map(|(name, value)| (name.to_string(), value)));
    env.extend(ready.run_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    match ready.shard {
        Some(Shard {
            item: Some(item),
            index,
            ..
        }) => {
            env.insert("AX_ITEM".into(), item.clone());
            env.insert("AX_ITEM_INDEX".into(), index.to_string());
        }
        Some(shard) => {
            env.insert("AX_SHARD_INDEX".into(), shard.index.to_string());
            env.insert("AX_SHARD_TOTAL".into(), shard.total.to_string());
        }
        None => {}
    }
    env
}

/// `text` with its `${tasks.T.outputs.K}` replaced by the outputs the run's tasks passed on. The
/// advance fails a task whose named output is missing before it is ever dispatched, so a
/// reference left as written (a rerun that moved an upstream back) is a rare mismatch, logged.
fn with_outputs(text: &str, outputs: &BTreeMap<String, ax_core::outputs::Outputs>) -> String {
    if !text.contains("${tasks.") {
        return text.to_string();
    }
    let lookup = |r: &ax_core::outputs::OutputRef| outputs.get(&r.task)?.get(&r.key).cloned();
    match ax_core::outputs::substitute(text, lookup) {
        Ok(text) => text,
        Err(missing) => {
            tracing::warn!(reference = %missing, "an output named by a task is missing at dispatch");
            text.to_string()
        }
    }
}

/// A logical time as RFC 3339 in UTC, e.g. `2024-05-01T02:00:00Z`.
fn rfc3339(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|time| time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_time_is_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_714_528_800_500), "2024-05-01T02:00:00.500Z");
    }
}
