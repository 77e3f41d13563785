//! Control from any node: two in-process nodes on one MySQL database, each worker connected to
//! one of them. A cancel sent to the node its worker is not on kills the task's process; `logs
//! -f` through that node follows the attempt to its last line; an instance whose labels only
//! the other node's worker carries runs there.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::requirements::MYSQL;
use ax_integration_tests::{Backend, TestClient, TestDb};
use ax_proto::v1 as pb;
use ax_scheduler::{RunningScheduler, SchedulerOptions};
use ax_worker::WorkerOptions;
use tokio_util::sync::CancellationToken;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) a_cancel_sent_to_another_node_kills_the_task_on_its_worker).requires(&MYSQL),
        trial!(async(multi_thread = 2) logs_followed_through_another_node_arrive_whole_and_end_with_the_attempt).requires(&MYSQL),
        trial!(async(multi_thread = 2) a_task_only_the_other_nodes_worker_can_run_runs_there).requires(&MYSQL),
        trial!(async(multi_thread = 2) failover_and_consistent_hash_choose_among_the_whole_clusters_workers).requires(&MYSQL),
    ]
}

/// What a test waits for at most before it calls a hang a failure.
const HANG_GUARD: Duration = Duration::from_secs(30);

struct TwoNodes {
    db: TestDb,
    nodes: Vec<RunningScheduler>,
    workers: Vec<(
        CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

impl TwoNodes {
    async fn start(dir: &Path) -> TwoNodes {
        let db = TestDb::create(Backend::MySql, dir).await.expect("test db");
        let mut nodes = Vec::new();
        for id in ["n1", "n2"] {
            let options = SchedulerOptions {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                store_url: db.url.clone(),
                node_id: id.into(),
                node_lease: Duration::from_secs(2),
                heartbeat_interval: Duration::from_millis(500),
                ..SchedulerOptions::default()
            };
            nodes.push(ax_scheduler::start(options).await.expect("node starts"));
        }
        TwoNodes {
            db,
            nodes,
            workers: Vec::new(),
        }
    }

    fn endpoint(&self, node: usize) -> String {
        format!("http://{}", self.nodes[node].local_addr())
    }

    async fn client(&self, node: usize) -> TestClient {
        TestClient::connect(&self.endpoint(node))
            .await
            .expect("client")
    }

    /// A worker connected to `node` only, carrying `labels`.
    fn worker(&mut self, id: &str, node: usize, labels: &[(&str, &str)]) {
        let options = WorkerOptions {
            endpoints: vec![self.endpoint(node)],
            worker_id: id.into(),
            state_dir: Some(ax_integration_tests::fresh_state_dir()),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            capacity: 4,
            heartbeat_interval: Duration::from_millis(500),
            kill_grace: Duration::from_secs(1),
            ..WorkerOptions::default()
        };
        let token = CancellationToken::new();
        let handle = tokio::spawn(ax_worker::run(options, token.clone()));
        self.workers.push((token, handle));
    }

    async fn shutdown(self) {
        for (token, handle) in self.workers {
            token.cancel();
            let _ = tokio::time::timeout(HANG_GUARD, handle).await;
        }
        for node in self.nodes {
            node.shutdown().await.expect("shutdown");
        }
        self.db.drop_database().await.expect("drop database");
    }
}

/// Whether a process with this pid exists.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn wait_until(what: &str, done: impl AsyncFnMut() -> bool) {
    wait_within(HANG_GUARD, what, done).await;
}

async fn wait_within(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "{what} did not happen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_cancel_sent_to_another_node_kills_the_task_on_its_worker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = TwoNodes::start(dir.path()).await;
    cluster.worker("w1", 0, &[]);
    let on_n1 = cluster.client(0).await;
    let on_n2 = cluster.client(1).await;
    on_n1
        .wait_worker_live("w1", HANG_GUARD)
        .await
        .expect("w1 live");
    let pid_file = dir.path().join("pid");
    let workflow = format!(
        "name: long\ntasks:\n  - name: sleep\n    command: echo $$ > {} && exec sleep 120\n",
        pid_file.display()
    );
    on_n2.apply(&workflow).await.expect("apply");
    let run = on_n2.trigger_run("long").await.expect("trigger");
    wait_until("the task writing its pid", async || {
        std::fs::read_to_string(&pid_file).is_ok_and(|text| text.trim().parse::<u32>().is_ok())
    })
    .await;
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(alive(pid));

    // The worker is on n1; the cancel goes to n2.
    let cancelled = on_n2.cancel_run(run.id, "from n2").await.expect("cancel");
    assert_eq!(cancelled.state(), pb::RunState::Cancelled);
    let asked = Instant::now();
    // Within a second or so; 10 s is far from that and far below the 30 s task heartbeat
    // whose refused report would kill the process anyway.
    wait_within(
        Duration::from_secs(10),
        "the task's process dying",
        async || !alive(pid),
    )
    .await;
    println!(
        "the process died {} ms after the cancel",
        asked.elapsed().as_millis()
    );

    // The worker's own report adds how the process ended to the cancelled attempt.
    let instance = on_n2.instances(run.id).await.expect("instances").remove(0);
    wait_until("the worker's report of the kill", async || {
        let instance = on_n1.instances(run.id).await.expect("instances").remove(0);
        instance.attempts[0].signal.is_some() || instance.attempts[0].exit_code.is_some()
    })
    .await;
    assert_eq!(instance.state(), pb::InstanceState::Cancelled);
    cluster.shutdown().await;
}

async fn logs_followed_through_another_node_arrive_whole_and_end_with_the_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = TwoNodes::start(dir.path()).await;
    cluster.worker("w1", 0, &[]);
    let on_n1 = cluster.client(0).await;
    let on_n2 = cluster.client(1).await;
    on_n1
        .wait_worker_live("w1", HANG_GUARD)
        .await
        .expect("w1 live");
    on_n2
        .apply(
            "name: talk\ntasks:\n  - name: count\n    \
             command: for i in $(seq 1 30); do echo line $i; sleep 0.05; done\n",
        )
        .await
        .expect("apply");
    let run = on_n2.trigger_run("talk").await.expect("trigger");
    let instance = on_n2
        .wait_instance(run.id, "count", pb::InstanceState::Running)
        .await
        .expect("running");
    let request = pb::GetLogsRequest {
        instance_id: instance.id,
        attempt: 0,
        follow: true,
        after_seq: 0,
        ..Default::default()
    };
    let followed = tokio::time::timeout(HANG_GUARD, async {
        let mut stream = on_n2
            .control()
            .get_logs(request)
            .await
            .expect("GetLogs")
            .into_inner();
        let mut lines = Vec::new();
        while let Some(chunk) = stream.message().await.expect("chunk") {
            lines.extend(chunk.lines.into_iter().map(|line| line.text));
        }
        lines
    })
    .await
    .expect("the follow ends with the attempt");
    let expected: Vec<String> = (1..=30).map(|i| format!("line {i}")).collect();
    assert_eq!(followed, expected);
    cluster.shutdown().await;
}

