//! Deadlines end to end: a real scheduler and worker, a workflow with `deadline: 2s` whose task
//! sleeps longer. The run misses it once: one `deadline_missed` alert at a webhook receiver, one
//! decision (`axctl why`), `ax_deadlines_missed_total` counted, the run shown missed by `axctl
//! get run`; it goes on, or with `on_deadline: cancel` ends CANCELLED with its process killed.
//! Two nodes on MySQL judge it once. Timing is only ever bounded from above, generously.

use std::time::Duration;

use ax_integration_tests::harness::{MYSQL, Test, trial};
use ax_integration_tests::on_every_backend;
use ax_integration_tests::process::{pid_from_file, wait_gone};
use ax_integration_tests::{Backend, Cluster, TestClient, TestDb, WebhookReceiver};
use ax_proto::v1 as pb;
use ax_scheduler::SchedulerOptions;
use ax_scheduler::alerts::{ChannelConfig, ChannelFormat};

/// A hang guard, not a timing assertion.
const WITHIN: Duration = Duration::from_secs(30);

pub(crate) fn tests() -> Vec<Test> {
    [
        on_every_backend!(
            a_run_past_its_deadline_is_alerted_once_and_goes_on,
            a_cancelling_deadline_ends_the_run_and_kills_its_task,
        ),
        vec![
            trial!(async(multi_thread = 4) two_nodes_judge_a_missed_deadline_once).requires(&MYSQL),
        ],
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The `deadline_missed` alerts the receiver got so far.
fn missed_alerts(receiver: &WebhookReceiver) -> Vec<serde_json::Value> {
    receiver
        .bodies()
        .iter()
        .map(|body| serde_json::from_str::<serde_json::Value>(body).expect("json body"))
        .filter(|alert| alert["kind"] == "deadline_missed")
        .collect()
}

/// Waits until the receiver has a `deadline_missed` alert.
async fn first_missed_alert(receiver: &WebhookReceiver) -> serde_json::Value {
    let until = tokio::time::Instant::now() + WITHIN;
    loop {
        if let Some(alert) = missed_alerts(receiver).into_iter().next() {
            return alert;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no deadline_missed alert; received: {:?}",
            receiver.bodies()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The run's `deadline_missed` decisions, as `ExplainWorkflow` (`axctl why`) shows them.
async fn missed_decisions(client: &TestClient, workflow: &str) -> Vec<pb::DecisionEntry> {
    client
        .control()
        .explain_workflow(pb::ExplainWorkflowRequest {
            name: workflow.into(),
            at_ms: 0,
        })
        .await
        .expect("ExplainWorkflow")
        .into_inner()
        .decisions
        .into_iter()
        .filter(|d| d.kind == "deadline_missed")
        .collect()
}

async fn a_run_past_its_deadline_is_alerted_once_and_goes_on(backend: Backend) {
    let receiver = WebhookReceiver::start().await.expect("receiver");
    let cluster = Cluster::builder(backend)
        .worker("w1", 2)
        .alert_channel(ChannelConfig::new(
            "ops",
            ChannelFormat::Webhook,
            receiver.url.clone(),
        ))
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let source = "
name: late
deadline: 2s
tasks:
  - name: slow
    command: sleep 5
";
    client.apply(source).await.expect("apply");
    let run = client.trigger_run("late").await.expect("trigger");
    assert_eq!(run.deadline_at_ms, run.created_at_ms + 2_000);
    assert_eq!(run.deadline_missed_at_ms, 0);

    let alert = first_missed_alert(&receiver).await;
    assert_eq!(alert["workflow"], "late");
    assert_eq!(alert["run_id"], run.id);
    let message = alert["message"].as_str().expect("message");
    assert!(message.contains("deadline 2s"), "{message}");
    assert!(message.contains("the run goes on"), "{message}");

    // Alert only: the run goes on and succeeds; it stays marked missed.
    let ended = client
        .wait_run_within(run.id, WITHIN)
        .await
        .expect("run ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    assert!(
        ended.deadline_missed_at_ms >= ended.deadline_at_ms,
        "{ended:?}"
    );
    // A few more judging passes raise nothing more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(missed_alerts(&receiver).len(), 1, "{:?}", receiver.bodies());
    let decisions = missed_decisions(&client, "late").await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0].run_id, run.id);

    let metrics = reqwest::get(format!("http://{}/metrics", cluster.addr))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics
            .lines()
            .any(|line| line == "ax_deadlines_missed_total 1"),
        "{metrics}"
    );

    // axctl shows the miss: `get run` and `why`.
    let id = run.id.to_string();
    let shown = cluster.axctl(&["get", "run", &id]).expect("axctl get run");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("(missed, judged "), "{text}");
    let why = cluster.axctl(&["why", "late"]).expect("axctl why");
    let text = String::from_utf8_lossy(&why.stdout);
    assert!(text.contains("deadline_missed"), "{text}");
    cluster.shutdown().await.expect("shutdown");
}

async fn a_cancelling_deadline_ends_the_run_and_kills_its_task(backend: Backend) {
    let receiver = WebhookReceiver::start().await.expect("receiver");
    let cluster = Cluster::builder(backend)
        .worker("w1", 2)
        .alert_channel(ChannelConfig::new(
            "ops",
            ChannelFormat::Webhook,
            receiver.url.clone(),
        ))
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let pid_file = cluster.dir().join("pid");
    let source = format!(
        "
name: bounded
deadline: 2s
on_deadline: cancel
tasks:
  - name: long
    command: echo $$ > {pid}; exec sleep 60
  - name: after
    upstream: [long]
    command: echo never
",
        pid = pid_file.display()
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("bounded").await.expect("trigger");
    let pid = pid_from_file(&pid_file, WITHIN).await;

    let ended = client
        .wait_run_within(run.id, WITHIN)
        .await
        .expect("run ends");
    assert_eq!(ended.state, pb::RunState::Cancelled as i32);
    assert!(ended.deadline_missed_at_ms > 0, "{ended:?}");
    // The task's process is killed once its run's deadline cancelled it.
    wait_gone(pid, WITHIN).await;
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(
        instances.len(),
        1,
        "the downstream of a cancelled task was created"
    );
    assert_eq!(instances[0].state, pb::InstanceState::Cancelled as i32);
    let alert = first_missed_alert(&receiver).await;
    let message = alert["message"].as_str().expect("message");
    assert!(message.contains("the run is cancelled"), "{message}");
    assert_eq!(missed_decisions(&client, "bounded").await.len(), 1);
    cluster.shutdown().await.expect("shutdown");
}

/// A node of a two-node cluster, alerting to `receiver`.
fn node(url: &str, node_id: &str, receiver: &WebhookReceiver) -> SchedulerOptions {
    SchedulerOptions {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: url.to_string(),
        node_id: node_id.into(),
        node_lease: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(500),
        alerts: vec![ChannelConfig::new(
            "ops",
            ChannelFormat::Webhook,
            receiver.url.clone(),
        )],
        ..SchedulerOptions::default()
    }
}

async fn two_nodes_judge_a_missed_deadline_once() {
    let receiver = WebhookReceiver::start().await.expect("receiver");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(Backend::MySql, dir.path())
        .await
        .expect("test db");
    let n1 = ax_scheduler::start(node(&db.url, "n1", &receiver))
        .await
        .expect("n1");
    let n2 = ax_scheduler::start(node(&db.url, "n2", &receiver))
        .await
        .expect("n2");
    // The worker and the client are on n2; the judge is n1, the lowest live node.
    let n2_url = format!("http://{}", n2.local_addr());
    let cancel = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(ax_worker::run(
        ax_worker::WorkerOptions {
            endpoints: vec![n2_url.clone()],
            worker_id: "w1".into(),
            state_dir: Some(ax_integration_tests::fresh_state_dir()),
            capacity: 4,
            heartbeat_interval: Duration::from_millis(500),
            ..ax_worker::WorkerOptions::default()
        },
        cancel.clone(),
    ));
    let client = TestClient::connect(&n2_url).await.expect("client");
    client
        .wait_for_workers(1, WITHIN)
        .await
        .expect("the worker is live");
    let source = "
name: late
deadline: 1s
tasks:
  - name: slow
    command: sleep 4
";
    client.apply(source).await.expect("apply");
    let runs = [
        client.trigger_run("late").await.expect("trigger"),
        client.trigger_run("late").await.expect("trigger"),
    ];
    for run in &runs {
        let ended = client
            .wait_run_within(run.id, WITHIN)
            .await
            .expect("run ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
        assert!(ended.deadline_missed_at_ms > 0, "{ended:?}");
    }
    first_missed_alert(&receiver).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let alerts = missed_alerts(&receiver);
    let mut alerted: Vec<i64> = alerts
        .iter()
        .map(|alert| alert["run_id"].as_i64().expect("run id"))
        .collect();
    alerted.sort();
    assert_eq!(
        alerted,
        [runs[0].id, runs[1].id],
        "one alert per run: {alerts:?}"
    );

    let store = ax_store::open(&db.url).await.expect("store");
    let workflow = store
        .get_workflow("late")
        .await
        .expect("read")
        .expect("workflow");
    let decisions: Vec<_> = store
        .list_decisions(workflow.id, 0, i64::MAX, 1_000)
        .await
        .expect("decisions")
        .into_iter()
        .filter(|d| d.kind == ax_core::decision::DecisionKind::DeadlineMissed)
        .collect();
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert!(decisions.iter().all(|d| d.node_id == "n1"), "{decisions:?}");

    cancel.cancel();
    let _ = tokio::time::timeout(WITHIN, worker).await;
    n2.shutdown().await.expect("shutdown n2");
    n1.shutdown().await.expect("shutdown n1");
    db.drop_database().await.expect("drop database");
}
