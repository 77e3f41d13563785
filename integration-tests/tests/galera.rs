//! ax on a multi-primary MariaDB Galera cluster (`ax_integration_tests::galera`), each node on a
//! member of its own: three nodes started together on an empty database all start (they migrate
//! one after the other under the migration lock, a committed row), and a workflow limited to one
//! active run, triggered on all three nodes at once round after round, never has two runs at a
//! time, by the ledger its task appends to (a row lock holds on one member only, so each decision
//! also writes the rows it locked, and Galera's certification orders them). The fault tests on
//! Galera (a member killed under load, nodes killed, the per-second cron soak) are in
//! `cluster_faults`. A member isolated from the others (`gmcast.isolate`, outside the primary
//! component) cuts off its node, which then answers every API call and registration with
//! UNAVAILABLE at once, and no node starts on it. A worker that moves, with a task running, to a
//! node whose member has not yet applied that task's dispatch keeps it: the registration waits
//! for the member (a causal read) rather than judge the task unknown and kill it.

use std::net::SocketAddr;
use std::time::Duration;

use ax_integration_tests::TestClient;
use ax_integration_tests::fault_kit::{read_notes, script};
use ax_integration_tests::galera::{self, GALERA, GaleraDb, MEMBERS};
use ax_integration_tests::harness::{Test, trial};
use ax_proto::v1 as pb;
use ax_scheduler::{RunningScheduler, SchedulerOptions};
use ax_worker::WorkerOptions;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) galera_three_nodes_started_together_on_an_empty_database_all_start).requires(&GALERA),
        trial!(async(multi_thread = 2) galera_one_active_run_holds_when_every_node_triggers_at_once).requires(&GALERA),
        trial!(async(multi_thread = 2) galera_a_node_whose_member_leaves_the_cluster_is_cut_off_and_refuses_at_once).requires(&GALERA),
        trial!(async(multi_thread = 2) galera_a_worker_moving_to_a_member_that_lags_keeps_its_running_task).requires(&GALERA),
    ]
}

/// Worker `w1` in this process, knowing `endpoints`, LIVE as `client` sees it; cancel the token
/// to stop it.
async fn live_worker(
    client: &TestClient,
    endpoints: Vec<String>,
    capacity: u32,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let worker = CancellationToken::new();
    let options = WorkerOptions {
        endpoints,
        worker_id: "w1".into(),
        state_dir: Some(ax_integration_tests::fresh_state_dir()),
        capacity,
        heartbeat_interval: Duration::from_millis(500),
        ..WorkerOptions::default()
    };
    let task = tokio::spawn(ax_worker::run(options, worker.clone()));
    client
        .wait_worker_live("w1", HANG_GUARD)
        .await
        .expect("w1 live");
    (worker, task)
}

/// Rounds of the run-limit race: each triggers the workflow on the three nodes at once.
const ROUNDS: usize = 18;
/// What a test waits for at most before it calls a hang a failure.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn node(url: String, id: &str) -> SchedulerOptions {
    SchedulerOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: url,
        node_id: id.into(),
        node_lease: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        ..SchedulerOptions::default()
    }
}

/// The three nodes, started at once, node `i` on member `i`.
async fn start_together(db: &GaleraDb) -> Vec<RunningScheduler> {
    let (a, b, c) = tokio::join!(
        ax_scheduler::start(node(db.url(1), "n1")),
        ax_scheduler::start(node(db.url(2), "n2")),
        ax_scheduler::start(node(db.url(3), "n3")),
    );
    [a, b, c]
        .into_iter()
        .map(|started| started.expect("every node starts"))
        .collect()
}

