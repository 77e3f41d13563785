//! OpenTelemetry traces, end to end: a real `ax-scheduler` and `ax-worker` started with
//! `--otlp-endpoint` export to an OTLP/HTTP receiver this test runs on loopback. The example
//! workflow (`examples/etl.yaml`, its report task also printing its `TRACEPARENT`) makes one
//! trace: the run's span, a span per instance under it, a span per attempt under each, and under
//! each attempt its dispatch, the report batches that applied its start and its end, and the
//! worker's span for the process; the task's `TRACEPARENT` names the trace and its attempt's span.
//! A run with a retried task, then cancelled, shows both attempts (the failed one in error) and
//! the cancelled task's attempt and killed process.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax_integration_tests::Backend;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{ProcessCluster, SchedulerSettings, WorkerSettings};
use ax_proto::v1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

pub(crate) fn tests() -> Vec<Test> {
    vec![trial!(async(multi_thread = 4) the_example_workflow_makes_one_trace_that_the_task_joins)]
}

/// A hang guard, not a timing assertion.
const GUARD: Duration = Duration::from_secs(60);

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    start: u64,
    end: u64,
    attributes: BTreeMap<String, String>,
    error: bool,
}

impl Received {
    fn attribute(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("span {} has no attribute {key}: {self:?}", self.name))
    }
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver on loopback: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, as a collector takes it.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return (axum::http::StatusCode::BAD_REQUEST, Vec::new());
                    };
                    let mut spans = kept.lock().unwrap_or_else(|p| p.into_inner());
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                            .unwrap_or_default();
                        for scope in resource.scope_spans {
                            for span in scope.spans {
                                spans.push(Received {
                                    service: service.clone(),
                                    name: span.name,
                                    trace: hex(&span.trace_id),
                                    id: hex(&span.span_id),
                                    parent: hex(&span.parent_span_id),
                                    start: span.start_time_unix_nano,
                                    end: span.end_time_unix_nano,
                                    attributes: span
                                        .attributes
                                        .iter()
                                        .map(|kv| {
                                            let value =
                                                kv.value.as_ref().and_then(|v| v.value.as_ref());
                                            (kv.key.clone(), text(value))
                                        })
                                        .collect(),
                                    error: span.status.is_some_and(|s| s.code == 2),
                                });
                            }
                        }
                    }
                    (
                        axum::http::StatusCode::OK,
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            endpoint,
            spans,
            task,
        }
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn the_example_workflow_makes_one_trace_that_the_task_joins() {
    let receiver = Receiver::start().await;
    let settings = SchedulerSettings {
        otlp_endpoint: Some(receiver.endpoint.clone()),
        ..SchedulerSettings::default()
    };
    let mut cluster = ProcessCluster::start_with(Backend::Sqlite, settings)
        .await
        .expect("the scheduler starts");
    let worker = WorkerSettings {
        capacity: Some(4),
        otlp_endpoint: Some(receiver.endpoint.clone()),
        ..WorkerSettings::default()
    };
    cluster
        .start_live_worker("w1", &worker)
        .await
        .expect("the worker connects");
    let client = cluster.client().await.expect("client");

    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/etl.yaml"))
            .expect("example file")
            .replace(
                "/tmp/ax-etl",
                &cluster.dir().join("etl").display().to_string(),
            )
            .replace(
                "      echo \"daily revenue report",
                "      echo \"traceparent $TRACEPARENT\"\n      echo \"daily revenue report",
            );
    assert!(source.contains("traceparent $TRACEPARENT"), "{source}");
    client.apply(&source).await.expect("apply");
    let (run, finished) = client
        .run_to_end("daily-sales-etl")
        .await
        .expect("run ends");
    assert_eq!(finished.state, pb::RunState::Success as i32, "{finished:?}");
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(instances.len(), 5);
    let report = instances
        .iter()
        .find(|i| i.task == "report")
        .expect("report task");
    let lines = client.logs(report.id).await.expect("logs");
    let traceparent = lines
        .iter()
        .find_map(|line| line.text.strip_prefix("traceparent "))
        .unwrap_or_else(|| panic!("the task printed no TRACEPARENT: {lines:?}"))
        .to_string();

    // A retried attempt and a cancelled run: their spans say so.
    client
        .apply(
            "name: traced-failures\ntasks:\n  - name: flaky\n    retries: 1\n    retry_backoff: 100ms\n    command: if [ \"$AX_ATTEMPT\" -lt 2 ]; then exit 1; fi\n  - name: hold\n    command: exec sleep 60\n",
        )
        .await
        .expect("apply traced-failures");
    let second = client
        .trigger_run("traced-failures")
        .await
        .expect("trigger traced-failures");
    client
        .wait_instance(second.id, "flaky", pb::InstanceState::Success)
        .await
        .expect("flaky succeeds on its retry");
    client
        .wait_instance(second.id, "hold", pb::InstanceState::Running)
        .await
        .expect("hold runs");
    client
        .cancel_run(second.id, "enough")
        .await
        .expect("cancel");
    let cancelled = client.wait_run(second.id).await.expect("run ends");
    assert_eq!(cancelled.state, pb::RunState::Cancelled as i32);

    // A graceful stop flushes every process's exporter.
    cluster.shutdown().await.expect("clean shutdown");
    let deadline = tokio::time::Instant::now() + GUARD;
    let spans = loop {
        let spans = receiver.spans();
        let processes = spans.iter().filter(|s| s.name == "process").count();
        let runs = ["run daily-sales-etl", "run traced-failures"];
        if runs.iter().all(|run| spans.iter().any(|s| s.name == *run)) && processes >= 8 {
            break spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the spans never all arrived: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // One run span, the root of one trace.
    let runs: Vec<&Received> = spans
        .iter()
        .filter(|s| s.name == "run daily-sales-etl")
        .collect();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let root = runs[0];
    assert_eq!(root.service, "ax-scheduler");
    assert_eq!(root.parent, "", "the run span is the root");
    assert_eq!(root.attribute("ax.run_id"), run.id.to_string());
    assert_eq!(root.attribute("ax.workflow"), "daily-sales-etl");
    assert_eq!(root.attribute("ax.run.state"), "SUCCESS");
    assert!(!root.error);
    let trace = root.trace.clone();
    let in_trace: Vec<&Received> = spans.iter().filter(|s| s.trace == trace).collect();
    let traces: BTreeSet<&str> = spans
        .iter()
        .filter(|s| s.attributes.get("ax.workflow").map(String::as_str) == Some("daily-sales-etl"))
        .map(|s| s.trace.as_str())
        .collect();
    assert_eq!(traces.len(), 1, "one trace for the run: {traces:?}");
    let children_of = |parent: &str, name: &str| -> Vec<&Received> {
        in_trace
            .iter()
            .copied()
            .filter(|s| s.parent == parent && s.name == name)
            .collect()
    };

    for instance in &instances {
        let task = &instance.task;
        let task_spans = children_of(&root.id, &format!("task {task}"));
        assert_eq!(task_spans.len(), 1, "{task}: {task_spans:#?}");
        let task_span = task_spans[0];
        assert_eq!(task_span.attribute("ax.task"), task);
        assert_eq!(
            task_span.attribute("ax.instance_id"),
            instance.id.to_string()
        );
        assert_eq!(task_span.attribute("ax.instance.state"), "SUCCESS");
        assert!(root.start <= task_span.start && task_span.end <= root.end);

        let attempts = children_of(&task_span.id, &format!("attempt {task}"));
        assert_eq!(attempts.len(), 1, "{task}: {attempts:#?}");
        let attempt = attempts[0];
        assert_eq!(attempt.attribute("ax.attempt"), "1");
        assert_eq!(attempt.attribute("ax.outcome"), "success");
        assert_eq!(attempt.attribute("ax.worker"), "w1");
        assert_eq!(attempt.attribute("ax.task"), task);
        assert_eq!(attempt.attribute("process.exit.code"), "0");
        assert!(attempt.start <= attempt.end && attempt.end <= task_span.end);

        let dispatches = children_of(&attempt.id, "dispatch");
        assert_eq!(dispatches.len(), 1, "{task}: {dispatches:#?}");
        assert_eq!(dispatches[0].attribute("ax.outcome"), "sent");
        assert_eq!(dispatches[0].attribute("ax.worker"), "w1");
        assert_eq!(dispatches[0].attribute("ax.task"), task);

        let reports: BTreeSet<&str> = children_of(&attempt.id, "report batch")
            .iter()
            .map(|s| s.attribute("ax.report"))
            .collect();
        assert_eq!(
            reports,
            BTreeSet::from(["started", "finished"]),
            "{task}: the batches that applied its start and its end"
        );

        let processes = children_of(&attempt.id, "process");
        assert_eq!(processes.len(), 1, "{task}: {processes:#?}");
        assert_eq!(processes[0].service, "ax-worker");
        assert_eq!(processes[0].attribute("task"), task);

        if task == "report" {
            assert_eq!(
                traceparent,
                format!("00-{trace}-{}-01", attempt.id),
                "the task's TRACEPARENT names the trace and its attempt's span"
            );
        }
    }
    // Nothing of the run's trace hangs outside the tree.
    let ids: BTreeSet<&str> = in_trace.iter().map(|s| s.id.as_str()).collect();
    for span in &in_trace {
        assert!(
            span.parent.is_empty() || ids.contains(span.parent.as_str()),
            "{} has a parent outside the trace: {span:?}",
            span.name
        );
    }
    print_tree(&in_trace, &root.id, 0);

    let failures = spans
        .iter()
        .find(|s| s.name == "run traced-failures")
        .expect("the cancelled run's span");
    assert_eq!(failures.attribute("ax.run.state"), "CANCELLED");
    assert!(failures.error, "a cancelled run's span has an error status");
    let of_run: Vec<&Received> = spans.iter().filter(|s| s.trace == failures.trace).collect();
    let child = |parent: &str, name: &str| -> Vec<&Received> {
        of_run
            .iter()
            .copied()
            .filter(|s| s.parent == parent && s.name == name)
            .collect()
    };
    let flaky = child(&failures.id, "task flaky");
    assert_eq!(flaky.len(), 1, "{flaky:#?}");
    assert_eq!(flaky[0].attribute("ax.attempts"), "2");
    let mut tries = child(&flaky[0].id, "attempt flaky");
    tries.sort_by_key(|s| s.attribute("ax.attempt").to_string());
    let outcomes: Vec<(&str, &str, bool)> = tries
        .iter()
        .map(|s| {
            (
                s.attribute("ax.attempt"),
                s.attribute("ax.outcome"),
                s.error,
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![("1", "failed", true), ("2", "success", false)]
    );
    let hold = child(&failures.id, "task hold");
    assert_eq!(hold.len(), 1, "{hold:#?}");
    assert_eq!(hold[0].attribute("ax.instance.state"), "CANCELLED");
    let held = child(&hold[0].id, "attempt hold");
    assert_eq!(held.len(), 1, "{held:#?}");
    assert_eq!(held[0].attribute("ax.outcome"), "cancelled");
    assert_eq!(
        child(&held[0].id, "process").len(),
        1,
        "the killed process's span"
    );
    print_tree(&of_run, &failures.id, 0);
}

/// The trace as a tree on the test's output, for the docs.
fn print_tree(spans: &[&Received], id: &str, depth: usize) {
    let Some(span) = spans.iter().find(|s| s.id == id) else {
        return;
    };
    let attributes: Vec<String> = span
        .attributes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "{}{} [{}] {:.1} ms span={} {}",
        "  ".repeat(depth),
        span.name,
        span.service,
        (span.end.saturating_sub(span.start)) as f64 / 1e6,
        span.id,
        attributes.join(" ")
    );
    let mut children: Vec<&&Received> = spans.iter().filter(|s| s.parent == id).collect();
    children.sort_by_key(|s| (s.start, s.name.clone()));
    for child in children {
        print_tree(spans, &child.id, depth + 1);
    }
}
