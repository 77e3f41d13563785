//! Workers spread over the scheduler nodes of one MySQL store (and one Redis): in-process nodes
//! and in-process workers, every worker given the same list of endpoints.
//!
//! - six workers whose ids all start at the first node end up two per node once the other
//!   nodes are up, and stay so;
//! - a node shut down and started again gets its share back, moved to it from the others;
//! - tasks running on a worker that is moved finish SUCCESS as attempt 1 with every line
//!   stored once (the fault kit's ledger checks);
//! - a worker whose first endpoint refuses connections uses the others.
//!
//! Where workers are, is read from their rows (connected, refreshed within the dead-worker
//! threshold); waits give up after generous hang guards, and nothing is timed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ax_integration_tests::fault_kit::{Lines, check_invariants, script, wait_notes, workflow};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::free_port;
use ax_integration_tests::requirements::MYSQL;
use ax_integration_tests::{Backend, TestClient, TestDb, redis_url_if_set};
use ax_proto::v1 as pb;
use ax_scheduler::{RunningScheduler, SchedulerOptions};
use ax_store::Store;
use ax_worker::WorkerOptions;
use ax_worker::endpoints::first_index;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 4) workers_that_all_start_on_one_node_end_up_spread).requires(&MYSQL),
        trial!(async(multi_thread = 4) a_restarted_node_gets_its_share_of_workers_back).requires(&MYSQL),
        trial!(async(multi_thread = 4) tasks_running_through_a_move_finish_as_attempt_one_with_every_line).requires(&MYSQL),
        trial!(async(multi_thread = 4) a_worker_whose_first_endpoint_is_unreachable_runs_tasks).requires(&MYSQL),
    ]
}

/// How long the cluster may take to reach what a test waits for.
const GUARD: Duration = Duration::from_secs(90);
/// 500 ms heartbeats, dead after 4 missed: rows are fresh for 2 s, and a node's start grace
/// is 2 s.
const HEARTBEAT: Duration = Duration::from_millis(500);
const FRESH_MS: i64 = 2_000;

/// Which workers each node holds, by node id.
type Placement = BTreeMap<String, Vec<String>>;

struct Sandbox {
    _dir: tempfile::TempDir,
    db: TestDb,
    redis: Option<String>,
    namespace: String,
    /// Each node's address, fixed before any node starts, so a node can start later (or again)
    /// where the workers' lists say it is.
    addresses: Vec<SocketAddr>,
    nodes: Vec<Option<RunningScheduler>>,
    workers: Vec<(String, CancellationToken, JoinHandle<anyhow::Result<()>>)>,
    store: Arc<Store>,
}

/// A port nothing listens on now.
fn free_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port().expect("a free port")))
}

fn node_id(index: usize) -> String {
    format!("n{}", index + 1)
}

/// `count` worker ids whose first choice among `len` endpoints is the one at `index`.
fn ids_starting_at(index: usize, len: usize, count: usize) -> Vec<String> {
    (0..)
        .map(|n| format!("w{n}"))
        .filter(|id| first_index(id, len) == index)
        .take(count)
        .collect()
}

