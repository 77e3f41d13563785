//! `GET /metrics`: a scrape before and after a run with a success, a retry, a failure and a
//! timeout moves the counters and histograms by what the run did; the gauges read what the store
//! says while runs wait and run; the ops listener serves the metrics and the gRPC health service
//! and nothing else; the exposition text is well formed (every family has HELP and TYPE, the
//! names follow Prometheus's conventions); cron fires, guard calls made without an unreachable
//! Redis and alerts that could not be delivered are counted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        a_run_moves_the_counters_and_the_gauges_read_the_store,
        the_ops_listener_serves_metrics_and_health_only,
        cron_fires_redis_outages_and_failed_alerts_are_counted,
    )
}

/// A hang guard, not a timing assertion.
const GUARD: Duration = Duration::from_secs(60);

/// One scrape: each sample's value by its series (`name{labels}` as written), and each family's
/// HELP and TYPE.
#[derive(Debug, Default)]
struct Scrape {
    samples: BTreeMap<String, f64>,
    help: BTreeMap<String, String>,
    types: BTreeMap<String, String>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP has a text");
                scrape.help.insert(name.into(), help.into());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
                scrape.types.insert(name.into(), kind.into());
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
                let value: f64 = value
                    .parse()
                    .unwrap_or_else(|_| panic!("{line:?}: the value is not a number"));
                scrape.samples.insert(series.into(), value);
            }
        }
        scrape
    }

    /// A series' value, 0 when absent (a labelled counter appears on its first increment).
    fn value(&self, series: &str) -> f64 {
        self.samples.get(series).copied().unwrap_or(0.0)
    }

    /// A series' value, which must be there.
    fn present(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in the scrape: {:#?}", self.samples))
    }
}

async fn scrape(url: &str) -> Scrape {
    let response = reqwest::get(url).await.expect("GET /metrics");
    assert_eq!(response.status(), 200, "GET {url}");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.expect("body");
    check_exposition(&text);
    Scrape::parse(&text)
}

/// The family a sample belongs to: its name without labels and without a histogram's suffixes.
fn family_of(series: &str, types: &BTreeMap<String, String>) -> String {
    let name = series.split('{').next().unwrap_or(series);
    if types.contains_key(name) {
        return name.to_string();
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types.get(base).map(String::as_str) == Some("histogram")
        {
            return base.to_string();
        }
    }
    panic!("sample {series} belongs to no family with a TYPE")
}

/// The text format's rules and the naming conventions: every family has one HELP and one TYPE
/// before its samples, names are `ax_` snake case, counters end in `_total`, histograms and
/// every time in `_seconds` (base units), and nothing else ends in `_total`.
fn check_exposition(text: &str) {
    let scrape = Scrape::parse(text);
    assert!(!scrape.samples.is_empty(), "an empty scrape");
    let mut seen_families = BTreeSet::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            current = rest.split(' ').next().unwrap_or_default().to_string();
            assert!(
                seen_families.insert(current.clone()),
                "family {current} described twice"
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let series = line.rsplit_once(' ').map(|(s, _)| s).unwrap_or(line);
        let family = family_of(series, &scrape.types);
        assert_eq!(
            family, current,
            "sample {series} outside its family's block"
        );
    }
    for (family, kind) in &scrape.types {
        assert!(
            scrape.help.get(family).is_some_and(|help| help.len() > 10),
            "{family} has no HELP"
        );
        assert!(
            family.starts_with("ax_"),
            "{family}: not in the ax_ namespace"
        );
        assert!(
            family
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{family}: not snake case"
        );
        match kind.as_str() {
            "counter" => assert!(
                family.ends_with("_total"),
                "counter {family} without _total"
            ),
            "histogram" => assert!(family.ends_with("_seconds"), "histogram {family}: unit"),
            "gauge" => assert!(!family.ends_with("_total"), "gauge {family} ends in _total"),
            other => panic!("{family}: unexpected type {other}"),
        }
        for unit in ["_ms", "_milliseconds", "_minutes"] {
            assert!(!family.ends_with(unit), "{family}: not in base units");
        }
    }
    for series in scrape.samples.keys() {
        family_of(series, &scrape.types);
    }
}