async fn galera_three_nodes_started_together_on_an_empty_database_all_start() {
    let _alone = galera::exclusive().await;
    let db = GaleraDb::create().await.expect("a Galera database");
    let nodes = start_together(&db).await;
    // Every member has the whole schema and the three leases.
    for member in 1..=MEMBERS {
        let store = ax_store::open(&db.url(member)).await.expect("store");
        assert_eq!(store.engine(), ax_store::Engine::Galera);
        let (_, leases) = store.list_node_leases().await.expect("leases");
        assert_eq!(leases.len(), 3, "member {member}: {leases:?}");
        store.close().await;
    }
    for node in nodes {
        node.shutdown().await.expect("shutdown");
    }
    db.drop_database().await.expect("drop the database");
}

async fn galera_one_active_run_holds_when_every_node_triggers_at_once() {
    let _alone = galera::exclusive().await;
    let db = GaleraDb::create().await.expect("a Galera database");
    let dir = tempfile::tempdir().expect("tempdir");
    let effects = dir.path().join("effects");
    let nodes = start_together(&db).await;
    let mut clients = Vec::new();
    for node in &nodes {
        let endpoint = format!("http://{}", node.local_addr());
        clients.push(TestClient::connect(&endpoint).await.expect("client"));
    }
    let endpoints: Vec<String> = clients.iter().map(|c| c.endpoint().to_string()).collect();
    let (worker, worker_task) = live_worker(&clients[0], endpoints, 8).await;
    let command = script(dir.path(), "serial", &effects, "sleep 0.2");
    let yaml = format!(
        "name: serial\nschedule:\n  max_active_runs: 1\ntasks:\n  - name: step\n    command: \"{}\"\n",
        command.replace('\\', "\\\\").replace('"', "\\\"")
    );
    clients[0].apply(&yaml).await.expect("apply");

    // Each round starts with no run active, so that the three creations race for the one
    // place (later runs of a round queue behind the first, and are promoted one at a time).
    let mut runs = Vec::new();
    for _ in 0..ROUNDS {
        let (a, b, c) = tokio::join!(
            clients[0].trigger_run("serial"),
            clients[1].trigger_run("serial"),
            clients[2].trigger_run("serial"),
        );
        for run in [a, b, c] {
            let run = run.expect("trigger").id;
            runs.push(run);
        }
        for run in &runs[runs.len() - 3..] {
            let ended = clients[0]
                .wait_run_within(*run, HANG_GUARD)
                .await
                .expect("the run ends");
            assert_eq!(ended.state(), pb::RunState::Success, "run {run}");
        }
    }

    // By the ledger: one task ran at a time, and each run's task ran once.
    let notes = read_notes(&effects);
    let mut running = 0i32;
    let mut most = 0i32;
    for note in &notes {
        match note.what.as_str() {
            "start" => running += 1,
            "end" => running -= 1,
            _ => {}
        }
        most = most.max(running);
    }
    let starts = notes.iter().filter(|n| n.what == "start").count();
    println!(
        "{} runs triggered three at a time on three Galera members: at most {most} running at once, {starts} starts",
        runs.len()
    );
    assert_eq!(most, 1, "two runs were active at once:\n{notes:#?}");
    assert_eq!(starts, runs.len(), "a task ran other than once");

    worker.cancel();
    let _ = tokio::time::timeout(HANG_GUARD, worker_task).await;
    for node in nodes {
        node.shutdown().await.expect("shutdown");
    }
    db.drop_database().await.expect("drop the database");
}