impl Sandbox {
    /// A fresh MySQL database and `nodes` node addresses, no node started.
    async fn new(nodes: usize) -> Sandbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = TestDb::create(Backend::MySql, dir.path())
            .await
            .expect("test db");
        let store = ax_store::open(&db.url).await.expect("store");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Sandbox {
            _dir: dir,
            db,
            redis: redis_url_if_set(),
            namespace: format!("ax-test-spread-{}-{nanos}", std::process::id()),
            addresses: (0..nodes).map(|_| free_address()).collect(),
            nodes: (0..nodes).map(|_| None).collect(),
            workers: Vec::new(),
            store,
        }
    }

    fn url(&self, index: usize) -> String {
        format!("http://{}", self.addresses[index])
    }

    fn urls(&self) -> Vec<String> {
        (0..self.addresses.len()).map(|i| self.url(i)).collect()
    }

    async fn start_node(&mut self, index: usize) {
        let options = SchedulerOptions {
            listen: self.addresses[index],
            store_url: self.db.url.clone(),
            redis_url: self.redis.clone(),
            redis_namespace: self.namespace.clone(),
            node_id: node_id(index),
            node_lease: Duration::from_secs(2),
            spread_interval: Some(Duration::from_millis(500)),
            heartbeat_interval: HEARTBEAT,
            task_heartbeat_interval: Duration::from_secs(2),
            dead_after_missed_heartbeats: 4,
            timeout_grace: Duration::from_secs(2),
            log_flush_interval: Duration::from_millis(10),
            ..SchedulerOptions::default()
        };
        let node = tokio::time::timeout(GUARD, ax_scheduler::start(options))
            .await
            .expect("the node starts without hanging")
            .expect("the node starts");
        self.nodes[index] = Some(node);
    }

    async fn stop_node(&mut self, index: usize) {
        let node = self.nodes[index].take().expect("the node runs");
        node.shutdown().await.expect("clean shutdown");
    }

    fn start_worker(&mut self, id: &str, capacity: u32, endpoints: Vec<String>) {
        let options = WorkerOptions {
            endpoints,
            worker_id: id.into(),
            state_dir: Some(ax_integration_tests::fresh_state_dir()),
            capacity,
            heartbeat_interval: HEARTBEAT,
            task_heartbeat_interval: Duration::from_secs(2),
            reconnect_initial: Duration::from_millis(50),
            reconnect_max: Duration::from_millis(500),
            ..WorkerOptions::default()
        };
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(ax_worker::run(options, cancel.clone()));
        self.workers.push((id.to_string(), cancel, handle));
    }

    async fn client(&self, index: usize) -> TestClient {
        TestClient::connect(&self.url(index)).await.expect("client")
    }

    /// Where the workers are: the rows that say connected and were refreshed lately, by node.
    async fn placement(&self) -> Placement {
        let (db_now, _) = self.store.list_node_leases().await.expect("leases");
        let mut placement = Placement::new();
        for row in self.store.list_workers().await.expect("workers") {
            if row.connected && db_now - row.last_heartbeat <= FRESH_MS {
                placement.entry(row.node_id).or_default().push(row.id);
            }
        }
        placement
    }

    async fn wait_placement(&self, what: &str, done: impl Fn(&Placement) -> bool) -> Placement {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let placement = self.placement().await;
            if done(&placement) {
                return placement;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not {what} within {GUARD:?}: {placement:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the workers (draining), then the nodes, then drops the database.
    async fn shutdown(mut self) {
        for (_, cancel, _) in &self.workers {
            cancel.cancel();
        }
        for (id, _, handle) in self.workers.drain(..) {
            tokio::time::timeout(GUARD, handle)
                .await
                .unwrap_or_else(|_| panic!("worker {id} stops"))
                .expect("worker task")
                .expect("worker result");
        }
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            node.shutdown().await.expect("node shutdown");
        }
        self.db.drop_database().await.expect("drop database");
    }
}

fn counts(placement: &Placement) -> BTreeMap<&str, usize> {
    placement
        .iter()
        .map(|(node, workers)| (node.as_str(), workers.len()))
        .collect()
}

fn held(placement: &Placement, node: &str) -> usize {
    placement.get(node).map_or(0, Vec::len)
}

fn total(placement: &Placement) -> usize {
    placement.values().map(Vec::len).sum()
}

/// Six workers that all start at the first node: once the other two nodes are up, the first
/// asks workers to move, one at a time, until every node holds its share (2; the tolerance is
/// a tenth of the share, 0 here), and then nothing moves any more.
async fn workers_that_all_start_on_one_node_end_up_spread() {
    let mut sandbox = Sandbox::new(3).await;
    sandbox.start_node(0).await;
    let ids = ids_starting_at(0, 3, 6);
    for id in &ids {
        sandbox.start_worker(id, 2, sandbox.urls());
    }
    sandbox
        .wait_placement("all six on n1", |p| held(p, "n1") == 6)
        .await;

    sandbox.start_node(1).await;
    sandbox.start_node(2).await;
    let spread =
        |p: &Placement| total(p) == 6 && ["n1", "n2", "n3"].iter().all(|n| held(p, n) == 2);
    sandbox.wait_placement("two on each node", spread).await;
    // Settled: four more decisions of every node change nothing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sandbox.placement().await;
    assert!(
        spread(&after),
        "the spread did not hold: {:?}",
        counts(&after)
    );
    sandbox.shutdown().await;
}

/// A node shut down hands its workers to the others (they reconnect); started again, it gets
/// its share back over time, moved to it by the nodes that hold too many.
async fn a_restarted_node_gets_its_share_of_workers_back() {
    let mut sandbox = Sandbox::new(3).await;
    for index in 0..3 {
        sandbox.start_node(index).await;
    }
    for index in 0..3 {
        for id in ids_starting_at(index, 3, 2) {
            sandbox.start_worker(&id, 2, sandbox.urls());
        }
    }
    let spread =
        |p: &Placement| total(p) == 6 && ["n1", "n2", "n3"].iter().all(|n| held(p, n) == 2);
    sandbox.wait_placement("two on each node", spread).await;

    sandbox.stop_node(2).await;
    sandbox
        .wait_placement("all six on n1 and n2, at most three each", |p| {
            held(p, "n1") + held(p, "n2") == 6 && held(p, "n1") <= 3 && held(p, "n2") <= 3
        })
        .await;

    sandbox.start_node(2).await;
    let back = sandbox.wait_placement("n3 holding two again", spread).await;
    assert_eq!(held(&back, "n3"), 2, "{back:?}");
    sandbox.shutdown().await;
}

/// Three workers on the first node each run a task that prints ten lines, waits, and prints ten
/// more. A second node comes up; the first asks one of the busy workers to move. The task goes
/// on across the move: every task ends SUCCESS as attempt 1, ran in one process, and has all
/// twenty lines stored once.
async fn tasks_running_through_a_move_finish_as_attempt_one_with_every_line() {
    let mut sandbox = Sandbox::new(2).await;
    sandbox.start_node(0).await;
    let ids = ids_starting_at(0, 2, 3);
    for id in &ids {
        sandbox.start_worker(id, 1, sandbox.urls());
    }
    sandbox
        .wait_placement("all three on n1", |p| held(p, "n1") == 3)
        .await;

    let dir = tempfile::tempdir().expect("scratch dir");
    let effects = dir.path().join("effects");
    let go = dir.path().join("go");
    let body = format!(
        "i=1\nwhile [ $i -le 20 ]; do echo \"line $i\"; note tick; \
         if [ $i -eq 10 ]; then while [ ! -e '{}' ]; do sleep 0.05; done; fi; \
         i=$((i + 1)); sleep 0.02; done",
        go.display()
    );
    let command = script(dir.path(), "through-a-move", &effects, &body);
    let tasks: Vec<(String, String)> = (1..=3)
        .map(|i| (format!("t{i}"), command.clone()))
        .collect();
    let client = sandbox.client(0).await;
    client
        .apply(&workflow("through-a-move", "", &tasks))
        .await
        .expect("apply");
    let run = client.trigger_run("through-a-move").await.expect("trigger");
    // Every task is halfway: ten lines out, waiting.
    wait_notes(&effects, "ten lines from each task", |notes| {
        let mut ticks: BTreeMap<i64, usize> = BTreeMap::new();
        for note in notes.iter().filter(|n| n.what == "tick") {
            *ticks.entry(note.instance).or_default() += 1;
        }
        ticks.len() == 3 && ticks.values().all(|&n| n >= 10)
    })
    .await;

    sandbox.start_node(1).await;
    let moved = sandbox
        .wait_placement("a worker on n2", |p| held(p, "n2") >= 1)
        .await;
    let moved_worker = moved["n2"][0].clone();
    std::fs::write(&go, "").expect("go");

    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let instances = check_invariants(&client, run.id, &effects, Lines::Exactly(20)).await;
    for instance in &instances {
        assert_eq!(
            (instance.state(), instance.attempt),
            (pb::InstanceState::Success, 1),
            "{instance:?}"
        );
    }
    assert!(
        instances.iter().any(|i| i.worker_id == moved_worker),
        "the moved worker {moved_worker} ran none of the tasks: {instances:?}"
    );
    sandbox.shutdown().await;
}

/// The first endpoint of the worker's list refuses connections: it goes on to the nodes and
/// runs tasks.
async fn a_worker_whose_first_endpoint_is_unreachable_runs_tasks() {
    let mut sandbox = Sandbox::new(2).await;
    sandbox.start_node(0).await;
    sandbox.start_node(1).await;
    let unreachable = format!("http://{}", free_address());
    let mut endpoints = vec![unreachable];
    endpoints.extend(sandbox.urls());
    let id = ids_starting_at(0, 3, 1).remove(0);
    sandbox.start_worker(&id, 2, endpoints);
    sandbox
        .wait_placement("the worker connected", |p| total(p) == 1)
        .await;

    let client = sandbox.client(0).await;
    client
        .apply("name: hello\ntasks:\n  - name: say\n    command: echo hello from the good node\n")
        .await
        .expect("apply");
    let run = client.trigger_run("hello").await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let instances = client.instances(run.id).await.expect("instances");
    let lines = client.logs(instances[0].id).await.expect("logs");
    let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(texts, ["hello from the good node"]);
    assert_eq!(instances[0].worker_id, id);
    sandbox.shutdown().await;
}