async fn a_task_only_the_other_nodes_worker_can_run_runs_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = TwoNodes::start(dir.path()).await;
    cluster.worker("plain", 1, &[]);
    cluster.worker("gpu", 0, &[("gpu", "yes")]);
    let on_n2 = cluster.client(1).await;
    on_n2
        .wait_for_workers(2, HANG_GUARD)
        .await
        .expect("both live");
    on_n2
        .apply(
            "name: mixed\ntasks:\n  - name: train\n    labels: {gpu: 'yes'}\n    \
             command: echo trained\n  - name: report\n    upstream: [train]\n    \
             command: echo reported\n",
        )
        .await
        .expect("apply");
    let run = on_n2.trigger_run("mixed").await.expect("trigger");
    let ended = on_n2
        .wait_run_within(run.id, HANG_GUARD)
        .await
        .expect("run ends");
    assert_eq!(ended.state(), pb::RunState::Success);
    let instances = on_n2.instances(run.id).await.expect("instances");
    let train = instances.iter().find(|i| i.task == "train").expect("train");
    assert_eq!(train.attempts.len(), 1, "{train:?}");
    assert_eq!(train.attempts[0].worker_id, "gpu");
    assert_eq!(train.attempts[0].node_id, "n1");
    cluster.shutdown().await;
}

async fn failover_and_consistent_hash_choose_among_the_whole_clusters_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = TwoNodes::start(dir.path()).await;
    // The lowest id is on n2; triggers go to n1, whose only worker is "b".
    cluster.worker("a", 1, &[]);
    cluster.worker("b", 0, &[]);
    let on_n1 = cluster.client(0).await;
    on_n1
        .wait_for_workers(2, HANG_GUARD)
        .await
        .expect("both live");
    on_n1
        .apply(
            "name: routed\ntasks:\n  - name: primary\n    routing: failover\n    \
             command: 'true'\n  - name: sticky\n    routing: consistent_hash\n    \
             command: 'true'\n",
        )
        .await
        .expect("apply");
    let mut sticky_workers = Vec::new();
    for _ in 0..6 {
        let run = on_n1.trigger_run("routed").await.expect("trigger");
        let ended = on_n1
            .wait_run_within(run.id, HANG_GUARD)
            .await
            .expect("run ends");
        assert_eq!(ended.state(), pb::RunState::Success);
        for instance in on_n1.instances(run.id).await.expect("instances") {
            let worker = instance.attempts[0].worker_id.clone();
            match instance.task.as_str() {
                "primary" => assert_eq!(worker, "a", "failover picks the cluster's lowest id"),
                _ => sticky_workers.push(worker),
            }
        }
    }
    sticky_workers.dedup();
    assert_eq!(
        sticky_workers.len(),
        1,
        "one key, one worker, whichever node dispatched: {sticky_workers:?}"
    );
    cluster.shutdown().await;
}