/// Calls on a node until one is refused as cut off; returns the refusal and how long that call
/// took.
async fn wait_refused(client: &TestClient) -> (tonic::Status, Duration) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let asked = tokio::time::Instant::now();
        match client.control().list_nodes(pb::ListNodesRequest {}).await {
            Err(status) if status.message().contains("cannot reach its store") => {
                return (status, asked.elapsed());
            }
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node on the isolated member was not cut off"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn galera_a_node_whose_member_leaves_the_cluster_is_cut_off_and_refuses_at_once() {
    let _alone = galera::exclusive().await;
    let db = GaleraDb::create().await.expect("a Galera database");
    let nodes = start_together(&db).await;
    let endpoint = |i: usize| format!("http://{}", nodes[i].local_addr());
    let n3 = TestClient::connect(&endpoint(2))
        .await
        .expect("client of n3");
    let isolate = |on: u8| async move {
        let mut conn = sqlx::MySqlConnection::connect(&galera::server_url(3))
            .await
            .expect("member 3");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET GLOBAL wsrep_provider_options = 'gmcast.isolate={on}'"
        )))
        .execute(&mut conn)
        .await
        .expect("isolate member 3");
    };
    isolate(1).await;
    let (refused, took) = wait_refused(&n3).await;
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // At once, not after a pool's 30 s: 5 s only catches a hang.
    let asked = tokio::time::Instant::now();
    let again = n3.control().list_nodes(pb::ListNodesRequest {}).await;
    assert!(
        matches!(&again, Err(status) if status.code() == tonic::Code::Unavailable),
        "{again:?}"
    );
    assert!(
        took.max(asked.elapsed()) < Duration::from_secs(5),
        "a call to the cut-off node took {:?}",
        took.max(asked.elapsed())
    );
    // The JSON API says the same, and a worker's registration is refused with the reason.
    let response = reqwest::get(format!("{}/api/v1/runs", endpoint(2)))
        .await
        .expect("an HTTP answer");
    assert_eq!(response.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body = response.text().await.expect("body");
    assert!(body.contains("cannot reach its store"), "{body}");
    let registered = register(&endpoint(2)).await;
    assert!(
        matches!(&registered, Err(status) if status.code() == tonic::Code::Unavailable
            && status.message().contains("cannot reach its store")),
        "{registered:?}"
    );
    // The other nodes serve, and no node starts on the isolated member.
    let n1 = TestClient::connect(&endpoint(0))
        .await
        .expect("client of n1");
    n1.control()
        .list_nodes(pb::ListNodesRequest {})
        .await
        .expect("n1 answers");
    let started = ax_scheduler::start(node(db.url(3), "n4")).await;
    let refusal = match started {
        Ok(node) => {
            node.shutdown().await.expect("shutdown");
            panic!("a node started on a member outside the primary component");
        }
        Err(err) => format!("{err:#}"),
    };
    assert!(
        refusal.contains("not ready") || refusal.contains("WSREP"),
        "{refusal}"
    );
    println!("a node on an isolated member: {refused:?}; a new node: {refusal}");

    // Back in the cluster, the node serves again.
    isolate(0).await;
    galera::all_synced(HANG_GUARD)
        .await
        .expect("member 3 rejoins");
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while n3
        .control()
        .list_nodes(pb::ListNodesRequest {})
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "n3 did not serve again after its member rejoined"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for node in nodes {
        node.shutdown().await.expect("shutdown");
    }
    db.drop_database().await.expect("drop the database");
}

/// Opens a worker stream on `endpoint` with a Register frame; the stream once registered, else
/// the status it was refused with.
async fn register(endpoint: &str) -> Result<(), tonic::Status> {
    use pb::worker_message::Body;
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = pb::worker_service_client::WorkerServiceClient::new(channel);
    let register = pb::Register {
        protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
        worker_id: "w9".into(),
        version: "test".into(),
        capacity: 1,
        started_at_ms: chrono::Utc::now().timestamp_millis(),
        hostname: "test".into(),
        incarnation: "0123456789abcdef0123".into(),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WorkerMessage {
        body: Some(Body::Register(register)),
    })
    .await
    .expect("queue Register");
    let mut inbound = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    inbound.message().await.map(|_| ())
}