async fn a_run_moves_the_counters_and_the_gauges_read_the_store(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let url = format!("http://{}/metrics", cluster.addr);
    let store = ax_store::open(cluster.store_url()).await.expect("store");

    let before = scrape(&url).await;
    let source = r#"
name: observed
tasks:
  - name: ok
    command: echo one; echo two; echo three
  - name: flaky
    retries: 1
    retry_backoff: 100ms
    command: |
      echo "attempt $AX_ATTEMPT"
      if [ "$AX_ATTEMPT" -lt 2 ]; then echo "not yet" >&2; exit 1; fi
  - name: broken
    retries: 0
    command: echo "broken for good"; exit 3
  - name: slow
    retries: 0
    timeout: 1s
    command: echo "sleeping"; exec sleep 30
"#;
    client.apply(source).await.expect("apply");
    let (run, finished) = client.run_to_end("observed").await.expect("run ends");
    assert_eq!(finished.state, pb::RunState::Failed as i32, "{finished:?}");
    let instances = client.instances(run.id).await.expect("instances");
    let states: BTreeMap<&str, i32> = instances
        .iter()
        .map(|i| (i.task.as_str(), i.state))
        .collect();
    assert_eq!(
        states,
        BTreeMap::from([
            ("broken", pb::InstanceState::Failed as i32),
            ("flaky", pb::InstanceState::Success as i32),
            ("ok", pb::InstanceState::Success as i32),
            ("slow", pb::InstanceState::Timeout as i32),
        ])
    );
    // Reading each attempt's logs flushes the node's log queue: every line is stored.
    let mut stored_lines = 0;
    for instance in &instances {
        for attempt in &instance.attempts {
            stored_lines += client
                .attempt_logs(instance.id, attempt.attempt)
                .await
                .expect("logs")
                .len();
        }
    }
    assert_eq!(stored_lines, 3 + 3 + 1 + 1, "the run's lines");

    let after = scrape(&url).await;
    let moved = |series: &str| after.value(series) - before.value(series);
    assert_eq!(
        moved("ax_dispatches_total"),
        5.0,
        "ok, flaky twice, broken, slow"
    );
    assert_eq!(moved("ax_dispatch_latency_seconds_count"), 5.0);
    assert_eq!(moved("ax_start_latency_seconds_count"), 5.0);
    assert_eq!(
        moved(r#"ax_attempts_finished_total{outcome="success"}"#),
        2.0
    );
    assert_eq!(
        moved(r#"ax_attempts_finished_total{outcome="failed"}"#),
        2.0
    );
    assert_eq!(
        moved(r#"ax_attempts_finished_total{outcome="timeout"}"#),
        1.0
    );
    assert_eq!(moved("ax_retries_total"), 1.0);
    assert_eq!(moved("ax_timeouts_total"), 1.0);
    assert_eq!(moved("ax_lost_attempts_total"), 0.0);
    assert_eq!(moved("ax_log_lines_stored_total"), stored_lines as f64);
    assert!(
        moved("ax_report_batch_duration_seconds_count") >= 1.0,
        "report batches were applied"
    );
    // A histogram's +Inf bucket counts every observation.
    assert_eq!(
        after.present(r#"ax_dispatch_latency_seconds_bucket{le="+Inf"}"#),
        after.present("ax_dispatch_latency_seconds_count")
    );
    assert!(after.present("ax_log_writer_lag_seconds") >= 0.0);
    assert_eq!(after.present(r#"ax_workers{state="live"}"#), 1.0);
    assert_eq!(after.present(r#"ax_workers{state="dead"}"#), 0.0);
    assert!(
        after.present("ax_cluster_lease_age_seconds") < 10.0,
        "the lease (10 s) is renewed every 2 s"
    );
    for series in [
        "ax_alerts_failed_total",
        "ax_redis_fallbacks_total",
        "ax_log_writer_queued_bytes",
    ] {
        after.present(series);
    }
    after.present(r#"ax_reports_refused_total{reason="stale"}"#);
    assert!(after.types.contains_key("ax_cron_fire_lateness_seconds"));

    // The gauges while a run runs and another waits in the run queue, against the store.
    let held = r#"
name: held
schedule:
  max_active_runs: 1
tasks:
  - name: hold
    command: exec sleep 60
"#;
    client.apply(held).await.expect("apply held");
    let first = client.trigger_run("held").await.expect("first run");
    let second = client.trigger_run("held").await.expect("second run");
    assert_eq!(second.state, pb::RunState::Queued as i32, "{second:?}");
    client
        .wait_instance(first.id, "hold", pb::InstanceState::Running)
        .await
        .expect("hold runs");
    let gauges = wait_for_scrape(&url, |scrape| {
        scrape.value(r#"ax_instances{state="running"}"#) == 1.0
    })
    .await;
    let counts = store.active_counts().await.expect("active counts");
    assert_eq!(
        (counts.running, counts.queued_runs, counts.running_runs),
        (1, 1, 1),
        "{counts:?}"
    );
    assert_eq!(
        gauges.present(r#"ax_instances{state="running"}"#),
        counts.running as f64
    );
    assert_eq!(
        gauges.present(r#"ax_instances{state="waiting"}"#),
        counts.waiting as f64
    );
    assert_eq!(
        gauges.present(r#"ax_instances{state="dispatched"}"#),
        counts.dispatched as f64
    );
    assert_eq!(gauges.present("ax_run_queue_depth"), 1.0);
    assert_eq!(gauges.present(r#"ax_runs{state="queued"}"#), 1.0);
    assert_eq!(gauges.present(r#"ax_runs{state="running"}"#), 1.0);
    assert_eq!(
        gauges.present(r#"ax_worker_running_attempts{worker="w1"}"#),
        1.0
    );
    assert_eq!(gauges.present("ax_waiting_oldest_age_seconds"), 0.0);

    // A task no worker can take waits: the age of the oldest ready instance grows.
    let stranded =
        "name: stranded\ntasks:\n  - name: t\n    command: 'true'\n    labels: {zone: nowhere}\n";
    client.apply(stranded).await.expect("apply stranded");
    let waiting = client.trigger_run("stranded").await.expect("stranded run");
    let aged = wait_for_scrape(&url, |scrape| {
        scrape.value("ax_waiting_oldest_age_seconds") >= 1.0
    })
    .await;
    assert!(aged.present("ax_waiting_oldest_age_seconds") < 60.0);

    for run in [waiting.id, second.id, first.id] {
        client.cancel_run(run, "test over").await.expect("cancel");
    }
    let idle = wait_for_scrape(&url, |scrape| {
        scrape.value(r#"ax_instances{state="running"}"#) == 0.0
            && scrape.value("ax_run_queue_depth") == 0.0
            && scrape.value(r#"ax_worker_running_attempts{worker="w1"}"#) == 0.0
    })
    .await;
    assert_eq!(idle.present(r#"ax_runs{state="running"}"#), 0.0);
    cluster.shutdown().await.expect("shutdown");
}

/// Scrapes until `done` holds (the store is read at most once a second), within the guard.
async fn wait_for_scrape(url: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let scrape = scrape(url).await;
        if done(&scrape) {
            return scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the scrape never showed what was expected: {:#?}",
            scrape.samples
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn the_ops_listener_serves_metrics_and_health_only(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 1)
        .ops_listener()
        .start()
        .await
        .expect("cluster starts");
    let ops = cluster.scheduler.ops_addr().expect("an ops listener");
    assert_ne!(ops, cluster.addr, "a port of its own");
    let client: TestClient = cluster.client().await.expect("client");
    client
        .apply("name: one\ntasks:\n  - name: t\n    command: echo hi\n")
        .await
        .expect("apply");
    let (_, finished) = client.run_to_end("one").await.expect("run ends");
    assert_eq!(finished.state, pb::RunState::Success as i32);

    // The same registry on both ports.
    let on_ops = scrape(&format!("http://{ops}/metrics")).await;
    assert_eq!(on_ops.present("ax_dispatches_total"), 1.0);
    assert_eq!(
        on_ops.present(r#"ax_attempts_finished_total{outcome="success"}"#),
        1.0
    );

    // Only metrics and health: the API and the UI are not there.
    for path in ["/api/v1/workflows", "/", "/api/v1/runs"] {
        let response = reqwest::get(format!("http://{ops}{path}"))
            .await
            .expect("GET");
        assert_eq!(response.status(), 404, "{path} on the ops listener");
    }

    // The standard gRPC health service, as a Kubernetes probe asks it.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{ops}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the ops listener");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "ax.v1.WorkerService", "ax.v1.ControlService"] {
        let answer = tokio::time::timeout(
            GUARD,
            health.check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            }),
        )
        .await
        .expect("health answers")
        .expect("health check")
        .into_inner();
        assert_eq!(
            answer.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    // The control API is not served there.
    let mut control = pb::control_service_client::ControlServiceClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{ops}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect"),
    );
    let refused = control
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect_err("no control API on the ops listener");
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");
    cluster.shutdown().await.expect("shutdown");
}

async fn cron_fires_redis_outages_and_failed_alerts_are_counted(backend: Backend) {
    // Ports where nothing listens: Redis and the alert channel are unreachable.
    let closed = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
    };
    let mut channel = ax_scheduler::alerts::ChannelConfig::new(
        "nowhere",
        ax_scheduler::alerts::ChannelFormat::Webhook,
        format!("http://{}/hook", closed()),
    );
    channel.retries = 0;
    let cluster = Cluster::builder(backend)
        .worker("w1", 2)
        .redis_url(&format!("redis://{}", closed()))
        .alert_channel(channel)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let url = format!("http://{}/metrics", cluster.addr);
    let before = scrape(&url).await;
    client
        .apply("name: every-second\nschedule:\n  cron: \"* * * * * *\"\ntasks:\n  - name: fail\n    retries: 0\n    command: exit 1\n")
        .await
        .expect("apply");
    let after = wait_for_scrape(&url, |scrape| {
        scrape.value("ax_cron_fire_lateness_seconds_count") >= 2.0
            && scrape.value(r#"ax_attempts_finished_total{outcome="failed"}"#) >= 1.0
            && scrape.value("ax_alerts_failed_total") >= 1.0
    })
    .await;
    client.pause("every-second").await.expect("pause");
    let runs = client.runs("every-second").await.expect("runs");
    assert!(
        after.value("ax_cron_fire_lateness_seconds_count") <= runs.len() as f64,
        "one observation per cron run created"
    );
    // Every dispatch takes a start lock (one through the WAITING queue also a dedup marker; a
    // task placed as its run is created needs none): without Redis, each is a fallback.
    let dispatched = after.value("ax_dispatches_total") - before.value("ax_dispatches_total");
    assert!(dispatched >= 1.0);
    assert!(
        after.value("ax_redis_fallbacks_total") - before.value("ax_redis_fallbacks_total")
            >= dispatched,
        "{:#?}",
        after.samples
    );
    cluster.shutdown().await.expect("shutdown");
}