/// Two nodes on members 1 and 2 and one worker. The member of the node the worker is not on is
/// paused (it stops applying the others' commits) before a run is triggered, so the run, its
/// dispatch and the task's start exist on the worker's member only. That node stops; the worker
/// moves to the other with the task running. Read there without waiting, the task's attempt
/// does not exist and the worker would be told to kill it (what happened under a member's
/// death: a success never stored, its attempt RUNNING for good). The registration waits for
/// the member instead; once it is resumed, the task is adopted and its end stored, once.
async fn galera_a_worker_moving_to_a_member_that_lags_keeps_its_running_task() {
    let _alone = galera::exclusive().await;
    let db = GaleraDb::create().await.expect("a Galera database");
    let dir = tempfile::tempdir().expect("tempdir");
    let effects = dir.path().join("effects");
    // The dead-worker threshold Galera needs (20 s: a commit stall must not outlast half of
    // it), which also lets the worker wait out the pause without fencing itself.
    let patient = |url: String, id: &str| SchedulerOptions {
        dead_after_missed_heartbeats: 40,
        ..node(url, id)
    };
    let (a, b) = tokio::join!(
        ax_scheduler::start(patient(db.url(1), "n1")),
        ax_scheduler::start(patient(db.url(2), "n2")),
    );
    let mut nodes: Vec<Option<RunningScheduler>> =
        vec![Some(a.expect("n1 starts")), Some(b.expect("n2 starts"))];
    let endpoints: Vec<String> = nodes
        .iter()
        .flatten()
        .map(|node| format!("http://{}", node.local_addr()))
        .collect();
    let mut clients = Vec::new();
    for endpoint in &endpoints {
        clients.push(TestClient::connect(endpoint).await.expect("client"));
    }
    let (worker, worker_task) = live_worker(&clients[0], endpoints, 2).await;
    let on = |node: &str| usize::from(node == "n2");
    let held_by = clients[0]
        .workers()
        .await
        .expect("workers")
        .into_iter()
        .find(|w| w.id == "w1")
        .map(|w| on(&w.scheduler_node))
        .expect("w1 listed");
    let other = 1 - held_by;
    let command = script(dir.path(), "long", &effects, "sleep 4");
    let yaml = format!(
        "name: long\ntasks:\n  - name: step\n    command: \"{}\"\n",
        command.replace('\\', "\\\\").replace('"', "\\\"")
    );
    clients[held_by].apply(&yaml).await.expect("apply");
    galera::all_synced(HANG_GUARD)
        .await
        .expect("the workflow on every member");

    let paused = galera::pause_applying(other + 1)
        .await
        .expect("pause the other member");
    let run = clients[held_by]
        .trigger_run("long")
        .await
        .expect("trigger")
        .id;
    clients[held_by]
        .wait_instance(run, "step", pb::InstanceState::Running)
        .await
        .expect("the task runs");
    nodes[held_by]
        .take()
        .expect("the worker's node")
        .shutdown()
        .await
        .expect("the worker's node stops");
    // Long enough for the worker to be at the other node's door, short of that node's cut-off
    // (its own writes wait too).
    tokio::time::sleep(Duration::from_secs(2)).await;
    paused.resume().await.expect("resume the member");
    galera::all_synced(HANG_GUARD)
        .await
        .expect("the member catches up");

    let ended = clients[other]
        .wait_run_within(run, HANG_GUARD)
        .await
        .expect("the run ends");
    let instances = clients[other].instances(run).await.expect("instances");
    assert_eq!(ended.state(), pb::RunState::Success, "{instances:#?}");
    assert_eq!(
        instances[0].attempt, 1,
        "the task ran again: {instances:#?}"
    );
    let notes = read_notes(&effects);
    let starts = notes.iter().filter(|n| n.what == "start").count();
    let ends = notes.iter().filter(|n| n.what == "end").count();
    assert_eq!((starts, ends), (1, 1), "{notes:#?}");
    let moved_to = clients[other]
        .workers()
        .await
        .expect("workers")
        .into_iter()
        .find(|w| w.id == "w1")
        .map(|w| w.scheduler_node);
    println!(
        "w1 moved from n{} to {moved_to:?} with its task running; it ended once",
        held_by + 1
    );

    worker.cancel();
    let _ = tokio::time::timeout(HANG_GUARD, worker_task).await;
    for node in nodes.into_iter().flatten() {
        node.shutdown().await.expect("shutdown");
    }
    db.drop_database().await.expect("drop the database");
}
